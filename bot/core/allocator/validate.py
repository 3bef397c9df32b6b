"""The full validator of one candidate record: every problem it has, each named by field and issue, in words a
caller can act on (the fast path in candidates.py takes the common valid record; anything else comes here)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

from bot.core.allocator.records import CANDIDATE_FIELDS, Candidate, InputProblem, is_issue_number
from bot.core.vocabulary import MAX_ISSUE_NUMBER

_SHOWN_CHARS: Final[int] = 60
_RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)
class DuplicateKeyObject(dict[str, Any]):
    """A decoded JSON object that repeated a key; kept so the problem is reported at its element."""

    def __init__(self, pairs: list[tuple[str, Any]], duplicates: list[str]) -> None:
        super().__init__(pairs)
        self.duplicate_keys = duplicates


def show(value: object) -> str:
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
    return type_name(value)


def _field_name(key: object) -> str:
    return key if isinstance(key, str) and len(key) <= _SHOWN_CHARS else show(key)


def has_surrogate(text: str) -> bool:
    """A lone surrogate (JSON ``"\ud800"``) is not text: it cannot be encoded, so it cannot be a label or title."""
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def type_name(value: object) -> str:
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


def issue_number_problem(value: object) -> str | None:
    if is_issue_number(value):
        return None
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)} is not an integer"
    if isinstance(value, float):
        return f"{value!r} is a float; send an integer"
    if isinstance(value, str):
        return f"string {show(value)} is not an integer; send the number unquoted"
    if type(value) is int:
        return f"{show(value)} is not a positive issue number (1 to {MAX_ISSUE_NUMBER})"
    return f"expected a positive integer, got {type_name(value)}"



def _parse_rfc3339(value: str) -> datetime | None:
    if _RFC3339.fullmatch(value) is None:
        return None
    try:  # the pattern pins the shape; fromisoformat checks the calendar and keeps microseconds
        return datetime.fromisoformat(value.upper())
    except ValueError:
        return None


def candidate_from_record(
    record: Mapping[Any, Any], index: int, input_name: str
) -> tuple[Candidate | None, list[InputProblem]]:
    """The full validator: the candidate of one record, or every problem it has, each naming its field (and its
    issue, once the number is read)."""
    # The number comes first so that every other problem can name the issue it belongs to.
    number, number_problems = _record_number(record)
    problems: list[InputProblem] = []

    def problem(fld: str, text: str) -> None:
        problems.append(InputProblem(input=input_name, index=index, field=fld, problem=text, issue_number=number))

    if isinstance(record, DuplicateKeyObject):
        for key in record.duplicate_keys:
            problem(_field_name(key), f"key {show(key)} appears more than once in the object")
    for key in sorted((k for k in record if k not in CANDIDATE_FIELDS), key=show):
        problem(_field_name(key), f"unknown field {show(key)}; allowed: {', '.join(sorted(CANDIDATE_FIELDS))}")
    for fld, text in number_problems:
        problem(fld, text)
    title = _record_title(record.get("title"), problem)
    labels: list[str] = _record_array(record.get("labels"), "labels", "label names", _label_problem, problem)
    created_at = _record_created_at(record.get("created_at"), problem)
    depends_on: list[int] = _record_array(record.get("depends_on"), "depends_on", "issue numbers",
                                          _dependency_problem(number), problem)
    ready = record.get("ready", True)
    if ready is None:
        ready = True
    elif not isinstance(ready, bool):
        problem("ready", f"expected a boolean, got {type_name(ready)}")
        ready = True
    barred = _record_barred_owners(record.get("barred_owners"), problem)
    duplicate = record.get("duplicate")
    if duplicate is not None and (not isinstance(duplicate, str) or not duplicate or has_surrogate(duplicate)):
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
        issue = issue_number_problem(raw)
        if issue is not None:
            number_problems.append((fld, issue))
        else:
            number = raw
            alias = record.get("number") if has_primary and has_alias else raw
            if not (is_issue_number(alias) and alias == raw):
                number_problems.append(
                    ("number", f"alias `number` ({show(alias)}) disagrees with issue_number {raw}")
                )
    return number, number_problems


def _record_title(title: object, problem: _Problem) -> str | None:
    if title is None:
        return None
    if not isinstance(title, str):
        problem("title", f"expected a string or null, got {type_name(title)}")
        return None
    if has_surrogate(title):
        problem("title", "is not valid Unicode text (a lone surrogate such as \\ud800)")
        return None
    return title


def _record_array(
    raw: object, fld: str, expected: str, item_problem: Callable[[Any], str | None], problem: _Problem
) -> list[Any]:
    """The items of an array field that pass ``item_problem`` (None: no problem); every other one is a problem."""
    items: list[Any] = []
    if raw is not None:
        if not isinstance(raw, list | tuple):
            problem(fld, f"expected an array of {expected}, got {type_name(raw)}")
        else:
            for i, item in enumerate(raw):
                found = item_problem(item)
                if found is not None:
                    problem(f"{fld}[{i}]", found)
                else:
                    items.append(item)
    return items


def _label_problem(label: object) -> str | None:
    if not isinstance(label, str) or not label or has_surrogate(label):
        got = "an empty string" if label == "" else type_name(label)
        got = "a string with a lone surrogate" if isinstance(label, str) and label else got
        return f"expected a non-empty label name string, got {got}"
    return None


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
                f"{show(raw_created)} is not an RFC 3339 date-time with offset (e.g. 2026-07-20T21:35:15-05:00)",
            )
    elif raw_created is not None:
        problem("created_at", f"expected an RFC 3339 string or null, got {type_name(raw_created)}")
    return created_at


def _dependency_problem(number: int | None) -> Callable[[object], str | None]:
    def dependency_problem(dep: object) -> str | None:
        found = issue_number_problem(dep)
        if found is None and dep == number:
            return "an issue cannot depend on itself"
        return found

    return dependency_problem


def _record_barred_owners(raw_barred: object, problem: _Problem) -> list[str]:
    barred: list[str] = []
    if raw_barred is not None:
        if not isinstance(raw_barred, list | tuple) or not all(isinstance(x, str) and x for x in raw_barred):
            problem("barred_owners", f"expected an array of logins, got {type_name(raw_barred)}")
        else:
            barred = list(raw_barred)
    return barred


def candidate_as_record(candidate: Candidate) -> dict[str, Any]:
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
