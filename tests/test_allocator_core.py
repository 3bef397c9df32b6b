"""The allocator's pure decision: exclusions, ownership, results, ranking and the fingerprint (seed 000; AC8 at MCP)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.core.allocator import (
    BLOCK_REASONS,
    SKIP_REASONS,
    AllocationDecision,
    AllocationRequest,
    BlockedDecision,
    LiveLease,
    RankingPolicy,
    ResumeDecision,
    SelectDecision,
    WaitDecision,
    check_apply,
    decide,
)

NOW = datetime(2026, 7, 21, 12, 0, tzinfo=UTC)
POLICY = RankingPolicy()
ME = "author-1"
OTHER = "author-2"

# The canary situation: #617 is the highest-ranked candidate and must never be leased when excluded.
CANARY: list[dict[str, Any]] = [
    {"issue_number": 617, "title": "terminal", "labels": ["priority:p0"], "created_at": "2026-07-01T00:00:00Z"},
    {"issue_number": 776, "title": "allocator", "labels": ["priority:p1"], "created_at": "2026-07-20T21:35:15-05:00"},
    {"issue_number": 612, "labels": ["priority:p2"]},
]


def run(
    candidates: object,
    exclude: object = None,
    *,
    leases: list[LiveLease] | None = None,
    policy: RankingPolicy = POLICY,
    owner: str = ME,
    open_issues: frozenset[int] = frozenset(),
    now: datetime = NOW,
) -> AllocationDecision:
    request = AllocationRequest(
        owner=owner, candidates=candidates, exclude_issue_numbers=exclude, open_issue_numbers=open_issues
    )
    return decide(request, policy, leases or [], now)


def lease(issue: int, owner: str = OTHER, *, minutes: float = 30, lease_id: str | None = None) -> LiveLease:
    return LiveLease(
        issue_number=issue,
        owner=owner,
        role="author",
        lease_id=lease_id or f"L-{issue}-{owner}",
        expires_at=NOW + timedelta(minutes=minutes),
    )


def reasons(decision: AllocationDecision) -> dict[int | None, str]:
    return {s.issue_number: s.reason for s in decision.skipped}


# --- exclusions, ownership and results (AC1, AC2, AC5-AC7, AC9) -------------------------------------------------------


def test_omitted_exclusions_select_exactly_as_before() -> None:
    """AC1/AC9: a call without exclude_issue_numbers (None) behaves like an empty list: top rank wins."""
    omitted = run(CANARY)
    empty = run(CANARY, [])
    assert isinstance(omitted, SelectDecision)
    assert omitted.issue_number == 617
    assert omitted.to_dict() == empty.to_dict()


def test_highest_ranked_excluded_issue_617_is_never_selected() -> None:
    """AC2/AC8 core: #617 (priority:p0, oldest) is removed before ranking; the next rank is chosen."""
    decision = run(CANARY, [617])
    assert isinstance(decision, SelectDecision)
    assert decision.issue_number == 776
    assert [r.issue_number for r in decision.ranked] == [776, 612]
    assert reasons(decision) == {617: "excluded_by_controller"}


def test_protected_issue_numbers_and_labels_are_removed_before_ranking() -> None:
    """AC2: configured protections exclude exactly as the caller's list does, each with its own reason."""
    policy = RankingPolicy(protected_issue_numbers=frozenset({617}), protected_labels=frozenset({"do-not-allocate"}))
    candidates = [*CANARY, {"issue_number": 1, "labels": ["priority:p0", "do-not-allocate"]}]
    decision = run(candidates, policy=policy)
    assert isinstance(decision, SelectDecision)
    assert decision.issue_number == 776
    assert reasons(decision) == {617: "protected_issue", 1: "protected_label"}


def test_caller_exclusion_is_reported_before_a_protection_on_the_same_issue() -> None:
    """AC2/AC6: one reason per candidate; the caller's exclusion is named first."""
    policy = RankingPolicy(protected_issue_numbers=frozenset({617}))
    assert reasons(run(CANARY, [617], policy=policy))[617] == "excluded_by_controller"


def test_foreign_lease_is_skipped_and_never_overridden() -> None:
    """AC5: the top-ranked issue leased by someone else is foreign_claim; the next one is selected."""
    decision = run(CANARY, leases=[lease(617, OTHER)])
    assert isinstance(decision, SelectDecision)
    assert decision.issue_number == 776
    assert reasons(decision) == {617: "foreign_claim"}
    assert OTHER in decision.skipped[0].detail


