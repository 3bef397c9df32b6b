"""Smoke test of the intake benchmark (bench/intake.py): it runs end to end; no timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.intake import builtin_payload, load_template, make_requests, percentile, process_memory_kb, sign
from tests.conftest import SHARED
from tests.support import HANG_S

pytestmark = [pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE = SHARED / "gitea" / "payloads" / "issue_comment-created--go-playground.json"


@pytest.mark.needs_shared
def test_builtin_payload_is_the_gitea_sample_layout() -> None:
    """The fallback generator reproduces the shared go-playground body byte for byte (2-space, no newline)."""
    body = json.dumps(builtin_payload(), indent=2).encode()
    assert body == SAMPLE.read_bytes()


def test_requests_are_unique_signed_and_about_6_kb() -> None:
    template, source = load_template("builtin")
    assert source == "builtin"
    requests = make_requests(template, "tag", 0, 50)
    bodies = {body for body, _ in requests}
    deliveries = {headers["X-Gitea-Delivery"] for _, headers in requests}
    assert len(bodies) == len(deliveries) == 50
    for body, headers in requests:
        assert 6000 <= len(body) <= 7000
        assert not body.endswith(b"\n")
        assert headers["X-Gitea-Signature"] == sign(body)
        assert headers["X-Gitea-Event"] == headers["X-Gitea-Event-Type"] == "issue_comment"
        assert json.loads(body)["action"] == "created"


def test_process_memory_reads_the_peak_and_resident_set_of_a_process() -> None:
    memory = process_memory_kb(os.getpid())
    assert memory is not None and memory["VmHWM"] >= memory["VmRSS"] > 1024
    assert process_memory_kb(2**22 + 1) is None  # no such process


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def test_benchmark_runs_both_targets_and_every_delivery_is_stored(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "bench.intake", "--requests", "200", "--concurrency", "8", "--rounds", "1"]
    argv += ["--warmup", "20", "--json", "--tmpdir", str(tmp_path)]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["errors"] == []
    for name in ("bare", "foreman"):
        target = doc[name]
        assert target["requests"] == 200
        assert target["statuses"] == {"202": 200}
        assert target["all_202"] is True
        assert target["deliveries_per_s"] > 0
        # Peak RSS of the server process from /proc (a Python service holds at least a few MiB resident).
        assert target["peak_rss_mib"] >= target["rss_last_round_mib"] > 1
        assert target["rss_growth_mib"] == 0.0  # one round: its first is its last
        assert target["rounds"][0]["peak_rss_mib"] == target["peak_rss_mib"]
    foreman = doc["foreman"]
    assert foreman["rows_expected"] == 220  # warm-up included: every accepted request is a stored row
    assert foreman["rows_stored"] == 220
    assert doc["settings"]["payload_bytes"] > 6000
    assert {t["result"] for t in doc["targets"].values()} <= {"PASS", "MISS"}
