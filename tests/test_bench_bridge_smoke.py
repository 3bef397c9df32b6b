"""Smoke test of the bridge benchmark (bench/bridge.py): one round end to end; no timing or memory is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT
from tests.support import SLOW_HANG_S

pytestmark = [pytest.mark.process, pytest.mark.slow]


def test_one_round_measures_every_contender_against_a_real_foreman_serve() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.bridge", "--runs", "1", "--json"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=SLOW_HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["failures"] == []
    assert {"bridge", "old", "sdk", "python"} <= set(report["results"])
    tools = {name: r["tools"] for name, r in report["results"].items() if name != "python"}
    assert len({tuple(t) for t in tools.values()}) == 1, tools
    assert all(r["peak_mib_median"] > 0 and r["seconds_median"] > 0 for r in report["results"].values())
