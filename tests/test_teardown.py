"""After the merge, end to end: a merged (or closed) pull request, or a closed issue, ends the issue's life once."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from bot import gitops, invariants
from bot.core.canonical import parse_comment
from bot.core.evidence import find_marker
from bot.core.teardown import BranchFacts, WorktreeFacts, closing_issue, decide_branch, decide_worktree
from bot.emulator import pullgit
from bot.emulator.webhooks import expand_hook_events
from bot.gitea import PullRequest
from bot.loops.teardown import _judge
from state.db import utcnow
from state.journal import JournalStore, Transition
from state.leases import LeaseStore
from state.publications import PublicationStore
from state.teardowns import TeardownStore
from tests.gitea_fixtures import OWNER, REPO
from tests.support import HANG_S, SECRET, Started, wait_status
from tests.world import FULL_NAME, Sections, World, open_world

ROSTER = {"controller-bot": ["controller"], "author-1": ["author"]}
LOOP: Sections = {"allocator": {"auto_allocate_owner": "author-1"}, "bootstrap": {"on_allocate": "run"}}


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER, **LOOP) as opened:
        opened.hook.events = expand_hook_events(["issues", "pull_request"])
        yield opened


# --- the pure part ----------------------------------------------------------------------------------------------------


def test_the_issue_a_pull_request_closes_is_its_keyword_else_its_branch() -> None:
    assert closing_issue(body="Fixes #12 and more", title="x", head_ref="feature") == 12
    assert closing_issue(body="see #3", title="x", head_ref="issue-7-make-it-blue") == 7
    assert closing_issue(body="closes: #4", title="x", head_ref="issue-7-x") == 4
    assert closing_issue(body="mentions #3 only", title="nothing", head_ref="feature") is None


def test_a_worktree_is_removed_only_when_clean_and_merged() -> None:
    clean = WorktreeFacts(path="/w", exists=True, created_by_foreman=True, status=(), head="a" * 40,
                          merged_head="b" * 40, head_in_default=True)
    assert decide_worktree(clean, remove_enabled=True).action == "remove"
    assert decide_worktree(clean, remove_enabled=False).action == "keep"
    dirty = WorktreeFacts(path="/w", exists=True, created_by_foreman=True, status=("?? notes.txt",), head="a" * 40,
                          merged_head="b" * 40, head_in_default=True)
    kept = decide_worktree(dirty, remove_enabled=True)
    assert kept.action == "keep" and "notes.txt" in kept.reason
    unmerged = WorktreeFacts(path="/w", exists=True, created_by_foreman=True, status=(), head="c" * 40,
                             merged_head=None, head_in_default=False)
    assert decide_worktree(unmerged, remove_enabled=True).action == "keep"
    at_head = WorktreeFacts(path="/w", exists=True, created_by_foreman=True, status=(), head="c" * 40,
                            merged_head="c" * 40, head_in_default=False)
    assert decide_worktree(at_head, remove_enabled=True).action == "remove"
    gone = WorktreeFacts(path="/w", exists=False, created_by_foreman=True, status=(), head=None,
                         merged_head=None, head_in_default=False)
    assert decide_worktree(gone, remove_enabled=True).action == "absent"


def test_a_branch_is_deleted_only_when_merged_unmoved_and_not_the_default() -> None:
    merged = BranchFacts(branch="issue-1-x", default_branch="main", remote_sha="a" * 40, merged_head="a" * 40)
    assert decide_branch(merged, reason="merged", delete_enabled=True).action == "delete"
    assert decide_branch(merged, reason="merged", delete_enabled=False).action == "keep"
    assert decide_branch(merged, reason="pr_closed", delete_enabled=True).action == "keep"
    moved = BranchFacts(branch="issue-1-x", default_branch="main", remote_sha="b" * 40, merged_head="a" * 40)
    assert "moved" in decide_branch(moved, reason="merged", delete_enabled=True).reason
    default = BranchFacts(branch="main", default_branch="main", remote_sha="a" * 40, merged_head="a" * 40)
    assert decide_branch(default, reason="merged", delete_enabled=True).action == "keep"
    absent = BranchFacts(branch="issue-1-x", default_branch="main", remote_sha=None, merged_head="a" * 40)
    assert decide_branch(absent, reason="merged", delete_enabled=True).action == "absent"


# --- end to end -------------------------------------------------------------------------------------------------------


async def bootstrapped(world: World, title: str = "Make the widget blue") -> tuple[int, Transition]:
    """An issue leased to author-1 and bootstrapped (branch + worktree) through the existing verbs."""
    number = await world.open_issue("alice", title)
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    [transition] = await JournalStore(world.service.db).history(FULL_NAME.lower(), number)
    assert transition.phase == "completed"
    assert Path(transition.worktree_path).is_dir()
    return number, transition


async def open_pull(world: World, number: int, transition: Transition, *, body: str | None = None) -> int:
    """A commit pushed to the issue branch on Gitea, then a pull request that closes the issue."""
    world.live.emulator.push_commit(OWNER, REPO, transition.branch, {"feature.txt": "blue\n"}, pusher="alice",
                                    message="Make it blue")
    pr = await world.call("alice", "POST", "/pulls", {
        "head": transition.branch, "base": "main", "title": "Make the widget blue",
        "body": f"Closes #{number}" if body is None else body,
    })
    return int(pr["number"])


async def merge(world: World, pr: int, *, settle: bool = True) -> None:
    await world.call("alice", "POST", f"/pulls/{pr}/reviews", {"event": "COMMENT", "body": "looks fine"},
                     settle=settle)
    world.clock.now += 1
    await world.live.client("alice").merge_pull(pr, style="merge")
    if settle:
        await world.settle()


def bot_comments(world: World, number: int) -> list[str]:
    issue = world.live.emulator.issue(OWNER, REPO, number)
    return [c.body for c in issue.comments if c.kind == "comment" and c.poster.login == "foreman-bot"]


def teardown_comments(world: World, number: int) -> list[str]:
    return [b for b in bot_comments(world, number) if (find_marker(b) or "").startswith("teardown:")]


def evidence_of(body: str) -> dict[str, Any]:
    start = body.index("```json") + len("```json")
    return dict(json.loads(body[start:body.index("```", start)]))


async def test_a_merged_pull_request_ends_the_issues_life(world: World) -> None:
    """Merged PR → every lease ended (merged), the clean worktree removed and its registration ended, the branch
    deleted on Gitea, status:done, and one final evidence comment summing up the life, read back."""
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    await merge(world, pr)
    emu = world.live.emulator
    db = world.service.db
    history = await LeaseStore(db).history(FULL_NAME, number)
    assert [(lease.status, lease.end_reason) for lease in history] == [("released", "merged")]
    assert not Path(transition.worktree_path).exists()
    [registration] = await JournalStore(db).registrations(FULL_NAME.lower(), number)
    assert registration.ended_at is not None and registration.end_reason == f"teardown merged: removed (pr #{pr})"
    assert emu.repo(OWNER, REPO).issues[number].closed is not None
    from bot.emulator import pullgit
    assert pullgit.branch_sha(emu.repo(OWNER, REPO).path, transition.branch) is None
    assert emu.label_names(OWNER, REPO, number) == ["status:done"]
    [final] = teardown_comments(world, number)
    state = parse_comment(final).current
    assert state is not None and state.state == "done" and pr in state.related_prs
    evidence = evidence_of(final)
    assert evidence["reason"] == "merged"
    assert [(lease["owner"], lease["end_reason"]) for lease in evidence["leases"]] == [("author-1", "merged")]
    assert [c["subject"] for c in evidence["pull_request"]["commits"]] == ["Make it blue"]
    assert [r["state"] for r in evidence["pull_request"]["reviews"]] == ["COMMENT"]
    assert evidence["pull_request"]["merge_commit"] == emu.pull_of(emu.repo(OWNER, REPO).issues[pr]).merge_commit_sha
    assert evidence["worktree"]["action"] == "removed" and evidence["branch"]["action"] == "deleted"
    snapshot = await world.snapshot(number)
    assert snapshot.state is not None and snapshot.state.state == "done"
    for entry in await world.service.outbox.list(limit=1000):
        assert entry.status == "done", entry.summary()
    [record] = await TeardownStore(db).for_issue(FULL_NAME.lower(), number)
    assert record.reason == "merged" and record.pr_number == pr


async def test_a_dirty_worktree_is_kept_byte_for_byte_and_reported(world: World) -> None:
    number, transition = await bootstrapped(world)
    worktree = Path(transition.worktree_path)
    draft = b"half a thought\x00\xff\n"
    (worktree / "notes.txt").write_bytes(draft)
    (worktree / "README.md").write_bytes(b"# widgets, edited\n")
    pr = await open_pull(world, number, transition)
    await merge(world, pr)
    assert (worktree / "notes.txt").read_bytes() == draft
    assert (worktree / "README.md").read_bytes() == b"# widgets, edited\n"
    [final] = teardown_comments(world, number)
    evidence = evidence_of(final)
    assert evidence["worktree"]["action"] == "kept"
    assert "notes.txt" in evidence["worktree"]["reason"] and "README.md" in evidence["worktree"]["reason"]
    assert "kept" in final.split("\n", 1)[0]
    history = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert [lease.end_reason for lease in history] == ["merged"]


async def test_a_replayed_or_duplicated_pull_request_webhook_tears_down_once(world: World) -> None:
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    await merge(world, pr)
    emu = world.live.emulator
    [closed] = [d for d in emu.deliveries if d.event_type == "pull_request" and d.payload["action"] == "closed"]
    deletes = sum(1 for r in emu.requests if r.method == "DELETE" and "branches" in (r.route or ""))
    assert deletes == 1
    # The very same delivery again, Gitea's Replay (a new id, the same body), and a forced replay that runs
    # every handler again.
    async with world.client.post("/webhook", data=closed.body, headers=closed.headers) as resp:
        assert (resp.status, (await resp.json())["status"]) == (200, "duplicate")
    emu.replay_delivery(closed.delivery_id)
    await world.settle()
    await world.service.store.replay(closed.delivery_id, requested_by="test", force=True)
    world.service.worker.wakeup.set()
    await wait_status(world.service, closed.delivery_id, "done")
    await world.settle()
    assert len(teardown_comments(world, number)) == 1
    assert sum(1 for r in emu.requests if r.method == "DELETE" and "branches" in (r.route or "")) == 1
    assert len(await TeardownStore(world.service.db).for_issue(FULL_NAME.lower(), number)) == 1


async def test_a_pull_request_closed_unmerged_ends_with_its_own_reason(world: World) -> None:
    """Leases end with pr_closed; the worktree holds no unmerged commit here but the branch keeps the PR's work,
    so the branch is kept; status:done with the reason."""
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    await world.call("alice", "PATCH", f"/issues/{pr}", {"state": "closed"})
    history = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert [lease.end_reason for lease in history] == ["pr_closed"]
    from bot.emulator import pullgit
    assert pullgit.branch_sha(world.live.emulator.repo(OWNER, REPO).path, transition.branch) is not None
    [final] = teardown_comments(world, number)
    evidence = evidence_of(final)
    assert evidence["reason"] == "pr_closed" and evidence["branch"]["action"] == "kept"
    assert world.labels(number) == ["status:done"]


async def test_an_issue_closed_by_a_person_ends_with_its_own_reason(world: World) -> None:
    number, transition = await bootstrapped(world)
    worktree = Path(transition.worktree_path)
    await world.call("alice", "PATCH", f"/issues/{number}", {"state": "closed"})
    history = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert [lease.end_reason for lease in history] == ["issue_closed"]
    # Nothing was committed in it: the clean worktree at the base is removed; the branch was never published.
    assert not worktree.exists()
    [final] = teardown_comments(world, number)
    evidence = evidence_of(final)
    assert evidence["reason"] == "issue_closed" and evidence["branch"]["action"] == "absent"
    assert world.labels(number) == ["status:done"]
    assert evidence["pull_request"] is None


async def test_an_issue_closed_by_its_recorded_merged_pull_request_reads_that_one_not_every_closed_one(
        world: World) -> None:
    """Issue 35: the issue's `closed` webhook of a merge finds the merging PR by foreman's record of it (one read),
    not by listing every closed pull request the repository ever had (a read that grew with every life)."""
    world.hook.events = expand_hook_events(["issues"])  # only the issue's close reaches foreman: its own path
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    db, emu = world.service.db, world.live.emulator
    async with db.transaction() as conn:  # as gitea_open_pull_request records the PR it opened
        await PublicationStore(db).record_pull(conn, repo=FULL_NAME.lower(), issue_number=number, pr_number=pr,
                                               head=transition.branch, base="main", opened_by="author-1",
                                               adopted=False, now=utcnow())
    seen = len(emu.requests)
    await merge(world, pr)
    [record] = await TeardownStore(db).for_issue(FULL_NAME.lower(), number)
    assert record.reason == "merged" and record.pr_number == pr
    listings = [r.path for r in emu.requests[seen:] if r.login == "foreman-bot" and r.path.endswith("/pulls")]
    assert listings == []


async def test_an_issue_the_bot_never_governed_is_left_alone(world: World) -> None:
    number = await world.open_issue("alice", "Nothing to do with us")
    await world.call("alice", "PATCH", f"/issues/{number}", {"state": "closed"})
    assert teardown_comments(world, number) == []
    assert world.labels(number) == []


async def test_catch_up_after_downtime_finds_a_merge_and_tears_down_once(world: World) -> None:
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    reconciler = world.service.reconciler
    assert reconciler is not None
    world.hook.active = False  # the service hears nothing of the merge
    await merge(world, pr, settle=False)
    assert await LeaseStore(world.service.db).live_for_issue(FULL_NAME, number) is not None
    world.hook.active = True
    for _ in range(2):
        await reconciler.run_pass(trigger="interval")
        await drain(world)
    assert [lease.end_reason for lease in await LeaseStore(world.service.db).history(FULL_NAME, number)] == ["merged"]
    assert not Path(transition.worktree_path).exists()
    assert len(teardown_comments(world, number)) == 1
    assert world.labels(number) == ["status:done"]


async def test_catch_up_finds_a_pull_request_closed_unmerged_during_downtime(world: World) -> None:
    """The issue stays open with its labels (no issue event to catch up): only the PR's close tells."""
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    reconciler = world.service.reconciler
    assert reconciler is not None
    world.hook.active = False
    await world.call("alice", "PATCH", f"/issues/{pr}", {"state": "closed"}, settle=False)
    world.hook.active = True
    for _ in range(2):
        await reconciler.run_pass(trigger="interval")
        await drain(world)
    assert [lease.end_reason for lease in await LeaseStore(world.service.db).history(FULL_NAME, number)] == [
        "pr_closed"]
    [final] = teardown_comments(world, number)
    assert evidence_of(final)["trigger"] == "catch_up"


