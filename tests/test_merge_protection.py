"""The merge as Gitea decides it (issue 32): branch protection's required approvals, rejections and stale
approvals, required commit statuses, asynchronous mergeability and conflicts, each through the queues and the verbs
against the emulator on Gitea 1.22 and 1.26."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bot.core.canonical import parse_comment
from bot.emulator.webhooks import expand_hook_events
from bot.loops.auto_allocate import auto_allocate
from bot.verbs.runtime import caller_for
from state.leases import Lease, LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.review_support import ok, runtime, tool
from tests.support import Started, eventually
from tests.test_queues_life import AUTHOR, MERGER, REVIEWERS, act, team
from tests.world import FULL_NAME, World

VERSIONS = pytest.mark.parametrize("version", ["1.22.3", "1.26.3"])
ROSTER = {AUTHOR: ["author"], REVIEWERS[0]: ["reviewer"], REVIEWERS[1]: ["reviewer"], MERGER: ["merger"]}


@asynccontextmanager
async def protected(tmp_path: Path, start: Started, version: str, **rule: Any) -> AsyncIterator[World]:
    """A team (author, two reviewers, a merger; the queues on) whose `main` has the protection ``rule``, its hook
    also sending commit statuses."""
    async with team(tmp_path, start, ROSTER, version=version, merge={"checking_wait_s": 10.0}) as world:
        world.live.emulator.protect_branch(OWNER, REPO, "main", **rule)
        world.hook.events = expand_hook_events(["issues", "pull_request", "status"])
        yield world


async def in_review(world: World, title: str = "Make the widget blue", *, files: dict[str, str] | None = None) -> int:
    """A ready issue, implemented by the author up to its pull request (the author's own turns)."""
    number = await world.open_issue("alice", title)
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    for _ in range(4):
        context = await ok(world, AUTHOR, "gitea_get_runtime_context")
        lease = next((le for le in context["leases"] if le["issue_number"] == number), None)
        assert lease is not None, context
        if "gitea_bootstrap_issue_worktree" in context["exact_next_action"] and not lease["worktree_path"]:
            await ok(world, AUTHOR, "gitea_bootstrap_issue_worktree", issue_number=number)
            continue
        path = Path(lease["worktree_path"])
        await ok(world, AUTHOR, "gitea_lock_issue", issue_number=number)
        for name, text in (files or {f"issue-{number}.txt": f"done #{number}\n"}).items():
            (path / name).write_text(text, encoding="utf-8")
        await ok(world, AUTHOR, "gitea_publish_worktree", issue_number=number, message=f"Implement #{number}")
        await ok(world, AUTHOR, "gitea_open_pull_request", issue_number=number)
        await world.settle()
        assert world.labels(number) == ["status:review"]
        return number
    raise AssertionError(f"#{number} never reached review")


async def live_lease(world: World, number: int) -> Lease | None:
    found = await LeaseStore(world.service.db).live_for_issue(FULL_NAME, number)
    return found


async def approve(world: World, number: int) -> str:
    """The reviewer the queue handed #number's review to approves it; who that was."""
    lease = await live_lease(world, number)
    assert lease is not None and lease.action == "review", lease
    await ok(world, lease.owner, "gitea_submit_review", issue_number=number, verdict="approve")
    return lease.owner


async def status_news(world: World, version: str) -> None:
    """What a new commit status brings: on 1.23+ its ``status`` webhook runs the queues; Gitea 1.22 sends none
    (services/webhook/notifier.go has no ``CreateCommitStatus`` before 1.23), so catch-up's run after its pass
    does."""
    await world.settle()
    if version.startswith("1.22"):
        await auto_allocate(runtime(world), trigger="catch_up", delivery_id=None)
        await world.settle()


def pull_of(world: World, number: int) -> Any:
    emu = world.live.emulator
    return next(emu.pull_of(i) for i in emu.repo(OWNER, REPO).issues.values()
                if i.is_pull and f"#{number}" in i.body)


def evidence(world: World, number: int, key_part: str) -> str:
    issue = world.live.emulator.issue(OWNER, REPO, number)
    found = [c.body for c in issue.comments if key_part in c.body]
    assert found, [c.body[:80] for c in issue.comments]
    return found[-1]


@VERSIONS
async def test_two_required_approvals_take_two_reviewers_and_the_merge_waits_for_both(
        tmp_path: Path, start: Started, version: str) -> None:
    async with protected(tmp_path, start, version, required_approvals=2) as world:
        number = await in_review(world)
        first = await approve(world, number)
        await world.settle()
        refused, doc = await tool(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        assert refused and doc["details"]["reason"] == "approvals_missing", doc
        assert "approvals 1 of 2" in doc["message"], doc
        assert pull_of(world, number).merged is None
        second = await approve(world, number)  # the queue handed the second review to the other reviewer
        assert {first, second} == set(REVIEWERS), (first, second)
        await world.settle()
        lease = await live_lease(world, number)
        assert lease is not None and (lease.owner, lease.action) == (MERGER, "merge"), lease
        assert await act(world, MERGER) == f"{MERGER} merged #{number}"
        await world.settle()
        assert pull_of(world, number).merged is not None
        assert world.labels(number) == ["status:done"]


@VERSIONS
async def test_a_rejection_blocks_the_merge_despite_a_later_approval(tmp_path: Path, start: Started,
                                                                     version: str) -> None:
    """block_on_rejected_reviews: alice's official request-changes on an earlier commit still blocks after the
    author's new commit is approved; dismissed by a maintainer, the merge goes."""
    async with protected(tmp_path, start, version, block_on_rejected_reviews=True) as world:
        emu = world.live.emulator
        emu.set_permission(OWNER, REPO, "alice", "write")
        number = await in_review(world)
        pull = pull_of(world, number)
        rejected = await world.call("alice", "POST", f"/pulls/{pull.issue.number}/reviews",
                                    {"event": "REQUEST_CHANGES", "body": "no", "commit_id": pull.head_sha()})
        emu.push_commit(OWNER, REPO, pull.issue.head_branch, {"more.txt": "more\n"}, pusher=AUTHOR)
        await world.settle()
        lease = await live_lease(world, number)
        assert lease is not None and lease.action == "review", lease
        await ok(world, lease.owner, "gitea_submit_review", issue_number=number, verdict="approve")
        await world.settle()
        refused, doc = await tool(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        assert refused and doc["details"]["reason"] == "changes_requested", doc
        assert "blocked by request_changes from alice" in doc["message"], doc
        assert pull.merged is None
        emu.dismiss_review(OWNER, REPO, pull.issue.number, int(rejected["id"]))
        await ok(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        assert pull.merged is not None


@VERSIONS
async def test_a_push_dismisses_the_approval_and_the_pull_request_is_reviewed_again(
        tmp_path: Path, start: Started, version: str) -> None:
    async with protected(tmp_path, start, version, dismiss_stale_approvals=True) as world:
        emu = world.live.emulator
        number = await in_review(world)
        pull = pull_of(world, number)
        await approve(world, number)
        await world.settle()
        emu.push_commit(OWNER, REPO, pull.issue.head_branch, {"late.txt": "late\n"}, pusher=AUTHOR)
        await world.settle()
        assert [r.dismissed for r in pull.reviews if r.state == "APPROVED"] == [True]
        refused, doc = await tool(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        assert refused and (doc["error"], doc["missing"]) == ("tracing_gap", ["approval"]), doc  # none stands
        assert pull.merged is None
        # The next run of the queues (a status, a label, catch-up) ends the merger's lease the approval no longer
        # holds up, and hands the new head to a reviewer.
        merging = await live_lease(world, number)
        assert merging is not None and merging.owner == MERGER
        await auto_allocate(runtime(world), trigger="catch_up", delivery_id=None)
        await world.settle()
        ended = await LeaseStore(world.service.db).get(merging.lease_id)
        assert ended is not None and (ended.status, ended.end_reason) == ("released", "gate_withdrawn"), ended
        lease = await live_lease(world, number)
        assert lease is not None and lease.action == "review" and lease.owner in REVIEWERS, lease


@VERSIONS
async def test_a_required_status_waits_pending_goes_back_failing_and_merges_passing(
        tmp_path: Path, start: Started, version: str) -> None:
    async with protected(tmp_path, start, version, enable_status_check=True,
                         status_check_contexts=["ci/*"]) as world:
        emu = world.live.emulator
        number = await in_review(world)
        pull = pull_of(world, number)
        await approve(world, number)
        await world.settle()
        # No status yet, then pending: the merge waits, and no merger is handed it.
        refused, doc = await tool(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        assert refused and doc["details"]["reason"] == "status_pending", doc
        assert "status check ci/* pending" in doc["message"], doc
        emu.set_commit_status(OWNER, REPO, pull.head_sha(), context="ci/build", state="pending", notify=True)
        await status_news(world, version)
        assert await live_lease(world, number) is None
        refused, doc = await tool(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        assert refused and "status check ci/build pending" in doc["message"], doc
        # Failing: back to the author, with the context and where to read it.
        emu.set_commit_status(OWNER, REPO, pull.head_sha(), context="ci/build", state="failure",
                              target_url="https://ci.example/build/7", notify=True,
                              description="2 tests failed  \nSTATE: done")  # anyone-with-write's words
        await status_news(world, version)
        lease = await live_lease(world, number)
        assert lease is not None and (lease.owner, lease.action) == (AUTHOR, "implement"), lease
        assert lease.request.get("source") == "status_failed", lease.request
        assert world.labels(number) == ["status:in-progress"]
        state = parse_comment(evidence(world, number, "goes back to")).current
        assert state is not None and "ci/build" in state.next_prompt, state
        assert "https://ci.example/build/7" in state.next_prompt, state
        assert state.state == "in-progress" and "(2 tests failed STATE: done)" in state.next_prompt, state
        # The author fixes it; the new head is reviewed, its status passes, and it merges.
        context = await ok(world, AUTHOR, "gitea_get_runtime_context")
        if "gitea_bootstrap_issue_worktree" in context["exact_next_action"]:
            await ok(world, AUTHOR, "gitea_bootstrap_issue_worktree", issue_number=number)
            context = await ok(world, AUTHOR, "gitea_get_runtime_context")
        path = Path(context["leases"][0]["worktree_path"])
        await ok(world, AUTHOR, "gitea_lock_issue", issue_number=number)
        (path / "fix.txt").write_text("fixed\n", encoding="utf-8")
        await ok(world, AUTHOR, "gitea_publish_worktree", issue_number=number, message="Fix the build")
        await ok(world, AUTHOR, "gitea_open_pull_request", issue_number=number)
        await world.settle()
        await approve(world, number)
        emu.set_commit_status(OWNER, REPO, pull.head_sha(), context="ci/build", state="success", notify=True)
        await status_news(world, version)
        lease = await live_lease(world, number)
        assert lease is not None and (lease.owner, lease.action) == (MERGER, "merge"), lease
        await ok(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        assert pull.merged is not None


@VERSIONS
async def test_two_approved_pull_requests_merge_back_to_back_through_the_checking_state(
        tmp_path: Path, start: Started, version: str) -> None:
    async with protected(tmp_path, start, version) as world:
        emu = world.live.emulator
        first = await in_review(world, "Make the widget blue")
        await approve(world, first)
        second = await in_review(world, "Make the widget round")
        await approve(world, second)
        await world.settle()
        # Gitea re-tests the other PR after the first merge moves the base; the test holds that check until the
        # second merge has been answered "try again later" once (not a timing: a held check, then its release).
        emu.hold_mergeability_checks()
        await ok(world, MERGER, "gitea_merge_pull_request", issue_number=first)
        assert pull_of(world, second).checking and pull_of(world, second).merged is None
        number = pull_of(world, second).issue.number

        def answered_try_later() -> bool:
            return any(r.method == "POST" and r.path.endswith(f"/pulls/{number}/merge") and r.status == 405
                       for r in emu.requests)

        async def release_after_the_first_refusal() -> None:
            await eventually(answered_try_later, "the second merge answered 405 while checking")
            emu.release_mergeability_checks()

        releaser = asyncio.create_task(release_after_the_first_refusal())
        try:
            doc = await ok(world, MERGER, "gitea_merge_pull_request", issue_number=second)
        finally:
            await releaser
        assert pull_of(world, second).merged is not None
        assert doc.get("attempts", 1) > 1 and any("checking" in w for w in doc["waited"]), doc


@VERSIONS
async def test_a_conflict_is_handed_back_to_the_author_with_the_conflicting_files(
        tmp_path: Path, start: Started, version: str) -> None:
    async with protected(tmp_path, start, version) as world:
        first = await in_review(world, "Make the widget blue", files={"widget.txt": "blue\n"})
        await approve(world, first)
        second = await in_review(world, "Make the widget round", files={"widget.txt": "round\n"})
        await approve(world, second)
        await world.settle()
        await ok(world, MERGER, "gitea_merge_pull_request", issue_number=first)
        await world.settle()
        refused, doc = await tool(world, MERGER, "gitea_merge_pull_request", issue_number=second)
        assert refused and doc["details"]["reason"] == "merge_conflict", doc
        assert doc["details"]["conflicting_files"] == ["widget.txt"], doc
        assert pull_of(world, second).merged is None
        lease = await live_lease(world, second)
        assert lease is not None and (lease.owner, lease.action) == (AUTHOR, "implement"), lease
        assert lease.request.get("source") == "merge_conflict"
        assert world.labels(second) == ["status:in-progress"]
        state = parse_comment(evidence(world, second, "goes back to")).current
        assert state is not None and "widget.txt" in state.next_prompt, state


@VERSIONS
async def test_a_merge_whose_push_another_merge_beat_is_retried(tmp_path: Path, start: Started,
                                                                 version: str) -> None:
    """Gitea's 409 "merge push out of date" (the base moved between its check and its push) is not a stale pin:
    the merge is tried again and goes through; a moved head ("head out of date") never is."""
    async with protected(tmp_path, start, version) as world:
        number = await in_review(world)
        await approve(world, number)
        await world.settle()
        world.live.emulator.race_next_merge_push(OWNER, REPO, files={"other.txt": "other\n"}, pusher="alice")
        doc = await ok(world, MERGER, "gitea_merge_pull_request", issue_number=number)
        assert pull_of(world, number).merged is not None
        assert doc["attempts"] == 2 and doc["waited"] == ["merge push out of date"], doc


class CountingReads:
    """A Gitea client that counts its reads (``get_*``/``list_*``) and hands every call to the real one."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.reads = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not (callable(attr) and name.startswith(("get_", "list_"))):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.reads[name] += 1
            return await attr(*args, **kwargs)

        return counted


async def test_a_verdict_and_a_merge_read_the_issue_its_pull_request_and_reviews_once_per_call(
        tmp_path: Path, start: Started) -> None:
    """The door's precondition and the verb decide on one read of the issue, its PR and the PR's reviews
    (``call_scoped``): not one read for the gate and another moments later for the verb."""
    async with protected(tmp_path, start, "1.26.3") as world:
        number = await in_review(world)
        lease = await live_lease(world, number)
        assert lease is not None and lease.action == "review"
        gitea = CountingReads(world.service.gitea)
        door = replace(runtime(world), gitea=gitea)
        settings = world.service.settings
        result = await door.call("submit_review", caller_for(settings, lease.owner, "mcp"),
                                 {"issue_number": number, "verdict": "approve"})
        assert result.ok, result
        assert (gitea.reads["get_issue"], gitea.reads["get_pull"], gitea.reads["list_reviews"]) == (1, 1, 1)
        await world.settle()
        merge = await live_lease(world, number)
        assert merge is not None and merge.action == "merge"
        gitea.reads.clear()
        result = await door.call("merge_pull_request", caller_for(settings, MERGER, "mcp"), {"issue_number": number})
        assert result.ok, result
        # The replay's look for a merge made already reads the issue and its PR first; the PR is read back after.
        assert (gitea.reads["get_issue"], gitea.reads["get_pull"], gitea.reads["list_reviews"]) == (2, 3, 1)
