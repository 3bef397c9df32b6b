"""Shared fixtures: where ../shared lives, and nothing else global."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FOREMAN_SHARED", str(REPO_ROOT.parent / "shared")))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder (seeds, Gitea facts, swagger, payloads). Missing is a failure, not a skip."""
    assert SHARED.is_dir(), f"../shared not found at {SHARED}; set FOREMAN_SHARED"
    return SHARED


from tests.support import start  # noqa: E402, F401  (fixture shared by the service tests)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI (FOREMAN_FAIL_ON_SKIP=1) a skipped test is a failure: a skip proves nothing."""
    if os.environ.get("FOREMAN_FAIL_ON_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"FOREMAN_FAIL_ON_SKIP: {skipped} test(s) skipped; failing the run", red=True)
        session.exitstatus = 1
