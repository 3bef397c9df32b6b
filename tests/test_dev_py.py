"""`python3 dev.py`, the set-up-free entry point (issue 34 item 3): it shows progress while it installs, and a signal
to it stops the child it runs (a supervisor's SIGTERM used to leave `foreman serve` running)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import dev
from tests.conftest import REPO_ROOT
from tests.support import HANG_S, SECRET, free_port


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in found]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.process
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads a process's children from /proc (Linux)")
def test_sigterm_to_dev_py_run_stops_the_service_it_started(tmp_path: Path) -> None:
    """A real `python3 dev.py run --config ...` (the path that spawns `foreman serve`), healthy; SIGTERM to dev.py
    alone (as systemd or a shell's `kill` sends it) stops the service too, and dev.py exits with its code."""
    port = free_port()
    config = tmp_path / "foreman.toml"
    config.write_text(f'[server]\nport = {port}\n[webhook]\nsecrets = ["{SECRET}"]\n[database]\npath = "foreman.db"\n'
                      '[reconcile]\ninterval_s = 0\n', encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    proc = subprocess.Popen([sys.executable, str(REPO_ROOT / "dev.py"), "run", "--config", str(config)],
                            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    children: list[int] = []
    try:
        deadline = time.monotonic() + HANG_S  # a hang detector, never a timing
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "foreman serve under dev.py never answered /healthz"
            time.sleep(0.2)
        children = _children(proc.pid)
        assert len(children) == 1, children
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(HANG_S)
        assert code == 0, proc.stderr.read().decode() if proc.stderr else ""
        assert not _alive(children[0]), "dev.py exited and left foreman serve running"
    finally:
        for pid in [*children, proc.pid]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait(HANG_S)


def test_the_install_prints_progress_and_a_line_while_it_is_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    """`dev.py` was silent for ~80 s while pip installed: now each package pip collects and installs is a line with
    the time since the start, a quiet stretch (a wheel building) says it is still installing, and pip's chatter
    ("Requirement already satisfied") stays out; a failed pip shows its whole output."""
    script = ("import sys, time; print('Collecting aiohttp>=3.9'); print('Requirement already satisfied: x');"
              "sys.stdout.flush(); time.sleep(2.5); print('Successfully installed aiohttp-3.9')")
    assert dev.relay_progress([sys.executable, "-c", script], time.monotonic(), quiet_s=1.0) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("dev.py [") and lines[0].endswith("s] Collecting aiohttp>=3.9"), lines
    assert any(line.endswith("still installing ...") for line in lines[1:-1]), lines
    assert lines[-1].endswith("Successfully installed aiohttp-3.9") and not any("already" in line for line in lines)
    failing = "import sys; print('Requirement already satisfied: y'); sys.exit(3)"
    assert dev.relay_progress([sys.executable, "-c", failing], time.monotonic()) == 3
    assert "Requirement already satisfied: y" in capsys.readouterr().err
