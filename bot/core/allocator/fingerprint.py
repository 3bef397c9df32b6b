"""The decision's fingerprint: a digest of the material inputs only, pinned between dry-run and apply (seed AC4)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Final

from bot.core.allocator.candidates import Row
from bot.core.allocator.records import LiveLease, RankingPolicy, exclusions_view
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


def relevant_label_texts(label_sets: Sequence[tuple[str, ...]], relevant_labels: frozenset[str]) -> list[str]:
    """Per label set, the JSON text of its labels that the policy reads (priority and protected), in order."""
    return [_json_text([label for label in labels if label in relevant_labels]) for labels in label_sets]


def candidate_rows_digest(owner: str, rows: Sequence[Row], label_texts: Sequence[str]) -> str:
    """:func:`bot.core.digest.fingerprint_digest` of the candidate rows, written as text row by row.

    Each row is ``[number, relevant labels, created_at as UTC microseconds, depends_on, ready]`` plus ``true``
    when the candidate is barred for ``owner`` (review candidates); ``label_texts`` is
    :func:`relevant_label_texts` of the rows' label sets. The values are already exact JSON scalars (validated
    ints, bools, None, strings), so the text is byte for byte what the canonical dump of the same lists gives
    (tests/test_allocator_fast_paths.py compares them) without a copying walk and without a tracked object per row.
    """
    text = [
        f"[{number},{label_texts[k]},{'null' if micros is None else micros},[],true]" if plain
        else _row_text(owner, number, label_texts[k], micros, deps, ready, barred)
        for number, _title, k, _when, micros, deps, ready, barred, _duplicate, plain in rows
    ]
    return hashlib.sha256(("[" + ",".join(text) + "]").encode("ascii")).hexdigest()


def _row_text(owner: str, number: int, labels: str, micros: int | None, deps: tuple[int, ...], ready: bool,
              barred: tuple[str, ...]) -> str:
    flag = ",true" if barred and owner in barred else ""
    return (f"[{number},{labels},{'null' if micros is None else micros},{_json_text(list(deps))},"
            f"{'true' if ready else 'false'}{flag}]")


def lease_state(lease: LiveLease, owner: str, policy: RankingPolicy, now: datetime) -> str | None:
    """live / grace (foreign, expired less than the grace ago) / None when it no longer matters."""
    if lease.is_live(now):
        return "live"
    if lease.owner != owner and now < lease.expires_at + policy.lease_grace:
        return "grace"
    return None


#: A lease as the fingerprint's ``leases`` part holds it: ``(issue_number, owner, lease_id, role, state)``.
LeaseRow = tuple[int, str, str, str, str]
_by_issue_owner_id = itemgetter(0, 1, 2)
_ascii_string = json.encoder.encode_basestring_ascii


def _leases_digest(rows: list[LeaseRow]) -> str:
    """:func:`bot.core.digest.fingerprint_digest` of the lease rows as objects, ordered by issue, owner and lease id:
    written as text, byte for byte the canonical dump when every value is a plain string (a lease from the store);
    anything else goes through the canonical dump itself, which refuses what is not JSON as it always did."""
    rows = sorted(rows, key=_by_issue_owner_id)
    try:
        text = ",".join([
            f'{{"issue_number":{number},"lease_id":{_ascii_string(lease_id)},"owner":{_ascii_string(holder)},'
            f'"role":{_ascii_string(role)},"state":"{state}"}}'
            for number, holder, lease_id, role, state in rows
        ])
    except TypeError:
        return fingerprint_digest([
            {"issue_number": number, "owner": holder, "role": role, "lease_id": lease_id, "state": state}
            for number, holder, lease_id, role, state in rows
        ])
    return hashlib.sha256(f"[{text}]".encode("ascii")).hexdigest()


def decision_fingerprint(
    owner: str,
    rows: Sequence[Row],
    label_texts: Sequence[str],
    numbers: Collection[int],
    dependencies: set[int],
    caller_exclusions: frozenset[int],
    open_issue_numbers: frozenset[int],
    policy: RankingPolicy,
    lease_rows: list[LeaseRow],
) -> tuple[str, dict[str, str]]:
    """SHA-256 over the material inputs only, in canonical JSON (sorted keys, sets sorted).

    Material means "could change the decision": titles, labels that are neither priority nor protected,
    open issues nobody depends on, heartbeats that only move ``expires_at``, and leases on issues that
    are neither candidates nor held by the owner are left out, so unrelated activity between dry-run
    and apply does not raise a spurious conflict. ``rows`` are the candidates (:func:`normalize_rows`),
    ``numbers`` their issue numbers, ``dependencies`` every issue they depend on, ``lease_rows`` the
    :data:`LeaseRow` of each lease whose :func:`lease_state` is not None and that is on a candidate or held
    by ``owner``.
    """
    parts_values: dict[str, object] = {
        "owner": owner,
        "exclusions": exclusions_view(caller_exclusions, policy),
        "policy": {
            "priority_labels": list(policy.priority_labels),  # order is the ranking: not sorted
            "lease_grace_seconds": policy.lease_grace.total_seconds(),
        },
        "open_dependencies": sorted(d for d in dependencies if d in open_issue_numbers or d in numbers),
    }
    parts = {name: fingerprint_digest(value) for name, value in parts_values.items()}
    parts["leases"] = _leases_digest(lease_rows)
    parts["candidates"] = candidate_rows_digest(owner, rows, label_texts)
    parts = {name: parts[name] for name in _PART_ORDER}
    return fingerprint_digest({"version": FINGERPRINT_VERSION, "parts": parts}), parts


# The parts in the order they have always been listed (the digest sorts keys; fingerprint_parts keeps this order).
_PART_ORDER: Final[tuple[str, ...]] = ("owner", "candidates", "exclusions", "policy", "open_dependencies", "leases")
