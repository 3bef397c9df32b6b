"""The one canonical JSON and its digests (grants, run evidence and the allocator's fingerprint use it)."""

from __future__ import annotations

import pytest

from bot.core.digest import CanonicalError, canonical_json, digest, freeze


def test_canonical_json_is_key_order_and_whitespace_independent_and_typed() -> None:
    """Issue 8.1: digests are SHA-256 over canonical JSON; true is never 1 and 1 is never 1.0."""
    assert canonical_json({"b": [1, {"d": 2, "c": "é"}], "a": None}) == '{"a":null,"b":[1,{"c":"é","d":2}]}'
    assert digest({"x": 1, "y": 2}) == digest({"y": 2, "x": 1})
    assert canonical_json({"v": True}) != canonical_json({"v": 1})
    assert canonical_json({"v": 1}) != canonical_json({"v": 1.0})
    for bad in ({1: "x"}, {"n": float("nan")}, {"s": {1, 2}}, object()):
        with pytest.raises(CanonicalError):
            canonical_json(bad)


def test_freeze_gives_a_deep_read_only_copy() -> None:
    source = {"a": [1, {"b": 2}]}
    frozen = freeze(source)
    source["a"].append(3)  # type: ignore[attr-defined]
    assert frozen["a"] == (1, {"b": 2})
    with pytest.raises(TypeError):
        frozen["a"][1]["b"] = 3
