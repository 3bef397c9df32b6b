"""The storage key of the configured repository (leases, journals and issue state are stored under it)."""

from __future__ import annotations

from bot.config import Settings
from bot.core.issue_state import repo_key


def repo_key_of(settings: Settings) -> str:
    """``owner/name`` of the configured repository in lower case, as every store keys it."""
    return repo_key(f"{settings.repository.owner}/{settings.repository.name}")
