"""The decision's fingerprint: a digest of the material inputs only, pinned between dry-run and apply (seed AC4)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from bot.core.allocator.records import Candidate, LiveLease, RankingPolicy, exclusions_view
from bot.core.digest import fingerprint_digest

FINGERPRINT_VERSION: Final[int] = 2
UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def utc_micros(when: datetime | None) -> int | None:
    """``when`` as integer microseconds since the Unix epoch (None stays None): the fingerprint's and the rank's key."""
    return None if when is None else (when - UNIX_EPOCH) // MICROSECOND


def _json_text(value: object) -> str:
    """Compact, ASCII-escaped JSON text: the form :func:`bot.core.digest.fingerprint_digest` hashes."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _candidate_rows_digest(owner: str, candidates: Sequence[Candidate], created_micros: Sequence[int | None],
                           relevant_labels: frozenset[str]) -> str:
    """:func:`bot.core.digest.fingerprint_digest` of the candidate rows, written as text row by row.

    Each row is ``[number, relevant labels, created_at as UTC microseconds, depends_on, ready]`` plus ``true``
    when the candidate is barred for ``owner`` (review candidates). The values are already exact JSON scalars
    (validated ints, bools, None, strings), so the text is byte for byte what the canonical dump of the same lists
    gives (tests/test_allocator_fast_paths.py compares them) without a copying walk and without a tracked object per
    row. Label sets and dependency lists repeat, so each distinct one is rendered once.
    """
    labels_text: dict[tuple[str, ...], str] = {(): "[]"}
    deps_text: dict[tuple[int, ...], str] = {(): "[]"}
    rows: list[str] = []
    append = rows.append
    for c, micros in zip(candidates, created_micros, strict=True):
        labels = c.labels
        kept = labels_text.get(labels)
        if kept is None:
            kept = labels_text[labels] = _json_text([label for label in labels if label in relevant_labels])
        deps = deps_text.get(c.depends_on)
        if deps is None:
            deps = deps_text[c.depends_on] = _json_text(list(c.depends_on))
        barred = ",true" if c.barred_owners and owner in c.barred_owners else ""
        append(f"[{c.issue_number},{kept},{'null' if micros is None else micros},{deps},"
               f"{'true' if c.ready else 'false'}{barred}]")
    return hashlib.sha256(("[" + ",".join(rows) + "]").encode("ascii")).hexdigest()


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
    created_micros: Sequence[int | None] | None = None,
) -> tuple[str, dict[str, str]]:
    """SHA-256 over the material inputs only, in canonical JSON (sorted keys, sets sorted).

    Material means "could change the decision": titles, labels that are neither priority nor protected,
    open issues nobody depends on, heartbeats that only move ``expires_at``, and leases on issues that
    are neither candidates nor held by the owner are left out, so unrelated activity between dry-run
    and apply does not raise a spurious conflict. ``created_micros`` is :func:`utc_micros` of each
    candidate's ``created_at`` in the same order, when the caller has it already.
    """
    relevant_labels = frozenset(policy.priority_labels) | policy.protected_labels
    numbers = {c.issue_number for c in candidates}
    deps = {d for c in candidates if c.depends_on for d in c.depends_on}
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
    if created_micros is None:
        created_micros = [utc_micros(c.created_at) for c in candidates]
    parts_values: dict[str, object] = {
        "owner": owner,
        "exclusions": exclusions_view(caller_exclusions, policy),
        "policy": {
            "priority_labels": list(policy.priority_labels),  # order is the ranking: not sorted
            "lease_grace_seconds": policy.lease_grace.total_seconds(),
        },
        "open_dependencies": sorted(deps & (open_issue_numbers | numbers)),
        "leases": sorted(lease_rows, key=lambda r: (r["issue_number"], r["owner"], r["lease_id"])),
    }
    parts = {name: fingerprint_digest(value) for name, value in parts_values.items()}
    parts["candidates"] = _candidate_rows_digest(owner, candidates, created_micros, relevant_labels)
    parts = {name: parts[name] for name in _PART_ORDER}
    return fingerprint_digest({"version": FINGERPRINT_VERSION, "parts": parts}), parts


# The parts in the order they have always been listed (the digest sorts keys; fingerprint_parts keeps this order).
_PART_ORDER: Final[tuple[str, ...]] = ("owner", "candidates", "exclusions", "policy", "open_dependencies", "leases")
