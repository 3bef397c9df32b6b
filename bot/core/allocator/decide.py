"""The decision itself (its screening and ranking are bot/core/allocator/screen.py's), and the apply gate."""

from __future__ import annotations

import gc
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

# The decision kinds by their module (decisions.SelectDecision): the package's __init__ lists them for its callers.
import bot.core.allocator.decisions as decisions
from bot.core.allocator.candidates import (
    DEPENDS_ON,
    NUMBER,
    PLAIN,
    LabelSets,
    Row,
    normalize_exclusions,
    normalize_rows,
    row_candidate,
)
from bot.core.allocator.fingerprint import LeaseRow, decision_fingerprint, relevant_label_texts
from bot.core.allocator.records import (
    EXCLUSION_REASONS,
    AllocationRequest,
    Blocker,
    InputError,
    InputProblem,
    LiveLease,
    RankingPolicy,
    Skipped,
    WaitReason,
    exclusions_view,
    input_envelope,
    require_aware,
)
from bot.core.allocator.screen import (
    Inputs,
    LeaseStates,
    Screened,
    blockers_of,
    first_lease,
    lease_states,
    rank,
    screen,
    set_priorities,
)
from bot.core.errors import Envelope

_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)


def _invalid(
    problems: Sequence[InputProblem], policy: RankingPolicy, caller: frozenset[int]
) -> decisions.InvalidDecision:
    skipped: list[Skipped] = []
    seen: set[int | None] = set()
    for p in problems:
        if p.input != "candidates_json" or p.index is None or p.index in seen:
            continue
        seen.add(p.index)
        skipped.append(Skipped(p.issue_number, "invalid_candidate", p.describe()))
    return decisions.InvalidDecision(
        fingerprint=None,
        fingerprint_parts={},
        considered=0,
        ranked=(),
        skipped=tuple(skipped),
        exclusions=exclusions_view(caller, policy),
        envelope=input_envelope(problems),
    )


def decide(
    request: AllocationRequest,
    policy: RankingPolicy,
    leases: Sequence[LiveLease],
    now: datetime,
) -> decisions.AllocationDecision:
    """Decide what ``request.owner`` should work on next; pure and deterministic.

    The result does not depend on the order of candidates, exclusions or leases. ``leases`` is the
    store's snapshot of unreleased leases taken immediately before the call (apply must take it inside
    the same transaction that creates the lease). ``now`` must be timezone-aware.

    The cyclic garbage collector is paused while it runs (and restored as it was): a decision builds a few
    objects per candidate, none of them in a reference cycle (tests/test_allocator_fast_paths.py checks that nothing
    is left for the collector), yet with 100k candidates the allocations alone set off full collections that
    walk the caller's whole heap, about a third of the time at that size (docs/benchmarks.md).
    """
    require_aware(now, "now")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _decide(request, policy, leases, now)
    finally:
        if was_enabled:
            gc.enable()


def _decide(
    request: AllocationRequest,
    policy: RankingPolicy,
    leases: Sequence[LiveLease],
    now: datetime,
) -> decisions.AllocationDecision:
    """:func:`decide`'s steps: validate, each lease's state, the fingerprint, screen, rank, then the outcome."""
    inputs = _normalized(request, policy)
    if isinstance(inputs, decisions.InvalidDecision):
        return inputs
    held = lease_states(leases, request.owner, inputs.numbers, policy.lease_grace, now)
    common = _common(inputs, held.rows)
    screened = screen(inputs, held)
    blockers = blockers_of(inputs, held.own_live, screened.own_rows)
    ranked_rows, ranked = rank(screened.eligible, set_priorities(inputs.sets, policy), screened.owned, policy)
    common["ranked"] = ranked
    common["skipped"] = tuple(screened.skipped)
    if blockers:
        return decisions.BlockedDecision(**common, blockers=tuple(blockers), envelope=_blocked_envelope(blockers))
    return _outcome(inputs, common, ranked_rows, screened, held)


def _normalized(request: AllocationRequest, policy: RankingPolicy) -> decisions.InvalidDecision | Inputs:
    """The request validated; every problem of it at once when it is not."""
    caller_raw_problems: list[InputProblem] = []
    caller: frozenset[int] = frozenset()
    try:
        caller = normalize_exclusions(request.exclude_issue_numbers)
    except InputError as exc:
        caller_raw_problems.extend(exc.problems)
    rows: list[Row] = []
    label_sets = LabelSets()
    try:
        rows, label_sets = normalize_rows(request.candidates)
    except InputError as exc:
        caller_raw_problems.extend(exc.problems)
    if not isinstance(request.owner, str) or not request.owner:
        caller_raw_problems.append(
            InputProblem(input="owner", index=None, field="owner", problem="the requesting owner is empty")
        )
    if caller_raw_problems:
        return _invalid(caller_raw_problems, policy, caller)
    return Inputs(request, policy, caller, rows, label_sets.sets, {row[NUMBER] for row in rows})


