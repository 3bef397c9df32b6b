"""The allocate-CLI benchmark's baseline process: load a candidates file and type-check every record, nothing else.

``python -m bench.candidates_typecheck FILE`` reads FILE (UTF-8), decodes it with the standard library's
``json.loads`` and checks each record the cheapest correct way, in one loop: an object with only the candidate keys,
``issue_number`` an integer (not a boolean) from 1 to 2^63-1 and unique, ``title`` null or a string, ``labels`` null
or an array of non-empty strings, ``created_at`` null or a string of the RFC 3339 shape (the pattern, not the
calendar), ``depends_on`` null or an array of such integers, ``ready`` null or a boolean, ``barred_owners`` null or an
array of non-empty strings, ``duplicate`` null or a string. It prints one JSON line: the records checked and the
milliseconds that took in-process (a cross-check of the figure measured from outside). Exit 1 if a record fails.
Standard library only: the process starts as small as Python does.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

FIELDS = frozenset({"issue_number", "title", "labels", "created_at", "depends_on", "ready", "barred_owners",
                    "duplicate"})
MAX_NUMBER = 2**63 - 1
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})", re.ASCII).fullmatch


def _names(value: object) -> bool:
    return value is None or (type(value) is list and all(type(x) is str and x for x in value))


def _numbers(value: object) -> bool:
    return value is None or (type(value) is list and all(type(x) is int and 0 < x <= MAX_NUMBER for x in value))


def record_ok(record: Any) -> bool:
    """One record's keys and the JSON type of each of its fields."""
    if type(record) is not dict or not record.keys() <= FIELDS:
        return False
    get = record.get
    number, title, created = get("issue_number"), get("title"), get("created_at")
    ready, duplicate = get("ready"), get("duplicate")
    return (
        type(number) is int and 0 < number <= MAX_NUMBER
        and (title is None or type(title) is str)
        and _names(get("labels"))
        and (created is None or (type(created) is str and _RFC3339(created) is not None))
        and _numbers(get("depends_on"))
        and (ready is None or type(ready) is bool)
        and _names(get("barred_owners"))
        and (duplicate is None or type(duplicate) is str)
    )


def load_and_check(path: str) -> int:
    """The records of ``path`` once every one passed; ValueError naming the first that does not."""
    with open(path, encoding="utf-8") as handle:
        records = json.loads(handle.read())
    if type(records) is not list:
        raise ValueError("not an array of records")
    seen: set[int] = set()
    for index, record in enumerate(records):
        if not record_ok(record) or record["issue_number"] in seen:
            raise ValueError(f"record {index} fails the type check")
        seen.add(record["issue_number"])
    return len(records)


def main(argv: Sequence[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) != 1:
        print("usage: python -m bench.candidates_typecheck FILE", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        count = load_and_check(args[0])
    except (OSError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 1
    print(json.dumps({"ok": True, "records": count, "ms": round((time.perf_counter() - started) * 1000, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
