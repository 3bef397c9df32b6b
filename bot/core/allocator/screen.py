"""The decision's screening: exclusions, live ownership, readiness, and the ranking of what is eligible."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from itertools import count, repeat
from operator import itemgetter
from typing import Final, NamedTuple

from bot.core.allocator.candidates import (
    BARRED_OWNERS,
    CREATED_AT,
    CREATED_MICROS,
    DEPENDS_ON,
    DUPLICATE,
    LABEL_SET,
    NUMBER,
    PLAIN,
    READY,
    Row,
)
from bot.core.allocator.fingerprint import LeaseRow
from bot.core.allocator.records import (
    AllocationRequest,
    Blocker,
    LiveLease,
    RankedCandidate,
    RankingPolicy,
    Skipped,
    SkipReason,
    new_skipped,
)


class Inputs(NamedTuple):
    """One decision's validated inputs: the caller's exclusions, the candidate rows in issue number order, the label
    sets they index and their issue numbers."""

    request: AllocationRequest
    policy: RankingPolicy
    caller: frozenset[int]
    rows: list[Row]
    sets: list[tuple[str, ...]]
    numbers: set[int]


def set_priorities(sets: Sequence[tuple[str, ...]], policy: RankingPolicy) -> list[int]:
    """Each distinct label set's priority index, once: the policy's order, ``len(priority_labels)`` when none."""
    prio = {label: i for i, label in enumerate(policy.priority_labels)}
    return [min([prio[label] for label in labels if label in prio], default=len(prio)) for labels in sets]


class LeaseStates(NamedTuple):
    """Each lease's state once (fingerprint.lease_state, inlined), for the decision and for the fingerprint."""

    own_live: dict[int, list[LiveLease]]
    foreign_live: dict[int, list[LiveLease]]
    foreign_grace: dict[int, list[LiveLease]]
    #: Those on a candidate or held by the owner, as the fingerprint's ``leases`` part reads them.
    rows: list[LeaseRow]


def lease_states(
    leases: Sequence[LiveLease], owner: str, numbers: set[int], grace: timedelta, now: datetime
) -> LeaseStates:
    own_live: dict[int, list[LiveLease]] = {}
    foreign_live: dict[int, list[LiveLease]] = {}
    foreign_grace: dict[int, list[LiveLease]] = {}
    lease_rows: list[LeaseRow] = []
    for lease in leases:
        login, expires = lease.owner, lease.expires_at
        if expires > now:
            state = "live"
        elif login != owner and now < expires + grace:
            state = "grace"
        else:
            continue
        number = lease.issue_number
        if number in numbers or login == owner:
            lease_rows.append((number, login, lease.lease_id, lease.role, state))
        if state == "grace":
            foreign_grace.setdefault(number, []).append(lease)
        else:
            (own_live if login == owner else foreign_live).setdefault(number, []).append(lease)
    return LeaseStates(own_live, foreign_live, foreign_grace, lease_rows)


