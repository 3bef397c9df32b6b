"""Strict RFC 8259 decoding of untrusted JSON text: every refusal is one typed ``JSONTextError``. Pure."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

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
