"""``bot.invariants``' time-bound checks on hand-made states: an issue in `status:in-progress` without a live lease
past the grace (leases.in_progress_without_lease), and pull requests the review and merge queues leave waiting with
someone idle (queues.review_waits, queues.merge_waits); each with the states that hold."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from bot import invariants
from bot.invariants.facts import Facts, LeaseFact, QueueFacts, WaitingPullFact
from bot.verbs.queue_view import entered_queue
from tests.test_invariants import NOW, _db, _gitea, consistent

GRACE = timedelta(seconds=120)
BOUND = timedelta(seconds=600)
BOTH = frozenset({"review", "merge"})


def found(facts: Facts) -> list[tuple[str, str]]:
    return [(v.invariant, v.subject) for v in invariants.check(facts)]


# --- leases.in_progress_without_lease ---------------------------------------------------------------------------------


def _working(leases: tuple[LeaseFact, ...], *, now: Any = NOW) -> Facts:
    """consistent(), with issue #5 in `status:in-progress` and ``leases`` of it (their evidence left out of the
    picture: only the in-progress invariant is looked at)."""
    base = _gitea(dataclasses.replace(consistent(), now=now), in_progress=frozenset({5}))
    return _db(base, leases=(*base.db.leases, *leases))


def _in_progress(facts: Facts) -> list[str]:
    return [v.subject for v in invariants.check(facts) if v.invariant == "leases.in_progress_without_lease"]


def test_an_in_progress_issue_with_a_live_lease_holds() -> None:
    live = LeaseFact("lease-5", 5, "author-1", "live", expires_at=NOW + timedelta(hours=1))
    assert _in_progress(_working((live,))) == []
    # Its earlier leases ended long ago: only a live one (or the last one's end) matters.
    old = LeaseFact("lease-4", 5, "author-2", "released", "done", expires_at=NOW - timedelta(days=2),
                    ended_at=NOW - timedelta(days=1))
    assert _in_progress(_working((old, live))) == []


def test_an_in_progress_issue_whose_lease_ended_within_the_grace_holds() -> None:
    ended = LeaseFact("lease-5", 5, "author-1", "released", "done", expires_at=NOW + timedelta(hours=1),
                      ended_at=NOW - GRACE + timedelta(seconds=1))
    expired = LeaseFact("lease-5", 5, "author-1", "live", expires_at=NOW - GRACE + timedelta(seconds=1))
    assert _in_progress(_working((ended,))) == []
    assert _in_progress(_working((expired,))) == []  # past expiry, still inside the grace: the sweep has time


def test_an_in_progress_issue_past_the_grace_without_a_live_lease_is_a_violation() -> None:
    released = LeaseFact("lease-5", 5, "author-1", "released", "done", expires_at=NOW + timedelta(hours=1),
                         ended_at=NOW - GRACE - timedelta(seconds=1))
    [violation] = [v for v in invariants.check(_working((released,)))
                   if v.invariant == "leases.in_progress_without_lease"]
    assert violation.subject == "#5" and "lease-5" in violation.detail and "released (done)" in violation.detail
    # Still marked live, its expiry past the grace (nothing swept it back to status:ready).
    stale = LeaseFact("lease-5", 5, "author-1", "live", expires_at=NOW - GRACE - timedelta(seconds=1))
    assert _in_progress(_working((stale,))) == ["#5"]
    # Never leased at all.
    assert _in_progress(_working(())) == ["#5"]
    # The latest end counts: an expired lease after a release long ago, both past the grace.
    again = LeaseFact("lease-6", 5, "author-2", "expired", "expired", expires_at=NOW - timedelta(minutes=5),
                      ended_at=NOW - timedelta(minutes=3))
    assert _in_progress(_working((released, again))) == ["#5"]


def test_without_the_time_the_in_progress_invariant_is_not_checked() -> None:
    assert _in_progress(_working((), now=None)) == []


# --- queues.review_waits and queues.merge_waits -----------------------------------------------------------------------


def _queued(*, reviews: tuple[WaitingPullFact, ...] = (), merges: tuple[WaitingPullFact, ...] = (),
            **changes: Any) -> Facts:
    queues = QueueFacts(reviews=reviews, merges=merges, idle_reviewers=("reviewer-1",), idle_mergers=("merger-1",),
                        running=BOTH, merge_by="merger", wait_bound_s=BOUND.total_seconds())
    return dataclasses.replace(consistent(), now=NOW, queues=dataclasses.replace(queues, **changes))


def _pull(since: Any = NOW - BOUND - timedelta(seconds=1), **changes: Any) -> WaitingPullFact:
    return dataclasses.replace(WaitingPullFact(7, 17, frozenset({"author-1"}), since), **changes)


def test_a_review_waiting_past_the_bound_with_an_idle_reviewer_is_a_violation() -> None:
    [violation] = invariants.check(_queued(reviews=(_pull(),)))
    assert (violation.invariant, violation.subject) == ("queues.review_waits", "#7 (PR #17)")
    assert "reviewer-1" in violation.detail and "601 s" in violation.detail


def test_a_review_waiting_holds_within_the_bound_or_with_nobody_idle_who_may_take_it() -> None:
    assert found(_queued(reviews=(_pull(since=NOW - BOUND),))) == []  # exactly the bound: not yet
    assert found(_queued(reviews=(_pull(),), idle_reviewers=())) == []  # every reviewer busy
    # The only idle reviewer implemented it (or posted the PR): nobody idle may take it.
    assert found(_queued(reviews=(_pull(barred=frozenset({"reviewer-1"})),))) == []
    assert found(_queued(reviews=(_pull(barred=frozenset({"reviewer-1"})),), idle_reviewers=("Reviewer-1",))) == []
    # The review queue does not run by itself (a controller hands reviews out): not foreman's to keep.
    assert found(_queued(reviews=(_pull(),), running=frozenset({"merge"}))) == []
    assert found(_queued(reviews=(_pull(),), running=frozenset())) == []
    # foreman never leased the issue: when it entered the queue is not known.
    assert found(_queued(reviews=(_pull(since=None),))) == []
    # The queues not read, or no time: not checked.
    assert found(dataclasses.replace(_queued(reviews=(_pull(),)), queues=None)) == []
    assert found(dataclasses.replace(_queued(reviews=(_pull(),)), now=None)) == []


def test_an_approved_pull_request_waiting_past_the_bound_with_an_idle_merger_is_a_violation() -> None:
    [violation] = invariants.check(_queued(merges=(_pull(),)))
    assert (violation.invariant, violation.subject) == ("queues.merge_waits", "#7 (PR #17)")
    assert "merger-1" in violation.detail
    # foreman merges itself: nobody need be idle.
    [by_foreman] = invariants.check(_queued(merges=(_pull(),), merge_by="foreman", idle_mergers=()))
    assert by_foreman.invariant == "queues.merge_waits" and "by = \"foreman\"" in by_foreman.detail


def test_a_merge_waiting_holds_within_the_bound_unmergeable_or_with_nobody_idle() -> None:
    assert found(_queued(merges=(_pull(since=NOW - timedelta(seconds=30)),))) == []
    assert found(_queued(merges=(_pull(),), idle_mergers=())) == []
    assert found(_queued(merges=(_pull(barred=frozenset({"merger-1"})),))) == []
    assert found(_queued(merges=(_pull(mergeable=False),))) == []  # a conflict: its author's turn
    assert found(_queued(merges=(_pull(mergeable=False),), merge_by="foreman")) == []
    assert found(_queued(merges=(_pull(),), running=frozenset({"review"}))) == []
    assert found(_queued(merges=(_pull(),), running=frozenset({"review"}), merge_by="foreman")) == []
    # An idle reviewer is no merger: a review queue's idle roster does not count for the merge queue.
    assert found(_queued(merges=(_pull(),), idle_mergers=(), idle_reviewers=("merger-1",))) == []


def test_both_queues_report_each_waiting_pull_request() -> None:
    facts = _queued(reviews=(_pull(), _pull(issue_number=8, pull_number=18)),
                    merges=(_pull(issue_number=9, pull_number=19),))
    assert found(facts) == [("queues.review_waits", "#7 (PR #17)"), ("queues.review_waits", "#8 (PR #18)"),
                            ("queues.merge_waits", "#9 (PR #19)")]
    assert invariants.report(invariants.check(facts))["counts"] == {"queues.merge_waits": 1,
                                                                    "queues.review_waits": 2}


def test_entered_queue_is_the_end_of_the_issues_last_lease() -> None:
    from state.leases import Lease

    def lease(expires: timedelta, ended: timedelta | None) -> Lease:
        return Lease("l", "acme/widgets", 7, "author-1", "author", "implement", NOW, NOW + expires, NOW,
                     "released" if ended is not None else "live", NOW + ended if ended is not None else None, None,
                     None)

    assert entered_queue([]) is None
    assert entered_queue([lease(timedelta(hours=4), timedelta(minutes=5)),
                          lease(timedelta(hours=4), timedelta(minutes=50))]) == NOW + timedelta(minutes=50)
    # One still marked live (expired, not swept yet): its expiry.
    assert entered_queue([lease(timedelta(minutes=1), None)]) == NOW + timedelta(minutes=1)