def exclusion_reason(
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


def first_lease(found: list[LiveLease]) -> LiveLease:
    return min(found, key=lambda lease: (lease.owner, lease.lease_id))


class Screened(NamedTuple):
    """The candidates that passed the checks (in issue number order) and those skipped, with the owner's resumable
    leases by issue and the rows of the issues the owner holds a live lease on."""

    eligible: list[Row]
    skipped: list[Skipped]
    owned: dict[int, LiveLease]
    own_rows: dict[int, Row]


def screen(inputs: Inputs, held: LeaseStates) -> Screened:
    """Every candidate through the checks, in their order; the first that holds it back skips it."""
    request, policy, caller, rows, sets, numbers = inputs
    owner = request.owner
    own_live, foreign_live, foreign_grace = held.own_live, held.foreign_live, held.foreign_grace
    protected_labels = policy.protected_labels
    set_protected = [bool(protected_labels) and not protected_labels.isdisjoint(labels) for labels in sets]
    # A candidate that is none of these, plain and without a protected label is eligible as it stands; every other
    # one takes the checks in their order.
    attention = caller | policy.protected_issue_numbers | own_live.keys() | foreign_live.keys() | foreign_grace.keys()
    open_numbers = request.open_issue_numbers | numbers
    skipped: list[Skipped] = []
    skip = skipped.append
    eligible: list[Row] = []
    keep = eligible.append
    owned: dict[int, LiveLease] = {}
    own_rows: dict[int, Row] = {}
    for row in rows:
        number = row[NUMBER]
        if row[PLAIN] and number not in attention and not set_protected[row[LABEL_SET]]:
            keep(row)
            continue
        excluded = exclusion_reason(number, sets[row[LABEL_SET]], caller, policy)
        barred = row[BARRED_OWNERS]
        if number in own_live:
            own_rows[number] = row
        if excluded is not None:
            skip(new_skipped(number, *excluded))
        elif barred and owner in barred:
            skip(new_skipped(number, "self_review",
                             f"{owner} may not take #{number}: it wrote or implemented its pull request, or "
                             "released the issue itself"))
        elif number in foreign_live:
            holder = first_lease(foreign_live[number])
            skip(new_skipped(number, "foreign_claim",
                             f"#{number} is leased to {holder.owner} (lease {holder.lease_id})"))
        elif number in own_live and not request.resume_own:
            skip(new_skipped(number, "own_claim", f"#{number} is already leased to {owner}"))
        elif number in own_live:
            owned[number] = first_lease(own_live[number])
            keep(row)
        elif row[DUPLICATE] is not None:
            skip(new_skipped(number, "duplicate_work", f"#{number}: {row[DUPLICATE]}"))
        elif number in foreign_grace:
            holder = first_lease(foreign_grace[number])
            skip(
                new_skipped(number, "lease_grace",
                            f"#{number}: lease {holder.lease_id} of {holder.owner} expired at "
                            f"{holder.expires_at.isoformat()}, reclaimable after the {policy.lease_grace} grace")
            )
        elif not row[READY]:
            skip(new_skipped(number, "not_ready", f"#{number} is not marked status:ready"))
        elif row[DEPENDS_ON] and not open_numbers.isdisjoint(row[DEPENDS_ON]):
            held_by = sorted(d for d in row[DEPENDS_ON] if d in open_numbers)
            skip(
                new_skipped(number, "dependency_open",
                            f"#{number} depends on open issue(s) {', '.join(f'#{d}' for d in held_by)}")
            )
        else:
            keep(row)
    return Screened(eligible, skipped, owned, own_rows)


def blockers_of(inputs: Inputs, own_live: dict[int, list[LiveLease]], own_rows: dict[int, Row]) -> list[Blocker]:
    """Own live leases on excluded issues, candidates or not: they would be stranded (AC5)."""
    request, policy, caller, _rows, sets, _numbers = inputs
    blockers: list[Blocker] = []
    for number, held in sorted(own_live.items() if request.resume_own else ()):
        own_row = own_rows.get(number)
        excluded = exclusion_reason(number, sets[own_row[LABEL_SET]] if own_row else (), caller, policy)
        if excluded is not None:
            blockers.append(Blocker(issue_number=number, reason="excluded_owned_lease", lease=first_lease(held),
                                    excluded_as=excluded[0]))
    return blockers


# One integer per eligible candidate orders them exactly as the tuple (priority, undated, created_at UTC
# microseconds, issue number) would: integers are not tracked by the cyclic GC and sort in C without a key
# function. Bits, high to low: priority index and the undated flag, created_at shifted to be non-negative (64 bits:
# years 1 to 9999 are within +-2**62 microseconds of 1970), the candidate's position among the eligible ones, which
# are in issue number order (so the position orders as the number does, and names the candidate after the sort).
_POSITION_BITS: Final[int] = 63
_WHEN_BITS: Final[int] = 64
_WHEN_SHIFT: Final[int] = 2**62
_POSITION_MASK: Final[int] = (1 << _POSITION_BITS) - 1
_issue_number = itemgetter(NUMBER)
_created_at = itemgetter(CREATED_AT)


def rank(
    eligible: Sequence[Row],
    set_priority: Sequence[int],
    owned: Mapping[int, LiveLease],
    policy: RankingPolicy,
) -> tuple[list[Row], tuple[RankedCandidate, ...]]:
    """Priority label (policy order, unlabelled last), then ``created_at`` (undated last), then issue number.

    ``eligible`` is in issue number order; ``set_priority[k]`` is the priority index of label set ``k`` (the
    policy's order, ``len(priority_labels)`` when unlabelled). The rows carry ``created_at`` in UTC microseconds:
    integers compare far faster than aware datetimes with different offsets, and order the same instants the same
    way."""
    dated = [(p << 1) << _WHEN_BITS for p in set_priority]
    undated = [(p << 1 | 1) << _WHEN_BITS << _POSITION_BITS for p in set_priority]
    keys = [
        undated[row[LABEL_SET]] | i if (micros := row[CREATED_MICROS]) is None
        else (dated[row[LABEL_SET]] | (micros + _WHEN_SHIFT)) << _POSITION_BITS | i
        for i, row in enumerate(eligible)
    ]
    keys.sort()
    # From here on, all in C: the rows in rank order, then one named tuple per rank.
    ordered = list(map(eligible.__getitem__, map(int.__and__, keys, repeat(_POSITION_MASK))))
    labels_by_rank = (*policy.priority_labels, None)
    priority_shift = _POSITION_BITS + _WHEN_BITS + 1
    priority_labels = map(labels_by_rank.__getitem__, map(int.__rshift__, keys, repeat(priority_shift)))
    owned_ids: Iterable[str | None] = repeat(None)
    if owned:
        owned_ids = [None if (lease := owned.get(row[NUMBER])) is None else lease.lease_id for row in ordered]
    ranked: tuple[RankedCandidate, ...] = tuple(map(
        tuple.__new__, repeat(RankedCandidate),
        zip(count(1), map(_issue_number, ordered), priority_labels, map(_created_at, ordered), owned_ids),
    ))
    return ordered, ranked
