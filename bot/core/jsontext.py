"""Strict RFC 8259 decoding of untrusted JSON text: every refusal is one typed ``JSONTextError``. Pure."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final, Literal

import orjson

JSONTextProblem = Literal["syntax", "constant", "too_deep", "long_integer", "repeated_key"]


class JSONTextError(ValueError):
    """Why a text is not strict JSON: ``kind`` for callers that word it their own way, and a message."""

    def __init__(self, kind: JSONTextProblem, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The default object hook: a repeated key is refused (one of its values would be silently lost)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JSONTextError("repeated_key", f"key {key!r} appears more than once in a JSON object")
        out[key] = value
    return out


def _constant(name: str) -> Any:
    raise JSONTextError("constant", f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def strict_loads(
    text: str | bytes, *, object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = unique_pairs
) -> Any:
    """``json.loads`` refusing, as ``JSONTextError``, everything RFC 8259 or Python's limits refuse.

    ``object_pairs_hook=None`` keeps repeated keys (the last wins, as ``json.loads`` does); a hook may raise
    ``JSONTextError`` itself, or collect what it finds for the caller to report.
    """
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook, parse_constant=_constant)
    except JSONTextError:
        raise
    except RecursionError:
        raise JSONTextError("too_deep", "nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise JSONTextError("syntax", f"{exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except UnicodeDecodeError:
        raise JSONTextError("syntax", "not UTF-8 text") from None
    except ValueError as exc:  # the decoder's int-str limit (a hook's own ValueError is worded by the hook)
        if "digits" in str(exc):
            raise JSONTextError("long_integer", "an integer has more than 4,300 digits") from None
        raise JSONTextError("syntax", str(exc)[:200]) from None


#: An integer literal of 19 or more digits may be past 64 bits, which orjson reads as a float (json as an int).
#: Found as a run of 19 nines once every digit is a nine (C speed; a regular expression costs 10x more).
_DIGITS_AS_NINES = bytes.maketrans(b"0123456789", b"9" * 10)
_LONG_RUN = b"9" * 19
#: Opening brackets below which no text can nest deep enough for json's recursion limit (about 1,000 levels
#: under the caller's frames): json would refuse a deeper text as ``too_deep`` where orjson reads 1,024 levels.
QUICK_MAX_CONTAINERS = 500


class _Unsure:
    """The answer of ``quick_loads`` when only the standard decoder may read the text."""


UNSURE: Final = _Unsure()


def may_hold_long_integer(text: bytes) -> bool:
    """Whether ``text`` has a run of 19 or more digits: only then may its JSON hold an integer past 64 bits (or
    past what a database column holds); False proves it holds none. C speed."""
    return _LONG_RUN in text.translate(_DIGITS_AS_NINES)


def quick_loads(text: bytes, *, containers: int | None = None) -> Any:
    """What ``json.loads(text)`` returns, read by orjson (about 3x faster), or ``UNSURE`` where the two could differ.

    orjson reads a subset of what ``json.loads`` reads, each value equal and of the same type, except integers past
    64 bits (it makes them floats; any 19-digit run is left to json) and nesting json's recursion limit refuses
    (texts with ``QUICK_MAX_CONTAINERS`` brackets or more are left to json). Everything orjson refuses (NaN,
    Infinity, lone surrogates, a byte-order mark, UTF-16, bad syntax) is ``UNSURE`` too: json decides it, so the
    callers' acceptance and error messages are exactly json's. ``containers``: the count of ``{`` and ``[`` when
    the caller has it already.
    """
    if containers is None:
        containers = text.count(b"{") + text.count(b"[")
    if containers >= QUICK_MAX_CONTAINERS or may_hold_long_integer(text):
        return UNSURE
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return UNSURE


def loads(text: bytes) -> Any:
    """``json.loads(text)``, exactly (its value, its errors), through orjson wherever ``quick_loads`` may."""
    value = quick_loads(text)
    return json.loads(text) if value is UNSURE else value
