"""The test harness's ``free_port``: a port one test process took is never handed to another (two xdist workers,
or two runs on one machine: CI's verification and a second clone's ran side by side and one restarted serve was
answered by the other run's server on the same port)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT
from tests.support import free_port


def test_a_port_another_test_process_holds_is_never_handed_out() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from tests.support import free_port\n"
         "print(*(free_port() for _ in range(200)), flush=True); sys.stdin.read()"],
        cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None
        theirs = {int(port) for port in holder.stdout.readline().split()}
        assert len(theirs) == 200
        ours = {free_port() for _ in range(300)}
        assert len(ours) == 300 and not ours & theirs
    finally:
        holder.communicate("")
