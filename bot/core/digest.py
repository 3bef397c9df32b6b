"""One canonical JSON and its digests: equal values give equal text, equal text gives equal digests."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any


class CanonicalError(ValueError):
    """A value that has no canonical JSON form (a non-string key, NaN, a set, an object, ...)."""


def canonicalize(value: object, *, where: str = "$") -> Any:
    """A fresh, plain JSON copy of ``value`` (dicts, lists, str, int, finite float, bool, None).

    Mappings need string keys; lists and tuples become lists. Nothing of the input is shared with the output,
    so a caller mutating what it passed in afterwards changes nothing here.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalError(f"{where}: not a finite number")
        return float(value)
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalError(f"{where}: object keys must be strings")
            out[key] = canonicalize(item, where=f"{where}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [canonicalize(item, where=f"{where}[{index}]") for index, item in enumerate(value)]
    raise CanonicalError(f"{where}: {type(value).__name__} is not JSON")


def _dumps(value: object, *, ensure_ascii: bool) -> str:
    plain = canonicalize(value)
    try:
        return json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)
    except ValueError as exc:  # an integer too long to print (more than sys.get_int_max_str_digits() digits)
        raise CanonicalError(f"$: {exc}") from None


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, UTF-8 text as is: equal values give equal text (and equal digests)."""
    text = _dumps(value, ensure_ascii=False)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise CanonicalError("$: a string holds a lone surrogate, which UTF-8 cannot encode") from None
    return text


def digest(value: object) -> str:
    """``sha256:<hex>`` over the canonical JSON of ``value``."""
    return text_digest(canonical_json(value))


def text_digest(text: str) -> str:
    """``sha256:<hex>`` over ``text`` as UTF-8 (canonical JSON already made text, or any other text)."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def freeze(value: object) -> Any:
    """A deep read-only view of a JSON value: mappings become ``MappingProxyType`` over private copies, lists tuples."""
    plain = canonicalize(value)
    return _freeze(plain)


def _freeze(plain: Any) -> Any:
    if isinstance(plain, dict):
        return MappingProxyType({k: _freeze(v) for k, v in plain.items()})
    if isinstance(plain, list):
        return tuple(_freeze(v) for v in plain)
    return plain


def fingerprint_digest(value: object) -> str:
    """Bare SHA-256 hex over the canonical JSON with every non-ASCII character escaped (``"\\u00e9"``).

    The allocator's fingerprint form: dry runs hand it out and callers pin it on apply, so pinned values made by
    an earlier version still match; never change it (a change makes every outstanding pin ``stale_pin``).
    """
    return hashlib.sha256(_dumps(value, ensure_ascii=True).encode("ascii")).hexdigest()
