"""The whole life of an issue end to end against the emulator, through MCP tool calls as four identities."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from bot import invariants
from bot.core.canonical import parse_comment
from bot.core.evidence import find_marker
from bot.emulator import pullgit
from bot.emulator.webhooks import expand_hook_events
from bot.mcp_server import build_server
from bot.verbs.bootstrap import BootstrapContext
from bot.verbs.runtime import caller_for
from state.journal import JournalStore
from state.leases import LeaseStore
from state.teardowns import TeardownStore
from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS
from tests.review_support import ok, runtime, start_work, tool
from tests.support import Started, wait_status
from tests.world import EXTRA_TOKENS, FULL_NAME, World, open_world

CONTROLLER, AUTHOR, REVIEWER, MERGER = "controller-bot", "author-1", "author-2", "author-3"
ROSTER = {CONTROLLER: ["controller"], AUTHOR: ["author"], REVIEWER: ["reviewer"], MERGER: ["merger"]}
TITLE = "Make the widget blue"


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    """Each identity has its own Gitea account and token (in the emulator and in [gitea.identity_tokens])."""
    tokens = {login: EXTRA_TOKENS[login] for login in ROSTER}
    # The review and merge queues off: these lives hand out reviews and merges by the agents' own claims
    # (tests/test_queues_life.py runs them with the queues).
    async with open_world(tmp_path, start, roster=ROSTER, gitea={"identity_tokens": tokens},
                          bootstrap={"on_allocate": "run"}, allocator={"queues": []}) as opened:
        for login in ROSTER:
            opened.live.emulator.set_permission(OWNER, REPO, login, "write")
        opened.hook.events = expand_hook_events(["issues", "pull_request"])
        yield opened


@dataclass(frozen=True)
class Worktree:
    path: Path
    branch: str


async def ready(world: World) -> tuple[int, Worktree]:
    """A person labels the issue `status:ready`: auto-allocation leases it to the author, with a worktree."""
    number = await world.open_issue("alice", TITLE)
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    [lease] = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert (lease.owner, lease.action, lease.status) == (AUTHOR, "implement", "live")
    registration = await JournalStore(world.service.db).live_registration(FULL_NAME.lower(), number)
    assert registration is not None and Path(registration.worktree_path).is_dir()
    assert world.labels(number) == ["status:in-progress"]
    return number, Worktree(Path(registration.worktree_path), registration.branch)


async def author_round(world: World, number: int, tree: Worktree, content: str, message: str) -> dict[str, Any]:
    """The author locks, writes in the worktree, publishes, opens (or updates) the PR and hands the issue on."""
    await ok(world, AUTHOR, "gitea_lock_issue", issue_number=number)
    (tree.path / "widget.txt").write_text(content, encoding="utf-8")
    published = await ok(world, AUTHOR, "gitea_publish_worktree", issue_number=number, message=message)
    assert pullgit.branch_sha(repo_path(world), tree.branch) == published["commit"]
    opened = await ok(world, AUTHOR, "gitea_open_pull_request", issue_number=number)
    assert opened["head_sha"] == published["commit"]
    assert world.labels(number) == ["status:review"]
    ended = (await LeaseStore(world.service.db).history(FULL_NAME, number))[-1]
    assert (ended.owner, ended.status, ended.end_reason) == (AUTHOR, "released", "pull_request_opened")
    assert opened["handed_over"] == {"lease_id": ended.lease_id, "reason": "pull_request_opened",
                                     "who_is_next": "reviewer"}
    return opened


async def review(world: World, number: int, verdict: str, body: str = "") -> dict[str, Any]:
    """The controller allocates the review to the reviewer, who submits the verdict."""
    allocated = await ok(world, CONTROLLER, "gitea_allocate_next_work", action="review", owner=REVIEWER,
                         dry_run=False)
    assert (allocated["lease"]["issue_number"], allocated["lease"]["action"]) == (number, "review"), allocated
    arguments: dict[str, Any] = {"issue_number": number, "verdict": verdict}
    if body:
        arguments["body"] = body
    return await ok(world, REVIEWER, "gitea_submit_review", **arguments)


def repo_path(world: World) -> Path:
    return Path(world.live.emulator.repo(OWNER, REPO).path)


def pull_record(world: World, pr: int) -> Any:
    emu = world.live.emulator
    return emu.pull_of(emu.issue(OWNER, REPO, pr))


def teardown_comments(world: World, number: int) -> list[str]:
    issue = world.live.emulator.issue(OWNER, REPO, number)
    return [c.body for c in issue.comments
            if c.kind == "comment" and c.poster.login == BOT and (find_marker(c.body) or "").startswith("teardown:")]


def evidence_of(body: str) -> dict[str, Any]:
    start = body.index("```json") + len("```json")
    return dict(json.loads(body[start:body.index("```", start)]))


async def assert_invariants(world: World) -> None:
    for entry in await world.service.outbox.list(limit=10_000):
        assert entry.status == "done", entry.summary()
    checkout = BootstrapContext.from_service(world.service).checkout_path
    facts = await invariants.gather(database=world.service.settings.database.path, client=world.gitea,
                                    bot_login=BOT, checkout=checkout, require_bootstrap=True)
    assert invariants.check(facts) == []


async def assert_torn_down(world: World, number: int, pr: int, tree: Worktree, *, merged: bool) -> dict[str, Any]:
    """Every lease ended, the worktree removed (merged) or kept, the branch deleted (merged), status:done, one
    final evidence comment read back from Gitea, and the invariants hold."""
    db = world.service.db
    assert [lease for lease in await LeaseStore(db).history(FULL_NAME, number) if lease.status == "live"] == []
    assert tree.path.exists() is not merged
    assert (pullgit.branch_sha(repo_path(world), tree.branch) is None) is merged
    assert world.labels(number) == ["status:done"]
    assert (world.live.emulator.issue(OWNER, REPO, number).closed is not None) is merged  # "Closes #N" on a merge
    [final] = teardown_comments(world, number)
    state = parse_comment(final).current
    assert state is not None and state.state == "done" and pr in state.related_prs
    evidence = evidence_of(final)
    assert evidence["reason"] == ("merged" if merged else "pr_closed")
    [record] = await TeardownStore(db).for_issue(FULL_NAME.lower(), number)
    assert record.pr_number == pr
    await assert_invariants(world)
    return evidence


async def test_the_whole_life_of_an_issue(world: World) -> None:
    """status:ready → lease and worktree → lock → write → publish → PR (posted as the author) → review (posted as
    the reviewer) → approve → merge by the merger → the closed webhook tears the issue down."""
    number, tree = await ready(world)
    opened = await author_round(world, number, tree, "blue\n", "Make the widget blue")
    pr = opened["pull_request"]
    record = pull_record(world, pr)
    assert record.issue.poster.login == AUTHOR and f"Closes #{number}" in record.issue.body
    approved = await review(world, number, "approve")
    assert approved["review"]["commit_id"] == opened["head_sha"]
    [verdict] = record.reviews
    assert (verdict.reviewer.login, verdict.state, verdict.official) == (REVIEWER, "APPROVED", True)
    refused, doc = await tool(world, REVIEWER, "gitea_merge_pull_request", issue_number=number)
    assert refused and doc["error"] == "not_authorized", doc
    merged = await ok(world, MERGER, "gitea_merge_pull_request", issue_number=number)
    assert record.merged is not None and record.merge_commit_sha == merged["merge_commit_sha"]
    assert pullgit.branch_sha(repo_path(world), "main") == merged["merge_commit_sha"]
    evidence = await assert_torn_down(world, number, pr, tree, merged=True)
    assert [(lease["owner"], lease["action"]) for lease in evidence["leases"]] == [
        (AUTHOR, "implement"), (REVIEWER, "review")]
    assert [c["subject"] for c in evidence["pull_request"]["commits"]] == ["Make the widget blue"]
    assert evidence["pull_request"]["merge_commit"] == merged["merge_commit_sha"]
    assert evidence["worktree"]["action"] == "removed" and evidence["branch"]["action"] == "deleted"


async def test_request_changes_and_back_updates_the_same_pull_request(world: World) -> None:
    """Changes requested: the author's work resumes in the same worktree, the publish updates the SAME PR (the push
    synchronizes it), the labels go back to status:review, then approve and merge."""
    number, tree = await ready(world)
    first = await author_round(world, number, tree, "blue\n", "Make the widget blue")
    pr = first["pull_request"]
    changes = await review(world, number, "request_changes", "The widget must be navy.")
    assert changes["author_lease"]["owner"] == AUTHOR
    assert world.labels(number) == ["status:in-progress"]
    boot = await ok(world, AUTHOR, "gitea_bootstrap_issue_worktree", issue_number=number)
    assert boot["proof"]["created"] == {"branch": False, "worktree": False}
    assert Path(boot["proof"]["registration"]["worktree_path"]) == tree.path
    second = await author_round(world, number, tree, "navy\n", "Make the widget navy")
    assert second["pull_request"] == pr and second["adopted"] is True
    assert second["head_sha"] != first["head_sha"]
    assert [p.number for p in await world.gitea.list_pulls(state="all")] == [pr]
    emu = world.live.emulator
    synchronized = [d for d in emu.deliveries if d.event_type == "pull_request_sync"]
    assert [(d.payload["action"], d.payload["pull_request"]["number"], d.payload["pull_request"]["head"]["sha"])
            for d in synchronized] == [("synchronized", pr, second["head_sha"])]
    approved = await review(world, number, "approve")
    assert approved["review"]["commit_id"] == second["head_sha"]
    assert [(r.reviewer.login, r.state) for r in pull_record(world, pr).reviews] == [
        (REVIEWER, "REQUEST_CHANGES"), (REVIEWER, "APPROVED")]
    merged = await ok(world, MERGER, "gitea_merge_pull_request", issue_number=number)
    assert pullgit.branch_sha(repo_path(world), "main") == merged["merge_commit_sha"]
    evidence = await assert_torn_down(world, number, pr, tree, merged=True)
    assert [c["subject"] for c in evidence["pull_request"]["commits"]] == [
        "Make the widget blue", "Make the widget navy"]


async def test_a_pull_request_closed_unmerged_ends_the_life_as_pr_closed(world: World) -> None:
    number, tree = await ready(world)
    opened = await author_round(world, number, tree, "blue\n", "Make the widget blue")
    pr = opened["pull_request"]
    await world.call("alice", "PATCH", f"/issues/{pr}", {"state": "closed"})
    assert pull_record(world, pr).merged is None
    evidence = await assert_torn_down(world, number, pr, tree, merged=False)
    assert evidence["worktree"]["action"] == "kept" and evidence["branch"]["action"] == "kept"


async def test_a_replayed_pull_request_webhook_tears_down_once(world: World) -> None:
    number, tree = await ready(world)
    opened = await author_round(world, number, tree, "blue\n", "Make the widget blue")
    pr = opened["pull_request"]
    await review(world, number, "approve")
    await ok(world, MERGER, "gitea_merge_pull_request", issue_number=number)
    await assert_torn_down(world, number, pr, tree, merged=True)
    emu = world.live.emulator
    [closed] = [d for d in emu.deliveries if d.event_type == "pull_request" and d.payload["action"] == "closed"]
    comments = len(emu.issue(OWNER, REPO, number).comments)
    emu.replay_delivery(closed.delivery_id)
    await world.settle()
    assert len(teardown_comments(world, number)) == 1
    assert len(emu.issue(OWNER, REPO, number).comments) == comments
    assert sum(1 for r in emu.requests if r.method == "DELETE" and "branches" in (r.route or "")) == 1
    await assert_torn_down(world, number, pr, tree, merged=True)
    # Every lease had ended before the merge (hand-over, verdict): the teardown freed no author, so no trigger.
    from state.auto_allocations import AutoAllocationStore

    triggers = [d.trigger for d in await AutoAllocationStore(world.service.db).recent(FULL_NAME.lower(), limit=50)]
    assert "merge" not in triggers and "issue_closed" not in triggers, triggers


async def test_a_merge_foreman_posted_itself_still_tears_the_issue_down(tmp_path: Path, start: Started) -> None:
    """A merger without a Gitea token of its own: the merge is posted with the bot's token, and its `pull_request`
    closed webhook (sent by the bot) still ends the issue's life at once, not at the next catch-up."""
    tokens = {login: EXTRA_TOKENS[login] for login in (AUTHOR, REVIEWER)}
    async with open_world(tmp_path, start, roster=ROSTER, gitea={"identity_tokens": tokens},
                          bootstrap={"on_allocate": "run"}, reconcile={"interval_s": 0},
                          allocator={"queues": []}) as world:
        for login in ROSTER:
            world.live.emulator.set_permission(OWNER, REPO, login, "write")
        world.hook.events = expand_hook_events(["issues", "pull_request"])
        number, tree = await ready(world)
        opened = await author_round(world, number, tree, "blue\n", "Make the widget blue")
        await review(world, number, "approve")
        await ok(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        record = pull_record(world, opened["pull_request"])
        assert record.merged_by is not None and record.merged_by.login == BOT
        await assert_torn_down(world, number, opened["pull_request"], tree, merged=True)


async def unsettled(world: World, login: str, name: str, **arguments: Any) -> dict[str, Any]:
    """One MCP tool call as ``login`` that waits for nothing the outbox does (the test holds the sender)."""
    async with Client(build_server(runtime(world), caller_for(world.service.settings, login, "mcp"))) as client:
        result = await client.call_tool(name, arguments)
    assert not result.is_error and result.structured_content is not None, result.structured_content
    return dict(result.structured_content)


async def test_the_publish_evidence_sent_after_the_pr_opened_never_puts_in_progress_back(world: World) -> None:
    """The agent opens the PR before the publish's evidence comment (its state: in-progress) was sent: once it is,
    its label sync must not act on that older state while the PR's state (review) waits in the outbox; the labels
    go in-progress → pr-open → review and stay there, and a held sync records why."""
    number, tree = await ready(world)
    await ok(world, AUTHOR, "gitea_lock_issue", issue_number=number)
    (tree.path / "widget.txt").write_text("blue\n", encoding="utf-8")
    sender = world.service.outbox_sender
    assert sender is not None
    await sender.stop()
    await unsettled(world, AUTHOR, "gitea_publish_worktree", issue_number=number, message="Make the widget blue")
    opened = await unsettled(world, AUTHOR, "gitea_open_pull_request", issue_number=number)
    sender.start()
    await world.settle()
    assert world.labels(number) == ["status:review"]
    entries = sorted(await world.service.outbox.list(limit=10_000), key=lambda e: e.id)
    [review_labels] = [e.id for e in entries if e.key == opened["outbox"][1]]
    after = [e.key for e in entries if e.id > review_labels and e.kind == "labels"]
    assert [key for key in after if key.startswith("label-sync:")] == [], after
    held = [s for s in await world.store.label_syncs(FULL_NAME, number) if s["outcome"] == "held"]
    assert [(s["target_label"], s["reason"].split(":")[0]) for s in held] == [
        ("status:in-progress", "a newer state is queued")], held
    allocated = await ok(world, CONTROLLER, "gitea_allocate_next_work", action="review", owner=REVIEWER,
                         dry_run=False)
    assert allocated["lease"]["issue_number"] == number, allocated


async def test_a_merge_that_ends_a_live_lease_runs_auto_allocation(world: World) -> None:
    """Changes were requested (the author holds a lease again) and a person merges the PR on Gitea anyway: the
    teardown ends that lease (merged) and auto-allocation runs with trigger merge, as after a release."""
    from state.auto_allocations import AutoAllocationStore

    number, tree = await ready(world)
    opened = await author_round(world, number, tree, "blue\n", "Make the widget blue")
    await trigger_ran(world, opened["auto_allocation"]["queued"])
    changes = await review(world, number, "request_changes", "The widget must be navy.")
    assert changes["author_lease"]["owner"] == AUTHOR
    merge = world.live.api(f"/repos/{FULL_NAME}/pulls/{opened['pull_request']}/merge")
    async with world.live.session.post(merge, json={"Do": "merge"},
                                       headers={"Authorization": f"token {TOKENS['alice']}"}) as resp:
        assert resp.status == 200, await resp.text()
    await world.settle()
    leases = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert (leases[-1].owner, leases[-1].status, leases[-1].end_reason) == (AUTHOR, "released", "merged")
    triggers = [d.trigger for d in await AutoAllocationStore(world.service.db).recent(FULL_NAME.lower(), limit=50)]
    assert triggers.count("merge") == 1, triggers
    assert triggers.count("pull_request_opened") == 1, triggers
    # A replayed closed webhook finds the teardown recorded: no second trigger.
    emu = world.live.emulator
    [closed] = [d for d in emu.deliveries if d.event_type == "pull_request" and d.payload["action"] == "closed"]
    emu.replay_delivery(closed.delivery_id)
    await world.settle()
    triggers = [d.trigger for d in await AutoAllocationStore(world.service.db).recent(FULL_NAME.lower(), limit=50)]
    assert triggers.count("merge") == 1, triggers


async def trigger_ran(world: World, delivery_id: str) -> None:
    """Wait until the service's worker ran a trigger a verb queued in the inbox, then settle."""
    await wait_status(world.service, delivery_id, "done")
    await world.settle()


async def test_the_hand_over_queues_auto_allocation_and_requested_changes_wait_for_the_busy_author(
    world: World,
) -> None:
    """The PR's opening answers at once with a queued trigger the service runs (the freed author gets the next
    ready issue); changes requested then while the author holds max_leases_per_author (1) leases lease nothing
    (the state says the author must finish the other work first); once the author releases that work, the
    release's auto-allocation leases the reviewed issue back to them, in the same worktree."""
    from state.auto_allocations import AutoAllocationStore

    number, tree = await ready(world)
    second = await world.open_issue("alice", "Make the widget round")
    await world.call("alice", "POST", f"/issues/{second}/labels", {"labels": ["status:ready"]})
    leases = LeaseStore(world.service.db)
    assert await leases.live_for_issue(FULL_NAME, second) is None  # the author is busy with the first
    opened = await author_round(world, number, tree, "blue\n", "Make the widget blue")
    queued = opened["auto_allocation"]["queued"]
    assert opened["auto_allocation"] == {"trigger": "pull_request_opened", "queued": queued}, opened
    await trigger_ran(world, queued)
    decisions = await AutoAllocationStore(world.service.db).recent(FULL_NAME.lower(), limit=50)
    assert [(d.trigger, d.delivery_id) for d in decisions if d.trigger == "pull_request_opened"] == [
        ("pull_request_opened", queued)]
    other = await leases.live_for_issue(FULL_NAME, second)
    assert other is not None and (other.owner, other.action) == (AUTHOR, "implement")
    await start_work(world, AUTHOR, second)  # started: the hand-back waits for it (unstarted work is preempted)
    changes = await review(world, number, "request_changes", "The widget must be navy.")
    assert changes["author_lease"] is None, changes
    assert await leases.live_for_issue(FULL_NAME, number) is None
    assert [lease.owner for lease in await leases.open_leases(FULL_NAME)] == [AUTHOR]
    assert world.labels(number) == ["status:in-progress"]
    [verdict] = [c.body for c in world.live.emulator.issue(OWNER, REPO, number).comments
                 if find_marker(c.body) == f"{changes['lease']['lease_id']}:review"]
    state = parse_comment(verdict).current
    assert state is not None and state.who_is_next == "author", verdict
    assert f"#{second}" in state.next_action and "max_leases_per_author = 1" in state.next_action, state
    assert evidence_of(verdict)["awaiting_author"] == AUTHOR
    await ok(world, AUTHOR, "gitea_release_lease", issue_number=second, reason="done")
    back = await leases.live_for_issue(FULL_NAME, number)
    assert back is not None and (back.owner, back.action) == (AUTHOR, "implement"), back
    assert any(find_marker(c.body) == f"{back.lease_id}:evidence"
               for c in world.live.emulator.issue(OWNER, REPO, number).comments)
    boot = await ok(world, AUTHOR, "gitea_bootstrap_issue_worktree", issue_number=number)
    assert Path(boot["proof"]["registration"]["worktree_path"]) == tree.path
    second_round = await author_round(world, number, tree, "navy\n", "Make the widget navy")
    assert second_round["pull_request"] == opened["pull_request"]
