"""Strict normalization of ``candidates_json`` and ``exclude_issue_numbers`` as received (seed AC3)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, Final

import orjson

from bot.core.allocator.records import (
    CANDIDATE_FIELDS,
    Candidate,
    InputError,
    InputProblem,
    new_candidate,
)
from bot.core.allocator.validate import (
    DuplicateKeyObject,
    candidate_as_record,
    candidate_from_record,
    has_surrogate,
    issue_number_problem,
    show,
    type_name,
)
from bot.core.jsontext import JSONTextError, may_hold_long_integer, strict_loads
from bot.core.vocabulary import MAX_ISSUE_NUMBER

#: The largest candidates_json / exclude_issue_numbers text taken (characters); larger is refused unread.
MAX_INPUT_CHARS: Final[int] = 8 * 1024 * 1024
# The keys the fast path takes; a record with any other (the alias `number`) goes to the full validator.
_FAST_FIELDS: Final[frozenset[str]] = CANDIDATE_FIELDS - {"number"}


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    duplicates: list[str] = []
    for key, _ in pairs:
        if key in seen and key not in duplicates:
            duplicates.append(key)
        seen.add(key)
    return DuplicateKeyObject(pairs, duplicates) if duplicates else dict(pairs)


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

    @classmethod
    def of(cls, sets: Sequence[tuple[str, ...]]) -> LabelSets:
        """The label sets ``sets`` (validated, sorted and distinct, ``sets[0]`` the empty one) as one call's."""
        label_sets = cls()
        for labels in sets[1:]:
            label_sets.canonical(labels)
        return label_sets

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
            if type(label) is not str or not label or (not label.isascii() and has_surrogate(label)):
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
    if title is not None and (type(title) is not str or (not title.isascii() and has_surrogate(title))):
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
    if duplicate is not None and (type(duplicate) is not str or not duplicate or has_surrogate(duplicate)):
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


class NormalizedCandidates(tuple[Candidate, ...]):
    """The candidates of one input as :func:`normalized_candidates` made them (sorted by issue number), with the
    rows and label sets it made them from.

    Deciding on them reads those rows back instead of validating every candidate a second time: ``foreman
    allocate --candidates-json`` normalizes its file before the door (to refuse a bad one with its own exit code)
    and the decision normalizes its request again, which took about as long as everything else the command adds
    over 10k candidates (bench/allocate_cli.py). Only :func:`normalized_candidates` builds one; the tuple and its
    candidates are immutable, so the rows stay the ones normalizing it again would make."""

    # A tuple subclass cannot have slots of its own: the two are set once, by normalized_candidates, in __dict__.
    rows: tuple[Row, ...]
    sets: tuple[tuple[str, ...], ...]


def normalized_candidates(raw: object) -> NormalizedCandidates:
    """:func:`normalize_candidates` as a :class:`NormalizedCandidates` (a tuple): the same checks and refusals."""
    rows, label_sets = normalize_rows(raw)
    sets = label_sets.sets
    candidates = NormalizedCandidates(row_candidate(row, sets) for row in rows)
    candidates.rows = tuple(rows)
    candidates.sets = tuple(sets)
    return candidates


def row_candidate(row: Row, sets: Sequence[tuple[str, ...]]) -> Candidate:
    """The :class:`Candidate` of a row (``sets``: the label sets its ``LABEL_SET`` indexes)."""
    return new_candidate(row[NUMBER], row[TITLE], sets[row[LABEL_SET]], row[CREATED_AT], row[DEPENDS_ON], row[READY],
                         row[BARRED_OWNERS], row[DUPLICATE])


def normalize_rows(raw: object) -> tuple[list[Row], LabelSets]:
    """:func:`normalize_candidates` as the decision reads it: the same checks, the same refusals, rows instead of
    :class:`Candidate` objects (sorted by issue number) and the label sets their rows index."""
    name = "candidates_json"
    if type(raw) is NormalizedCandidates:  # normalized already, by these rules: its rows, not a second validation
        return list(raw.rows), LabelSets.of(raw.sets)
    value: object = raw
    if isinstance(raw, str):
        quick = _quick_rows(raw) if len(raw) <= MAX_INPUT_CHARS else None
        if quick is not None:
            return quick
        value = _decode_json(raw, name)
        if isinstance(value, str):
            raise _refused(name, "decoded to a string: the JSON was encoded twice; send it once")
    if isinstance(value, dict | Candidate):
        elements: Sequence[object] = [value]
    elif isinstance(value, list | tuple):
        elements = value
    else:
        raise _refused(name, f"expected an array of candidate objects or one object, got {type_name(value)}")

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
                record: Mapping[Any, Any] = candidate_as_record(element)
            elif isinstance(element, dict):
                record = element
            else:
                got = type_name(element)
                problems.append(
                    InputProblem(input=name, index=index, field="", problem=f"expected an object, got {got}")
                )
                continue
            candidate, found = candidate_from_record(record, index, name)
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


def _quick_rows(text: str) -> tuple[list[Row], LabelSets] | None:
    """:func:`normalize_rows` of a JSON text whose every record takes the fast path, decoded by orjson (the strict
    decoder's per-object hook that finds repeated keys costs as much as decoding); None for anything else, which the
    strict decoder and the full validator then take exactly as before (every refusal and its words are theirs).

    orjson reads the same values as json wherever it reads a text at all (bot/core/jsontext.py ``quick_loads``), save
    integers past 64 bits (a text with a 19-digit run is left to json) and nesting (records that take the fast path
    are three levels deep at most). A repeated key, which orjson drops silently, is found by counting colons: each
    object member has one outside strings, and every colon inside a string is written back as it was read (unless
    escaped, ``\\u003a``: such a text is left to json), so the text and orjson's compact re-dump of what it read have
    as many colons only when no member was dropped."""
    if "\\u003" in text:
        return None
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in the str itself
        return None
    if may_hold_long_integer(data):
        return None
    try:
        value = orjson.loads(data)
        if data.count(b":") != orjson.dumps(value).count(b":"):
            return None  # a repeated key: the full path names the record
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        return None
    records = [value] if type(value) is dict else value
    if type(records) is not list:
        return None
    rows: list[Row] = []
    label_sets = LabelSets()
    known_labels = label_sets.known
    numbers: set[int] = set()
    for record in records:
        row = _fast_row(record, label_sets, known_labels) if type(record) is dict else None
        if row is None or row[NUMBER] in numbers:
            return None
        numbers.add(row[NUMBER])
        rows.append(row)
    rows.sort(key=_issue_number_of)
    return rows, label_sets


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
        elements: Sequence[object] = sorted(value, key=show)
    elif isinstance(value, list | tuple):
        elements = value
    else:
        raise _refused(name, f"expected an array of issue numbers, got {type_name(value)}")
    problems: list[InputProblem] = []
    numbers: set[int] = set()
    for index, element in enumerate(elements):
        issue = issue_number_problem(element)
        if issue is not None:
            problems.append(InputProblem(input=name, index=index, field=name, problem=issue))
        else:
            assert isinstance(element, int)
            numbers.add(element)
    if problems:
        raise InputError(problems)
    return frozenset(numbers)

