"""Shared fixtures: where ../shared lives, and nothing else global."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FOREMAN_SHARED", str(REPO_ROOT.parent / "shared")))


#: The one line a test that needs ../shared is skipped with in a clone without it (CI always has it, and
#: `.ci/run` fails on any skip, so there these tests always run).
SHARED_MISSING = f"needs ../shared (Gitea's spec, real payloads, seeds): not found at {SHARED}; set FOREMAN_SHARED"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_shared: reads ../shared; skipped with one line where it is absent")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SHARED.is_dir():
        return
    skip = pytest.mark.skip(reason=SHARED_MISSING)
    for item in items:
        if item.get_closest_marker("needs_shared") is not None or "shared_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder (seeds, Gitea facts, swagger, payloads)."""
    if not SHARED.is_dir():
        pytest.skip(SHARED_MISSING)
    return SHARED


from tests.support import start  # noqa: E402, F401  (fixture shared by the service tests)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI (FOREMAN_FAIL_ON_SKIP=1) a skipped test is a failure: a skip proves nothing."""
    if os.environ.get("FOREMAN_FAIL_ON_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    skipped = len(reporter.stats.get("skipped", []))
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"FOREMAN_FAIL_ON_SKIP: {skipped} test(s) skipped; failing the run", red=True)
        session.exitstatus = 1
