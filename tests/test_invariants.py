"""``bot.invariants``: the pure checker on hand-made states, and the fact-gathering edges on real stores."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot import invariants
from bot.core.evidence import render_evidence
from bot.invariants.facts import (
    CheckoutFacts,
    CommentFact,
    DbFacts,
    DeliveryFact,
    Facts,
    GiteaFacts,
    LeaseFact,
    OutboxFact,
    QueueFacts,
    RegistrationFact,
    TransitionFact,
    WaitingPullFact,
    WorktreeFact,
)

BOT = "foreman-bot"
CHECKOUT = "/srv/checkouts/acme/widgets"
BRANCH = "issue-1-fix-it"
PATH = f"{CHECKOUT}/branches/{BRANCH}"
KEY = "bootstrap-1-aaaa"
OTHER = f"{CHECKOUT}/branches/issue-3-other"
NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def consistent() -> Facts:
    """Issue #1: leased to author-1, bootstrapped, worktree registered. Issue #2: leased, released through the
    verb. Issue #3: leased, its bootstrap compensated (which released the lease). Every comment once."""
    leases = (
        LeaseFact("lease-1", 1, "author-1", "live", exclude=(617,), decided_exclude=(617,)),
        LeaseFact("lease-2", 2, "author-2", "released", "done"),
        LeaseFact("lease-3", 3, "author-1", "released", "bootstrap failed: base moved"),
    )
    comment_keys = [("lease-1:evidence", 1), (f"{KEY}:evidence", 1), ("lease-2:evidence", 2),
                    ("lease-2:release", 2), ("lease-3:evidence", 3), ("bootstrap-3-bbbb:failure", 3),
                    ("command:77:reply", 2)]
    outbox = (
        *(OutboxFact(key, number, "comment", "done", 100 + i) for i, (key, number) in enumerate(comment_keys)),
        OutboxFact("lease-1:labels", 1, "labels", "done"),
        OutboxFact("lease-1:assignee", 1, "assignees", "done"),
    )
    comments = (
        *(CommentFact(o.issue_number, o.comment_id or 0, BOT, o.key) for o in outbox if o.kind == "comment"),
        CommentFact(1, 500, "alice", None),
        CommentFact(2, 501, "bob", "lease-9:evidence"),  # bob quoting a marker is not the bot's comment
    )
    transitions = (
        TransitionFact(KEY, 1, "lease-1", "author-1", "completed", "completed", BRANCH, PATH, True),
        TransitionFact("bootstrap-3-bbbb", 3, "lease-3", "author-1", "compensation_completed", "compensated",
                       "issue-3-other", OTHER),
    )
    return Facts(
        db=DbFacts(
            leases=leases,
            outbox=outbox,
            deliveries=(DeliveryFact("d-1", "sha-1", "done"), DeliveryFact("d-2", "sha-2", "ignored_self")),
            transitions=transitions,
            registrations=(RegistrationFact(KEY, 1, "lease-1", BRANCH, PATH, True),),
        ),
        gitea=GiteaFacts(comments=comments, assignees={1: frozenset({"author-1"}), 2: frozenset(), 3: frozenset()}),
        bot_login=BOT,
        checkout=CheckoutFacts(CHECKOUT, (PATH,), (WorktreeFact(PATH, BRANCH),), (BRANCH,)),
        acknowledged=(("d-1", "sha-1"), ("d-3", "sha-2")),  # d-3: Gitea's Replay of d-2, answered duplicate
        require_bootstrap=True,
    )


def test_a_consistent_state_has_no_violations() -> None:
    assert invariants.check(consistent()) == []
    assert invariants.report([])["ok"] is True


Mutation = Callable[[Facts], Facts]


def _db(facts: Facts, **changes: Any) -> Facts:
    return dataclasses.replace(facts, db=dataclasses.replace(facts.db, **changes))


def _gitea(facts: Facts, **changes: Any) -> Facts:
    return dataclasses.replace(facts, gitea=dataclasses.replace(facts.gitea, **changes))


