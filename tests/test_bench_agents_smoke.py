"""Smoke test of the many-agents benchmark (bench/agents.py): a few MCP sessions over HTTP (foreman serve's /mcp, one
identity each) beside a small webhook rate against a real `foreman serve`; every check passes, every call got a real
tool result and every figure is reported; and the helpers it shares with the other benchmarks (bench/harness.py,
bench/database.py's footprint). No timing is asserted (issue 19)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench.agents import BASELINE, TOOLS, _figures, _merged, _rounds, _session_rounds, answer_errors, failed_calls
from bench.database import footprint, scratch_schema
from bench.harness import signed_requests
from bench.intake import sign
from tests.conftest import POSTGRES_MISSING, POSTGRES_URL, REPO_ROOT, postgres_reachable
from tests.support import HANG_S, SLOW_HANG_S

pytestmark = [pytest.mark.slow]


def test_rounds_count_each_session_from_its_own_phase() -> None:
    """Session i starts at i/N of a period: 3 sessions, 5 s, period 2 make 3 + 3 + 2 rounds."""
    assert _rounds(3, 5.0, 2.0) == 8
    assert _rounds(1, 10.0, 10.0) == 1
    assert _rounds(100, 60.0, 10.0) == 600
    assert sum(_session_rounds(i, 1000, 60.0, 10.0) for i in range(0, 1000, 2)) == 3000  # one of two drivers


def test_the_drivers_documents_merge_and_failed_calls_are_counted_by_kind() -> None:
    def driver(calls: list[dict[str, Any]], ended: float) -> dict[str, Any]:
        return {"calls": calls, "samples": [], "startup_s": ended / 100, "mcp_processes": 0, "mcp_peak_rss_kib": [],
                "mcp_cpu_s": 0.5, "driver_lag_max_ms": ended, "driver_peak_rss_mib": 50.0, "session_failures": [],
                "sessions_ended_at": ended}

    ok = {"login": "a", "tool": "gitea_heartbeat_lease", "round": 0, "ok": True}
    merged = _merged([driver([ok, {**ok, "ok": False, "kind": "refused"}], 20.0),
                      driver([{**ok, "ok": False, "kind": "tool"}, {**ok, "ok": False}], 10.0)])
    assert (len(merged["calls"]), merged["sessions_ended_at"], merged["startup_s"], merged["mcp_cpu_s"]) == (
        4, 10.0, 0.2, 1.0)
    assert failed_calls(merged["calls"]) == {"total": 3, "refused": 1, "error": 0, "tool": 1, "broken": 1}


def test_the_load_is_signed_with_the_given_secret_and_unique() -> None:
    requests = signed_requests("s3cret", 20, "tag")
    assert len({headers["X-Gitea-Delivery"] for _, headers in requests}) == len({b for b, _ in requests}) == 20
    assert all(headers["X-Gitea-Signature"] == sign(body, "s3cret") for body, headers in requests)


def test_the_load_generator_refuses_without_its_secret() -> None:
    """The secret comes from the environment only (never the command line); without it, one line and exit 2."""
    env = {k: v for k, v in os.environ.items() if k != "BENCH_LOAD_SECRET"}
    argv = [sys.executable, "-m", "bench.harness", "load", "--url", "http://127.0.0.1:9/webhook", "--rate", "1",
            "--seconds", "1"]
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 2 and "BENCH_LOAD_SECRET" in done.stderr and "Traceback" not in done.stderr


def test_targets_are_missed_exactly_when_the_figures_exceed_them() -> None:
    calls = [{"tool": tool, "ms": ms, "ok": True} for tool in (*TOOLS, BASELINE) for ms in (1.0, 2.0)]
    calls += [{"tool": "gitea_post_issue_state", "ms": 150.0, "ok": True}]
    driver = {"calls": calls, "driver_lag_max_ms": 1.0}
    foreman: list[list[float]] = [[202, 5.0], [202, 999.0]]
    load = {"answers": {"foreman": foreman, "bare": [[202, 1.0], [202, 2.0]]}, "schedule_slip_ms_max": 0.5}
    view = {"lag_max_s": 0.01, "histogram": {"0.05": 10.0, "0.1": 10.0, "+Inf": 10.0}}
    after = {"lag_max_s": 0.2, "histogram": {"0.05": 18.0, "0.1": 19.0, "+Inf": 20.0}}
    doc = _figures(driver, load, view, after, ["held"])
    assert list(doc["targets"].values()) == [True, False, True]
    assert doc["tool_ms"]["gitea_post_issue_state"]["n"] == 3 and doc["webhook_ms"]["foreman"]["n"] == 2
    lag = doc["serve_event_loop"]
    assert (lag["samples_in_window"], lag["over_0.05s"], lag["over_0.1s"], lag["held_over_50ms_logged"]) == (
        10.0, 2.0, 1.0, 1)
    foreman[1][1] = 1000.0
    assert list(_figures(driver, load, view, after, [])["targets"].values())[-1] is False


def test_a_refused_call_a_non_202_answer_or_an_unstored_delivery_fails_the_run() -> None:
    ok_driver: dict[str, Any] = {"calls": [{"login": "a", "tool": "gitea_heartbeat_lease", "round": 0, "ok": True}],
                 "session_failures": [], "sessions_ended_at": 101.0}
    load: dict[str, Any] = {"answers": {"foreman": [[202, 1.0]], "bare": [[202, 1.0]]}, "delivery_ids": ["d1"],
                            "answered_at": 100.0}
    assert answer_errors(ok_driver, load, {"d1", "other"}) == []
    # 100 sessions ending at once take the machine: the window's last webhooks must be answered before.
    early = {**ok_driver, "sessions_ended_at": 99.0}
    assert answer_errors(early, load, {"d1"}) == ["the sessions ended before every webhook of the window was answered"]
    refused = {**ok_driver, "calls": [{**ok_driver["calls"][0], "ok": False, "error": "not_authorized"}]}
    assert answer_errors(refused, load, {"d1"}) == ["a gitea_heartbeat_lease round 0: not_authorized"]
    assert answer_errors({**ok_driver, "session_failures": ["EOF"]}, load, {"d1"}) == ["EOF"]
    slow = {**load, "answers": {"foreman": [[202, 1.0], [0, 30000.0]], "bare": [[202, 1.0]]}}
    assert answer_errors(ok_driver, slow, {"d1"}) == ["webhooks to foreman: answers {0: 1, 202: 1}"]
    assert answer_errors(ok_driver, load, set()) == ["0 of 1 webhooks stored"]


def test_the_benchmark_runs_every_session_over_http_and_reports_every_figure() -> None:
    """Three identities, each with its own session of serve's /mcp (the default transport), no process per session;
    every call answered by a real tool result."""
    argv = [sys.executable, "-m", "bench.agents", "--sessions", "3", "--seconds", "5", "--rate", "5", "--period", "2",
            "--timeout", str(HANG_S), "--json"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=SLOW_HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["ok"], doc["errors"], doc["sessions"], doc["transport"], doc["mcp_processes"]) == (
        True, [], 3, "http", 0)
    assert {tool: doc["tool_ms"][tool]["n"] for tool in (*TOOLS, BASELINE)} == dict.fromkeys((*TOOLS, BASELINE), 8)
    assert doc["failed_calls"]["total"] == 0
    answers = {a["tool"]: a for a in doc["sample_answers"]}
    assert "lease" in answers["gitea_heartbeat_lease"]["keys"] and '"status": "live"' in answers[
        "gitea_heartbeat_lease"]["answer"]
    assert "queued" in answers["gitea_post_issue_state"]["keys"]
    assert doc["webhook_ms"]["foreman"]["n"] == doc["webhook_ms"]["bare"]["n"] == 25
    assert len(doc["targets"]) == 4 and all(isinstance(v, bool) for v in doc["targets"].values())
    rss = doc["rss_mib"]
    assert 0 < rss["serve_before_sessions"] and 0 < rss["serve_after_sessions"] <= rss["serve_peak"]
    assert set(doc["memory_per_session_mib"]) == {"serve_growth", "serve_growth_to_window_end", "session_processes",
                                                  "all"}
    assert doc["cpu_s_in_window"]["serve"] > 0 and doc["serve_event_loop"]["samples_in_window"] > 0


def test_bad_arguments_are_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.agents", "--sessions", "0"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 2 and "--sessions" in done.stderr
    done = subprocess.run([sys.executable, "-m", "bench.agents", "--transport", "pigeon"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 2 and "--transport" in done.stderr


# --- the database's footprint (bench/database.py): its size and, on PostgreSQL, its backends' peak RSS ----------------


def test_the_footprint_of_a_sqlite_database_grows_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "grows.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x TEXT)")
    conn.commit()
    empty = footprint(path)
    conn.executemany("INSERT INTO t VALUES (?)", [("x" * 1000,)] * 1000)
    conn.commit()
    full = footprint(path)
    conn.close()
    assert full["bytes"] >= empty["bytes"] + 1000 * 1000 and full["backend_peak_rss_kib"] == []


def test_the_footprint_on_postgresql_counts_the_runs_own_backends_and_its_schema() -> None:
    """The scratch schema's sessions carry its name, so the run's server processes are found among all others."""
    if not postgres_reachable():
        pytest.skip(POSTGRES_MISSING)
    with scratch_schema(POSTGRES_URL) as url, psycopg.connect(url, autocommit=True) as writer, psycopg.connect(
            POSTGRES_URL, autocommit=True):  # a session of another run: not counted
        writer.execute("CREATE TABLE t (x TEXT)")
        before = footprint(url)
        writer.execute("INSERT INTO t SELECT repeat('x', 1000) FROM generate_series(1, 1000)")
        after = footprint(url)
    assert after["bytes"] >= before["bytes"] + 1000 * 1000
    assert len(before["backend_peak_rss_kib"]) == len(after["backend_peak_rss_kib"]) == 1
    assert after["backend_peak_rss_kib"][0] > 0


def test_the_canonical_benchmark_reports_memory_per_size() -> None:
    """bench/canonical.py (issue 19 item 6): peak RSS after each size, never falling, and what one parse allocates,
    growing with the text."""
    done = subprocess.run([sys.executable, "-m", "bench.canonical", "--repeat", "1", "--json"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=SLOW_HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(done.stdout)["rows"]
    rss = [row["peak_rss_mib"] for row in rows]
    alloc = [row["parse_alloc_peak_mib"] for row in rows]
    assert len(rows) == 4 and rss == sorted(rss) and rss[0] > 0
    assert alloc == sorted(alloc) and alloc[-1] > 10 * alloc[1] > 0