def test_catch_up_plans_a_closed_pull_request_once() -> None:
    from bot.core import reconcile as core
    repository = {"full_name": FULL_NAME}
    pull = {"number": 5, "state": "closed", "updated_at": "2026-01-01T00:00:00Z", "closed_at": "2026-01-01T00:00:00Z",
            "pull_request": {"merged": True}, "labels": [], "title": "t", "body": "Closes #4"}
    planned = core.plan(repository=repository, issues=[pull], comments=[], known=core.Known(), bot_login="bot",
                        pass_id=1)
    [item] = planned.issues
    assert (item.event, item.action, item.payload["pull_request"]["merged"]) == ("pull_request", "closed", True)
    again = core.plan(repository=repository, issues=[pull], comments=[], known=core.Known(torn_down=frozenset({5})),
                      bot_login="bot", pass_id=2)
    assert again.issues == () and again.skipped == {"pull_request": 1}
    still_open = core.plan(repository=repository, issues=[{**pull, "state": "open"}], comments=[],
                           known=core.Known(), bot_login="bot", pass_id=3)
    assert still_open.issues == ()


async def drain(world: World, timeout: float = HANG_S) -> None:
    """Wait until the inbox holds nothing queued or processing (synthetic deliveries included), then settle."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        rows = await world.service.store.list(limit=1000)
        if all(row.status not in ("queued", "processing") for row in rows):
            break
        assert loop.time() < deadline, [r.status for r in rows]
        await asyncio.sleep(0.02)
    await world.settle()


async def lifecycle_violations(world: World) -> list[invariants.Violation]:
    facts = await invariants.gather(database=world.service.settings.database.path, client=world.gitea,
                                    bot_login="foreman-bot",
                                    checkout=Path(world.service.settings.repository.checkout_root) / OWNER / REPO)
    return [v for v in invariants.check(facts) if v.invariant.startswith("lifecycle.")]


async def test_invariants_flag_a_merged_issue_with_a_live_lease_and_a_leftover_worktree(world: World) -> None:
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    world.hook.active = False
    await merge(world, pr, settle=False)
    found = await lifecycle_violations(world)
    names = sorted(v.invariant for v in found)
    assert names == ["lifecycle.merged_no_live_lease", "lifecycle.merged_no_worktree"], found
    world.hook.active = True
    reconciler = world.service.reconciler
    assert reconciler is not None
    await reconciler.run_pass(trigger="interval")
    await drain(world)
    assert await lifecycle_violations(world) == []
    facts = await invariants.gather(database=world.service.settings.database.path, client=world.gitea,
                                    bot_login="foreman-bot",
                                    checkout=Path(world.service.settings.repository.checkout_root) / OWNER / REPO)
    assert invariants.check(facts) == []


async def test_a_kept_dirty_worktree_of_a_merged_issue_passes_the_invariants(world: World) -> None:
    number, transition = await bootstrapped(world)
    (Path(transition.worktree_path) / "notes.txt").write_text("draft\n")
    pr = await open_pull(world, number, transition)
    await merge(world, pr)
    assert Path(transition.worktree_path).is_dir()
    assert await lifecycle_violations(world) == []
    facts = await invariants.gather(database=world.service.settings.database.path, client=world.gitea,
                                    bot_login="foreman-bot",
                                    checkout=Path(world.service.settings.repository.checkout_root) / OWNER / REPO)
    assert invariants.check(facts) == []


async def test_the_branch_is_kept_when_configured_so(tmp_path: Path, start: Started) -> None:
    sections: Sections = {**LOOP, "lifecycle": {"delete_branch_after_merge": False}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as world:
        world.hook.events = expand_hook_events(["issues", "pull_request"])
        number, transition = await bootstrapped(world)
        pr = await open_pull(world, number, transition)
        await merge(world, pr)
        from bot.emulator import pullgit
        assert pullgit.branch_sha(world.live.emulator.repo(OWNER, REPO).path, transition.branch) is not None
        [final] = teardown_comments(world, number)
        branch = evidence_of(final)["branch"]
        assert branch["action"] == "kept" and "delete_branch_after_merge" in branch["reason"]
        assert not Path(transition.worktree_path).exists()


async def test_a_branch_that_moved_since_the_merged_head_is_kept_and_reported(world: World) -> None:
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    world.hook.active = False
    await merge(world, pr, settle=False)
    emu = world.live.emulator
    moved = emu.push_commit(OWNER, REPO, transition.branch, {"later.txt": "after the merge\n"}, pusher="alice")
    world.hook.active = True
    reconciler = world.service.reconciler
    assert reconciler is not None
    await reconciler.run_pass(trigger="interval")
    await drain(world)
    from bot.emulator import pullgit
    assert pullgit.branch_sha(emu.repo(OWNER, REPO).path, transition.branch) == moved
    [final] = teardown_comments(world, number)
    branch = evidence_of(final)["branch"]
    assert branch["action"] == "kept" and "moved" in branch["reason"]
    assert parse_comment(final).current.who_is_next == "human"  # type: ignore[union-attr]


# --- guards (issue 29 item 8): each test fails when its guard is removed ---------------------------------------------


async def test_a_stale_closed_delivery_of_a_pull_request_reopened_since_ends_nothing(world: World) -> None:
    """Issue 29 item 8: the PR's ``closed`` webhook arrives late, after the PR was reopened. The teardown goes by the
    state it reads from Gitea now (open), not the delivery's: the lease, the worktree and the labels stay; before,
    the stale delivery tore the issue down as ``pr_closed``."""
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    emu = world.live.emulator
    # A second hook that reaches nobody keeps the closed delivery (signed with the same secret) to hand in late.
    late = emu.add_hook(OWNER, REPO, url="http://127.0.0.1:9/webhook", secret=SECRET, events=["pull_request"])
    late.events = expand_hook_events(["pull_request"])
    world.hook.active = False  # foreman hears neither the close nor the reopening
    await world.call("alice", "PATCH", f"/issues/{pr}", {"state": "closed"}, settle=False)
    await world.call("alice", "PATCH", f"/issues/{pr}", {"state": "open"}, settle=False)
    world.hook.active = True
    await emu.drain_webhooks()
    [closed] = [d for d in emu.deliveries
                if d.hook_id == late.id and d.event_type == "pull_request" and d.action == "closed"]
    assert (await world.gitea.get_pull(pr)).state == "open"
    async with world.client.post("/webhook", data=closed.body, headers=closed.headers) as resp:
        assert (resp.status, (await resp.json())["status"]) == (202, "queued")
    await world.wait_settled(closed.delivery_id, asyncio.get_running_loop().time() + 10)
    await world.settle()
    history = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert [(lease.owner, lease.status) for lease in history] == [("author-1", "live")]
    assert await TeardownStore(world.service.db).for_issue(FULL_NAME.lower(), number) == []
    assert teardown_comments(world, number) == [] and world.labels(number) == ["status:in-progress"]
    assert Path(transition.worktree_path).is_dir()


async def test_a_teardown_ends_only_its_own_issues_leases(tmp_path: Path, start: Started) -> None:
    """Issue 29 item 8: the merge of one issue's PR ends that issue's leases, never another issue's. author-1 holds
    two (``max_leases_per_author`` = 2); the other issue's lease, worktree and registration stay as they were."""
    sections: Sections = {"allocator": {"max_leases_per_author": 2}, "bootstrap": {"on_allocate": "run"}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as world:
        world.hook.events = expand_hook_events(["issues", "pull_request"])
        number, transition = await bootstrapped(world)
        other, other_transition = await bootstrapped(world, "Make the widget round")
        leases = LeaseStore(world.service.db)
        [before] = await leases.history(FULL_NAME, other)
        assert (before.owner, before.status) == ("author-1", "live")
        pr = await open_pull(world, number, transition)
        await merge(world, pr)
        assert [(lease.status, lease.end_reason) for lease in await leases.history(FULL_NAME, number)] == [
            ("released", "merged")]
        assert await leases.history(FULL_NAME, other) == [before]
        registration = await JournalStore(world.service.db).live_registration(FULL_NAME.lower(), other)
        assert registration is not None and registration.lease_id == before.lease_id
        assert Path(other_transition.worktree_path).is_dir() and world.labels(other) == ["status:in-progress"]
        [final] = teardown_comments(world, number)
        assert [lease["lease_id"] for lease in evidence_of(final)["leases"]] == [
            lease.lease_id for lease in await leases.history(FULL_NAME, number)]


async def test_a_merged_pull_requests_teardown_fetches_the_base_and_its_head_in_one_exchange(world: World) -> None:
    """The default branch and the PR's closed head come in one fetch (one ref advertisement read), not two."""
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    emu = world.live.emulator
    before = len(emu.requests)
    await merge(world, pr)
    adverts = [r for r in emu.requests[before:] if r.method == "GET" and r.path.endswith("/info/refs")]
    assert len(adverts) == 1, [r.path for r in emu.requests[before:]]
    checkout = gitops.ControlCheckout(Path(transition.worktree_path).parents[1], env={}, timeout_s=30)
    origin = emu.repo(OWNER, REPO).path
    assert checkout.read_ref(f"refs/foreman/pull/{pr}") == pullgit.rev(origin, f"refs/pull/{pr}/head")
    assert checkout.read_ref("refs/remotes/origin/main") == pullgit.branch_sha(origin, "main")


def test_when_the_one_fetch_fails_the_base_is_still_fetched_on_its_own(tmp_path: Path) -> None:
    """A PR head Gitea does not advertise fails the one fetch, which moves nothing; the teardown then fetches the
    default branch by itself, as before the two were one."""
    remote, clone = tmp_path / "remote.git", tmp_path / "clone"

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q", "--bare", "-b", "main", str(remote))
    git("clone", "-q", str(remote), str(clone))
    git("-C", str(clone), "commit", "-q", "--allow-empty", "-m", "one")
    git("-C", str(clone), "push", "-q", "origin", "main")
    git("-C", str(clone), "commit", "-q", "--allow-empty", "-m", "two")
    git("-C", str(clone), "push", "-q", str(remote), "HEAD:refs/heads/main")  # origin/main not updated
    head = git("-C", str(remote), "rev-parse", "main")
    checkout = gitops.ControlCheckout(clone, env={}, timeout_s=30)
    assert checkout.read_ref("refs/remotes/origin/main") != head
    assert gitops.fetch_base_and_pull_head(checkout, "main", 9, auth={}) is None
    assert checkout.read_ref("refs/remotes/origin/main") != head  # the failed fetch moved nothing
    pull = cast(PullRequest, SimpleNamespace(number=9, merged=True, head_sha=head, base_sha=head))
    _, _, merged_head = _judge(checkout, [], {}, "main", pull, {}, True)
    assert checkout.read_ref("refs/remotes/origin/main") == head and merged_head == head


async def test_the_issue_closed_by_a_merge_finds_its_pull_request_by_number_not_in_a_listing(world: World) -> None:
    """The merge's ``issues`` closed webhook reads the PR foreman recorded for the issue: no listing of every closed
    pull request the repository ever had (it grows with every life)."""
    number, transition = await bootstrapped(world)
    pr = await open_pull(world, number, transition)
    db = world.service.db
    async with db.transaction() as conn:  # as gitea_open_pull_request records the PR it opened
        await PublicationStore(db).record_pull(conn, repo=FULL_NAME.lower(), issue_number=number, pr_number=pr,
                                               head=transition.branch, base="main", opened_by="author-1",
                                               adopted=False, now=utcnow())
    emu = world.live.emulator
    before = len(emu.requests)
    await merge(world, pr)
    listings = [r for r in emu.requests[before:] if r.method == "GET" and r.route is not None
                and r.route.removeprefix("/api/v1") == "/repos/{owner}/{repo}/pulls"]
    assert listings == [] and len(teardown_comments(world, number)) == 1
async def test_an_issues_teardown_lock_is_dropped_once_no_teardown_holds_or_waits_for_it() -> None:
    """Issue 35: one lock per issue while a teardown holds or waits for it, then none (one more entry per life in
    foreman serve's memory, before); two teardowns of one issue still run one after the other."""
    from typing import cast

    from bot.loops.teardown import _LOCKS, _lock
    from state.db import Database

    class Key:  # any object a weak reference can name stands for the database
        pass

    db, inside, order = cast(Database, Key()), [0], []

    async def teardown(name: str) -> None:
        async with _lock(db, "o/r", 7):
            inside[0] += 1
            order.append((name, inside[0]))
            await asyncio.sleep(0.01)
            inside[0] -= 1

    await asyncio.gather(teardown("first"), teardown("second"))
    assert order == [("first", 1), ("second", 1)]
    assert _LOCKS[db] == {}
