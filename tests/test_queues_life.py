"""Issue 31: nobody waits for a controller. Ready issues go through implement → review → merge → teardown by the
agents' own calls, each agent asking only the runtime context what to do next (no controller on the roster); with
``[merge] by = "foreman"`` the same without a merger. And stranded work comes back: an expired or released lease
returns its issue to `status:ready` for the other author, and the old owner's next call says why."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot.emulator.webhooks import expand_hook_events
from bot.loops.auto_allocate import auto_allocate
from state.journal import JournalStore
from state.leases import Lease, LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.review_support import ok, runtime, tool
from tests.support import Started
from tests.world import EXTRA_TOKENS, FULL_NAME, World, open_world

AUTHOR, REVIEWERS, MERGER = "author-1", ("reviewer-1", "reviewer-2"), "merger-1"
#: Rounds of "every agent asks the runtime context and does what it says" before the test calls it a hang.
MAX_ROUNDS = 40


@asynccontextmanager
async def team(tmp_path: Path, start: Started, roster: dict[str, list[str]], **sections: Any) -> AsyncIterator[World]:
    tokens = {login: EXTRA_TOKENS[login] for login in roster}
    async with open_world(tmp_path, start, roster=roster, gitea={"identity_tokens": tokens},
                          bootstrap={"on_allocate": "run"}, reconcile={"interval_s": 0}, **sections) as world:
        for login in roster:
            world.live.emulator.set_permission(OWNER, REPO, login, "write")
        world.hook.events = expand_hook_events(["issues", "pull_request"])
        yield world


async def act(world: World, login: str) -> str | None:
    """One agent's turn: ask the runtime context, do the first leased thing it names. What it did, or None."""
    context = await ok(world, login, "gitea_get_runtime_context")
    if not context["leases"]:
        return None
    lease = context["leases"][0]
    n = lease["issue_number"]
    if lease["action"] == "review":
        await ok(world, login, "gitea_submit_review", issue_number=n, verdict="approve")
        return f"{login} approved #{n}"
    if lease["action"] == "merge":
        assert "gitea_merge_pull_request" in context["exact_next_action"], context
        await ok(world, login, "gitea_merge_pull_request", issue_number=n)
        return f"{login} merged #{n}"
    if "gitea_bootstrap_issue_worktree" in context["exact_next_action"]:
        await ok(world, login, "gitea_bootstrap_issue_worktree", issue_number=n)
        return f"{login} bootstrapped #{n}"
    path = lease["worktree_path"]
    assert path, context
    await ok(world, login, "gitea_lock_issue", issue_number=n)
    (Path(path) / f"issue-{n}.txt").write_text(f"done #{n}\n", encoding="utf-8")
    await ok(world, login, "gitea_publish_worktree", issue_number=n, message=f"Implement #{n}")
    await ok(world, login, "gitea_open_pull_request", issue_number=n)
    return f"{login} opened the PR of #{n}"


TWO_AUTHORS = {AUTHOR: ["author"], "author-2": ["author"]}


async def leased_to_author_1(world: World) -> tuple[int, Lease]:
    """One issue labelled `status:ready`: auto-allocation leases it to author-1 (the first of the idle authors)."""
    number = await world.open_issue("alice", "Make the widget blue")
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    [first] = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert first.owner == AUTHOR
    return number, first


async def live_three(world: World, agents: list[str],
                     titles: tuple[str, ...] = ("Make the widget blue", "Make the widget round",
                                                "Make the widget shiny")) -> list[str]:
    """Ready issues (three by default), then the agents' turns until every issue is done; the steps taken."""
    numbers = []
    for title in titles:
        number = await world.open_issue("alice", title)
        await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        numbers.append(number)
    steps: list[str] = []
    for _ in range(MAX_ROUNDS):
        if all(world.labels(n) == ["status:done"] for n in numbers):
            return steps
        for login in agents:
            did = await act(world, login)
            if did is not None:
                steps.append(did)
        await world.settle()
    raise AssertionError(f"the lives never ended: {steps}; labels {[world.labels(n) for n in numbers]}")


