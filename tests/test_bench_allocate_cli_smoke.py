"""bench/allocate_cli.py runs `foreman allocate --candidates-json @FILE` end to end and checks every run's output;
the figures and the verdict are reported, never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.candidates_typecheck import load_and_check, record_ok
from tests.support import HANG_S

pytestmark = [pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_benchmark_runs_the_command_checks_its_decisions_and_reports_the_ratio() -> None:
    argv = [sys.executable, "-m", "bench.allocate_cli", "--size", "300", "--repeat", "1", "--json"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["errors"] == []
    assert doc["settings"]["n"] == 300
    for clock in ("wall", "cpu"):
        figures = doc[clock]
        assert set(figures["medians_ms"]) == {"command_1", "command_300", "baseline_1", "baseline_300"}
        assert set(figures["fastest_ms"]) == set(figures["medians_ms"])
        assert all(len(samples) == 1 for samples in figures["samples_ms"].values())
        assert isinstance(figures["command_marginal_ms"], float) and isinstance(figures["baseline_marginal_ms"], float)
        # a ratio is reported whenever both marginal costs are positive; the verdict goes with it
        assert (figures["ratio"] is None) == (figures["result"] is None)
        assert figures["result"] in {"PASS", "MISS", None}
    assert doc["target"]["result"] == doc["wall"]["result"] and doc["baseline_in_process_ms"] > 0


def test_text_output_prints_both_clocks_and_the_verdict() -> None:
    argv = [sys.executable, "-m", "bench.allocate_cli", "--size", "50", "--repeat", "1"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "marginal" in out and "baseline 1" in out and "\n  wall " in out and "\n   cpu " in out
    assert "target allocate --candidates-json @FILE" in out and "correctness" in out and ": PASS" in out


def test_the_baseline_type_check_refuses_what_the_allocator_refuses_by_type(tmp_path: Path) -> None:
    """The baseline does real work: every record's keys and field types, and unique issue numbers."""
    good = {"issue_number": 7, "title": "t", "labels": ["a"], "created_at": "2026-01-02T03:04:05Z",
            "depends_on": [3], "ready": True}
    assert record_ok(good)
    for bad in ({**good, "issue_number": True}, {**good, "issue_number": "7"}, {**good, "labels": [""]},
                {**good, "created_at": "2026-01-02"}, {**good, "depends_on": [1.0]}, {**good, "ready": 1},
                {**good, "extra": 1}, {"title": "no number"}):
        assert not record_ok(bad), bad
    path = tmp_path / "c.json"
    path.write_text(json.dumps([good, {"issue_number": 8}]), encoding="utf-8")
    assert load_and_check(str(path)) == 2
    path.write_text(json.dumps([good, good]), encoding="utf-8")
    with pytest.raises(ValueError, match="record 1"):
        load_and_check(str(path))


def test_bad_size_is_a_usage_error() -> None:
    argv = [sys.executable, "-m", "bench.allocate_cli", "--size", "1"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 2 and "--size" in done.stderr