def _common(inputs: Inputs, lease_rows: list[LeaseRow]) -> dict[str, Any]:
    """What every decision kind carries: the fingerprint and its parts, how many were considered, the exclusions."""
    request, policy, caller, rows, sets, numbers = inputs
    dependencies = {d for row in rows if not row[PLAIN] and row[DEPENDS_ON] for d in row[DEPENDS_ON]}
    fingerprint, parts = decision_fingerprint(
        request.owner, rows, relevant_label_texts(sets, frozenset(policy.priority_labels) | policy.protected_labels),
        numbers, dependencies, caller, request.open_issue_numbers, policy, lease_rows,
    )
    return {
        "fingerprint": fingerprint,
        "fingerprint_parts": parts,
        "considered": len(rows),
        "exclusions": exclusions_view(caller, policy),
    }


def _outcome(
    inputs: Inputs, common: dict[str, Any], ranked_rows: list[Row], screened: Screened, held: LeaseStates
) -> decisions.AllocationDecision:
    """Resume the owner's own work, else select the top of the ranking, else wait, saying why."""
    request, _policy, _caller, rows, sets, numbers = inputs
    owned = screened.owned
    resumable = [owned[row[NUMBER]] for row in ranked_rows if row[NUMBER] in owned] if owned else []
    if not resumable and request.resume_own:
        # The owner's live lease on an issue outside the candidate set is still its current work.
        resumable = [
            first_lease(own) for number, own in sorted(held.own_live.items())
            if number not in numbers and number not in held.foreign_live
        ]
    if resumable:
        return decisions.ResumeDecision(**common, lease=resumable[0])
    if ranked_rows:
        return decisions.SelectDecision(**common, candidate=row_candidate(ranked_rows[0], sets))
    wait_reason: WaitReason
    if not rows:
        wait_reason = "no_candidates"
    elif all(s.reason in EXCLUSION_REASONS for s in screened.skipped):
        wait_reason = "all_excluded"
    else:
        wait_reason = "none_eligible"
    return decisions.WaitDecision(**common, wait_reason=wait_reason)


def _blocked_envelope(blockers: Sequence[Blocker]) -> Envelope:
    first = blockers[0]
    numbers = ", ".join(f"#{b.issue_number}" for b in blockers)
    return Envelope(
        error="invalid_state",
        message=(
            f"you hold a live lease on excluded issue(s) {numbers}; allocating something else would strand it, "
            "so nothing was allocated"
        ),
        remediate=(
            "Release the lease on each excluded issue, or, if the exclusion was a mistake, drop the issue "
            "from exclude_issue_numbers (or the protected configuration) and resume it."
        ),
        exact_next_action=(
            f"Call gitea_release_lease with issue_number={first.issue_number} "
            f"(lease {first.lease.lease_id}), then call gitea_allocate_next_work again."
        ),
        details={"blockers": [b.to_dict() for b in blockers]}, reason="excluded_owned_lease",
    )


def check_apply(
    expected_fingerprint: str | None,
    fresh: decisions.AllocationDecision,
    *,
    expected_parts: Mapping[str, str] | None = None,
) -> Envelope | None:
    """Gate an apply on the dry-run's fingerprint: None means "no drift, go on with ``fresh``".

    ``fresh`` is :func:`decide` re-run on the apply's own inputs and lease snapshot. Returns the
    refusal when ``fresh`` is invalid, when ``expected_fingerprint`` is not a SHA-256 hex digest
    (``invalid_input``), or when it differs from ``fresh.fingerprint`` (``stale_pin``, with the new
    fingerprint, the fresh outcome and, if the dry-run's ``fingerprint_parts`` are passed back, which
    parts changed). ``expected_fingerprint=None`` means the caller pinned nothing (behaviour before
    fingerprints existed) and only an invalid ``fresh`` is refused. ``wait`` and ``blocked`` are not
    drift: the caller renders them as they are and leases nothing.
    """
    if isinstance(fresh, decisions.InvalidDecision):
        return fresh.envelope
    if expected_fingerprint is None:
        return None
    if not isinstance(expected_fingerprint, str) or not _HEX64.fullmatch(expected_fingerprint):
        return Envelope(
            error="invalid_input",
            message="expected fingerprint is not a 64-character lowercase SHA-256 hex digest",
            remediate="Pass the fingerprint exactly as the dry-run returned it.",
            exact_next_action="Run gitea_allocate_next_work as a dry-run and pass its fingerprint back on apply.",
            details={"expected_fingerprint": expected_fingerprint},
        )
    if expected_fingerprint == fresh.fingerprint:
        return None
    details: dict[str, Any] = {
        "expected_fingerprint": expected_fingerprint,
        "fingerprint": fresh.fingerprint,
        "fresh_decision": fresh.kind,
        "fresh_issue_number": fresh.issue_number,
    }
    if expected_parts is not None:
        details["changed"] = sorted(
            name for name in set(expected_parts) | set(fresh.fingerprint_parts)
            if expected_parts.get(name) != fresh.fingerprint_parts.get(name)
        )
    return Envelope(
        error="stale_pin",
        message=(
            "the candidates, exclusions, policy or live leases changed since the dry-run; "
            "nothing was leased rather than lease a different candidate"
        ),
        remediate="Review the fresh dry-run result and apply again with its fingerprint if it is still wanted.",
        exact_next_action=(
            "Call gitea_allocate_next_work as a dry-run again and apply with the new fingerprint "
            f"{fresh.fingerprint}."
        ),
        details=details,
        reason="fingerprint_mismatch",
    )