async def test_three_issues_live_through_the_queues_with_no_controller(tmp_path: Path, start: Started) -> None:
    roster = {AUTHOR: ["author"], REVIEWERS[0]: ["reviewer"], REVIEWERS[1]: ["reviewer"], MERGER: ["merger"]}
    async with team(tmp_path, start, roster) as world:
        steps = await live_three(world, [AUTHOR, *REVIEWERS, MERGER])
        assert sum(s.startswith(f"{AUTHOR} opened") for s in steps) == 3, steps
        assert sum(" approved " in s for s in steps) == 3 and sum(s.startswith(f"{MERGER} merged") for s in steps) == 3
        leases = await LeaseStore(world.service.db).every_lease()
        reviews = [lease for lease in leases if lease.action == "review"]
        assert {lease.owner for lease in reviews} <= set(REVIEWERS) and len(reviews) == 3
        assert [lease for lease in leases if lease.status == "live"] == []
        merges = [lease for lease in leases if lease.action == "merge"]
        assert [(lease.owner, lease.end_reason) for lease in merges] == [(MERGER, "merged")] * 3, merges


async def test_with_merge_by_foreman_the_queue_merges_without_a_merger(tmp_path: Path, start: Started) -> None:
    roster = {AUTHOR: ["author"], REVIEWERS[0]: ["reviewer"], REVIEWERS[1]: ["reviewer"]}
    async with team(tmp_path, start, roster, merge={"by": "foreman"}) as world:
        steps = await live_three(world, [AUTHOR, *REVIEWERS])
        assert not any(" merged " in s for s in steps), steps
        pulls = await world.gitea.list_pulls(state="all")
        assert len(pulls) == 3 and all(p.merged for p in pulls), pulls
        leases = await LeaseStore(world.service.db).every_lease()
        assert [lease for lease in leases if lease.action == "merge"] == []


async def test_an_expired_lease_returns_the_issue_to_the_other_author(tmp_path: Path, start: Started) -> None:
    """author-1's lease expires mid-work (past its grace): the issue goes back to `status:ready`, unassigned, with
    evidence naming the kept worktree, and to author-2; author-1's next call is refused `lease_expired`; its
    worktree and its uncommitted file are still there."""
    async with team(tmp_path, start, TWO_AUTHORS) as world:
        number, first = await leased_to_author_1(world)
        store = LeaseStore(world.service.db)
        context = await ok(world, AUTHOR, "gitea_get_runtime_context")
        tree = Path(context["leases"][0]["worktree_path"])
        (tree / "draft.txt").write_text("half done\n", encoding="utf-8")
        grace = world.service.settings.allocator.lease_grace_s
        later = first.expires_at + timedelta(seconds=grace + 1)
        report = await auto_allocate(runtime(world), trigger="catch_up", now=later)
        assert report.expired == [number], report.to_dict()
        await world.settle()
        expired = await store.get(first.lease_id)
        assert expired is not None and expired.status == "expired"
        refused, doc = await tool(world, AUTHOR, "gitea_heartbeat_lease", issue_number=number)
        assert refused and doc["details"]["reason"] == "lease_expired", doc
        assert doc["details"]["expires_at"] == first.expires_at.isoformat()
        comments = world.live.emulator.issue(OWNER, REPO, number).comments
        assert any(str(tree) in c.body for c in comments if f"{first.lease_id}:expired" in c.body)
        now_held = await store.live_for_issue(FULL_NAME, number)
        assert now_held is not None and now_held.owner == "author-2", (now_held, world.labels(number))
        assert world.labels(number) == ["status:in-progress"]
        # author-2 took it over: author-1's worktree was moved aside and kept, its uncommitted file in it.
        [kept] = await JournalStore(world.service.db).kept_registrations(FULL_NAME.lower(), number)
        assert kept.owner == AUTHOR and Path(kept.worktree_path) != tree
        assert (Path(kept.worktree_path) / "draft.txt").read_text(encoding="utf-8") == "half done\n"
        context = await ok(world, "author-2", "gitea_get_runtime_context")
        assert Path(context["leases"][0]["worktree_path"]) == tree, context


