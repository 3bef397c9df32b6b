"""Opening the issue's pull request through the door, against the emulator: one PR per issue, labels, evidence."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.core.evidence import find_marker, parse_evidence
from state.leases import LeaseStore
from state.publications import PublicationStore
from tests.conftest import sqlite_path
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started
from tests.test_publish import ROSTER, call_tool, leased_and_locked, states, worktree_of
from tests.world import FULL_NAME, World, open_world


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER, allocator={"queues": []}) as opened:  # the PR verb alone
        yield opened


async def published(world: World) -> tuple[int, str, str]:
    number = await leased_and_locked(world, title="Open a pull request")
    worktree, branch = await worktree_of(world, number)
    (worktree / "change.txt").write_text("changed\n", encoding="utf-8")
    refused, doc = await call_tool(world, "author-1", "gitea_publish_worktree", issue_number=number,
                                   message="Change it")
    assert not refused, doc
    return number, branch, str(doc["commit"])


async def test_publish_then_open_the_pull_request_with_labels_and_evidence_read_back(world: World) -> None:
    number, branch, sha = await published(world)
    refused, doc = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert not refused, doc
    emu = world.live.emulator
    pr = await world.gitea.get_pull(doc["pull_request"])
    assert (pr.head_ref, pr.head_sha, pr.base_ref, pr.state) == (branch, sha, "main", "open")
    assert f"Closes #{number}" in pr.body and pr.title == "Open a pull request"
    assert world.labels(number) == ["status:review"]
    last = states(world, number)[-1]
    assert (last.state, last.who_is_next) == ("review", "reviewer") and last.related_prs == (pr.number,)
    for entry in await world.service.outbox.list(limit=1000):
        assert entry.status == "done", entry.summary()
    recorded = await PublicationStore(world.service.db).pull_for_issue(FULL_NAME.lower(), number)
    assert recorded is not None and (recorded.pr_number, recorded.head) == (pr.number, branch)
    assert [p.number for p in await world.gitea.list_pulls(state="open")] == [pr.number]
    assert emu.issue(OWNER, REPO, number).state == "open"


async def test_a_replay_adopts_the_pull_request_never_a_second_one(world: World) -> None:
    number, _, _ = await published(world)
    _, first = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    refused, second = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    recorded = {key: value for key, value in first.items() if key != "auto_allocation"}
    assert not refused and second == {**recorded, "replayed": True}, second
    assert len(await world.gitea.list_pulls(state="open")) == 1
    evidence = [c for c in world.live.emulator.issue(OWNER, REPO, number).comments
                if (find_marker(c.body) or "").startswith("pr:")]
    assert len(evidence) == 1


async def test_a_pull_request_someone_opened_from_the_branch_is_adopted(world: World) -> None:
    """Not recorded by foreman, found by list_pulls (as after a crash between Gitea's answer and the record)."""
    number, branch, _ = await published(world)
    theirs = await world.gitea.create_pull(branch, title="by hand", base="main", body="work in progress")
    refused, doc = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert not refused and doc["pull_request"] == theirs.number and doc["adopted"], doc
    assert len(await world.gitea.list_pulls(state="open")) == 1


async def test_without_a_published_branch_the_pull_request_is_a_tracing_gap_naming_commits(world: World) -> None:
    number = await leased_and_locked(world)
    refused, doc = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert refused and doc["error"] == "tracing_gap" and doc["missing"] == ["commits"], doc
    assert "gitea_publish_worktree" in doc["exact_next_action"]
    assert await world.gitea.list_pulls(state="open") == []


async def test_gitea_answering_already_exists_is_adopted(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PR appeared between foreman's look and its create (Gitea's 409): adopted, never a second one."""
    from bot.verbs import pulls

    number, branch, _ = await published(world)
    theirs = await world.gitea.create_pull(branch, title="raced", base="main", body="")
    real = pulls.open_pull
    looks: list[str] = []

    async def blind_once(gitea: pulls.PullsGitea, head: str) -> object:
        looks.append(head)
        return None if len(looks) == 1 else await real(gitea, head)

    monkeypatch.setattr(pulls, "open_pull", blind_once)
    refused, doc = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert not refused and doc["pull_request"] == theirs.number and doc["adopted"], doc
    assert len(looks) == 2 and len(await world.gitea.list_pulls(state="open")) == 1


async def test_opening_the_pull_request_ends_the_authoring_lease_and_a_replay_answers_the_record(
    world: World,
) -> None:
    """The hand-over: the PR's record and the lease's end (pull_request_opened) in one transaction; the same key
    from the same caller answers the recorded result (the ended lease no longer passes the ownership gate), another
    key is refused with the next action; a release afterwards (a run's reserved teardown) changes nothing."""
    number, _, _ = await published(world)
    refused, opened = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number,
                                      idempotency_key="open-1")
    assert not refused, opened
    [lease] = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert (lease.status, lease.end_reason) == ("released", "pull_request_opened")
    assert opened["handed_over"]["lease_id"] == lease.lease_id and "gitea_release_lease" not in opened["next"]
    [released] = [e for e in await LeaseStore(world.service.db).events(lease.lease_id) if e["kind"] == "released"]
    assert released["detail"]["idempotency_key"] == "open-1"
    assert released["detail"]["pull_request"] == opened["pull_request"]
    refused, again = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number,
                                     idempotency_key="open-1")
    assert not refused and again["replayed"] and again["pull_request"] == opened["pull_request"], again
    assert again["outbox"] == opened["outbox"]
    refused, other = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number,
                                     idempotency_key="open-2")
    assert refused and other["error"] == "not_authorized", other
    assert "gitea_get_runtime_context" in other["exact_next_action"]
    refused, teardown = await call_tool(world, "author-1", "gitea_release_lease", issue_number=number, reason="done")
    assert not refused and teardown["already_ended"] == "pull_request_opened", teardown
    assert teardown["lease"]["lease_id"] == lease.lease_id and teardown["outbox"] == []
    assert len(await world.gitea.list_pulls(state="all")) == 1
    evidence = [c for c in world.live.emulator.issue(OWNER, REPO, number).comments
                if (find_marker(c.body) or "").startswith("pr:")]
    assert len(evidence) == 1
    assert [e.key for e in await world.service.outbox.list(limit=1000) if e.key.endswith(":release")] == []


