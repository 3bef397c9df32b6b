#!/usr/bin/env python3
"""Set-up-free entry point: `python3 dev.py run` serves, `python3 dev.py test` runs every test (`test --quick`: the
in-process part only, without real processes, PostgreSQL, the browser or the slow runs)
(`python3 dev.py run demo` runs the bundled demo; `python3 dev.py lint` runs ruff, and mypy over every package
pyproject.toml lists: bot, handlers and state strictly, tests and bench with their bodies checked).

Both create ./.venv and install the project with its dev dependencies on first use (and again whenever
pyproject.toml changes), so a fresh machine needs nothing but Python 3.11+ and git; the install prints a line per
package as it goes. A signal to dev.py (SIGTERM, SIGINT, SIGHUP) is passed on to the process it runs, so stopping
dev.py stops the service too.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import venv
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"
STAMP = VENV / ".foreman-installed"


def ensure_env() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 (dev.py may be run by an older python3)
        sys.exit(f"gitea-foreman needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text().strip() == wanted and PY.exists():
        return
    started = time.monotonic()
    if not PY.exists():
        say(f"creating {VENV}", started)
        venv.EnvBuilder(with_pip=True).create(VENV)
    say("installing gitea-foreman and its dev dependencies (about a minute and a half the first time)", started)
    for step in (["install", "--upgrade", "pip"], ["install", "-e", f"{ROOT}[dev]"]):
        code = relay_progress([str(PY), "-m", "pip", *step, "--progress-bar", "off", "--disable-pip-version-check"],
                              started)
        if code:
            sys.exit(f"dev.py: `pip {' '.join(step)}` failed (exit {code}); its output is above")
    STAMP.write_text(wanted)
    say("installed", started)


def say(text: str, started: float) -> None:
    print(f"dev.py [{time.monotonic() - started:4.0f} s] {text}", file=sys.stderr, flush=True)


#: pip's lines worth a person's attention while it installs (the rest, e.g. "Requirement already satisfied", not).
PROGRESS = ("Collecting ", "Downloading ", "Building ", "Installing collected", "Successfully installed", "ERROR",
            "error:")


def relay_progress(command: list[str], started: float, *, quiet_s: float = 10.0) -> int:
    """Run ``command`` (pip), printing its progress lines to stderr with the time since ``started``, and a line
    every ``quiet_s`` while it says nothing (a wheel building); its exit code. The whole output is shown if it
    fails. A signal to dev.py stops it too (``call``)."""
    output: list[str] = []
    last = [time.monotonic()]
    done = threading.Event()

    def heartbeat() -> None:
        while not done.wait(1.0):
            if time.monotonic() - last[0] >= quiet_s:
                say("still installing ...", started)
                last[0] = time.monotonic()

    ticker = threading.Thread(target=heartbeat, daemon=True)
    ticker.start()
    try:
        with spawn(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                output.append(line)
                if line.lstrip().startswith(PROGRESS):
                    say(line.strip()[:160], started)
                    last[0] = time.monotonic()
            code = proc.wait()
    finally:
        done.set()
        ticker.join()
    if code:
        sys.stderr.write("".join(output))
    return code


#: The child dev.py runs now: a signal to dev.py (SIGTERM from a supervisor, SIGINT, SIGHUP) is passed on to it.
_child: subprocess.Popen[Any] | None = None


def _pass_on(signum: int, _frame: FrameType | None) -> None:
    if _child is not None and _child.poll() is None:
        _child.send_signal(signum)  # the child stops (serve: gracefully); dev.py then exits with its code
    else:
        raise SystemExit(128 + signum)


def spawn(command: list[str], **options: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(command, **options)``, its process receiving the signals dev.py receives while it runs."""
    global _child
    _child = subprocess.Popen(command, **options)
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):  # SIGHUP: not on Windows
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), _pass_on)
    return _child


def call(command: list[str]) -> int:
    """Run ``command`` to its end (signals to dev.py passed on to it); its exit code."""
    with spawn(command) as proc:
        return proc.wait()


def main(argv: list[str]) -> int:
    commands = ("run", "test", "lint")
    if not argv or argv[0] not in commands:
        print(f"usage: python3 dev.py {{{'|'.join(commands)}}} [args...]", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    ensure_env()
    os.chdir(ROOT)
    if command == "run":
        # `run` serves; `run demo` (or any other foreman command) runs that command instead.
        args = rest if rest and not rest[0].startswith("-") else ["serve", *rest]
        return call([str(PY), "-m", "bot", *args])
    if command == "lint":
        code = call([str(PY), "-m", "ruff", "check", "."])
        return code or call([str(PY), "-m", "mypy"])
    if "--quick" in rest:  # the in-process part: no real process, PostgreSQL, browser or slow run (tests/conftest.py)
        rest = [arg for arg in rest if arg != "--quick"] + ["-m", "not process and not postgres and not browser"
                                                            " and not slow"]
    code = call([str(PY), "-m", "pytest", *rest])
    if code == 5:
        print("dev.py: pytest collected no tests; that is a failure", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
