"""The allocator's pure decision: normalize candidates, apply exclusions, rank, fingerprint, decide.

Sans-I/O: the lease store, the Gitea fetch and the MCP tool call into this module with plain data
and act on the decision it returns. Dry-run and apply both go through :func:`decide` with the raw
request, so they share one normalization and one set of candidate semantics (seed AC4).

Order of evaluation inside :func:`decide` (each candidate gets exactly one outcome):

1. Normalize ``candidates`` and ``exclude_issue_numbers`` strictly; any problem makes the whole
   decision ``invalid`` (fail closed, nothing is leased). All problems are collected, not just the first.
2. Exclusions, before any ranking: the caller's ``exclude_issue_numbers`` (``excluded_by_controller``),
   then the configured protected issue numbers (``protected_issue``) and labels (``protected_label``).
   A live lease held by the requesting owner on an excluded issue blocks the whole decision
   (``blocked``, blocker ``excluded_owned_lease``) so the lease is never silently stranded.
3. Live ownership: a live lease held by anyone else is ``foreign_claim`` and never overridden; a
   foreign lease that expired less than ``policy.lease_grace`` ago is ``lease_grace``. A live lease held
   by the requesting owner makes the issue resumable (readiness and dependencies are not re-checked:
   the work is already under way).
4. Readiness (``not_ready``: the record says ``"ready": false``) and dependency holds
   (``dependency_open``: a ``depends_on`` number is an open issue).
5. Ranking of what is left: priority label (``policy.priority_labels`` order; unlabelled last), then
   ``created_at`` oldest first (undated after dated), then issue number ascending.

The decision is then, in this precedence: ``blocked`` > ``resume`` > ``select`` > ``wait``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final, Literal

from bot.core.digest import fingerprint_digest
from bot.core.errors import Envelope, EnvelopeError
from bot.core.jsontext import JSONTextError, strict_loads
from bot.core.vocabulary import MAX_ISSUE_NUMBER

__all__ = [
    "BLOCK_REASONS",
    "CANDIDATE_FIELDS",
    "DEFAULT_LEASE_GRACE",
    "DEFAULT_PRIORITY_LABELS",
    "EXCLUSION_REASONS",
    "FINGERPRINT_VERSION",
    "SKIP_REASONS",
    "AllocationDecision",
    "AllocationRequest",
    "BlockReason",
    "BlockedDecision",
    "Blocker",
    "Candidate",
    "InputError",
    "InputProblem",
    "InvalidDecision",
    "LiveLease",
    "RankedCandidate",
    "RankingPolicy",
    "ResumeDecision",
    "SelectDecision",
    "SkipReason",
    "Skipped",
    "WaitDecision",
    "WaitReason",
    "check_apply",
    "decide",
    "normalize_candidates",
    "normalize_exclusions",
]

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
]
SKIP_REASONS: Final[tuple[SkipReason, ...]] = (
    "excluded_by_controller",
    "protected_issue",
    "protected_label",
    "foreign_claim",
    "own_claim",
    "lease_grace",
    "not_ready",
    "dependency_open",
    "invalid_candidate",
)
EXCLUSION_REASONS: Final[frozenset[SkipReason]] = frozenset(
    {"excluded_by_controller", "protected_issue", "protected_label"}
)
BlockReason = Literal["excluded_owned_lease"]
BLOCK_REASONS: Final[tuple[BlockReason, ...]] = ("excluded_owned_lease",)
WaitReason = Literal["no_candidates", "all_excluded", "none_eligible"]

DEFAULT_PRIORITY_LABELS: Final[tuple[str, ...]] = ("priority:p0", "priority:p1", "priority:p2", "priority:p3")
DEFAULT_LEASE_GRACE: Final[timedelta] = timedelta(seconds=120)
FINGERPRINT_VERSION: Final[int] = 2
# Keys a candidate record may carry. Anything else is rejected: a misspelt "depend_on" silently
# dropped would lease a held issue, which is exactly the fail-open this module exists to prevent.
CANDIDATE_FIELDS: Final[frozenset[str]] = frozenset(
    {"issue_number", "number", "title", "labels", "created_at", "depends_on", "ready"}
)
# Issue numbers end up in SQLite INTEGER columns.
_MAX_ISSUE_NUMBER: Final[int] = MAX_ISSUE_NUMBER
_MAX_LISTED_PROBLEMS: Final[int] = 50
#: The largest candidates_json / exclude_issue_numbers text taken (characters); larger is refused unread.
MAX_INPUT_CHARS: Final[int] = 8 * 1024 * 1024
_SHOWN_CHARS: Final[int] = 60
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_EPOCH = datetime.min.replace(tzinfo=UTC)
_HEX64 = re.compile(r"[0-9a-f]{64}", re.ASCII)


# --------------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """An issue that may be allocated. Only ``issue_number`` is required.

    ``labels`` and ``depends_on`` are kept sorted and de-duplicated (their order carries no meaning);
    ``created_at`` is timezone-aware. ``ready`` is False when the source says the issue lacks
    ``status:ready`` (the Gitea fetch sets it from the label; a ``candidates_json`` record may send
    ``"ready": false``; omitted means ready, as before).
    """

    issue_number: int
    title: str | None = None
    labels: tuple[str, ...] = ()
    created_at: datetime | None = None
    depends_on: tuple[int, ...] = ()
    ready: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {
            "issue_number": self.issue_number,
            "title": self.title,
            "labels": list(self.labels),
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "depends_on": list(self.depends_on),
            "ready": self.ready,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveLease:
    """One unreleased lease from the store's snapshot. ``expires_at`` may already be in the past."""

    issue_number: int
    owner: str
    role: str
    lease_id: str
    expires_at: datetime

    def __post_init__(self) -> None:
        if not _is_issue_number(self.issue_number):
            raise ValueError(f"lease issue_number must be a positive integer, got {self.issue_number!r}")
        if not self.owner:
            raise ValueError("lease owner must be non-empty")
        _require_aware(self.expires_at, "lease expires_at")

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
        bad = [n for n in self.protected_issue_numbers if not _is_issue_number(n)]
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RankedCandidate:
    """An eligible (or resumable) candidate in rank order, with the keys that placed it there."""

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
        super().__init__(_input_envelope(self.problems))