def _checkout(facts: Facts, **changes: Any) -> Facts:
    assert facts.checkout is not None
    return dataclasses.replace(facts, checkout=dataclasses.replace(facts.checkout, **changes))


def _without_comment(key: str) -> Mutation:
    return lambda f: _gitea(f, comments=tuple(c for c in f.gitea.comments if c.marker != key))


def _twice(key: str) -> Mutation:
    def mutate(f: Facts) -> Facts:
        [first] = [c for c in f.gitea.comments if c.marker == key]
        return _gitea(f, comments=(*f.gitea.comments, dataclasses.replace(first, comment_id=999)))
    return mutate


def _outbox_status(key: str, status: str) -> Mutation:
    return lambda f: _db(f, outbox=tuple(dataclasses.replace(o, status=status) if o.key == key else o
                                         for o in f.db.outbox))


def _transition(key: str, **changes: Any) -> Mutation:
    def mutate(f: Facts) -> Facts:
        changed = (dataclasses.replace(t, **changes) if t.key == key else t for t in f.db.transitions)
        return _db(f, transitions=tuple(changed))
    return mutate


def _add_lease(lease: LeaseFact) -> Mutation:
    return lambda f: _db(f, leases=(*f.db.leases, lease))


CASES: dict[str, tuple[str, Mutation]] = {
    "delivery still processing": ("deliveries.settled", lambda f: _db(
        f, deliveries=(*f.db.deliveries, DeliveryFact("d-9", "sha-9", "processing")))),
    "delivery still queued": ("deliveries.settled", lambda f: _db(
        f, deliveries=(*f.db.deliveries, DeliveryFact("d-9", "sha-9", "queued")))),
    "delivery parked as failed": ("deliveries.not_failed", lambda f: _db(
        f, deliveries=(*f.db.deliveries, DeliveryFact("d-9", "sha-9", "failed")))),
    "an acknowledged delivery was never stored": ("deliveries.none_lost", lambda f: dataclasses.replace(
        f, acknowledged=(*(f.acknowledged or ()), ("d-8", "sha-8")))),
    "outbox entry still pending": ("outbox.settled", _outbox_status("lease-1:labels", "pending")),
    "outbox entry still sending": ("outbox.settled", _outbox_status("command:77:reply", "sending")),
    "outbox entry parked": ("outbox.not_stuck", _outbox_status("lease-1:assignee", "parked")),
    "outbox entry failed verification": ("outbox.not_stuck", _outbox_status("lease-1:labels", "verification_failed")),
    "a sent comment is missing in Gitea": ("outbox.comment_once", _without_comment("command:77:reply")),
    "a comment was posted twice": ("outbox.comment_once", _twice("command:77:reply")),
    "the entry recorded another comment": ("outbox.comment_once", lambda f: _db(f, outbox=tuple(
        dataclasses.replace(o, comment_id=4242) if o.key == "command:77:reply" else o for o in f.db.outbox))),
    "a bot comment without an outbox entry": ("outbox.no_stray_comment", lambda f: _gitea(
        f, comments=(*f.gitea.comments, CommentFact(1, 900, BOT, "command:88:reply")))),
    "an outbox entry filed under no repository": ("outbox.filed_by_repository", lambda f: _db(f, outbox=tuple(
        dataclasses.replace(o, repo="") if o.key == "lease-1:labels" else o for o in f.db.outbox))),
    "a run's evidence filed under another repository than its grant's": (
        "outbox.run_evidence_repository", lambda f: _db(
            f, run_repos=(("run-1", "acme/gadgets"),),
            outbox=(*f.db.outbox, OutboxFact("run:run-1:summary", 1, "comment", "done", 980, "acme/widgets")),
        )),
    "two live leases on one issue": ("leases.one_live_per_issue", _add_lease(LeaseFact("lease-1b", 1, "author-1",
                                                                                       "live"))),
    "a lease without its evidence entry": ("leases.evidence", lambda f: _db(
        f, outbox=tuple(o for o in f.db.outbox if o.key != "lease-2:evidence"))),
    "a lease whose evidence was never sent": ("leases.evidence", _outbox_status("lease-1:evidence", "pending")),
    "a lease whose evidence is not in Gitea": ("leases.evidence", _without_comment("lease-3:evidence")),
    "a lease evidence comment in Gitea without a lease": ("leases.no_evidence_without_lease", lambda f: _gitea(
        f, comments=(*f.gitea.comments, CommentFact(4, 901, BOT, "lease-404:evidence")))),
    "a lease key in the outbox without a lease": ("leases.no_evidence_without_lease", lambda f: _db(
        f, outbox=(*f.db.outbox, OutboxFact("lease-404:labels", 4, "labels", "done")))),
    "a released lease with no evidence of its end": ("leases.end_evidence", _without_comment("lease-2:release")),
    "a compensation release whose failure comment is missing": (
        "leases.end_evidence", _without_comment("bootstrap-3-bbbb:failure")),
    "a live lease whose owner is not assigned": ("leases.assigned", lambda f: _gitea(f, assignees={1: frozenset()})),
    "an owner still assigned after a failed bootstrap released the lease": (
        "leases.unassigned_after_failure", lambda f: _gitea(f, assignees={**f.gitea.assignees,
                                                                          3: frozenset({"author-1"})})),
    "an owner still assigned after an unworkable lease was released": (
        "leases.unassigned_after_failure", lambda f: _gitea(_db(_add_lease(LeaseFact(
            "lease-6", 6, "author-2", "released", "unworkable: invalid_state"))(f), outbox=(
                *f.db.outbox, OutboxFact("lease-6:evidence", 6, "comment", "done", 970),
                OutboxFact("lease-6:unworkable", 6, "comment", "done", 971))), comments=(
                    *f.gitea.comments, CommentFact(6, 970, BOT, "lease-6:evidence"),
                    CommentFact(6, 971, BOT, "lease-6:unworkable")), assignees={**f.gitea.assignees,
                                                                                6: frozenset({"author-2"})})),
    "a lease recording other exclusions than its decision applied": ("leases.exclusions_recorded", lambda f: _db(
        f, leases=tuple(dataclasses.replace(lease, exclude=()) if lease.lease_id == "lease-1" else lease
                        for lease in f.db.leases))),
    "a completed transition whose proof does not show the owner assigned": (
        "journal.assignment_read_back", _transition(KEY, assignment_read_back=False)),
    "a live lease that was never bootstrapped": ("leases.bootstrapped", lambda f: _db(
        _add_lease(LeaseFact("lease-4", 4, "author-3", "live"))(f),
        outbox=(*f.db.outbox, OutboxFact("lease-4:evidence", 4, "comment", "done", 950)),
    )),
    "a transition left open": ("journal.terminal", _transition(KEY, phase="path_reserved", outcome="open")),
    "a completed transition without its evidence comment": ("journal.evidence", _without_comment(f"{KEY}:evidence")),
    "a compensated transition's failure comment came twice": ("journal.evidence", _twice("bootstrap-3-bbbb:failure")),
    "bootstrap evidence of an unknown transition": ("journal.no_evidence_without_transition", lambda f: _db(
        f, outbox=(*f.db.outbox, OutboxFact("bootstrap-5-cccc:evidence", 5, "labels", "done")))),
    "a failure comment of a transition that completed": ("journal.no_evidence_without_transition", lambda f: _db(
        f, outbox=(*f.db.outbox, OutboxFact(f"{KEY}:failure", 1, "labels", "done")))),
    "a completed transition without a registration": ("journal.registered", lambda f: _db(
        f, registrations=())),
    "a directory under branches/ that git does not know": ("worktrees.no_orphan_dir", lambda f: _checkout(
        f, directories=(PATH, f"{CHECKOUT}/branches/issue-7-stray"))),
    "a git worktree with no registration row": ("worktrees.journaled", lambda f: _checkout(
        f, worktrees=(WorktreeFact(PATH, BRANCH), WorktreeFact(f"{CHECKOUT}/branches/issue-8-x", "issue-8-x")),
        directories=(PATH, f"{CHECKOUT}/branches/issue-8-x"))),
    "a registered worktree of a compensated transition": ("worktrees.journaled", lambda f: _checkout(_db(
        f, registrations=(RegistrationFact("bootstrap-3-bbbb", 3, "lease-3", "issue-3-other", OTHER, True),
                          *f.db.registrations)),
        worktrees=(WorktreeFact(PATH, BRANCH), WorktreeFact(OTHER, "issue-3-other")), directories=(PATH, OTHER))),
    "a worktree on another branch than registered": ("worktrees.journaled", lambda f: _checkout(
        f, worktrees=(WorktreeFact(PATH, "main"),))),
    "a git worktree outside branches/": ("worktrees.inside_branches", lambda f: _checkout(
        f, worktrees=(WorktreeFact(PATH, BRANCH), WorktreeFact("/tmp/elsewhere", "issue-1-fix-it")))),
    "a live registration whose worktree git lost": ("worktrees.on_disk", lambda f: _checkout(
        f, worktrees=(), directories=())),
    "a live registration whose directory is gone": ("worktrees.on_disk", lambda f: _checkout(
        f, worktrees=(WorktreeFact(PATH, BRANCH, prunable=True),), directories=())),
    "two live registrations of one issue": ("worktrees.one_per_issue", lambda f: _db(
        f, registrations=(*f.db.registrations, RegistrationFact(KEY, 1, "lease-1", BRANCH, PATH + "-2", True)))),
    "an issue branch no completed transition made": ("branches.journaled", lambda f: _checkout(
        f, issue_branches=(BRANCH, "issue-9-orphan"))),
    "a merged issue with a live lease": ("lifecycle.merged_no_live_lease", lambda f: _gitea(f, merged=frozenset({1}))),
    "a merged issue's worktree left on disk": ("lifecycle.merged_no_worktree", lambda f: _gitea(
        f, merged=frozenset({1}))),
    "an in-progress issue whose last lease ended past the grace": ("leases.in_progress_without_lease", lambda f: _gitea(
        _db(dataclasses.replace(f, now=NOW), leases=tuple(
            dataclasses.replace(lease, ended_at=NOW - timedelta(hours=1)) if lease.lease_id == "lease-2" else lease
            for lease in f.db.leases)), in_progress=frozenset({2}))),
    "a pull request waiting for review with an idle reviewer": ("queues.review_waits", lambda f: dataclasses.replace(
        f, now=NOW, queues=QueueFacts(reviews=(WaitingPullFact(2, 12, frozenset({"author-2"}),
                                                               NOW - timedelta(hours=1)),),
                                      idle_reviewers=("reviewer-1",), running=frozenset({"review", "merge"})))),
    "an approved pull request waiting with an idle merger": ("queues.merge_waits", lambda f: dataclasses.replace(
        f, now=NOW, queues=QueueFacts(merges=(WaitingPullFact(2, 12, frozenset({"author-2"}),
                                                              NOW - timedelta(hours=1)),),
                                      idle_mergers=("merger-1",), running=frozenset({"review", "merge"})))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_broken_invariant_is_caught(case: str) -> None:
    invariant, mutate = CASES[case]
    found = invariants.check(mutate(consistent()))
    assert invariant in {v.invariant for v in found}, (case, found)
    assert all(v.invariant in invariants.INVARIANTS for v in found)


def test_every_invariant_has_a_case_that_breaks_it() -> None:
    assert {invariant for invariant, _ in CASES.values()} == set(invariants.INVARIANTS)


def test_a_live_lease_without_a_worktree_is_a_violation_even_after_a_foreign_owners_worktree() -> None:
    """An allocation whose bootstrap is refused (`foreign_work`: the issue was bootstrapped for someone else before)
    releases its lease at once, so a live lease without a completed transition is always a violation."""
    base = consistent()
    foreign = _db(
        base,
        leases=(
            *(dataclasses.replace(lease, status="released", end_reason="done") if lease.lease_id == "lease-1"
              else lease for lease in base.db.leases),
            LeaseFact("lease-5", 1, "author-2", "live"),
        ),
        outbox=(*base.db.outbox, OutboxFact("lease-5:evidence", 1, "comment", "done", 960),
                OutboxFact("lease-1:release", 1, "comment", "done", 961)),
    )
    foreign = _gitea(foreign, assignees={1: frozenset({"author-2"})}, comments=(
        *foreign.gitea.comments,
        CommentFact(1, 960, BOT, "lease-5:evidence"),
        CommentFact(1, 961, BOT, "lease-1:release"),
    ))
    required = dataclasses.replace(foreign, require_bootstrap=True)
    assert [v.invariant for v in invariants.check(required)] == ["leases.bootstrapped"]
    assert invariants.check(dataclasses.replace(foreign, require_bootstrap=False)) == []


def test_an_owner_who_leased_the_issue_again_may_stay_assigned_after_an_earlier_failure() -> None:
    """The assignment must not outlive the lease; a new live lease of the same owner is a lease."""
    base = consistent()
    again = _db(
        _add_lease(LeaseFact("lease-7", 3, "author-1", "live"))(base),
        outbox=(*base.db.outbox, OutboxFact("lease-7:evidence", 3, "comment", "done", 980)),
    )
    again = _gitea(again, assignees={**again.gitea.assignees, 3: frozenset({"author-1"})},
                   comments=(*again.gitea.comments, CommentFact(3, 980, BOT, "lease-7:evidence")))
    assert "leases.unassigned_after_failure" not in {v.invariant for v in invariants.check(again)}
    # a lease without recorded exclusions (not made by an allocation) or without a recorded decision is not judged
    unknown = _db(base, leases=tuple(dataclasses.replace(lease, decided_exclude=None) for lease in base.db.leases))
    assert invariants.check(dataclasses.replace(unknown, require_bootstrap=True)) == []


def test_an_owner_who_leased_the_issue_again_and_handed_it_over_may_stay_assigned() -> None:
    """A failed lease, then a later lease of the same owner that ended normally (the pull request's opening): the
    assignment is the later lease's (the crash test of the whole life saw this after a stale pin); the failed
    lease is judged only while it is the owner's latest on the issue."""
    base = consistent()
    later = _db(
        _add_lease(LeaseFact("lease-7", 3, "author-1", "released", "pull_request_opened"))(base),
        outbox=(*base.db.outbox, OutboxFact("lease-7:evidence", 3, "comment", "done", 980)),
    )
    later = _gitea(later, assignees={**later.gitea.assignees, 3: frozenset({"author-1"})},
                   comments=(*later.gitea.comments, CommentFact(3, 980, BOT, "lease-7:evidence")))
    found = {v.invariant: v for v in invariants.check(later)}
    assert "leases.unassigned_after_failure" not in found, found
    # Another owner's later lease does not excuse the failed one's owner.
    other = _db(later, leases=tuple(dataclasses.replace(lease, owner="author-2") if lease.lease_id == "lease-7"
                                    else lease for lease in later.db.leases))
    assert "leases.unassigned_after_failure" in {v.invariant for v in invariants.check(other)}


def test_a_live_review_lease_needs_no_worktree_and_no_assignment() -> None:
    """A reviewer's lease (claim_review) posts only its evidence: it is neither bootstrapped nor assigned, and
    `foreman invariants` run while a review is under way reports nothing for it."""
    base = consistent()
    review = _db(
        _add_lease(LeaseFact("lease-8", 2, "reviewer-1", "live", action="review"))(base),
        outbox=(*base.db.outbox, OutboxFact("lease-8:evidence", 2, "comment", "done", 990)),
    )
    review = _gitea(review, comments=(*review.gitea.comments, CommentFact(2, 990, BOT, "lease-8:evidence")))
    assert invariants.check(review) == []
    # The same lease as an implement lease still needs both.
    implement = _db(review, leases=tuple(dataclasses.replace(lease, action="implement")
                                         if lease.lease_id == "lease-8" else lease for lease in review.db.leases))
    assert sorted(v.invariant for v in invariants.check(implement)) == ["leases.assigned", "leases.bootstrapped"]


def test_the_checkout_and_acknowledgements_are_optional() -> None:
    """Without a control checkout the worktree invariants see none on disk (a live registration is then a
    violation); without Gitea's delivery list `deliveries.none_lost` is not checked."""
    facts = dataclasses.replace(consistent(), checkout=None, acknowledged=None)
    assert {v.invariant for v in invariants.check(facts)} == {"worktrees.on_disk"}
    assert {v.invariant for v in invariants.check(_db(facts, registrations=()))} == {"journal.registered"}


def test_the_report_counts_violations_per_invariant() -> None:
    found = invariants.check(_twice("lease-2:release")(_outbox_status("lease-1:labels", "parked")(consistent())))
    doc = invariants.report(found)
    assert doc["ok"] is False and doc["counts"] == {"leases.end_evidence": 1, "outbox.comment_once": 1,
                                                    "outbox.not_stuck": 1}
    assert set(doc["checked"]) == set(invariants.INVARIANTS)
    assert all(str(v).startswith(v.invariant) for v in found)


# --- the edges --------------------------------------------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout


def test_gather_checkout_reads_git_worktrees_directories_and_issue_branches(tmp_path: Path) -> None:
    checkout = tmp_path / "acme" / "widgets"
    checkout.mkdir(parents=True)
    _git(checkout, "init", "-q", "-b", "main")
    (checkout / "README.md").write_text("hi\n", encoding="utf-8")
    _git(checkout, "add", "README.md")
    _git(checkout, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "-q", "-m", "init")
    _git(checkout, "worktree", "add", "-q", "-b", "issue-1-fix", str(checkout / "branches" / "issue-1-fix"))
    _git(checkout, "branch", "issue-2-idle")
    (checkout / "branches" / "issue-3-stray").mkdir()
    facts = invariants.gather_checkout(checkout)
    assert facts is not None
    real = str(checkout.resolve())
    assert facts.path == real
    assert facts.worktrees == (WorktreeFact(f"{real}/branches/issue-1-fix", "issue-1-fix"),)
    assert facts.directories == (f"{real}/branches/issue-1-fix", f"{real}/branches/issue-3-stray")
    assert facts.issue_branches == ("issue-1-fix", "issue-2-idle")
    assert invariants.gather_checkout(tmp_path / "nothing") is None


async def test_gather_db_and_gitea_read_a_real_database_and_the_emulator(tmp_path: Path) -> None:
    """The edges read what the stores hold: a lease with its outbox evidence entry, and the comment in Gitea."""

    from state.db import Database, utcnow
    from state.leases import LeaseStore
    from state.outbox import OutboxIntent, OutboxStore, enqueue
    from tests.gitea_fixtures import OWNER, REPO, live_emulator

    db = await Database.open(tmp_path / "foreman.db")
    async with db.transaction() as conn:
        lease = await LeaseStore(db).acquire(
            conn, repo="acme/widgets", issue_number=1, owner="author-1", role="author", action="implement",
            ttl=timedelta(hours=1), now=utcnow(), actor="controller-bot", fingerprint=None, request={})
        body = render_evidence(key=f"{lease.lease_id}:evidence", summary="Leased #1.", state=None, evidence={})
        await enqueue(conn, OutboxIntent(f"{lease.lease_id}:evidence", 1, "comment", {"body": body}),
                      repo="acme/widgets")
    entry = await OutboxStore(db).by_key(f"{lease.lease_id}:evidence")
    assert entry is not None
    await db.close()
    facts = await invariants.gather_db(tmp_path / "foreman.db")
    assert facts.leases == (LeaseFact(lease.lease_id, 1, "author-1", "live", expires_at=lease.expires_at),)
    assert facts.outbox == (OutboxFact(f"{lease.lease_id}:evidence", 1, "comment", "pending", None, "acme/widgets"),)
    async with live_emulator() as live:
        live.emulator.create_issue(OWNER, REPO, title="one", author="alice", assignees=["alice"])
        live.emulator.create_comment(OWNER, REPO, 1, author="foreman-bot", body=body)
        live.emulator.create_label(OWNER, REPO, "status:in-progress")
        live.emulator.create_issue(OWNER, REPO, title="two", author="alice", labels=["status:in-progress"])
        gitea = await invariants.gather_gitea(live.client())
        assert gitea.assignees == {1: frozenset({"alice"}), 2: frozenset()}
        assert gitea.in_progress == frozenset({2})
        [comment] = gitea.comments
        assert (comment.issue_number, comment.author, comment.marker) == (1, "foreman-bot", entry.key)
        found = invariants.check(Facts(db=facts, gitea=gitea, bot_login="foreman-bot"))
    # Not sent yet (pending), so not evidence yet; and alice, not author-1, is assigned.
    assert {v.invariant for v in found} == {"outbox.settled", "leases.evidence", "leases.assigned"}


def test_a_live_lease_with_an_open_transition_of_its_own_is_bootstrapping_not_unbootstrapped() -> None:
    """A live lease stands only with a completed bootstrap or an open transition of that lease (which
    start-up recovery finishes or compensates); the open transition is `journal.terminal`'s to report, and an open
    transition of another lease does not count."""
    base = consistent()
    lease_5 = LeaseFact("lease-5", 4, "author-2", "live")
    opened = _db(
        base,
        leases=(*base.db.leases, lease_5),
        outbox=(*base.db.outbox, OutboxFact("lease-5:evidence", 4, "comment", "done", 970)),
        transitions=(*base.db.transitions, TransitionFact("bootstrap-4-cccc", 4, "lease-5", "author-2",
                                                          "worktree_confirmed", "open", "issue-4-x",
                                                          f"{CHECKOUT}/branches/issue-4-x", None)),
    )
    opened = _gitea(opened, assignees={**opened.gitea.assignees, 4: frozenset({"author-2"})},
                    comments=(*opened.gitea.comments, CommentFact(4, 970, BOT, "lease-5:evidence")))
    assert [v.invariant for v in invariants.check(opened)] == ["journal.terminal"]
    foreign = _db(opened, transitions=tuple(
        dataclasses.replace(t, lease_id="lease-9") if t.key == "bootstrap-4-cccc" else t
        for t in opened.db.transitions))
    assert sorted(v.invariant for v in invariants.check(foreign)) == ["journal.terminal", "leases.bootstrapped"]


@pytest.mark.parametrize(("end_reason", "counted"), [("pull_request_opened", True), ("done", False)])
async def test_gather_db_counts_a_pull_requests_evidence_as_an_end_record_only_for_a_handed_over_lease(
    tmp_path: Path, end_reason: str, counted: bool,
) -> None:
    """A PR's evidence naming a lease is that lease's end record only when the lease ended pull_request_opened
    (one released `done` meanwhile needs its own release comment)."""

    from state.db import Database, utcnow
    from state.leases import LeaseStore
    from state.outbox import OutboxIntent, enqueue

    db = await Database.open(tmp_path / "foreman.db")
    now = utcnow()
    async with db.transaction() as conn:
        lease = await LeaseStore(db).acquire(
            conn, repo="acme/widgets", issue_number=1, owner="author-1", role="author", action="implement",
            ttl=timedelta(hours=1), now=now, actor="controller-bot", fingerprint=None, request={})
        await LeaseStore(db).release(conn, lease.lease_id, actor="author-1", reason=end_reason, now=now)
        key = "pr:1:2:abcdef012345:evidence"
        body = render_evidence(key=key, summary="Pull request #2 is open for #1.", state=None,
                               evidence={"handed_over": {"lease_id": lease.lease_id}})
        await enqueue(conn, OutboxIntent(key, 1, "comment", {"body": body}), repo="acme/widgets")
    await db.close()
    facts = await invariants.gather_db(tmp_path / "foreman.db")
    assert facts.handovers == (((lease.lease_id, key),) if counted else ()), facts.handovers