async def test_a_lease_that_ended_while_the_pr_was_opened_still_records_the_pr(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lease passed the gate, then ended (an expiry sweep) before the record: the PR, its labels and evidence
    are recorded all the same (the PR is open on Gitea), and the answer says no lease was handed over."""
    from bot.verbs import pulls

    number, _, _ = await published(world)
    real = pulls.open_pull
    db = world.service.db

    async def expire_first(gitea: pulls.PullsGitea, head: str) -> object:
        lease = await LeaseStore(db).live_for_issue(FULL_NAME, number)
        assert lease is not None
        async with db.transaction() as conn:
            await LeaseStore(db).release(conn, lease.lease_id, actor="test", reason="expired", now=lease.expires_at)
        return await real(gitea, head)

    monkeypatch.setattr(pulls, "open_pull", expire_first)
    refused, doc = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert not refused and doc["handed_over"]["lease_id"] is None, doc
    recorded = await PublicationStore(db).pull_for_issue(FULL_NAME.lower(), number)
    assert recorded is not None and recorded.pr_number == doc["pull_request"]
    assert world.labels(number) == ["status:review"]
    [lease] = await LeaseStore(db).history(FULL_NAME, number)
    assert lease.end_reason == "expired"


async def test_a_retitled_issue_still_finds_the_pull_request_foreman_recorded(world: World) -> None:
    """The review and merge verbs find the issue's PR from foreman's record first: a new title (another canonical
    branch name) does not lose it."""
    from bot.verbs.review import pull_for_issue

    number, branch, _ = await published(world)
    _, opened = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    await world.call("alice", "PATCH", f"/issues/{number}", {"title": "A new name for it"})
    issue = await world.gitea.get_issue(number)
    settings = world.service.settings
    found = await pull_for_issue(world.gitea, world.service.db, settings.repo_key, issue,
                                 slug_length=settings.bootstrap.slug_length)
    assert found is not None and (found.number, found.head_ref) == (opened["pull_request"], branch)


def pr_evidence(world: World, number: int) -> dict[str, object]:
    """The PR's evidence comment on the issue, as Gitea holds it (its evidence block)."""
    [body] = [c.body for c in world.live.emulator.issue(OWNER, REPO, number).comments
              if (find_marker(c.body) or "").startswith("pr:")]
    doc = parse_evidence(body)
    assert doc is not None
    return doc


async def test_a_lease_released_while_the_pr_was_opened_is_no_hand_over_in_answer_evidence_or_invariants(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The author released the lease (done) between the gate and the record: the answer, the PR's evidence comment
    and the invariants' reading all say no lease was handed over (the lease's end record is its release's)."""
    from bot import invariants
    from bot.verbs import pulls

    number, _, _ = await published(world)
    real = pulls.open_pull
    db = world.service.db

    async def release_first(gitea: pulls.PullsGitea, head: str) -> object:
        lease = await LeaseStore(db).live_for_issue(FULL_NAME, number)
        if lease is not None:
            async with db.transaction() as conn:
                await LeaseStore(db).release(conn, lease.lease_id, actor="author-1", reason="done",
                                             now=lease.acquired_at)
        return await real(gitea, head)

    monkeypatch.setattr(pulls, "open_pull", release_first)
    refused, doc = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert not refused and doc["handed_over"]["lease_id"] is None, doc
    [lease] = await LeaseStore(db).history(FULL_NAME, number)
    assert lease.end_reason == "done"
    handed = pr_evidence(world, number)["handed_over"]
    assert isinstance(handed, dict) and handed["lease_id"] is None, handed
    facts = await invariants.gather_db(sqlite_path(db))
    assert facts.handovers == (), facts.handovers


async def test_release_after_the_hand_over_never_answers_for_a_live_review_lease(
    tmp_path: Path, start: Started,
) -> None:
    """An author who is also a controller opened the PR (lease ended pull_request_opened); a reviewer then holds a
    live review lease: the author's release is no replay of the hand-over: the door decides as always (a controller
    may end another's lease), and the answer never says already_ended while a lease is live."""
    roster = {**ROSTER, "author-1": ["author", "controller"]}
    async with open_world(tmp_path, start, roster=roster, allocator={"queues": []}) as world:
        number, _, _ = await published(world)
        refused, opened = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
        assert not refused, opened
        refused, claimed = await call_tool(world, "author-3", "gitea_claim_review", issue_number=number)
        assert not refused, claimed
        review = claimed["lease"]["lease_id"]
        refused, doc = await call_tool(world, "author-1", "gitea_release_lease", issue_number=number,
                                       reason="done")
        assert not refused and "already_ended" not in doc, doc
        assert doc["lease"]["lease_id"] == review, doc
        ended = await LeaseStore(world.service.db).get(review)
        assert ended is not None and (ended.status, ended.end_reason) == ("released", "done")


async def test_a_released_lease_released_again_is_refused_no_hand_over_replay(world: World) -> None:
    """Only a lease the PR's opening ended is answered already_ended: release, then release again is the door's
    refusal (no live lease to end), as before the hand-over existed."""
    number = await leased_and_locked(world)
    refused, first = await call_tool(world, "author-1", "gitea_release_lease", issue_number=number, reason="done")
    assert not refused and "already_ended" not in first, first
    refused, again = await call_tool(world, "author-1", "gitea_release_lease", issue_number=number, reason="done")
    # The door's refusal of a release with no live lease (the ownership gate comes first).
    assert refused and again["error"] == "not_authorized" and "already_ended" not in again, again


async def test_the_hand_over_replay_answers_only_the_lease_owner(world: World) -> None:
    """Another author replaying the author's key, and a reviewer releasing after the hand-over, are the door's
    refusals (neither held the lease the PR's opening ended)."""
    number, _, _ = await published(world)
    refused, opened = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number,
                                      idempotency_key="open-1")
    assert not refused, opened
    refused, other = await call_tool(world, "author-2", "gitea_open_pull_request", issue_number=number,
                                     idempotency_key="open-1")
    assert refused and "replayed" not in other and other["error"] in ("not_authorized", "tracing_gap"), other
    refused, release = await call_tool(world, "author-3", "gitea_release_lease", issue_number=number, reason="done")
    assert refused and "already_ended" not in release and release["error"] == "not_authorized", release


async def test_another_issues_open_pull_request_is_never_adopted(world: World) -> None:
    """Issue 29 item 8: only an open PR whose head is this issue's branch is adopted. With another issue's PR open,
    the second issue's call adopted that PR (another head) instead of opening its own."""
    first, _, _ = await published(world)
    refused, theirs = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=first)
    assert not refused, theirs
    issue = world.live.emulator.create_issue(OWNER, REPO, title="Another feature", author="alice",
                                             labels=["status:ready"])
    await world.comment("controller-bot", issue.number, "/allocate --owner author-2")
    await world.comment("author-2", issue.number, "/lock")
    worktree, branch = await worktree_of(world, issue.number)
    (worktree / "another.txt").write_text("another\n", encoding="utf-8")
    refused, published_doc = await call_tool(world, "author-2", "gitea_publish_worktree", issue_number=issue.number,
                                             message="Another change")
    assert not refused, published_doc
    refused, mine = await call_tool(world, "author-2", "gitea_open_pull_request", issue_number=issue.number)
    assert not refused and mine["adopted"] is False and mine["pull_request"] != theirs["pull_request"], mine
    assert (mine["head"], mine["head_sha"]) == (branch, published_doc["commit"])
    pulls = {p.number: p.head_ref for p in await world.gitea.list_pulls(state="open")}
    assert pulls == {theirs["pull_request"]: theirs["head"], mine["pull_request"]: branch}
    recorded = await PublicationStore(world.service.db).pull_for_issue(FULL_NAME.lower(), issue.number)
    assert recorded is not None and recorded.pr_number == mine["pull_request"]


async def test_gitea_refusing_the_pull_request_is_a_refusal_not_a_retry(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gitea's 422 on the create (a branch it cannot compare with the base) is refused ``invalid_state`` with the
    issue's state to read, never ``unavailable`` ("call again"), which retrying would only repeat; nothing is
    recorded and no PR exists."""
    from bot.gitea.errors import error_for
    from bot.gitea.pulls import PullRequestCalls

    number, _, _ = await published(world)

    async def refuse(*args: object, **kwargs: object) -> object:
        raise error_for(422, "no commits between main and the branch", "POST", "/repos/acme/widgets/pulls")

    monkeypatch.setattr(PullRequestCalls, "create_pull", refuse)
    refused, doc = await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    assert refused and doc["error"] == "invalid_state", doc
    assert "no commits between" in doc["message"] and "gitea_get_issue_state" in doc["exact_next_action"], doc
    assert await PublicationStore(world.service.db).pull_for_issue(FULL_NAME.lower(), number) is None
    assert await world.gitea.list_pulls(state="open") == []
