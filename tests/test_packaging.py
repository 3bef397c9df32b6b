"""Packaging: the wheel carries the configs and the systemd unit, its sandbox scores under 4.0, no unused dependency."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support import HANG_S, SLOW_HANG_S

pytestmark = [pytest.mark.process, pytest.mark.slow]

UNIT = REPO_ROOT / "config" / "gitea-foreman.service"
SHIPPED = ("foreman.toml", "foreman.example.toml", "gitea-foreman.service", "foreman-alerts.yml",
           "foreman-grafana.json")


def test_the_wheel_carries_the_configs_and_the_unit(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO_ROOT), "--no-deps", "-q", "-w", str(tmp_path)],
        capture_output=True, text=True, timeout=SLOW_HANG_S, check=False,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("gitea_foreman-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        for name in SHIPPED:
            (member,) = [n for n in names if n.endswith(f".data/data/share/gitea-foreman/config/{name}")]
            assert archive.read(member) == (REPO_ROOT / "config" / name).read_bytes(), name
        assert any(n.startswith("bot/dashboard/") for n in names)
        # The documents `foreman --help` points at ship with it (issue 34 item 3).
        for doc in (REPO_ROOT / "docs").glob("*.md"):
            (member,) = [n for n in names if n.endswith(f".data/data/share/gitea-foreman/docs/{doc.name}")]
            assert archive.read(member) == doc.read_bytes(), doc.name
        assert [n for n in names if n.endswith(".data/data/share/gitea-foreman/README.md")]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_is_sandboxed_below_exposure_4() -> None:
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", str(UNIT)], capture_output=True,
                          text=True, timeout=HANG_S, check=False)
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) < 4.0, done.stdout
    assert "Unknown key" not in done.stderr and "Unknown section" not in done.stderr, done.stderr


def test_the_unit_runs_serve_with_the_documented_exit_code_policy() -> None:
    text = UNIT.read_text(encoding="utf-8")
    assert re.search(r"^ExecStart=\S+/foreman serve --config \S+$", text, re.MULTILINE)
    assert "RestartPreventExitStatus=2" in text  # a configuration error (exit 2) is not restarted in a loop
    assert "DynamicUser=yes" in text and "StateDirectory=gitea-foreman" in text


def test_every_runtime_dependency_is_imported() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    sources = "\n".join(p.read_text(encoding="utf-8") for folder in ("bot", "handlers", "state")
                        for p in (REPO_ROOT / folder).rglob("*.py"))
    modules = {"GitPython": "git", "prometheus-client": "prometheus_client", "pydantic-settings": "pydantic_settings"}
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=\[ ]", requirement, maxsplit=1)[0]
        module = modules.get(name, name.replace("-", "_"))
        assert re.search(rf"^\s*(from|import) {module}\b", sources, re.MULTILINE), f"{name} is never imported"