def test_foreign_lease_in_grace_is_held_then_reclaimable() -> None:
    """AC5: an expired foreign lease is held for the grace period (lease_grace), then reclaimable."""
    policy = RankingPolicy(lease_grace=timedelta(minutes=5))
    in_grace = run(CANARY, leases=[lease(617, minutes=-2)], policy=policy)
    assert reasons(in_grace) == {617: "lease_grace"}
    after = run(CANARY, leases=[lease(617, minutes=-6)], policy=policy)
    assert isinstance(after, SelectDecision)
    assert after.issue_number == 617


def test_own_expired_lease_is_not_held_by_grace() -> None:
    """AC5/AC9: the grace protects other holders; the owner's own expired lease is simply selectable."""
    decision = run(CANARY, leases=[lease(617, ME, minutes=-1)])
    assert isinstance(decision, SelectDecision)
    assert decision.issue_number == 617


def test_excluded_issue_with_live_same_owner_lease_returns_blocker() -> None:
    """AC5: an excluded #617 leased by the caller is a resume/release blocker, not silently stranded."""
    own = lease(617, ME)
    decision = run(CANARY, [617], leases=[own])
    assert isinstance(decision, BlockedDecision)
    [blocker] = decision.blockers
    assert (blocker.issue_number, blocker.reason, blocker.excluded_as, blocker.lease) == (
        617, "excluded_owned_lease", "excluded_by_controller", own
    )
    assert decision.envelope.error == "invalid_state"
    assert "gitea_release_lease" in decision.envelope.exact_next_action
    assert reasons(decision)[617] == "excluded_by_controller"
    body = decision.to_dict()
    assert body["decision"] == "blocked"
    assert body["details"]["reason"] == "excluded_owned_lease"
    assert check_apply(decision.fingerprint, decision) is None  # not drift; the caller renders the block


def test_protected_issue_outside_candidates_with_own_lease_blocks() -> None:
    """AC5: the block also covers the caller's lease on a protected issue that is not a candidate."""
    policy = RankingPolicy(protected_issue_numbers=frozenset({900}))
    decision = run(CANARY, leases=[lease(900, ME)], policy=policy)
    assert isinstance(decision, BlockedDecision)
    assert decision.blockers[0].excluded_as == "protected_issue"


def test_skipped_accounting_names_a_distinct_reason_for_each_cause() -> None:
    """AC6: exclusions, protections, foreign claims, grace, readiness and dependencies are distinguished."""
    policy = RankingPolicy(
        protected_issue_numbers=frozenset({2}), protected_labels=frozenset({"hold"}), lease_grace=timedelta(hours=1)
    )
    candidates = [
        {"issue_number": 1},
        {"issue_number": 2},
        {"issue_number": 3, "labels": ["hold"]},
        {"issue_number": 4},
        {"issue_number": 5},
        {"issue_number": 6, "ready": False},
        {"issue_number": 7, "depends_on": [50]},
        {"issue_number": 8, "depends_on": [10]},  # #10 is a candidate, hence open
        {"issue_number": 9, "depends_on": [51]},  # #51 is not known to be open
        {"issue_number": 10, "labels": ["priority:p3"]},
        {"issue_number": 11, "barred_owners": [ME, "someone"]},  # a review candidate whose PR the owner wrote
        {"issue_number": 12, "duplicate": "open pull request #13 closes #12"},
    ]
    decision = run(
        candidates, [1], leases=[lease(4), lease(5, minutes=-1)], policy=policy, open_issues=frozenset({50})
    )
    assert reasons(decision) == {
        1: "excluded_by_controller",
        2: "protected_issue",
        3: "protected_label",
        4: "foreign_claim",
        5: "lease_grace",
        6: "not_ready",
        7: "dependency_open",
        8: "dependency_open",
        11: "self_review",
        12: "duplicate_work",
    }
    assert [r.issue_number for r in decision.ranked] == [10, 9]
    assert decision.considered == len(decision.ranked) + len(decision.skipped) == len(candidates) == 12
    # own_claim only arises with resume_own=False (auto-allocation giving an owner a further issue).
    assert set(reasons(decision).values()) | {"invalid_candidate", "own_claim"} == set(SKIP_REASONS)
    assert BLOCK_REASONS == ("excluded_owned_lease",)


