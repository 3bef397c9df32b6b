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
