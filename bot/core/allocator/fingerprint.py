"""The decision's fingerprint: a digest of the material inputs only, pinned between dry-run and apply (seed AC4)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from bot.core.allocator.records import Candidate, LiveLease, RankingPolicy, exclusions_view
from bot.core.digest import fingerprint_digest

FINGERPRINT_VERSION: Final[int] = 2
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def lease_state(lease: LiveLease, owner: str, policy: RankingPolicy, now: datetime) -> str | None:
    """live / grace (foreign, expired less than the grace ago) / None when it no longer matters."""
    if lease.is_live(now):
        return "live"
    if lease.owner != owner and now < lease.expires_at + policy.lease_grace:
        return "grace"
    return None


def decision_fingerprint(
    owner: str,
    candidates: Sequence[Candidate],
    caller_exclusions: frozenset[int],
    open_issue_numbers: frozenset[int],
    policy: RankingPolicy,
    leases: Sequence[LiveLease],
    now: datetime,
) -> tuple[str, dict[str, str]]:
    """SHA-256 over the material inputs only, in canonical JSON (sorted keys, sets sorted).

    Material means "could change the decision": titles, labels that are neither priority nor protected,
    open issues nobody depends on, heartbeats that only move ``expires_at``, and leases on issues that
    are neither candidates nor held by the owner are left out, so unrelated activity between dry-run
    and apply does not raise a spurious conflict.
    """
    relevant_labels = set(policy.priority_labels) | policy.protected_labels
    numbers = {c.issue_number for c in candidates}
    deps = {d for c in candidates for d in c.depends_on}
    lease_rows = []
    for lease in leases:
        if lease.issue_number not in numbers and lease.owner != owner:
            continue
        state = lease_state(lease, owner, policy, now)
        if state is None:
            continue
        lease_rows.append(
            {"issue_number": lease.issue_number, "owner": lease.owner, "role": lease.role,
             "lease_id": lease.lease_id, "state": state}
        )
    parts_values: dict[str, object] = {
        "owner": owner,
        # one compact row per candidate, [number, relevant labels, created_at as UTC microseconds, depends_on,
        # ready]; candidates arrive sorted by number from normalize_candidates (FINGERPRINT_VERSION 2)
        "candidates": [
            [
                c.issue_number,
                [label for label in c.labels if label in relevant_labels],
                None if c.created_at is None else (c.created_at - _UNIX_EPOCH) // _MICROSECOND,
                c.depends_on,
                c.ready,
                *([True] if owner in c.barred_owners else []),  # barred for this owner (review candidates)
            ]
            for c in candidates
        ],
        "exclusions": exclusions_view(caller_exclusions, policy),
        "policy": {
            "priority_labels": list(policy.priority_labels),  # order is the ranking: not sorted
            "lease_grace_seconds": policy.lease_grace.total_seconds(),
        },
        "open_dependencies": sorted(deps & (open_issue_numbers | numbers)),
        "leases": sorted(lease_rows, key=lambda r: (r["issue_number"], r["owner"], r["lease_id"])),
    }
    parts = {name: fingerprint_digest(value) for name, value in parts_values.items()}
    return fingerprint_digest({"version": FINGERPRINT_VERSION, "parts": parts}), parts

