"""``quick_loads``: orjson's reading only where it equals ``json.loads``'s, value and type; every other text is
left to json (``UNSURE``), so the webhook door admits and refuses exactly what it did with json alone."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.intake import Delivery, Rejection, admit
from bot.core.jsontext import QUICK_MAX_CONTAINERS, UNSURE, JSONTextError, quick_loads, strict_loads
from tests.support import SECRET, webhook_headers


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type all the way down (1 == 1.0 == True in Python; not here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    return bool(a == b)


_scalars = (
    st.none() | st.booleans() | st.text() | st.floats(allow_nan=False, allow_infinity=False)
    | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
)
_values = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


def _agrees(text: bytes) -> None:
    quick = quick_loads(text)
    if quick is UNSURE:
        return
    assert same(quick, json.loads(text)), text


@settings(max_examples=400, deadline=None)
@given(_values, st.booleans())
def test_whatever_quick_reads_equals_json_value_and_type(value: Any, ascii_only: bool) -> None:
    _agrees(json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=40) | st.text(alphabet='{}[]",:0123456789.eE+-tfnrueal \\u\x00d8', max_size=40).map(
    lambda t: t.encode("utf-8", "surrogatepass")))
def test_arbitrary_bytes_are_read_alike_or_left_to_json(text: bytes) -> None:
    quick = quick_loads(text)
    if quick is UNSURE:
        return
    assert same(quick, json.loads(text)), text  # json must read it too, to the same value


@pytest.mark.parametrize(
    "text",
    [
        b"18446744073709551616",  # past 64 bits: orjson makes it a float
        b"-9223372036854775809",  # below int64: orjson makes it a float
        b'{"id": 1234567890123456789012}',
        b"1e400",  # json reads inf, orjson refuses
        b"NaN",
        b'"\\ud800"',  # a lone surrogate: json reads it (intake then refuses it), orjson refuses
        b"\xef\xbb\xbf{}",  # a UTF-8 byte-order mark: json skips it
        '{"a": 1}'.encode("utf-16"),  # json detects UTF-16
    ],
)
def test_texts_where_orjson_would_differ_are_left_to_json(text: bytes) -> None:
    assert quick_loads(text) is UNSURE


def test_deep_nesting_json_refuses_is_left_to_json() -> None:
    """orjson reads 1,024 levels; json stops near its recursion limit (``too_deep``): such texts go to json."""
    text = b"[" * 990 + b"]" * 990
    with pytest.raises(JSONTextError) as refused:
        strict_loads(text)
    assert refused.value.kind == "too_deep"
    assert quick_loads(text) is UNSURE
    assert quick_loads(b"[" * (QUICK_MAX_CONTAINERS - 1) + b"]" * (QUICK_MAX_CONTAINERS - 1)) is not UNSURE


def test_repeated_keys_the_last_wins_and_ordinary_values_are_read_quickly() -> None:
    assert quick_loads(b'{"a": 1, "b": [2.5, "x"], "a": 3}') == {"a": 3, "b": [2.5, "x"]}
    assert same(quick_loads(b"9223372036854775807"), UNSURE)  # 19 digits: left to json, whatever it is
    assert same(quick_loads(b"922337203685477580"), 922337203685477580)


@pytest.mark.parametrize("number", [b"9223372036854775807", b"-9223372036854775808", b"1234567890123456789"])
def test_the_webhook_door_keeps_a_long_integer_an_integer(number: bytes) -> None:
    """A 19-digit integer (orjson would read it as a float past 64 bits) stays an int, up to the int64 bounds."""
    body = b'{"action": "opened", "sender": {"login": "alice"}, "big": ' + number + b"}"
    verdict = admit(webhook_headers(body, delivery="d-long"), body, secrets=[SECRET.encode()], max_body_bytes=1 << 20)
    assert isinstance(verdict, Delivery)
    assert same(verdict.payload["big"], int(number))


@pytest.mark.parametrize("number", [b"123456789012345678901234567890", b"-9223372036854775809", b"9223372036854775808"])
def test_the_webhook_door_refuses_an_integer_past_64_bits(number: bytes) -> None:
    """Issue 29 item 6: no database column holds it (the handlers failed with OverflowError at every retry)."""
    body = b'{"action": "opened", "sender": {"login": "alice"}, "big": ' + number + b"}"
    verdict = admit(webhook_headers(body, delivery="d-long"), body, secrets=[SECRET.encode()], max_body_bytes=1 << 20)
    assert isinstance(verdict, Rejection) and (verdict.status, verdict.error) == (400, "invalid_number"), verdict


def test_loads_is_json_loads_for_what_orjson_reads_and_what_it_leaves() -> None:
    """The worker's reading of a stored body: json.loads's value and errors, quick or not."""
    from bot.core import jsontext

    for text in (b'{"a": [1, 2.5, "x"]}', b'{"big": 123456789012345678901234567890}', b"\xef\xbb\xbf{}"):
        assert same(jsontext.loads(text), json.loads(text))
    with pytest.raises(json.JSONDecodeError):
        jsontext.loads(b'{"a": ')
