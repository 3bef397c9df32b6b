"""Where am I (issue 33, item 3): each live lease in the runtime context carries its issue, action, expiry and time
left, its own next step, and its worktree's absolute path as the agent sees it (``[mcp] worktree_roots``)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tests.review_support import ok, put_in_review, world
from tests.support import Started
from tests.test_queues_life import AUTHOR, leased_to_author_1, team
from tests.world import World

__all__ = ["world"]  # the fixture


async def test_each_lease_says_where_its_worktree_is_for_the_agent_and_what_comes_next(
        tmp_path: Path, start: Started) -> None:
    roster = {AUTHOR: ["author"], "author-2": ["author"]}
    async with team(tmp_path, start, roster, mcp={"worktree_roots": {AUTHOR: "/workspace"}}) as world:
        number, lease = await leased_to_author_1(world)
        context = await ok(world, AUTHOR, "gitea_get_runtime_context")
        [doc] = context["leases"]
        assert (doc["issue_number"], doc["action"], doc["lease_id"]) == (number, "implement", lease.lease_id)
        assert 0 < doc["seconds_left"] <= world.service.settings.allocator.lease_ttl_s
        assert datetime.fromisoformat(doc["expires_at"]) == lease.expires_at
        service_path = Path(doc["service_worktree_path"])
        assert service_path.is_dir()  # the bootstrap ran on allocation
        root = Path(world.service.settings.repository.checkout_root).resolve()
        assert doc["worktree_path"] == "/workspace/" + service_path.relative_to(root).as_posix(), doc
        assert doc["next_action"] == context["exact_next_action"] and f"issue_number={number}" in doc["next_action"]
        # Without a root of its own (no "*" either) an agent sees the service's path.
        other = await ok(world, "author-2", "gitea_get_runtime_context")
        assert other["leases"] == [] or all(d["worktree_path"] == d["service_worktree_path"]
                                            for d in other["leases"])


async def test_a_merger_without_a_running_queue_is_shown_the_approved_pull_request_to_merge(world: World) -> None:
    """The queues off ([allocator] queues = []): a merger holding nothing is not told to wait for a controller;
    it sees the approved pull request waiting for its role and the tool that merges it."""
    pr = await put_in_review(world)
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    context = await ok(world, "author-3", "gitea_get_runtime_context")
    assert "gitea_merge_pull_request" in context["exact_next_action"], context
    assert "controller" not in context["exact_next_action"], context
    assert [m["issue_number"] for m in context["work_waiting"]["merges"]] == [pr.number], context
    assert context["work_waiting"]["merges"][0]["approvals"] == "1 of 1"
