#!/usr/bin/env python3
"""Set-up-free entry point: `python3 dev.py run` serves, `python3 dev.py test` runs every test (`test --quick`: the
in-process part only, without real processes, PostgreSQL, the browser or the slow runs)
(`python3 dev.py run demo` runs the bundled demo; `python3 dev.py lint` runs ruff, and mypy over every package
pyproject.toml lists: bot, handlers and state strictly, tests and bench with their bodies checked).

Both create ./.venv and install the project with its dev dependencies on first use (and again whenever
pyproject.toml changes), so a fresh machine needs nothing but Python 3.11+ and git.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

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
    if not PY.exists():
        print(f"dev.py: creating {VENV}", file=sys.stderr)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("dev.py: installing gitea-foreman and its dev dependencies", file=sys.stderr)
    subprocess.run([str(PY), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([str(PY), "-m", "pip", "install", "--quiet", "-e", f"{ROOT}[dev]"], check=True)
    STAMP.write_text(wanted)


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
        return subprocess.call([str(PY), "-m", "bot", *args])
    if command == "lint":
        code = subprocess.call([str(PY), "-m", "ruff", "check", "."])
        return code or subprocess.call([str(PY), "-m", "mypy"])
    if "--quick" in rest:  # the in-process part: no real process, PostgreSQL, browser or slow run (tests/conftest.py)
        rest = [arg for arg in rest if arg != "--quick"] + ["-m", "not process and not postgres and not browser"
                                                            " and not slow"]
    code = subprocess.call([str(PY), "-m", "pytest", *rest])
    if code == 5:
        print("dev.py: pytest collected no tests; that is a failure", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
