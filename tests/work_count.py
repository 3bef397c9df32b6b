"""Work counted, not timed: the function calls a piece of pure code makes, for tests that bound its cost.

A time limit in a test fails on a busy machine and passes a quadratic bug on a fast one; a count of calls is the
same on every run. ``sys.setprofile`` sees every Python and C function called (not the work inside one C call, so
the integer-to-text conversions that are the classic hidden cost are bounded separately: while counting, the
interpreter refuses to print an integer past ``INT_DIGITS_PRINTED`` digits).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: The lowest limit the interpreter accepts; every integer the service accepts is int64 (19 digits).
INT_DIGITS_PRINTED = 640


def json_values(value: object) -> int:
    """How many JSON values ``value`` holds (each object key counted; a string one per 1,000 characters)."""
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, list | tuple):
            stack.extend(node)
        elif isinstance(node, dict):
            count += len(node)
            stack.extend(node.values())
        elif isinstance(node, str):
            count += len(node) // 1000
    return count


def counted(
    call: Callable[[], T], *, int_digits: int | None = INT_DIGITS_PRINTED
) -> tuple[T | None, Exception | None, int]:
    """Run ``call``; its result (or the exception it raised) and the function calls it made (Python and C).

    ``int_digits`` lowers the interpreter's integer-to-text limit meanwhile (None: leaves it as it is, for code that
    decodes JSON text and so meets the limit while parsing, not only while printing)."""
    calls = 0

    def count(frame: object, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" or event == "c_call":
            calls += 1

    digits = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(digits if int_digits is None else int_digits)
    sys.setprofile(count)
    try:
        return call(), None, calls
    except Exception as exc:  # the caller decides what an exception means
        return None, exc, calls
    finally:
        sys.setprofile(None)
        sys.set_int_max_str_digits(digits)


def lines_executed(call: Callable[[], T]) -> tuple[T, int]:
    """Run ``call``; its result and the Python lines it executed (``sys.settrace``): a loop inside one function shows
    here, where a count of calls would not see it."""
    lines = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return trace

    sys.settrace(trace)
    try:
        return call(), lines
    finally:
        sys.settrace(None)