def test_all_candidates_excluded_returns_canonical_wait() -> None:
    """AC7: every otherwise-eligible candidate excluded -> WAIT, no selection, every exclusion accounted."""
    policy = RankingPolicy(protected_labels=frozenset({"priority:p2"}))
    decision = run(CANARY, [617, 776], policy=policy)
    assert isinstance(decision, WaitDecision)
    assert decision.wait_reason == "all_excluded"
    body = decision.to_dict()
    assert (body["decision"], body["issue_number"], body["ranked"]) == ("wait", None, [])
    assert reasons(decision) == {617: "excluded_by_controller", 776: "excluded_by_controller", 612: "protected_label"}


@pytest.mark.parametrize(
    ("candidates", "leases", "wait_reason"),
    [
        ([], [], "no_candidates"),
        ("[]", [], "no_candidates"),
        ([{"issue_number": 1, "ready": False}, {"issue_number": 2}], [lease(2)], "none_eligible"),
    ],
)
def test_nothing_eligible_returns_wait(candidates: object, leases: list[LiveLease], wait_reason: str) -> None:
    """AC7: an empty or fully held candidate set waits and names why."""
    decision = run(candidates, leases=leases)
    assert isinstance(decision, WaitDecision)
    assert decision.wait_reason == wait_reason


def test_same_owner_live_lease_is_resumed() -> None:
    """AC9: the caller's live lease on a non-excluded candidate is resumed, even over a higher rank."""
    own = lease(612, ME)
    decision = run(CANARY, leases=[own])
    assert isinstance(decision, ResumeDecision)
    assert decision.lease == own
    assert decision.to_dict()["lease"]["lease_id"] == own.lease_id
    assert [r.owned_lease_id for r in decision.ranked if r.issue_number == 612] == [own.lease_id]


def test_same_owner_lease_outside_the_candidates_is_resumed() -> None:
    """AC9: the caller's current work is resumed even when the controller's list omits it."""
    own = lease(900, ME)
    decision = run(CANARY, leases=[own])
    assert isinstance(decision, ResumeDecision)
    assert decision.issue_number == 900


@pytest.mark.parametrize(
    ("candidates", "expected"),
    [
        # priority label order, unlabelled last
        ([{"issue_number": 1}, {"issue_number": 2, "labels": ["priority:p3"]},
          {"issue_number": 3, "labels": ["priority:p0"]}], [3, 2, 1]),
        # the highest priority label of a candidate counts
        ([{"issue_number": 1, "labels": ["priority:p2"]},
          {"issue_number": 2, "labels": ["priority:p3", "priority:p1"]}], [2, 1]),
        # same priority: oldest first, compared as instants across offsets; undated after dated
        ([{"issue_number": 1}, {"issue_number": 2, "created_at": "2026-07-20T10:00:00+00:00"},
          {"issue_number": 3, "created_at": "2026-07-20T06:00:00-05:00"}], [2, 3, 1]),
        # everything equal: issue number ascending
        ([{"issue_number": 30}, {"issue_number": 4}, {"issue_number": 12}], [4, 12, 30]),
        # priority beats age
        ([{"issue_number": 1, "created_at": "2020-01-01T00:00:00Z"},
          {"issue_number": 2, "labels": ["priority:p1"], "created_at": "2026-01-01T00:00:00Z"}], [2, 1]),
    ],
)
def test_ranking_order(candidates: list[dict[str, Any]], expected: list[int]) -> None:
    """AC2/AC9: ranking is priority label, then age (undated last), then issue number."""
    decision = run(candidates)
    assert [r.issue_number for r in decision.ranked] == expected
    assert isinstance(decision, SelectDecision)
    assert decision.issue_number == expected[0]


def test_every_result_type_renders_to_json() -> None:
    """AC9: each result kind has a to_dict() that is plain JSON with the common accounting keys."""
    decisions = [
        run(CANARY),
        run(CANARY, leases=[lease(612, ME)]),
        run(CANARY, [617, 776, 612]),
        run(CANARY, [617], leases=[lease(617, ME)]),
        run("{"),
    ]
    assert [d.kind for d in decisions] == ["select", "resume", "wait", "blocked", "invalid"]
    for decision in decisions:
        body = json.loads(json.dumps(decision.to_dict()))
        assert {"decision", "issue_number", "fingerprint", "considered", "ranked", "skipped", "exclusions"} <= set(body)


def test_naive_now_is_a_programming_error() -> None:
    """The core refuses to compare lease expiry against a clock without an offset."""
    with pytest.raises(ValueError, match="timezone-aware"):
        run(CANARY, now=datetime(2026, 7, 21))


# --- fingerprint and apply (AC4) --------------------------------------------------------------------------------------


