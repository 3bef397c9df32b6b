"""The allocator's values: candidates, leases, the ranking policy, the request, skips and input problems."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal, NamedTuple, get_args

from bot.core.errors import Envelope, EnvelopeError
from bot.core.vocabulary import MAX_ISSUE_NUMBER

SkipReason = Literal[
    "excluded_by_controller",
    "protected_issue",
    "protected_label",
    "foreign_claim",
    "own_claim",
    "lease_grace",
    "not_ready",
    "dependency_open",
    "invalid_candidate",
    "self_review",
    "duplicate_work",
]
SKIP_REASONS: Final[tuple[SkipReason, ...]] = get_args(SkipReason)
EXCLUSION_REASONS: Final[frozenset[SkipReason]] = frozenset(
    {"excluded_by_controller", "protected_issue", "protected_label"}
)
BlockReason = Literal["excluded_owned_lease"]
BLOCK_REASONS: Final[tuple[BlockReason, ...]] = get_args(BlockReason)
WaitReason = Literal["no_candidates", "all_excluded", "none_eligible"]

DEFAULT_PRIORITY_LABELS: Final[tuple[str, ...]] = ("priority:p0", "priority:p1", "priority:p2", "priority:p3")
DEFAULT_LEASE_GRACE: Final[timedelta] = timedelta(seconds=120)
# Keys a candidate record may carry. Anything else is rejected: a misspelt "depend_on" silently
# dropped would lease a held issue, which is exactly the fail-open the allocator exists to prevent.
CANDIDATE_FIELDS: Final[frozenset[str]] = frozenset(
    {"issue_number", "number", "title", "labels", "created_at", "depends_on", "ready", "barred_owners", "duplicate"}
)
_MAX_LISTED_PROBLEMS: Final[int] = 50


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """An issue that may be allocated. Only ``issue_number`` is required.

    ``labels`` and ``depends_on`` are kept sorted and de-duplicated (their order carries no meaning);
    ``created_at`` is timezone-aware. ``ready`` is False when the source says the issue lacks
    ``status:ready`` (the Gitea fetch sets it from the label; a ``candidates_json`` record may send
    ``"ready": false``; omitted means ready, as before). ``duplicate`` is the finding of the duplicate-work
    assessment (a linked open PR, a conflicting branch) that makes it skipped ``duplicate_work``; None: none.
    """

    issue_number: int
    title: str | None = None
    labels: tuple[str, ...] = ()
    created_at: datetime | None = None
    depends_on: tuple[int, ...] = ()
    ready: bool = True
    #: Logins that may never receive this issue's lease (a review candidate's PR author and implementer).
    barred_owners: tuple[str, ...] = ()
    duplicate: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "issue_number": self.issue_number,
            "title": self.title,
            "labels": list(self.labels),
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "depends_on": list(self.depends_on),
            "ready": self.ready,
            **({"barred_owners": list(self.barred_owners)} if self.barred_owners else {}),
        }
        if self.duplicate is not None:
            out["duplicate"] = self.duplicate
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveLease:
    """One unreleased lease from the store's snapshot. ``expires_at`` may already be in the past."""

    issue_number: int
    owner: str
    role: str
    lease_id: str
    expires_at: datetime

    def __post_init__(self) -> None:
        if not is_issue_number(self.issue_number):
            raise ValueError(f"lease issue_number must be a positive integer, got {self.issue_number!r}")
        if not self.owner:
            raise ValueError("lease owner must be non-empty")
        require_aware(self.expires_at, "lease expires_at")

    def is_live(self, now: datetime) -> bool:
        return self.expires_at > now

    def to_dict(self) -> dict[str, Any]:
        return {
            "issue_number": self.issue_number,
            "owner": self.owner,
            "role": self.role,
            "lease_id": self.lease_id,
            "expires_at": self.expires_at.isoformat(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class RankingPolicy:
    """The configured allocation policy: ranking order, protections and the expired-lease grace."""

    priority_labels: tuple[str, ...] = DEFAULT_PRIORITY_LABELS
    protected_issue_numbers: frozenset[int] = frozenset()
    protected_labels: frozenset[str] = frozenset()
    lease_grace: timedelta = DEFAULT_LEASE_GRACE

    def __post_init__(self) -> None:
        if len(set(self.priority_labels)) != len(self.priority_labels) or not all(
            isinstance(label, str) and label for label in self.priority_labels
        ):
            raise ValueError("priority_labels must be distinct non-empty strings")
        bad = [n for n in self.protected_issue_numbers if not is_issue_number(n)]
        if bad:
            raise ValueError(f"protected_issue_numbers must be positive integers, got {bad!r}")
        if not all(isinstance(label, str) and label for label in self.protected_labels):
            raise ValueError("protected_labels must be non-empty strings")
        if self.lease_grace < timedelta(0):
            raise ValueError("lease_grace must not be negative")

    def to_dict(self) -> dict[str, Any]:
        return {
            "priority_labels": list(self.priority_labels),
            "protected_issue_numbers": sorted(self.protected_issue_numbers),
            "protected_labels": sorted(self.protected_labels),
            "lease_grace_seconds": self.lease_grace.total_seconds(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocationRequest:
    """What the caller asks for, as received: ``candidates`` and ``exclude_issue_numbers`` are raw.

    ``candidates`` may be a list of records or :class:`Candidate`, one record, or a JSON string of
    either; ``exclude_issue_numbers`` a list of integers, a JSON string of one, or None (no exclusions).
    ``open_issue_numbers`` is the set of open issues known to the caller; the candidates themselves
    are open issues and always count as open for dependency holds.
    """

    owner: str
    candidates: object
    exclude_issue_numbers: object = None
    open_issue_numbers: frozenset[int] = frozenset()
    # False (auto-allocation with `max_leases_per_author` > 1): the owner's own live leases are not resumed;
    # their issues are skipped `own_claim` and the owner may be given another issue.
    resume_own: bool = True


@dataclass(frozen=True, slots=True)
class Skipped:
    """A candidate that was not eligible, with a stable reason (one of :data:`SKIP_REASONS`)."""

    issue_number: int | None
    reason: SkipReason
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"issue_number": self.issue_number, "reason": self.reason, "detail": self.detail}


class RankedCandidate(NamedTuple):
    """An eligible (or resumable) candidate in rank order, with the keys that placed it there.

    A named tuple, not a dataclass: a decision makes one per eligible candidate (7.7k of 10k in the benchmark), and
    a tuple is built in C (``tuple.__new__`` over a ``zip``), about a sixth of the cost of a slotted dataclass."""

    rank: int
    issue_number: int
    priority_label: str | None
    created_at: datetime | None
    owned_lease_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "issue_number": self.issue_number,
            "priority_label": self.priority_label,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "owned_lease_id": self.owned_lease_id,
        }


def ranked_dicts(ranked: Iterable[RankedCandidate]) -> list[dict[str, Any]]:
    """``[r.to_dict() for r in ranked]``, each tuple unpacked once instead of read field by field (a decision's
    JSON lists every eligible candidate: 9.6k of the 10k in bench/allocate_cli.py)."""
    return [
        {"rank": rank, "issue_number": number, "priority_label": label,
         "created_at": when.isoformat() if when else None, "owned_lease_id": lease}
        for rank, number, label, when, lease in ranked
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class Blocker:
    """Why nothing may be allocated until the caller acts, e.g. its own lease on an excluded issue."""

    issue_number: int
    reason: BlockReason
    lease: LiveLease
    excluded_as: SkipReason

    def to_dict(self) -> dict[str, Any]:
        return {
            "issue_number": self.issue_number,
            "reason": self.reason,
            "excluded_as": self.excluded_as,
            "lease": self.lease.to_dict(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class InputProblem:
    """One reason an input was refused. ``index`` is the element's position (None: the whole input)."""

    input: str
    index: int | None
    field: str
    problem: str
    issue_number: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "index": self.index,
            "field": self.field,
            "problem": self.problem,
            "issue_number": self.issue_number,
        }

    def describe(self) -> str:
        where = self.input if self.index is None else f"{self.input}[{self.index}]"
        if self.field and self.field != self.input:
            where = f"{where}.{self.field}"
        return f"{where}: {self.problem}"


class InputError(EnvelopeError):
    """Raised by the normalizers; carries an ``invalid_input`` envelope listing every problem."""

    def __init__(self, problems: Sequence[InputProblem]) -> None:
        self.problems: tuple[InputProblem, ...] = tuple(problems)
        super().__init__(input_envelope(self.problems))


def is_issue_number(value: object) -> bool:
    # type() rather than isinstance(): bool is an int subclass and `true` must never be issue #1.
    return type(value) is int and 0 < value <= MAX_ISSUE_NUMBER



def exclusions_view(caller: frozenset[int], policy: RankingPolicy) -> dict[str, list[Any]]:
    """The caller's exclusions and the configured protections, sorted: as decided, rendered and fingerprinted."""
    return {
        "exclude_issue_numbers": sorted(caller),
        "protected_issue_numbers": sorted(policy.protected_issue_numbers),
        "protected_labels": sorted(policy.protected_labels),
    }


def require_aware(value: datetime, what: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware")



def input_envelope(problems: Sequence[InputProblem]) -> Envelope:
    inputs = sorted({p.input for p in problems})
    shown = problems[:_MAX_LISTED_PROBLEMS]
    summary = "; ".join(p.describe() for p in shown[:5])
    more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
    details: dict[str, Any] = {"problems": [p.to_dict() for p in shown]}
    if len(problems) > len(shown):
        details["problems_not_listed"] = len(problems) - len(shown)
    return Envelope(
        error="invalid_input",
        message=f"{', '.join(inputs)} refused, nothing was leased: {summary}{more}",
        remediate=(
            "Send candidates_json as an array of objects (or one object), each with a positive integer "
            "issue_number, optional title (string), labels (array of strings), created_at (RFC 3339 with "
            "offset), depends_on (array of positive integers), ready (boolean); send exclude_issue_numbers "
            "as an array of positive integers. Integers must be JSON numbers, not booleans, floats or strings."
        ),
        exact_next_action="Fix the elements listed in details.problems and call gitea_allocate_next_work again.",
        details=details,
    )


# Building a frozen slotted dataclass through its generated ``__init__`` costs about 2 us (keyword parsing and
# one ``object.__setattr__`` per field); a decide over 10k candidates builds tens of thousands. These set the
# slots directly, which is exactly what ``__init__`` does for these classes (they have no ``__post_init__``);
# tests/test_allocator_fast_paths.py checks they equal the regular constructor field for field.
_new = object.__new__


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    """Each named slot's descriptor ``__set__``: it bypasses the frozen ``__setattr__``, as ``__init__`` does."""
    return tuple(vars(cls)[name].__set__ for name in names)


(_c_number, _c_title, _c_labels, _c_created, _c_deps, _c_ready, _c_barred, _c_duplicate) = _slot_setters(
    Candidate, "issue_number", "title", "labels", "created_at", "depends_on", "ready", "barred_owners", "duplicate"
)
(_s_number, _s_reason, _s_detail) = _slot_setters(Skipped, "issue_number", "reason", "detail")


def new_candidate(
    issue_number: int,
    title: str | None,
    labels: tuple[str, ...],
    created_at: datetime | None,
    depends_on: tuple[int, ...],
    ready: bool,
    barred_owners: tuple[str, ...],
    duplicate: str | None,
) -> Candidate:
    """``Candidate(...)`` for already validated values, without the generated ``__init__``'s overhead."""
    c: Candidate = _new(Candidate)
    _c_number(c, issue_number)
    _c_title(c, title)
    _c_labels(c, labels)
    _c_created(c, created_at)
    _c_deps(c, depends_on)
    _c_ready(c, ready)
    _c_barred(c, barred_owners)
    _c_duplicate(c, duplicate)
    return c


def new_skipped(issue_number: int | None, reason: SkipReason, detail: str) -> Skipped:
    """``Skipped(...)`` without the generated ``__init__``'s overhead."""
    s: Skipped = _new(Skipped)
    _s_number(s, issue_number)
    _s_reason(s, reason)
    _s_detail(s, detail)
    return s
