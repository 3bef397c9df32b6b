"""The pure author pick of auto-allocation: least live leases, then longest idle, then login."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bot.core.authors import AuthorLoad, rank_authors

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_idle_authors_come_first_then_the_longest_idle() -> None:
    loads = [
        AuthorLoad("carol", live_leases=0, idle_since=NOW - timedelta(minutes=5)),
        AuthorLoad("alice", live_leases=1, idle_since=None),
        AuthorLoad("bob", live_leases=0, idle_since=NOW - timedelta(hours=1)),
        AuthorLoad("dave", live_leases=0, idle_since=None),  # never held a lease: idle the longest
    ]
    pick = rank_authors(loads, max_leases_per_author=1)
    assert pick.order == ("dave", "bob", "carol")
    assert [(s.login, s.reason) for s in pick.skipped] == [("alice", "busy")]


def test_with_two_leases_allowed_the_least_loaded_go_first() -> None:
    loads = [
        AuthorLoad("alice", live_leases=1, idle_since=NOW - timedelta(hours=3)),
        AuthorLoad("bob", live_leases=0, idle_since=NOW),
        AuthorLoad("carol", live_leases=2, idle_since=None),
    ]
    pick = rank_authors(loads, max_leases_per_author=2)
    assert pick.order == ("bob", "alice")
    assert [(s.login, s.reason) for s in pick.skipped] == [("carol", "busy")]


def test_a_named_owner_is_the_only_one_considered() -> None:
    loads = [AuthorLoad("alice", 0, None), AuthorLoad("bob", 0, None)]
    pick = rank_authors(loads, max_leases_per_author=1, named_owner="bob")
    assert pick.order == ("bob",)
    assert [(s.login, s.reason) for s in pick.skipped] == [("alice", "not_the_named_owner")]


def test_the_order_does_not_depend_on_the_input_order() -> None:
    loads = [AuthorLoad(f"a{i}", i % 2, NOW - timedelta(minutes=i)) for i in range(6)]
    assert rank_authors(loads, max_leases_per_author=2) == rank_authors(list(reversed(loads)),
                                                                         max_leases_per_author=2)


def test_without_resume_an_owner_with_a_live_lease_is_given_another_issue() -> None:
    """`max_leases_per_author` > 1: the owner's own leased issue is skipped `own_claim`, the next one selected."""
    from bot.core.allocator import AllocationRequest, LiveLease, RankingPolicy, SelectDecision, decide

    held = LiveLease(issue_number=1, owner="alice", role="author", lease_id="L-1", expires_at=NOW + timedelta(hours=1))
    request = AllocationRequest(owner="alice", candidates=[{"issue_number": 1}, {"issue_number": 2}])
    assert decide(request, RankingPolicy(), [held], NOW).kind == "resume"
    fresh = AllocationRequest(owner="alice", candidates=[{"issue_number": 1}, {"issue_number": 2}], resume_own=False)
    decision = decide(fresh, RankingPolicy(), [held], NOW)
    assert isinstance(decision, SelectDecision) and decision.issue_number == 2
    assert [(s.issue_number, s.reason) for s in decision.skipped] == [(1, "own_claim")]