def test_fingerprint_is_stable_under_reordering_of_inputs() -> None:
    """AC4: candidate, exclusion and lease order carry no meaning, so they do not move the fingerprint."""
    leases = [lease(612), lease(900, ME, minutes=-1), lease(776, ME)]
    a = run(CANARY, [617, 1, 2], leases=leases)
    b = run(list(reversed(CANARY)), [2, 617, 1], leases=list(reversed(leases)))
    assert a.fingerprint is not None
    assert a.fingerprint == b.fingerprint
    assert a.to_dict() == b.to_dict()


def test_dry_run_and_apply_with_same_inputs_pass_check_apply() -> None:
    """AC4: dry-run (JSON transport) and apply (decoded transport) agree, so apply is allowed."""
    dry = run(json.dumps(CANARY), "[617]")
    fresh = run(CANARY, [617])
    assert dry.fingerprint is not None
    assert check_apply(dry.fingerprint, fresh) is None


@pytest.mark.parametrize(
    ("change", "part"),
    [
        ({"leases": [lease(776)]}, "leases"),
        ({"exclude": [617, 612]}, "exclusions"),
        ({"exclude": None}, "exclusions"),
        ({"candidates": [*CANARY, {"issue_number": 5}]}, "candidates"),
        ({"candidates": [{**CANARY[1], "labels": ["priority:p0"]}, CANARY[0], CANARY[2]]}, "candidates"),
        ({"policy": RankingPolicy(protected_labels=frozenset({"x"}))}, "exclusions"),
        ({"policy": RankingPolicy(priority_labels=("priority:p1", "priority:p0"))}, "policy"),
        ({"owner": OTHER}, "owner"),
    ],
)
def test_material_change_changes_fingerprint_and_apply_rejects_drift(change: dict[str, Any], part: str) -> None:
    """AC4: any material change gives a new fingerprint; apply gets a conflict naming it, never a silent lease."""
    base: dict[str, Any] = {"candidates": CANARY, "exclude": [617]}
    dry = run(base["candidates"], base["exclude"])
    kwargs = {k: v for k, v in change.items() if k not in ("candidates", "exclude")}
    fresh = run(change.get("candidates", base["candidates"]), change.get("exclude", base["exclude"]), **kwargs)
    assert fresh.fingerprint != dry.fingerprint
    assert dry.fingerprint is not None
    envelope = check_apply(dry.fingerprint, fresh, expected_parts=dry.fingerprint_parts)
    assert envelope is not None
    assert envelope.error == "stale_pin"
    assert envelope.details["fingerprint"] == fresh.fingerprint
    assert envelope.details["expected_fingerprint"] == dry.fingerprint
    assert part in envelope.details["changed"]
    assert fresh.fingerprint is not None
    assert fresh.fingerprint in envelope.exact_next_action


def test_dependency_closing_changes_fingerprint_but_unrelated_open_issues_do_not() -> None:
    """AC4: a dependency that closes between dry-run and apply is drift; other issues opening is not."""
    candidates = [*CANARY, {"issue_number": 1, "labels": ["priority:p0"], "depends_on": [50]}]
    held = run(candidates, [617], open_issues=frozenset({50, 60}))
    assert reasons(held)[1] == "dependency_open"
    assert run(candidates, [617], open_issues=frozenset({50, 61})).fingerprint == held.fingerprint
    released = run(candidates, [617], open_issues=frozenset({60}))
    assert isinstance(released, SelectDecision)
    assert released.issue_number == 1
    assert held.fingerprint is not None
    envelope = check_apply(held.fingerprint, released, expected_parts=held.fingerprint_parts)
    assert envelope is not None
    assert envelope.details["changed"] == ["open_dependencies"]
    assert envelope.details["fresh_issue_number"] == 1


def test_fingerprint_ignores_what_cannot_change_the_decision() -> None:
    """AC4: heartbeats, titles, unrelated labels, offsets and unrelated leases do not cause spurious drift."""
    base = run(CANARY, [617], leases=[lease(612)])
    same_instant = [{**CANARY[0], "created_at": "2026-06-30T19:00:00-05:00"}, CANARY[1], CANARY[2]]
    retitled = [{**c, "title": "renamed", "labels": [*c.get("labels", []), "kind:bug"]} for c in CANARY]
    for candidates, leases in [
        (CANARY, [lease(612, minutes=90)]),  # heartbeat moved expires_at
        (retitled, [lease(612)]),
        (same_instant, [lease(612)]),
        (CANARY, [lease(612), lease(4242)]),  # foreign lease elsewhere
    ]:
        assert run(candidates, [617], leases=leases).fingerprint == base.fingerprint


