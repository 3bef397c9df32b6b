"""``from_db_time`` reads the stored shape with ``datetime.fromisoformat`` (strptime took ~10 µs a timestamp, a
visible share of the event loop's time in the loop benchmark): the same value and the same errors as
``strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ")`` for every text."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from state.db import from_db_time, to_db_time

FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _reference(text: str) -> datetime | type[Exception]:
    try:
        return datetime.strptime(text, FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return ValueError


def _ours(text: str) -> datetime | type[Exception]:
    try:
        return from_db_time(text)
    except ValueError:
        return ValueError


@given(st.datetimes(min_value=datetime(1000, 1, 1), timezones=st.just(UTC)))  # strftime writes 4-digit years only
def test_every_stored_time_reads_back_as_itself(moment: datetime) -> None:
    text = to_db_time(moment)
    assert from_db_time(text) == moment == _reference(text)
    assert from_db_time(text).tzinfo is UTC


@given(st.text(alphabet="0123456789-T:.Z +", max_size=30))
def test_any_text_reads_as_strptime_reads_it(text: str) -> None:
    assert _ours(text) == _reference(text)


@pytest.mark.parametrize("text", [
    "2026-02-30T00:00:00.000000Z",  # the shape, not the calendar
    "2026-12-06T24:00:00.000000Z",
    "2026-1-06T00:00:00.000000Z",  # strptime's looser digits
    "2026-12-06T03:21:40.12345Z",
    "2026-12-06T03:21:40.123456+00:00",
    "\uff12\uff10\uff12\uff16-12-06T03:21:40.123456Z",  # non-ASCII digits
    "",
])
def test_the_edges_read_as_strptime_reads_them(text: str) -> None:
    assert _ours(text) == _reference(text)
