"""The "event loop was held" warning is rate-limited with a count (issue 34 item 3: 834 of 905 log lines were it)."""

from __future__ import annotations

import logging

import pytest

from bot.metrics import HeldWarnings


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "foreman.metrics"]


def test_a_burst_of_holds_logs_one_line_then_one_line_with_the_count(caplog: pytest.LogCaptureFixture) -> None:
    """A hold over the threshold logs at once; the next 50 within the window are counted, not logged; the first
    after the window logs one line naming how many there were and the longest."""
    caplog.set_level(logging.WARNING, logger="foreman.metrics")
    warnings = HeldWarnings(warn_s=0.05, every_s=60.0)
    warnings.held(0.2, now=1000.0)
    for i in range(50):
        warnings.held(0.06 + i / 1000, now=1001.0 + i)
    warnings.held(0.01, now=1055.0)  # under the threshold: neither logged nor counted
    assert _lines(caplog) == ["the event loop was held for 200 ms"]
    warnings.held(0.07, now=1061.0)
    assert _lines(caplog)[1] == ("the event loop was held for 70 ms (and 50 more time(s) over 50 ms in the 61 s "
                                 "before, the longest 109 ms)")
    warnings.held(0.3, now=1062.0)
    warnings.flush(now=1070.0)
    warnings.flush(now=1080.0)  # nothing left to say
    assert _lines(caplog)[2:] == [
        "the event loop was held 1 more time(s) over 50 ms in the last 9 s, the longest 300 ms"]


def test_holds_further_apart_than_the_window_each_log_alone(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="foreman.metrics")
    warnings = HeldWarnings(warn_s=0.05, every_s=60.0)
    for minute in range(3):
        warnings.held(0.1, now=60.0 * minute)
    assert _lines(caplog) == ["the event loop was held for 100 ms"] * 3
