"""Smoke test of the intake benchmark (bench/intake.py and its modules): it runs end to end, with wrk and with the
aiohttp client, beside a few MCP sessions; every accepted delivery stored and processed. No timing is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.intake import SECRET, builtin_payload, load_template, make_requests, percentile, process_memory_kb, sign
from bench.intake_gitea import BODY_BYTES, SERVED, route_key
from bench.intake_run import issue_templates, make_issue_requests
from bench.intake_wrk import WrkResult, raw_request
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
    """bench/harness.py's load (bench/agents.py) still sends these issue_comment deliveries."""
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


@pytest.mark.parametrize("payload", [None, "builtin"])
def test_issue_deliveries_are_unique_signed_6_4_kb_and_for_the_served_repository(payload: str | None) -> None:
    templates, _ = issue_templates("http://127.0.0.1:3000", payload)
    requests = make_issue_requests(templates, [1, 2, 3], "tag", 0, 64)
    assert len({body for body, _ in requests}) == len({h["X-Gitea-Delivery"] for _, h in requests}) == 64
    actions: set[str] = set()
    labels: set[str] = set()
    for body, headers in requests:
        assert len(body) == BODY_BYTES and not body.endswith(b"\n")
        assert headers["X-Gitea-Signature"] == sign(body, SECRET)
        assert headers["X-Gitea-Event"] == headers["X-Gitea-Event-Type"] == "issues"
        doc = json.loads(body)
        assert doc["repository"]["full_name"] == doc["issue"]["repository"]["full_name"] == SERVED
        assert doc["issue"]["number"] in (1, 2, 3)
        actions.add(doc["action"])
        labels.update(label["name"] for label in doc["issue"]["labels"])
    assert "label_updated" in actions
    assert "status:ready" in labels  # the deliveries whose handler reads Gitea (an auto-allocation)


def test_a_wrk_request_is_the_whole_http_request_and_its_report_is_read() -> None:
    raw = raw_request(b'{"a": 1}', {"X-Gitea-Event": "issues"})
    head = b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Gitea-Event: issues\r\nContent-Length: 8\r\n\r\n"
    assert raw == head + b'{"a": 1}'
    line = ('BENCH_JSON {"duration_us": 2000000, "wrk_requests": 10, "sent": 12, "answered": 10, "s202": 9, "s200": 1,'
            ' "sother": 0, "wrapped": 0, "errors": {"connect": 0, "read": 0, "write": 0, "status": 0, "timeout": 0},'
            ' "p50_us": 1500, "p90_us": 2000, "p99_us": 3000, "max_us": 4000, "mean_us": 1600.0}')
    result = WrkResult.parse(f"Running 2s test\n{line}\n")
    assert (result.seconds, result.sent, result.answered, result.statuses) == (2.0, 12, 10, {202: 9, 200: 1})
    assert (result.p50_ms, result.p99_ms) == (1.5, 3.0)


def test_gitea_requests_are_counted_by_route() -> None:
    found = route_key("GET", "/api/v1/repos/demo/widgets/issues/12/labels")
    assert found == "GET /api/v1/repos/demo/widgets/issues/N/labels"


def test_process_memory_reads_the_peak_and_resident_set_of_a_process() -> None:
    memory = process_memory_kb(os.getpid())
    assert memory is not None and memory["VmHWM"] >= memory["VmRSS"] > 1024
    assert process_memory_kb(2**22 + 1) is None  # no such process


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([3.0], 99) == 3.0


def _run(tmp_path: Path, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.intake", "--requests", "300", "--concurrency", "8", "--rounds", "1"]
    argv += ["--warmup", "20", "--issues", "5", "--json", "--tmpdir", str(tmp_path), *extra]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    assert doc["ok"] is True and doc["errors"] == []
    for name in ("bare", "foreman"):
        target = doc[name]
        # wrk stops once 300 are answered; answers already read on its other connections by then count too
        assert 300 <= target["requests"] <= 300 + 8
        assert target["statuses"] == {"202": target["requests"]}
        assert target["accepted_per_s"] > 0
    rows = doc["rows"]
    # Every 202 is a stored row, every stored row of the run (and foreman's own) finished done.
    assert set(rows["by_status"]) == {"done"} and set(rows["foreman_own"]) <= {"done"}
    assert 320 <= rows["accepted"] <= rows["by_status"]["done"] <= rows["sent"]
    round_doc = doc["foreman"]["rounds"][0]
    assert round_doc["stored_at_end"] >= round_doc["finished_at_end"] >= 0 and round_doc["drain_s"] >= 0
    assert doc["settings"]["payload_bytes"] > 6000
    assert {t["result"] for t in doc["targets"].values()} <= {"PASS", "MISS"}
    return doc


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install -y wrk)")
def test_benchmark_with_wrk_beside_mcp_sessions_stores_and_processes_every_delivery(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--mcp", "3")
    assert doc["settings"]["client"] == "wrk"
    assert doc["mcp"]["sessions"] == 3 and doc["mcp"]["failed"] == 0
    # The handlers read Gitea: the status:ready deliveries' auto-allocations list the ready issues.
    gitea = doc["foreman"]["rounds"][0]["gitea_requests"]
    assert gitea.get("GET /api/v1/repos/demo/widgets/issues", 0) > 0


def test_benchmark_with_the_aiohttp_client_stores_exactly_what_it_sent(tmp_path: Path) -> None:
    doc = _run(tmp_path, "--client", "aiohttp")
    assert doc["settings"]["client"] == "aiohttp" and doc["mcp"] is None
    rows = doc["rows"]  # no in-flight margin: each request sent once and answered
    assert rows["sent"] == rows["accepted"] == rows["by_status"]["done"] == 320


def test_a_missing_wrk_is_one_line_and_a_usage_exit(tmp_path: Path) -> None:
    git = shutil.which("git")
    assert git is not None
    (tmp_path / "git").symlink_to(git)  # git only (GitPython looks for it at import): no wrk on this PATH
    env = {**os.environ, "PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "bench.intake", "--requests", "10"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "wrk is not installed: apt-get install -y wrk, or run with --client aiohttp"]
