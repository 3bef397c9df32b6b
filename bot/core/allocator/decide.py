"""The decision itself: exclusions, live ownership, readiness, ranking, and the apply gate."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from bot.core.allocator.candidates import normalize_candidates, normalize_exclusions
from bot.core.allocator.decisions import (
    AllocationDecision,
    BlockedDecision,
    InvalidDecision,
    ResumeDecision,
    SelectDecision,
    WaitDecision,
)
from bot.core.allocator.fingerprint import decision_fingerprint, lease_state
from bot.core.allocator.records import (
    EXCLUSION_REASONS,
    AllocationRequest,
    Blocker,
    Candidate,
    InputError,
    InputProblem,
    LiveLease,
    RankedCandidate,
    RankingPolicy,
    Skipped,
    SkipReason,
    WaitReason,
    exclusions_view,
    input_envelope,
    require_aware,
)
from bot.core.errors import Envelope

_EPOCH = datetime.min.replace(tzinfo=UTC)
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)


def _invalid(problems: Sequence[InputProblem], policy: RankingPolicy, caller: frozenset[int]) -> InvalidDecision:
    skipped: list[Skipped] = []
    seen: set[int | None] = set()
    for p in problems:
        if p.input != "candidates_json" or p.index is None or p.index in seen:
            continue
        seen.add(p.index)
        skipped.append(Skipped(p.issue_number, "invalid_candidate", p.describe()))
    return InvalidDecision(
        fingerprint=None,
        fingerprint_parts={},
        considered=0,
        ranked=(),
        skipped=tuple(skipped),
        exclusions=exclusions_view(caller, policy),
        envelope=input_envelope(problems),
    )


def _exclusion_reason(
    number: int, labels: Iterable[str], caller: frozenset[int], policy: RankingPolicy
) -> tuple[SkipReason, str] | None:
    if number in caller:
        return "excluded_by_controller", f"#{number} is in exclude_issue_numbers"
    if number in policy.protected_issue_numbers:
        return "protected_issue", f"#{number} is a configured protected issue"
    protected = sorted(set(labels) & policy.protected_labels)
    if protected:
        return "protected_label", f"#{number} carries protected label(s) {', '.join(protected)}"
    return None


def _rank(
    eligible: Sequence[Candidate], owned: Mapping[int, LiveLease], policy: RankingPolicy
) -> tuple[list[Candidate], tuple[RankedCandidate, ...]]:
    """Priority label (policy order, unlabelled last), then ``created_at`` (undated last), then issue number."""
    prio = {label: i for i, label in enumerate(policy.priority_labels)}
    unlabelled = len(prio)
    keyed = []
    for c in eligible:
        p = min([prio[label] for label in c.labels if label in prio], default=unlabelled)
        # one tzinfo for all keys: comparing datetimes with different offsets is several times slower
        when = c.created_at.astimezone(UTC) if c.created_at is not None else _EPOCH
        keyed.append((p, 0 if c.created_at is not None else 1, when, c.issue_number, c))
    keyed.sort(key=lambda k: k[:4])
    labels_by_rank = policy.priority_labels
    ranked = tuple(
        RankedCandidate(
            rank=i + 1,
            issue_number=k[3],
            priority_label=labels_by_rank[k[0]] if k[0] < unlabelled else None,
            created_at=k[4].created_at,
            owned_lease_id=owned[k[3]].lease_id if k[3] in owned else None,
        )
        for i, k in enumerate(keyed)
    )
    return [k[4] for k in keyed], ranked


def decide(
    request: AllocationRequest,
    policy: RankingPolicy,
    leases: Sequence[LiveLease],
    now: datetime,
) -> AllocationDecision:
    """Decide what ``request.owner`` should work on next; pure and deterministic.

    The result does not depend on the order of candidates, exclusions or leases. ``leases`` is the
    store's snapshot of unreleased leases taken immediately before the call (apply must take it inside
    the same transaction that creates the lease). ``now`` must be timezone-aware.
    """
    require_aware(now, "now")
    caller_raw_problems: list[InputProblem] = []
    caller: frozenset[int] = frozenset()
    try:
        caller = normalize_exclusions(request.exclude_issue_numbers)
    except InputError as exc:
        caller_raw_problems.extend(exc.problems)
    candidates: list[Candidate] = []
    try:
        candidates = normalize_candidates(request.candidates)
    except InputError as exc:
        caller_raw_problems.extend(exc.problems)
    if not isinstance(request.owner, str) or not request.owner:
        caller_raw_problems.append(
            InputProblem(input="owner", index=None, field="owner", problem="the requesting owner is empty")
        )
    if caller_raw_problems:
        return _invalid(caller_raw_problems, policy, caller)

    owner = request.owner
    by_number = {c.issue_number: c for c in candidates}
    open_numbers = request.open_issue_numbers | by_number.keys()
    fingerprint, parts = decision_fingerprint(
        owner, candidates, caller, request.open_issue_numbers, policy, leases, now
    )
    common: dict[str, Any] = {
        "fingerprint": fingerprint,
        "fingerprint_parts": parts,
        "considered": len(candidates),
        "exclusions": exclusions_view(caller, policy),
    }

    own_live: dict[int, list[LiveLease]] = {}
    foreign_live: dict[int, list[LiveLease]] = {}
    foreign_grace: dict[int, list[LiveLease]] = {}
    for lease in leases:
        state = lease_state(lease, owner, policy, now)
        if state == "live":
            (own_live if lease.owner == owner else foreign_live).setdefault(lease.issue_number, []).append(lease)
        elif state == "grace":
            foreign_grace.setdefault(lease.issue_number, []).append(lease)

    def first(found: list[LiveLease]) -> LiveLease:
        return min(found, key=lambda lease: (lease.owner, lease.lease_id))

    # Own live leases on excluded issues, candidates or not: they would be stranded (AC5).
    blockers: list[Blocker] = []
    for number, held in sorted(own_live.items() if request.resume_own else ()):
        candidate = by_number.get(number)
        excluded = _exclusion_reason(number, candidate.labels if candidate else (), caller, policy)
        if excluded is not None:
            blockers.append(
                Blocker(issue_number=number, reason="excluded_owned_lease", lease=first(held), excluded_as=excluded[0])
            )

    skipped: list[Skipped] = []
    eligible: list[Candidate] = []
    owned: dict[int, LiveLease] = {}
    for candidate in candidates:
        number = candidate.issue_number
        excluded = _exclusion_reason(number, candidate.labels, caller, policy)
        if excluded is not None:
            skipped.append(Skipped(number, *excluded))
        elif owner in candidate.barred_owners:
            skipped.append(Skipped(number, "self_review",
                                   f"{owner} wrote or implemented #{number}'s pull request and cannot review it"))
        elif number in foreign_live:
            holder = first(foreign_live[number])
            skipped.append(
                Skipped(number, "foreign_claim", f"#{number} is leased to {holder.owner} (lease {holder.lease_id})")
            )
        elif number in own_live and not request.resume_own:
            skipped.append(Skipped(number, "own_claim", f"#{number} is already leased to {owner}"))
        elif number in own_live:
            owned[number] = first(own_live[number])
            eligible.append(candidate)
        elif candidate.duplicate is not None:
            skipped.append(Skipped(number, "duplicate_work", f"#{number}: {candidate.duplicate}"))
        elif number in foreign_grace:
            holder = first(foreign_grace[number])
            skipped.append(
                Skipped(number, "lease_grace",
                        f"#{number}: lease {holder.lease_id} of {holder.owner} expired at "
                        f"{holder.expires_at.isoformat()}, reclaimable after the {policy.lease_grace} grace")
            )
        elif not candidate.ready:
            skipped.append(Skipped(number, "not_ready", f"#{number} is not marked status:ready"))
        else:
            held_by = sorted(d for d in candidate.depends_on if d in open_numbers)
            if held_by:
                skipped.append(
                    Skipped(number, "dependency_open",
                            f"#{number} depends on open issue(s) {', '.join(f'#{d}' for d in held_by)}")
                )
            else:
                eligible.append(candidate)

    eligible, ranked = _rank(eligible, owned, policy)
    common["ranked"] = ranked
    common["skipped"] = tuple(skipped)

    if blockers:
        return BlockedDecision(**common, blockers=tuple(blockers), envelope=_blocked_envelope(blockers))

    resumable = [owned[c.issue_number] for c in eligible if c.issue_number in owned]
    if not resumable and request.resume_own:
        # The owner's live lease on an issue outside the candidate set is still its current work.
        resumable = [
            first(held) for number, held in sorted(own_live.items())
            if number not in by_number and number not in foreign_live
        ]
    if resumable:
        return ResumeDecision(**common, lease=resumable[0])

    if eligible:
        return SelectDecision(**common, candidate=eligible[0])

    wait_reason: WaitReason
    if not candidates:
        wait_reason = "no_candidates"
    elif all(s.reason in EXCLUSION_REASONS for s in skipped):
        wait_reason = "all_excluded"
    else:
        wait_reason = "none_eligible"
    return WaitDecision(**common, wait_reason=wait_reason)


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
        details={"reason": "excluded_owned_lease", "blockers": [b.to_dict() for b in blockers]},
    )


def check_apply(
    expected_fingerprint: str | None,
    fresh: AllocationDecision,
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
    if isinstance(fresh, InvalidDecision):
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
        "reason": "fingerprint_mismatch",
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
    )
