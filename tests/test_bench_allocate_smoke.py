"""bench/allocate.py runs end to end and its correctness checks pass; no timing is asserted."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from bench.allocate_data import OWNER, RESUME_OWNER, build_database, load
from tests.support import HANG_S

pytestmark = [pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_generated_data_has_the_advertised_shape(tmp_path: Path) -> None:
    data = build_database(tmp_path / "a.sqlite3", 500, seed=1)
    conn = sqlite3.connect(tmp_path / "a.sqlite3")
    try:
        loaded = load(conn)
        (index_sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'leases_one_live_per_issue'").fetchone()
    finally:
        conn.close()
    assert "WHERE status = 'live'" in index_sql
    assert len(loaded.candidates) == 500 and loaded.open_issue_numbers == frozenset(range(1, 501))
    assert len(data.excluded) == 50 and len(data.foreign_leased) == 50
    assert not set(data.excluded) & data.foreign_leased
    owners = {lease.owner for lease in loaded.leases}
    assert RESUME_OWNER in owners and OWNER not in owners
    assert len(loaded.leases) == 51 < data.lease_rows  # ended leases are stored but not loaded
    assert data.with_deps == sum(1 for c in loaded.candidates if c["depends_on"])
    labelled = [c for c in loaded.candidates if any(label.startswith("priority:") for label in c["labels"])]
    assert 0 < len(labelled) < 500
    assert all(c["created_at"][-1] == "Z" or c["created_at"][-6] in "+-" for c in loaded.candidates)


def test_benchmark_runs_and_its_correctness_checks_pass() -> None:
    argv = [sys.executable, "-m", "bench.allocate", "--sizes", "200,2000", "--repeat", "1", "--json"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["checks_passed"] is True and doc["errors"] == []
    assert [r["n"] for r in doc["sizes"]] == [200, 2000]
    for row in doc["sizes"]:
        n = row["n"]
        # both figures of the same run, and their ratio
        assert row["load_ms"]["median"] > 0 and row["decide_ms"]["median"] > 0
        assert row["ratio_decide_load"] > 0
        assert row["excluded"] == n // 10 and row["foreign_leases"] == n // 10
        select, resume = row["scenarios"]["select"], row["scenarios"]["resume"]
        assert select["decision"] == "select" and resume["decision"] == "resume"
        assert resume["issue_number"] == row["resume_owner_lease_issue"]
        assert select["skipped"]["excluded_by_controller"] == n // 10
        assert select["skipped"]["foreign_claim"] == n // 10 + 1  # the resume owner's lease is foreign here
        for scenario in (select, resume):
            assert scenario["checks"] == {
                "no_excluded_chosen_or_ranked": True,
                "matches_reference": True,
                "fingerprint_stable_repeat": True,
                "fingerprint_stable_shuffled": True,
                "passed": True,
            }
            assert len(scenario["fingerprint"]) == 64
    (step,) = doc["growth"]
    assert step["from"] == 200 and step["to"] == 2000 and step["result"] in {"PASS", "MISS"}
    assert step["n_log_n_expects"] > step["linear_expects"] == 10
    assert doc["targets"]["decide_10k_ms"]["result"] is None  # 10k was not measured
    assert doc["targets"]["resume_10k_ms"]["result"] is None
    for row in doc["sizes"]:  # peak memory, and what one decide allocates, per size
        assert row["memory"]["peak_rss_mib"] > 0 and row["memory"]["decide_alloc_peak_mib"] > 0
    assert step["decide_alloc_growth"] > 1
    assert doc["targets"]["growth_n_log_n"]["result"] in {"PASS", "MISS"}


def test_text_output_prints_both_figures_and_the_verdicts() -> None:
    argv = [sys.executable, "-m", "bench.allocate", "--sizes", "100,1000", "--repeat", "1"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "load ms" in out and "decide ms" in out and "decide/load" in out
    assert "n log n expects" in out
    assert "target decide at 10k < 50.0 ms: n/a" in out
    assert "target resume at 10k < 50.0 ms: n/a" in out
    assert "peak RSS MiB" in out
    assert "shuffled order): PASS" in out


def test_bad_sizes_are_a_usage_error() -> None:
    argv = [sys.executable, "-m", "bench.allocate", "--sizes", "5,x"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 2
    assert "--sizes" in done.stderr
