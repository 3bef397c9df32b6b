"""Strict normalization of ``candidates_json`` and ``exclude_issue_numbers`` as received (seed AC3)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, Final

from bot.core.allocator.records import (
    CANDIDATE_FIELDS,
    Candidate,
    InputError,
    InputProblem,
    is_issue_number,
    new_candidate,
)
from bot.core.jsontext import JSONTextError, strict_loads
from bot.core.vocabulary import MAX_ISSUE_NUMBER

#: The largest candidates_json / exclude_issue_numbers text taken (characters); larger is refused unread.
MAX_INPUT_CHARS: Final[int] = 8 * 1024 * 1024
_SHOWN_CHARS: Final[int] = 60
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)
# The keys the fast path takes; a record with any other (the alias `number`) goes to the full validator.
_FAST_FIELDS: Final[frozenset[str]] = CANDIDATE_FIELDS - {"number"}


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


def _refused(input_name: str, problem: str) -> InputError:
    """The whole input refused at once (no element to point at)."""
    return InputError([InputProblem(input=input_name, index=None, field=input_name, problem=problem)])


def _decode_json(text: str, input_name: str) -> object:
    """Decode once, refusing typed whatever the decoder cannot or should not take: oversized text, nesting
    deeper than the decoder's recursion limit, integers over Python's 4,300-digit limit, NaN/Infinity."""
    if len(text) > MAX_INPUT_CHARS:
        raise _refused(input_name, f"is {len(text)} characters; at most {MAX_INPUT_CHARS} are taken")
    try:
        return strict_loads(text, object_pairs_hook=_object_pairs)  # repeats are collected, reported per record
    except JSONTextError as exc:
        if exc.kind == "constant":
            raise _refused(input_name, str(exc)) from None
        detail = {
            "too_deep": "nested too deeply (a candidate record is at most 3 levels deep)",
            "long_integer": "an integer has more than 4,300 digits (no issue number is that long)",
        }.get(exc.kind, str(exc))
        raise _refused(input_name, f"malformed JSON: {detail}") from None


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


def _issue_number_problem(value: object) -> str | None:
    if is_issue_number(value):
        return None
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)} is not an integer"
    if isinstance(value, float):
        return f"{value!r} is a float; send an integer"
    if isinstance(value, str):
        return f"string {_show(value)} is not an integer; send the number unquoted"
    if type(value) is int:
        return f"{_show(value)} is not a positive issue number (1 to {MAX_ISSUE_NUMBER})"
    return f"expected a positive integer, got {_type_name(value)}"



def _parse_rfc3339(value: str) -> datetime | None:
    if _RFC3339.fullmatch(value) is None:
        return None
    try:  # the pattern pins the shape; fromisoformat checks the calendar and keeps microseconds
        return datetime.fromisoformat(value.upper())
    except ValueError:
        return None


# The common shape, taken without collecting problems: uppercase ``T`` and ``Z`` (fromisoformat reads both; a
# lowercase ``t`` or ``z`` goes to the full validator, which uppercases it first, exactly as before).
_FAST_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})", re.ASCII).fullmatch
_from_iso = datetime.fromisoformat
_UNIX_EPOCH: Final[datetime] = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND: Final[timedelta] = timedelta(microseconds=1)

# created_at texts already read, with what they mean: the aware datetime and its instant in UTC microseconds (the
# rank's and the fingerprint's key). Reading one costs about 12k machine instructions (the pattern, the parse, the
# offset arithmetic), most of a candidate's validation; an issue's created_at never changes, and the same issues
# come back on every allocation (dry run, proof, apply; each auto-allocation run), so each text is read once per
# process. Only texts that passed the pattern and the calendar are kept; a datetime is immutable, so sharing it is
# safe. Bounded: emptied when full (a few hundred bytes an entry, ~35 MB at the bound).
_INSTANTS: dict[str, tuple[datetime, int]] = {}
_INSTANTS_MAX: Final[int] = 1 << 17


def _read_instant(text: str) -> tuple[datetime, int] | None:
    """The datetime and UTC microseconds of a created_at text in the common shape (remembered), or None."""
    if _FAST_RFC3339(text) is None:
        return None
    try:  # the pattern pins the shape; fromisoformat checks the calendar and keeps microseconds
        when = _from_iso(text)
    except ValueError:
        return None
    instant = (when, (when - _UNIX_EPOCH) // _MICROSECOND)
    if len(_INSTANTS) >= _INSTANTS_MAX:
        _INSTANTS.clear()
    _INSTANTS[text] = instant
    return instant


def forget_instants() -> None:
    """Empty the created_at memo (benchmarks measure a first allocation with it; tests check what it holds)."""
    _INSTANTS.clear()


#: One validated candidate as the decision reads it, read by the field names below (``row[NUMBER]``): a plain
#: tuple, one C-level allocation, where a frozen dataclass costs about a microsecond. Not a named tuple: building
#: one (its ``__new__``, or ``tuple.__new__``) costs about five times a tuple display, reading a field by name about
#: eight times an index, and unpacking or indexing it misses the interpreter's exact-tuple fast paths; together
#: about a tenth more per decision (measured paired on bench/allocate.py's inputs, 10k candidates).
Row = tuple[int, str | None, int, datetime | None, int | None, tuple[int, ...], bool, tuple[str, ...], str | None, bool]
NUMBER: Final = 0  # the issue number
TITLE: Final = 1
LABEL_SET: Final = 2  # the index of its labels in LabelSets.sets
CREATED_AT: Final = 3
CREATED_MICROS: Final = 4  # created_at as UTC microseconds (the rank's and the fingerprint's key), or None
DEPENDS_ON: Final = 5
READY: Final = 6
BARRED_OWNERS: Final = 7
DUPLICATE: Final = 8  # the duplicate-work finding, or None
#: True when nothing but the issue's number and labels can hold it back (no dependencies, ready, nobody barred, no
#: duplicate finding).
PLAIN: Final = 9


class LabelSets:
    """The distinct label sets of one call's candidates, each validated and sorted once (few sets, many issues).

    ``sets[k]`` is a sorted, de-duplicated tuple of label names shared by every candidate whose row names ``k``;
    ``_index`` maps every label tuple already seen (as received, or sorted) to its ``k``."""

    __slots__ = ("_index", "known", "sets")

    def __init__(self) -> None:
        self.sets: list[tuple[str, ...]] = [()]
        self._index: dict[tuple[object, ...], int] = {(): 0}
        #: ``k`` of a label tuple seen before (validated then), else None; raises TypeError when unhashable.
        self.known = self._index.get

    def index(self, received: tuple[object, ...]) -> int | None:
        """``k`` of a label tuple as received, or None when it holds anything but non-empty label names.

        A hit means ``received`` equals, element by element, a tuple that was validated: among JSON values only a
        string equals a string, so it holds exactly those names."""
        try:
            return self._index[received]
        except KeyError:
            pass
        except TypeError:  # an unhashable element (an array or object) is no label name
            return None
        for label in received:
            if type(label) is not str or not label or (not label.isascii() and _has_surrogate(label)):
                return None
        return self.canonical(received)  # type: ignore[arg-type]

    def canonical(self, labels: Sequence[str]) -> int:
        """``k`` of validated label names (any order, repeats allowed)."""
        key = tuple(labels)
        k = self._index.get(key)
        if k is None:
            ordered = tuple(sorted(set(key)))
            k = self._index.get(ordered)
            if k is None:
                k = self._index[ordered] = len(self.sets)
                self.sets.append(ordered)
            self._index[key] = k
        return k


_known_instant = _INSTANTS.get


def _fast_row(
    record: dict[Any, Any], label_sets: LabelSets, known_labels: Callable[[tuple[object, ...]], int | None]
) -> Row | None:
    """The common valid record (plain dict, known keys, exact types) without collecting problems; None sends the
    record to the full validator, which then reports every problem exactly as before."""
    if not record.keys() <= _FAST_FIELDS:
        return None  # "number" (the alias) and anything unknown are the full validator's
    get = record.get
    number = get("issue_number")
    if type(number) is not int or not 0 < number <= MAX_ISSUE_NUMBER:
        return None
    title = get("title")
    if title is not None and (type(title) is not str or (not title.isascii() and _has_surrogate(title))):
        return None
    labels = get("labels")
    if labels is None:
        k: int | None = 0
    elif type(labels) is list or type(labels) is tuple:
        try:
            k = known_labels(tuple(labels))  # a label set seen before in this call: validated then
        except TypeError:  # an unhashable element (an array or object) is no label name
            return None
        if k is None:
            k = label_sets.index(tuple(labels))
    else:
        return None
    if k is None:
        return None
    created = get("created_at")
    if created is None:
        micros = None
    elif type(created) is str:
        instant = _known_instant(created) or _read_instant(created)
        if instant is None:
            return None
        created, micros = instant
    else:
        return None
    deps = get("depends_on")
    if deps is None:
        deps = ()
    elif type(deps) is list or type(deps) is tuple:
        for dep in deps:
            if type(dep) is not int or not 0 < dep <= MAX_ISSUE_NUMBER or dep == number:
                return None
        deps = tuple(sorted(set(deps))) if len(deps) > 1 else tuple(deps)
    else:
        return None
    ready = get("ready", True)
    if ready is None:
        ready = True
    elif type(ready) is not bool:
        return None
    barred = get("barred_owners")
    if barred is None:
        barred = ()
    elif type(barred) is list or type(barred) is tuple:
        for login in barred:
            if type(login) is not str or not login:
                return None
        barred = tuple(sorted(set(barred))) if len(barred) > 1 else tuple(barred)
    else:
        return None
    duplicate = get("duplicate")
    if duplicate is not None and (type(duplicate) is not str or not duplicate or _has_surrogate(duplicate)):
        return None
    return (number, title, k, created, micros, deps, ready, barred, duplicate,
            not deps and ready and not barred and duplicate is None)


def _row_of(candidate: Candidate, label_sets: LabelSets) -> Row:
    """The row of a candidate the full validator built."""
    when = candidate.created_at
    deps, ready, barred, duplicate = candidate.depends_on, candidate.ready, candidate.barred_owners, candidate.duplicate
    return (candidate.issue_number, candidate.title, label_sets.canonical(candidate.labels), when,
            None if when is None else (when - _UNIX_EPOCH) // _MICROSECOND, deps, ready, barred, duplicate,
            not deps and ready and not barred and duplicate is None)


def _candidate_from_record(
    record: Mapping[Any, Any], index: int, input_name: str
) -> tuple[Candidate | None, list[InputProblem]]:
    """The full validator: the candidate of one record, or every problem it has, each naming its field (and its
    issue, once the number is read)."""
    # The number comes first so that every other problem can name the issue it belongs to.
    number, number_problems = _record_number(record)
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
    title = _record_title(record.get("title"), problem)
    labels = _record_labels(record.get("labels"), problem)
    created_at = _record_created_at(record.get("created_at"), problem)
    depends_on = _record_depends_on(record.get("depends_on"), number, problem)
    ready = record.get("ready", True)
    if ready is None:
        ready = True
    elif not isinstance(ready, bool):
        problem("ready", f"expected a boolean, got {_type_name(ready)}")
        ready = True
    barred = _record_barred_owners(record.get("barred_owners"), problem)
    duplicate = record.get("duplicate")
    if duplicate is not None and (not isinstance(duplicate, str) or not duplicate or _has_surrogate(duplicate)):
        problem("duplicate", "expected a non-empty string (the duplicate-work finding) or null")
        duplicate = None

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
            barred_owners=tuple(sorted(set(barred))),
            duplicate=duplicate,
        ),
        [],
    )


#: Records one problem of a field: ``(field, text)``.
_Problem = Callable[[str, str], None]


def _record_number(record: Mapping[Any, Any]) -> tuple[int | None, list[tuple[str, str]]]:
    """The issue number of a record (``issue_number``, or its alias ``number``), or None and why not."""
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
            if not (is_issue_number(alias) and alias == raw):
                number_problems.append(
                    ("number", f"alias `number` ({_show(alias)}) disagrees with issue_number {raw}")
                )
    return number, number_problems


def _record_title(title: object, problem: _Problem) -> str | None:
    if title is None:
        return None
    if not isinstance(title, str):
        problem("title", f"expected a string or null, got {_type_name(title)}")
        return None
    if _has_surrogate(title):
        problem("title", "is not valid Unicode text (a lone surrogate such as \\ud800)")
        return None
    return title


def _record_labels(raw_labels: object, problem: _Problem) -> list[str]:
    labels: list[str] = []
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
    return labels


def _record_created_at(raw_created: object, problem: _Problem) -> datetime | None:
    created_at: datetime | None = None
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
    return created_at


def _record_depends_on(raw_deps: object, number: int | None, problem: _Problem) -> list[int]:
    depends_on: list[int] = []
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
    return depends_on


def _record_barred_owners(raw_barred: object, problem: _Problem) -> list[str]:
    barred: list[str] = []
    if raw_barred is not None:
        if not isinstance(raw_barred, list | tuple) or not all(isinstance(x, str) and x for x in raw_barred):
            problem("barred_owners", f"expected an array of logins, got {_type_name(raw_barred)}")
        else:
            barred = list(raw_barred)
    return barred


def _candidate_as_record(candidate: Candidate) -> dict[str, Any]:
    # Typed callers are checked by the same rules as transport records: one code path (AC4 parity).
    return {
        "issue_number": candidate.issue_number,
        "title": candidate.title,
        "labels": list(candidate.labels),
        "created_at": candidate.created_at,
        "depends_on": list(candidate.depends_on),
        "ready": candidate.ready,
        **({"barred_owners": list(candidate.barred_owners)} if candidate.barred_owners else {}),
        "duplicate": candidate.duplicate,
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
    rows, label_sets = normalize_rows(raw)
    return [row_candidate(row, label_sets.sets) for row in rows]


def row_candidate(row: Row, sets: Sequence[tuple[str, ...]]) -> Candidate:
    """The :class:`Candidate` of a row (``sets``: the label sets its ``LABEL_SET`` indexes)."""
    return new_candidate(row[NUMBER], row[TITLE], sets[row[LABEL_SET]], row[CREATED_AT], row[DEPENDS_ON], row[READY],
                         row[BARRED_OWNERS], row[DUPLICATE])


def normalize_rows(raw: object) -> tuple[list[Row], LabelSets]:
    """:func:`normalize_candidates` as the decision reads it: the same checks, the same refusals, rows instead of
    :class:`Candidate` objects (sorted by issue number) and the label sets their rows index."""
    name = "candidates_json"
    value: object = raw
    if isinstance(raw, str):
        value = _decode_json(raw, name)
        if isinstance(value, str):
            raise _refused(name, "decoded to a string: the JSON was encoded twice; send it once")
    if isinstance(value, dict | Candidate):
        elements: Sequence[object] = [value]
    elif isinstance(value, list | tuple):
        elements = value
    else:
        raise _refused(name, f"expected an array of candidate objects or one object, got {_type_name(value)}")

    problems: list[InputProblem] = []
    rows: list[Row] = []
    append = rows.append
    first_index: dict[int, int] = {}
    fast = _fast_row
    label_sets = LabelSets()
    known_labels = label_sets.known
    for index, element in enumerate(elements):
        row = fast(element, label_sets, known_labels) if type(element) is dict else None
        if row is None:
            if isinstance(element, Candidate):
                record: Mapping[Any, Any] = _candidate_as_record(element)
            elif isinstance(element, dict):
                record = element
            else:
                got = _type_name(element)
                problems.append(
                    InputProblem(input=name, index=index, field="", problem=f"expected an object, got {got}")
                )
                continue
            candidate, found = _candidate_from_record(record, index, name)
            problems.extend(found)
            if candidate is None:
                continue
            row = _row_of(candidate, label_sets)
        number = row[NUMBER]
        if number in first_index:
            problems.append(
                InputProblem(input=name, index=index, field="issue_number", issue_number=number,
                             problem=f"duplicate issue_number {number} (first at index {first_index[number]})")
            )
            continue
        first_index[number] = index
        append(row)
    if problems:
        raise InputError(problems)
    rows.sort(key=_issue_number_of)
    return rows, label_sets


_issue_number_of = itemgetter(NUMBER)


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
        raise _refused(name, f"expected an array of issue numbers, got {_type_name(value)}")
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