async def test_a_released_lease_returns_the_issue_to_the_other_author(tmp_path: Path, start: Started) -> None:
    """author-1 gives its issue up (a release without a hand-over): `status:ready` again, and to author-2, never
    straight back to author-1; author-1's next call says `lease_released`. Before, the issue stayed in-progress with
    the old assignee and nothing re-offered it."""
    async with team(tmp_path, start, TWO_AUTHORS) as world:
        number, first = await leased_to_author_1(world)
        store = LeaseStore(world.service.db)
        await ok(world, AUTHOR, "gitea_release_lease", issue_number=number, reason="stuck")
        await world.settle()
        released = await store.get(first.lease_id)
        assert released is not None and (released.status, released.end_reason) == ("released", "stuck")
        now_held = await store.live_for_issue(FULL_NAME, number)
        assert now_held is not None and now_held.owner == "author-2", (now_held, world.labels(number))
        assert world.labels(number) == ["status:in-progress"]
        assert [u.login for u in world.live.emulator.issue(OWNER, REPO, number).assignees] == ["author-2"]
        refused, doc = await tool(world, AUTHOR, "gitea_heartbeat_lease", issue_number=number)
        assert refused and doc["details"]["reason"] == "lease_released", doc
        assert doc["details"]["current_lease"]["owner"] == "author-2", doc


async def test_an_expired_review_lease_goes_to_the_other_reviewer(tmp_path: Path, start: Started) -> None:
    """A review lease past its grace: the issue stays in `status:review` with evidence, and the review goes to the
    other idle reviewer; the first reviewer's verdict is refused `lease_expired`."""
    roster = {AUTHOR: ["author"], REVIEWERS[0]: ["reviewer"], REVIEWERS[1]: ["reviewer"]}
    async with team(tmp_path, start, roster, allocator={"queues": ["review"]}) as world:
        number, _ = await leased_to_author_1(world)
        assert await act(world, AUTHOR) == f"{AUTHOR} opened the PR of #{number}"
        await world.settle()
        store = LeaseStore(world.service.db)
        first = await store.live_for_issue(FULL_NAME, number)
        assert first is not None and first.action == "review" and first.owner in REVIEWERS, first
        later = first.expires_at + timedelta(seconds=world.service.settings.allocator.lease_grace_s + 1)
        report = await auto_allocate(runtime(world), trigger="catch_up", now=later)
        assert report.expired == [number], report.to_dict()
        other = next(login for login in REVIEWERS if login != first.owner)
        again = await store.live_for_issue(FULL_NAME, number)
        assert again is not None and (again.owner, again.action) == (other, "review"), again
        assert world.labels(number) == ["status:review"]
        comments = world.live.emulator.issue(OWNER, REPO, number).comments
        assert any(f"{first.lease_id}:expired" in c.body and "waits again" in c.body for c in comments)
        refused, doc = await tool(world, first.owner, "gitea_submit_review", issue_number=number, verdict="approve")
        assert refused and doc["details"]["reason"] == "lease_expired", doc


async def test_a_run_that_leases_nothing_says_why_for_each_queue(tmp_path: Path, start: Started) -> None:
    """Issue 31 item 5: an automatic run that leases nothing records why, per phase (before: only "leased [],
    resumed [], blocked [], waiting []")."""
    roster = {AUTHOR: ["author"], REVIEWERS[0]: ["reviewer"], MERGER: ["merger"]}
    async with team(tmp_path, start, roster) as world:
        quiet = await auto_allocate(runtime(world), trigger="catch_up")
        assert quiet.silence == {"implement": "no issue is status:ready",
                                 "review": "no pull request waits for review",
                                 "merge": "no approved pull request waits to merge"}, quiet.to_dict()
        await leased_to_author_1(world)
        second = await world.open_issue("alice", "Make the widget round")
        await world.call("alice", "POST", f"/issues/{second}/labels", {"labels": ["status:ready"]})
        busy = await auto_allocate(runtime(world), trigger="catch_up")
        assert busy.waiting == [second] and "every author is busy" in busy.silence["implement"], busy.to_dict()
        assert "every author is busy" in busy.summary()


async def test_an_issue_titled_work_in_progress_gets_a_pull_request_gitea_will_merge(tmp_path: Path,
                                                                                    start: Started) -> None:
    """Issue 32 item 5: Gitea reads a PR titled `WIP:` or `[WIP]` (any case) as a draft and refuses to merge it.
    The PR verb never copies the prefix from the issue's title, so the queue's merge goes through; before, the PR
    was titled as the issue and every merge was refused 405."""
    roster = {AUTHOR: ["author"], REVIEWERS[0]: ["reviewer"]}
    async with team(tmp_path, start, roster, merge={"by": "foreman"}) as world:
        await live_three(world, [AUTHOR, REVIEWERS[0]], titles=("[WIP] wip: Make the widget blue",))
        [pull] = await world.gitea.list_pulls(state="all")
        assert pull.merged and pull.title == "Make the widget blue", pull