@pytest.mark.parametrize("expected", ["abc", "A" * 64, 123])
def test_check_apply_refuses_a_malformed_expected_fingerprint(expected: Any) -> None:
    """AC4: a pin that cannot be a fingerprint is an input error, not a pass."""
    envelope = check_apply(expected, run(CANARY))
    assert envelope is not None
    assert envelope.error == "invalid_input"


def test_check_apply_without_a_pin_only_refuses_invalid_input() -> None:
    """AC4/AC9: apply without --expect-fingerprint keeps working as before."""
    assert check_apply(None, run(CANARY)) is None


# --- properties -------------------------------------------------------------------------------------------------------

_LABELS = ("priority:p0", "priority:p1", "priority:p3", "hold", "kind:bug")
# Two of these are the same instant written with different offsets: ties must still be deterministic.
_DATES = (
    None,
    "2026-07-01T00:00:00Z", "2026-07-01T00:00:00+02:00", "2026-06-30T22:00:00Z", "2025-01-01T09:30:00-05:00",
)

candidate_records = st.lists(
    st.fixed_dictionaries(
        {"issue_number": st.integers(1, 25)},
        optional={
            "labels": st.lists(st.sampled_from(_LABELS), max_size=3),
            "created_at": st.sampled_from(_DATES),
            "depends_on": st.lists(st.integers(26, 30), max_size=2),
            "ready": st.booleans(),
        },
    ),
    max_size=12,
    unique_by=lambda r: str(r["issue_number"]),
)
lease_snapshots = st.lists(
    st.builds(
        lambda issue, owner, minutes: lease(issue, owner, minutes=minutes, lease_id=f"L{issue}{owner}{minutes}"),
        st.integers(1, 32),
        st.sampled_from([ME, OTHER]),
        st.sampled_from([-10, -1, 1, 30]),
    ),
    max_size=5,
)
policies = st.builds(
    lambda numbers, labels: RankingPolicy(protected_issue_numbers=numbers, protected_labels=labels),
    st.frozensets(st.integers(1, 25), max_size=3),
    st.frozensets(st.sampled_from(["hold", "kind:bug"]), max_size=1),
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(
    records=candidate_records,
    exclude=st.lists(st.integers(1, 30), max_size=6),
    leases=lease_snapshots,
    policy=policies,
    open_issues=st.frozensets(st.integers(26, 30)),
)
def test_property_an_excluded_issue_is_never_selected_or_resumed(
    records: list[dict[str, Any]],
    exclude: list[int],
    leases: list[LiveLease],
    policy: RankingPolicy,
    open_issues: frozenset[int],
) -> None:
    """AC2/AC5/AC7: for any candidate set, no excluded or protected issue gets (or keeps) a lease."""
    decision = run(records, exclude, leases=leases, policy=policy, open_issues=open_issues)
    barred = set(exclude) | policy.protected_issue_numbers
    barred |= {r["issue_number"] for r in records if set(r.get("labels", [])) & policy.protected_labels}
    if isinstance(decision, SelectDecision | ResumeDecision):
        assert decision.issue_number not in barred
    if isinstance(decision, SelectDecision):
        foreign = {x.issue_number for x in leases if x.owner != ME and x.expires_at > NOW}
        assert decision.issue_number not in foreign
    assert not {r.issue_number for r in decision.ranked} & barred
    assert decision.considered == len(decision.ranked) + len(decision.skipped) == len(records)


@FAST
@given(
    records=candidate_records,
    exclude=st.lists(st.integers(1, 30), max_size=6),
    leases=lease_snapshots,
    policy=policies,
    seed=st.integers(0, 2**32 - 1),
)
def test_property_decide_is_deterministic_and_input_order_independent(
    records: list[dict[str, Any]],
    exclude: list[int],
    leases: list[LiveLease],
    policy: RankingPolicy,
    seed: int,
) -> None:
    """AC4: same inputs in any order (and either transport) give the same decision and fingerprint."""
    shuffle = random.Random(seed)
    first = run(records, exclude, leases=leases, policy=policy).to_dict()
    records2, exclude2, leases2 = list(records), list(exclude), list(leases)
    for items in (records2, exclude2, leases2):
        shuffle.shuffle(items)
    second = run(json.dumps(records2), json.dumps(exclude2), leases=leases2, policy=policy).to_dict()
    assert first == second
    assert run(records, exclude, leases=leases, policy=policy).to_dict() == first
