"""Smoke test of the end-to-end loop benchmark (bench/e2e.py): a few issues through the whole loop against the
emulator and a real `foreman serve`; every check passes and every figure of the same run is reported. No timing
is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.e2e import memory_kib, percentile, summary
from tests.conftest import REPO_ROOT
from tests.gitea_fixtures import scratch_dir
from tests.support import HANG_S, SLOW_HANG_S

pytestmark = [pytest.mark.slow]


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([7.0], 99) == 7.0 and percentile([1.0, 2.0], 50) == 1.0
    assert summary([3.0, 1.0, 2.0]) == {"n": 3, "p50": 2.0, "p99": 3.0, "mean": 2.0, "min": 1.0, "max": 3.0}


def test_the_benchmark_runs_the_loop_and_reports_every_figure() -> None:
    argv = [sys.executable, "-m", "bench.e2e", "--issues", "3", "--baseline-samples", "2", "--timeout", str(HANG_S),
            "--json"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=SLOW_HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["errors"] == [] and doc["issues"] == 3
    assert doc["latency_ms"]["n"] == 3 and 0 < doc["latency_ms"]["p50"] <= doc["latency_ms"]["p99"]
    steps = doc["breakdown_p50_ms"]
    assert steps["lease_committed"] <= steps["bootstrap_completed"] <= steps["bootstrap_evidence_verified"]
    assert doc["throughput_per_min"] > 0 and doc["wall_s"] > 0
    bare = doc["bare_ms"]
    assert bare["git_worktree_add"]["n"] == bare["comment_post_get"]["n"] == 2
    assert bare["sum_of_medians"] > 0 and doc["ratio_p50_to_bare"] > 0
    # The targets beside the figures (issue 19): the ratio to the bare operations, and flatness over the fifths.
    assert doc["ratio_pass"] == (doc["ratio_p50_to_bare"] <= doc["ratio_target"] == 3.0)
    fifths = doc["latency_p50_by_fifth_ms"]
    assert len(fifths) == len(doc["lease_p50_by_fifth_ms"]) == len(doc["serve_hwm_by_fifth_kib"]) >= 1
    assert doc["flat_ratio"] == fifths[-1] / fifths[0] and doc["flat_pass"] == (doc["flat_ratio"] <= 1.25)
    # foreman serve's memory, read from /proc after each issue: the peak never falls, and is at least the RSS.
    peaks, now = doc["serve_hwm_by_fifth_kib"], doc["serve_rss_by_fifth_kib"]
    assert peaks == sorted(peaks) and all(p >= r > 0 for p, r in zip(peaks, now, strict=True))


def test_memory_is_read_from_proc_and_nothing_for_a_process_that_is_gone() -> None:
    peak, rss = memory_kib(os.getpid())
    assert peak >= rss > 0
    assert memory_kib(2**31 - 1) == (0, 0)


def test_bad_arguments_are_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.e2e", "--issues", "0"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 2 and "--issues" in done.stderr


def test_the_whole_life_mode_runs_every_life_and_reports_every_figure() -> None:
    """`--life`: each issue from its label to the merge and the teardown through `foreman mcp` as four identities."""
    argv = [sys.executable, "-m", "bench.e2e", "--life", "--issues", "2", "--baseline-samples", "2", "--timeout",
            str(HANG_S), "--json"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=SLOW_HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["mode"], doc["ok"], doc["errors"], doc["issues"]) == ("life", True, [], 2)
    merged, torn_down = doc["label_to_merged_ms"], doc["label_to_torn_down_ms"]
    assert merged["n"] == torn_down["n"] == 2 and 0 < merged["p50"] <= merged["p99"]
    order = ["bootstrap_evidence_verified", "published", "pull_request_opened", "approved", "merged", "torn_down"]
    steps = [doc["milestones_p50_ms"][name] for name in order]
    assert steps == sorted(steps) and steps[-1] == torn_down["p50"] and steps[-2] == merged["p50"]
    assert doc["throughput_per_min"] > 0 and doc["wall_s"] > 0
    bare = doc["bare_ms"]
    assert [bare[step]["n"] for step in ("worktree_add", "commit", "push", "pr_create", "review", "merge")] == [2] * 6
    assert bare["sum_of_medians"] > 0 and doc["ratio_merged_p50_to_bare"] > 0
    assert doc["deliveries"] > 0 and 0 <= doc["deliveries_refused"] <= doc["deliveries"]
    assert doc["peak_rss_mib"]["foreman_serve"] > 0 and doc["peak_rss_mib"]["bench_process_with_emulator"] > 0
    _assert_reported_by_fifth(doc)


def test_the_gitea_process_mode_times_the_first_verified_bot_comment() -> None:
    """`--gitea-process --first-comment` (issue 35): the emulator in its own process, the latency ending at the
    allocation's evidence comment verified; the loop's checks pass and the emulator process is gone after."""
    tmpdir = scratch_dir("bench-e2e-process-")
    try:
        argv = [sys.executable, "-m", "bench.e2e", "--gitea-process", "--first-comment", "--issues", "3",
                "--baseline-samples", "2", "--timeout", str(HANG_S), "--tmpdir", str(tmpdir), "--json"]
        done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=SLOW_HANG_S, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        doc = json.loads(done.stdout)
        assert (doc["ok"], doc["errors"], doc["issues"], doc["gitea_process"]) == (True, [], 3, True)
        assert doc["latency_ends_at"] == "allocation_evidence_verified"
        steps = doc["breakdown_p50_ms"]
        assert doc["latency_ms"]["p50"] == steps["allocation_evidence_verified"] > steps["lease_committed"]
        assert steps["bootstrap_evidence_verified"] >= steps["bootstrap_completed"]
        bare = doc["bare_ms"]
        assert bare["git_worktree_add"]["n"] == bare["comment_post_get"]["n"] == 2 and bare["sum_of_medians"] > 0
        assert doc["ratio_pass"] == (doc["ratio_p50_to_bare"] <= doc["ratio_target"] == 3.0)
        left = [pid for pid, cmdline in _cmdlines().items() if str(tmpdir) in cmdline]
        assert left == [], left  # the emulator's process and foreman serve were stopped
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _cmdlines() -> dict[int, str]:
    found: dict[int, str] = {}
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found[int(entry.parent.name)] = entry.read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
    return found


def _assert_reported_by_fifth(doc: dict[str, Any]) -> None:
    """Issue 35: the whole life reports each fifth's milestones and serve's memory, and both flatness verdicts."""
    fifths = doc["fifths"]
    assert sum(fifths) == doc["issues"] and all(n > 0 for n in fifths)
    for name, by_fifth in doc["milestones_p50_by_fifth_ms"].items():
        assert len(by_fifth) == len(fifths) and all(v > 0 for v in by_fifth), name
    assert set(doc["flat_ratio"]) == set(doc["flat_pass"]) == {"merged", "torn_down"}
    rss, hwm = doc["serve_rss_by_fifth_mib"], doc["serve_hwm_by_fifth_mib"]
    assert len(rss) == len(hwm) == len(fifths) and all(0 < r <= h for r, h in zip(rss, hwm, strict=True))
    assert doc["serve_rss_growth_mib"] == rss[-1] - rss[0] and isinstance(doc["serve_rss_growth_pass"], bool)
