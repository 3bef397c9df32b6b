"""The one config writer: what it writes reads back as what it was given, and what it cannot write it refuses."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.config import load_settings
from bot.config_writer import ConfigWriteError, merged, render_config, write_config

_keys = st.text(min_size=1, max_size=12)
_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30).filter(lambda s: not any(0xD800 <= ord(c) <= 0xDFFF for c in s)),
)
_values = st.one_of(_scalars, st.lists(_scalars, max_size=4))
_tables = st.recursive(
    st.dictionaries(_keys, _values, max_size=4),
    lambda inner: st.dictionaries(
        _keys, st.one_of(_values, inner, st.lists(inner, min_size=1, max_size=2)), max_size=4
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_tables)
def test_what_is_written_reads_back_equal(doc: dict[str, Any]) -> None:
    """Keys that need quotes, escapes, control characters, nested tables and arrays of tables all survive."""
    assert tomllib.loads(render_config(doc)) == doc


def test_hostile_strings_and_keys_round_trip() -> None:
    doc = {"roster": {'a "quoted" login': ["author"], "dotted.key": ["reviewer"]},
           "x": {"s": 'back\\slash "q" \n\t\x00\x1f\x7f \u2028 \U0001f600'}}
    assert tomllib.loads(render_config(doc)) == doc


def test_arrays_of_tables_and_paths(tmp_path: Path) -> None:
    doc = {"repositories": [{"owner": "o", "name": "a"}, {"owner": "o", "name": "b", "checkout_root": tmp_path}]}
    assert tomllib.loads(render_config(doc)) == {
        "repositories": [{"owner": "o", "name": "a"}, {"owner": "o", "name": "b", "checkout_root": str(tmp_path)}]
    }


@pytest.mark.parametrize("value", [None, math.nan, math.inf, {1, 2}, object()])
def test_values_without_a_toml_form_are_refused_by_path(value: object) -> None:
    with pytest.raises(ConfigWriteError, match=r"^a\.b"):
        render_config({"a": {"b": value}})


def test_merged_lays_tables_over_each_other_without_touching_the_base() -> None:
    base = {"gitea": {"url": "http://x", "token": "t"}, "roster": {"a": ["author"]}}
    out = merged(base, {"gitea": {"token": "u"}}, {"roster": {"b": ["controller"]}, "extra": 1})
    assert out == {"gitea": {"url": "http://x", "token": "u"}, "roster": {"a": ["author"], "b": ["controller"]},
                   "extra": 1}
    assert base == {"gitea": {"url": "http://x", "token": "t"}, "roster": {"a": ["author"]}}


def test_a_written_config_loads_as_settings(tmp_path: Path) -> None:
    path = write_config(tmp_path / "sub" / "foreman.toml", {
        "webhook": {"secrets": ["s" * 24]},
        "database": {"path": tmp_path / "foreman.db"},
        "repository": {"owner": "acme", "name": "widgets"},
        "roster": {"author-1": ["author"]},
    }, comment="written by a test")
    assert path.read_text().startswith("# written by a test\n")
    settings = load_settings(path)
    assert (settings.repository.owner, settings.repository.name) == ("acme", "widgets")
    assert settings.database.path == tmp_path / "foreman.db"