# --------------------------------------------------------------------------------------------------
# Decisions


@dataclass(frozen=True, slots=True, kw_only=True)
class _DecisionBase:
    kind: ClassVar[str]
    fingerprint: str | None
    fingerprint_parts: Mapping[str, str]
    considered: int
    ranked: tuple[RankedCandidate, ...]
    skipped: tuple[Skipped, ...]
    exclusions: Mapping[str, list[Any]]

    def _common(self) -> dict[str, Any]:
        return {
            "decision": self.kind,
            "fingerprint": self.fingerprint,
            "fingerprint_parts": dict(self.fingerprint_parts),
            "considered": self.considered,
            "ranked": [r.to_dict() for r in self.ranked],
            "skipped": [s.to_dict() for s in self.skipped],
            "exclusions": {k: list(v) for k, v in self.exclusions.items()},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectDecision(_DecisionBase):
    """Lease ``candidate`` (the top of ``ranked``) to the requesting owner."""

    kind: ClassVar[str] = "select"
    candidate: Candidate

    @property
    def issue_number(self) -> int:
        return self.candidate.issue_number

    def to_dict(self) -> dict[str, Any]:
        return {**self._common(), "issue_number": self.issue_number, "candidate": self.candidate.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeDecision(_DecisionBase):
    """The owner already holds a live lease on a non-excluded issue: continue it, lease nothing new."""

    kind: ClassVar[str] = "resume"
    lease: LiveLease

    @property
    def issue_number(self) -> int:
        return self.lease.issue_number

    def to_dict(self) -> dict[str, Any]:
        return {**self._common(), "issue_number": self.issue_number, "lease": self.lease.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitDecision(_DecisionBase):
    """The canonical WAIT / no-candidate result: nothing is eligible, nothing is leased."""

    kind: ClassVar[str] = "wait"
    wait_reason: WaitReason

    def to_dict(self) -> dict[str, Any]:
        return {**self._common(), "issue_number": None, "wait_reason": self.wait_reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockedDecision(_DecisionBase):
    """The caller must resolve ``blockers`` first (release the lease or stop excluding the issue)."""

    kind: ClassVar[str] = "blocked"
    blockers: tuple[Blocker, ...]
    envelope: Envelope

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.envelope.to_dict(),
            **self._common(),
            "issue_number": None,
            "blockers": [b.to_dict() for b in self.blockers],
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class InvalidDecision(_DecisionBase):
    """The request was refused before any decision (fail closed); ``envelope`` says why."""

    kind: ClassVar[str] = "invalid"
    envelope: Envelope

    def to_dict(self) -> dict[str, Any]:
        return {**self.envelope.to_dict(), **self._common(), "issue_number": None}


AllocationDecision = SelectDecision | ResumeDecision | WaitDecision | BlockedDecision | InvalidDecision


# --------------------------------------------------------------------------------------------------
# Normalization (seed AC3)


class _DuplicateKeyObject(dict[str, Any]):
    """A decoded JSON object that repeated a key; kept so the problem is reported at its element."""

    def __init__(self, pairs: list[tuple[str, Any]], duplicates: list[str]) -> None:
        super().__init__(pairs)
        self.duplicate_keys = duplicates


def _show(value: object) -> str:
    """A short, always-computable rendering of any received value for a problem message.

    Never ``repr`` of a container (deep nesting recurses), never ``str`` of a huge integer (Python refuses
    over 4,300 digits) and never a whole megabyte string: problems echo at most a few dozen characters.
    """
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if type(value) is int:
        if value.bit_length() > 64:
            return f"{'a negative' if value < 0 else 'an'} integer of about {int(value.bit_length() * 0.30103)} digits"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if len(value) <= _SHOWN_CHARS:
            return ascii(value)
        return f"{value[:_SHOWN_CHARS]!a}... ({len(value)} characters)"
    return _type_name(value)


def _field_name(key: object) -> str:
    return key if isinstance(key, str) and len(key) <= _SHOWN_CHARS else _show(key)


def _has_surrogate(text: str) -> bool:
    """A lone surrogate (JSON ``"\ud800"``) is not text: it cannot be encoded, so it cannot be a label or title."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    duplicates: list[str] = []
    for key, _ in pairs:
        if key in seen and key not in duplicates:
            duplicates.append(key)
        seen.add(key)
    return _DuplicateKeyObject(pairs, duplicates) if duplicates else dict(pairs)


def _decode_json(text: str, input_name: str) -> object:
    """Decode once, refusing typed whatever the decoder cannot or should not take (issue 12.7): oversized text,
    nesting deeper than the decoder's recursion limit, integers over Python's 4,300-digit limit, NaN/Infinity."""

    def refuse(problem: str) -> InputError:
        return InputError([InputProblem(input=input_name, index=None, field=input_name, problem=problem)])

    if len(text) > MAX_INPUT_CHARS:
        raise refuse(f"is {len(text)} characters; at most {MAX_INPUT_CHARS} are taken")
    try:
        return strict_loads(text, object_pairs_hook=_object_pairs)  # repeats are collected, reported per record
    except JSONTextError as exc:
        if exc.kind == "constant":
            raise refuse(str(exc)) from None
        detail = {
            "too_deep": "nested too deeply (a candidate record is at most 3 levels deep)",
            "long_integer": "an integer has more than 4,300 digits (no issue number is that long)",
        }.get(exc.kind, str(exc))
        raise refuse(f"malformed JSON: {detail}") from None


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number (float)"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return f"unsupported type {type(value).__name__}"


def _is_issue_number(value: object) -> bool:
    # type() rather than isinstance(): bool is an int subclass and `true` must never be issue #1.
    return type(value) is int and 0 < value <= _MAX_ISSUE_NUMBER


def _issue_number_problem(value: object) -> str | None:
    if _is_issue_number(value):
        return None
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)} is not an integer"
    if isinstance(value, float):
        return f"{value!r} is a float; send an integer"
    if isinstance(value, str):
        return f"string {_show(value)} is not an integer; send the number unquoted"
    if type(value) is int:
        return f"{_show(value)} is not a positive issue number (1 to {_MAX_ISSUE_NUMBER})"
    return f"expected a positive integer, got {_type_name(value)}"


def _require_aware(value: datetime, what: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware")


def _parse_rfc3339(value: str) -> datetime | None:
    if _RFC3339.fullmatch(value) is None:
        return None
    try:  # the pattern pins the shape; fromisoformat checks the calendar and keeps microseconds
        return datetime.fromisoformat(value.upper())
    except ValueError:
        return None


def _fast_candidate(record: Mapping[Any, Any]) -> Candidate | None:
    """The common valid record (plain dict, known keys, exact types) without collecting problems; None
    sends the record to the full validator, which then reports every problem exactly as before."""
    if type(record) is not dict or not record.keys() <= CANDIDATE_FIELDS or "number" in record:
        return None
    number = record.get("issue_number")
    if type(number) is not int or not 0 < number <= _MAX_ISSUE_NUMBER:
        return None
    title = record.get("title")
    if title is not None and (type(title) is not str or _has_surrogate(title)):
        return None
    labels = record.get("labels")
    if labels is None:
        labels = ()
    elif type(labels) is not list and type(labels) is not tuple:
        return None
    for label in labels:
        if type(label) is not str or not label or _has_surrogate(label):
            return None
    raw_created = record.get("created_at")
    created_at = None
    if raw_created is not None:
        if type(raw_created) is not str:
            return None
        created_at = _parse_rfc3339(raw_created)
        if created_at is None:
            return None
    deps = record.get("depends_on")
    if deps is None:
        deps = ()
    elif type(deps) is not list and type(deps) is not tuple:
        return None
    for dep in deps:
        if type(dep) is not int or not 0 < dep <= _MAX_ISSUE_NUMBER or dep == number:
            return None
    ready = record.get("ready", True)
    if ready is None:
        ready = True
    elif type(ready) is not bool:
        return None
    return Candidate(
        issue_number=number,
        title=title,
        labels=tuple(sorted(set(labels))) if len(labels) > 1 else tuple(labels),
        created_at=created_at,
        depends_on=tuple(sorted(set(deps))) if len(deps) > 1 else tuple(deps),
        ready=ready,
    )


def _candidate_from_record(
    record: Mapping[Any, Any], index: int, input_name: str
) -> tuple[Candidate | None, list[InputProblem]]:
    # The number comes first so that every other problem can name the issue it belongs to.
    number: int | None = None
    number_problems: list[tuple[str, str]] = []
    has_primary, has_alias = "issue_number" in record, "number" in record
    if not has_primary and not has_alias:
        number_problems.append(("issue_number", "required field is missing (`number` is accepted as an alias)"))
    else:
        fld = "issue_number" if has_primary else "number"
        raw = record[fld]
        issue = _issue_number_problem(raw)
        if issue is not None:
            number_problems.append((fld, issue))
        else:
            number = raw
            alias = record.get("number") if has_primary and has_alias else raw
            if not (_is_issue_number(alias) and alias == raw):
                number_problems.append(
                    ("number", f"alias `number` ({_show(alias)}) disagrees with issue_number {raw}")
                )

    problems: list[InputProblem] = []

    def problem(fld: str, text: str) -> None:
        problems.append(InputProblem(input=input_name, index=index, field=fld, problem=text, issue_number=number))

    if isinstance(record, _DuplicateKeyObject):
        for key in record.duplicate_keys:
            problem(_field_name(key), f"key {_show(key)} appears more than once in the object")
    for key in sorted((k for k in record if k not in CANDIDATE_FIELDS), key=_show):
        problem(_field_name(key), f"unknown field {_show(key)}; allowed: {', '.join(sorted(CANDIDATE_FIELDS))}")
    for fld, text in number_problems:
        problem(fld, text)

    title = record.get("title")
    if title is not None and not isinstance(title, str):
        problem("title", f"expected a string or null, got {_type_name(title)}")
        title = None
    elif title is not None and _has_surrogate(title):
        problem("title", "is not valid Unicode text (a lone surrogate such as \\ud800)")
        title = None

    labels: list[str] = []
    raw_labels = record.get("labels")
    if raw_labels is not None:
        if not isinstance(raw_labels, list | tuple):
            problem("labels", f"expected an array of label names, got {_type_name(raw_labels)}")
        else:
            for i, label in enumerate(raw_labels):
                if not isinstance(label, str) or not label or _has_surrogate(label):
                    got = "an empty string" if label == "" else _type_name(label)
                    got = "a string with a lone surrogate" if isinstance(label, str) and label else got
                    problem(f"labels[{i}]", f"expected a non-empty label name string, got {got}")
                else:
                    labels.append(label)

    created_at: datetime | None = None
    raw_created = record.get("created_at")
    if isinstance(raw_created, datetime):
        if raw_created.tzinfo is None or raw_created.utcoffset() is None:
            problem("created_at", "datetime must carry a UTC offset")
        else:
            created_at = raw_created
    elif isinstance(raw_created, str):
        created_at = _parse_rfc3339(raw_created)
        if created_at is None:
            problem(
                "created_at",
                f"{_show(raw_created)} is not an RFC 3339 date-time with offset (e.g. 2026-07-20T21:35:15-05:00)",
            )
    elif raw_created is not None:
        problem("created_at", f"expected an RFC 3339 string or null, got {_type_name(raw_created)}")

    depends_on: list[int] = []
    raw_deps = record.get("depends_on")
    if raw_deps is not None:
        if not isinstance(raw_deps, list | tuple):
            problem("depends_on", f"expected an array of issue numbers, got {_type_name(raw_deps)}")
        else:
            for i, dep in enumerate(raw_deps):
                dep_problem = _issue_number_problem(dep)
                if dep_problem is not None:
                    problem(f"depends_on[{i}]", dep_problem)
                elif dep == number:
                    problem(f"depends_on[{i}]", "an issue cannot depend on itself")
                else:
                    depends_on.append(dep)

    ready = record.get("ready", True)
    if ready is None:
        ready = True
    elif not isinstance(ready, bool):
        problem("ready", f"expected a boolean, got {_type_name(ready)}")
        ready = True

    if problems or number is None:
        return None, problems
    return (
        Candidate(
            issue_number=number,
            title=title,
            labels=tuple(sorted(set(labels))),
            created_at=created_at,
            depends_on=tuple(sorted(set(depends_on))),
            ready=ready,
        ),
        [],
    )


def _candidate_as_record(candidate: Candidate) -> dict[str, Any]:
    # Typed callers are checked by the same rules as transport records: one code path (AC4 parity).
    return {
        "issue_number": candidate.issue_number,
        "title": candidate.title,
        "labels": list(candidate.labels),
        "created_at": candidate.created_at,
        "depends_on": list(candidate.depends_on),
        "ready": candidate.ready,
    }


def normalize_candidates(raw: object) -> list[Candidate]:
    """Turn ``candidates_json`` as received into validated candidates, sorted by issue number.

    Accepts a list (or tuple) of objects / :class:`Candidate`, a single object or Candidate, or a JSON
    string of an array or an object. A JSON string is decoded once: a string that decodes to another
    string is refused as double-encoded. Refused, all collected into one :class:`InputError`
    (``invalid_input`` envelope, ``details.problems`` with index and field per problem):
    malformed JSON, ``NaN``/``Infinity``, a top-level scalar or unsupported type, elements that are not
    objects, a missing or non-positive ``issue_number`` (alias ``number``), booleans, floats (even
    ``3.0``) and numeric strings (``"617"``) where an integer is expected, ``labels`` that are not an
    array of non-empty strings, ``created_at`` that is not RFC 3339 with an offset, ``depends_on`` that
    is not an array of positive integers (or names the issue itself), a non-boolean ``ready``, unknown
    or repeated keys, and duplicate issue numbers. ``null`` for an optional field means omitted.
    """
    name = "candidates_json"
    value: object = raw
    if isinstance(raw, str):
        value = _decode_json(raw, name)
        if isinstance(value, str):
            raise InputError(
                [InputProblem(input=name, index=None, field=name,
                              problem="decoded to a string: the JSON was encoded twice; send it once")]
            )
    if isinstance(value, dict | Candidate):
        elements: Sequence[object] = [value]
    elif isinstance(value, list | tuple):
        elements = value
    else:
        raise InputError(
            [InputProblem(input=name, index=None, field=name,
                          problem=f"expected an array of candidate objects or one object, got {_type_name(value)}")]
        )

    problems: list[InputProblem] = []
    candidates: list[Candidate] = []
    first_index: dict[int, int] = {}
    for index, element in enumerate(elements):
        if isinstance(element, Candidate):
            record: Mapping[Any, Any] = _candidate_as_record(element)
        elif isinstance(element, dict):
            record = element
        else:
            got = _type_name(element)
            problems.append(InputProblem(input=name, index=index, field="", problem=f"expected an object, got {got}"))
            continue
        candidate = _fast_candidate(record)
        found: list[InputProblem] = []
        if candidate is None:
            candidate, found = _candidate_from_record(record, index, name)
        problems.extend(found)
        if candidate is None:
            continue
        number = candidate.issue_number
        if number in first_index:
            problems.append(
                InputProblem(input=name, index=index, field="issue_number", issue_number=number,
                             problem=f"duplicate issue_number {number} (first at index {first_index[number]})")
            )
            continue
        first_index[number] = index
        candidates.append(candidate)
    if problems:
        raise InputError(problems)
    return sorted(candidates, key=lambda c: c.issue_number)


def normalize_exclusions(raw: object) -> frozenset[int]:
    """Turn ``exclude_issue_numbers`` into a set of issue numbers; None (omitted) means no exclusions.

    Accepts a list, tuple, set or frozenset of positive integers, or a JSON string of an array of them.
    Refuses scalars (a bare ``617`` must be sent as ``[617]``), booleans, floats, numeric strings and
    non-positive numbers, collecting every problem into one :class:`InputError`. Repeats are harmless
    (it is a set) and are accepted.
    """
    name = "exclude_issue_numbers"
    if raw is None:
        return frozenset()
    value: object = raw
    if isinstance(raw, str):
        value = _decode_json(raw, name)
        if value is None:
            return frozenset()
    if isinstance(value, set | frozenset):
        elements: Sequence[object] = sorted(value, key=_show)
    elif isinstance(value, list | tuple):
        elements = value
    else:
        raise InputError(
            [InputProblem(input=name, index=None, field=name,
                          problem=f"expected an array of issue numbers, got {_type_name(value)}")]
        )
    problems: list[InputProblem] = []
    numbers: set[int] = set()
    for index, element in enumerate(elements):
        issue = _issue_number_problem(element)
        if issue is not None:
            problems.append(InputProblem(input=name, index=index, field=name, problem=issue))
        else:
            assert isinstance(element, int)
            numbers.add(element)
    if problems:
        raise InputError(problems)
    return frozenset(numbers)


def _input_envelope(problems: Sequence[InputProblem]) -> Envelope:
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


# --------------------------------------------------------------------------------------------------
# Ranking


def _priority(candidate: Candidate, policy: RankingPolicy) -> tuple[int, str | None]:
    for index, label in enumerate(policy.priority_labels):
        if label in candidate.labels:
            return index, label
    return len(policy.priority_labels), None


def _rank_key(candidate: Candidate, policy: RankingPolicy) -> tuple[int, int, datetime, int]:
    dated = candidate.created_at is not None
    when = candidate.created_at.astimezone(UTC) if candidate.created_at else datetime.min.replace(tzinfo=UTC)
    return (_priority(candidate, policy)[0], 0 if dated else 1, when, candidate.issue_number)


# --------------------------------------------------------------------------------------------------
# Fingerprint (seed AC4)


def _utc(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def _lease_state(lease: LiveLease, owner: str, policy: RankingPolicy, now: datetime) -> str | None:
    """live / grace (foreign, expired less than the grace ago) / None when it no longer matters."""
    if lease.is_live(now):
        return "live"
    if lease.owner != owner and now < lease.expires_at + policy.lease_grace:
        return "grace"
    return None


def _fingerprint(
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
        state = _lease_state(lease, owner, policy, now)
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
            ]
            for c in candidates
        ],
        "exclusions": {
            "exclude_issue_numbers": sorted(caller_exclusions),
            "protected_issue_numbers": sorted(policy.protected_issue_numbers),
            "protected_labels": sorted(policy.protected_labels),
        },
        "policy": {
            "priority_labels": list(policy.priority_labels),  # order is the ranking: not sorted
            "lease_grace_seconds": policy.lease_grace.total_seconds(),
        },
        "open_dependencies": sorted(deps & (open_issue_numbers | numbers)),
        "leases": sorted(lease_rows, key=lambda r: (r["issue_number"], r["owner"], r["lease_id"])),
    }
    parts = {name: fingerprint_digest(value) for name, value in parts_values.items()}
    return fingerprint_digest({"version": FINGERPRINT_VERSION, "parts": parts}), parts


# --------------------------------------------------------------------------------------------------
# Decision


def _exclusions_view(caller: frozenset[int], policy: RankingPolicy) -> dict[str, list[Any]]:
    return {
        "exclude_issue_numbers": sorted(caller),
        "protected_issue_numbers": sorted(policy.protected_issue_numbers),
        "protected_labels": sorted(policy.protected_labels),
    }


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
        exclusions=_exclusions_view(caller, policy),
        envelope=_input_envelope(problems),
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
    _require_aware(now, "now")
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
    fingerprint, parts = _fingerprint(owner, candidates, caller, request.open_issue_numbers, policy, leases, now)
    common: dict[str, Any] = {
        "fingerprint": fingerprint,
        "fingerprint_parts": parts,
        "considered": len(candidates),
        "exclusions": _exclusions_view(caller, policy),
    }

    own_live: dict[int, list[LiveLease]] = {}
    foreign_live: dict[int, list[LiveLease]] = {}
    foreign_grace: dict[int, list[LiveLease]] = {}
    for lease in leases:
        state = _lease_state(lease, owner, policy, now)
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

    prio = {label: i for i, label in enumerate(policy.priority_labels)}
    unlabelled = len(prio)
    keyed = []
    for c in eligible:
        p = min([prio[label] for label in c.labels if label in prio], default=unlabelled)
        # one tzinfo for all keys: comparing datetimes with different offsets is several times slower
        when = c.created_at.astimezone(UTC) if c.created_at is not None else _EPOCH
        keyed.append((p, 0 if c.created_at is not None else 1, when, c.issue_number, c))
    keyed.sort(key=lambda k: k[:4])
    eligible = [k[4] for k in keyed]
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
        "fresh_issue_number": getattr(fresh, "issue_number", None),
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
