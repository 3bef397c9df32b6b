"""`foreman emulator` as a real process: URL, users and tokens, the demo repository, a usable config, SIGTERM."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.support import HANG_S

pytestmark = [pytest.mark.process]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def _get(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})  # noqa: S310 (loopback)
    with urllib.request.urlopen(request, timeout=HANG_S) as resp:  # noqa: S310
        return json.loads(resp.read())


def test_foreman_emulator_prints_what_an_operator_needs_and_serves_it(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "bot", "emulator", "--port", "0", "--json", "--dir",
                             str(tmp_path / "emu")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, env=_env())
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], HANG_S)
        assert ready, f"foreman emulator printed nothing within {HANG_S:.0f} s"
        doc = json.loads(proc.stdout.readline())
        users = {u["login"]: u for u in doc["users"]}
        assert set(users) == {"maintainer", "controller-bot", "author-1", "foreman-bot"}
        assert doc["url"].startswith("http://127.0.0.1:") and doc["api"] == doc["url"] + "/api/v1"
        me = _get(f"{doc['api']}/user", users["maintainer"]["token"])
        assert me["login"] == "maintainer"
        repo = _get(f"{doc['api']}/repos/demo/widgets", users["author-1"]["token"])
        assert repo["full_name"] == "demo/widgets"
        labels = {label["name"] for label in _get(f"{doc['api']}/repos/demo/widgets/labels", users["maintainer"]
                                                                                              ["token"])}
        assert {"status:ready", "status:in-progress"} <= labels
        assert Path(doc["config"]).stat().st_mode & 0o077 == 0
        check = subprocess.run([sys.executable, "-m", "bot", "--config", doc["config"], "check-config", "--json"],
                               capture_output=True, text=True, timeout=HANG_S, check=False, cwd=REPO_ROOT, env=_env())
        assert check.returncode == 0, check.stdout + check.stderr
        assert [c["status"] for c in json.loads(check.stdout)["checks"]] == ["ok"] * 6
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(HANG_S)
        except subprocess.TimeoutExpired:  # never left running, whatever happened
            proc.kill()
            proc.wait()
            raise
    assert code == 0, proc.stderr.read() if proc.stderr else ""
