"""What every handler receives besides the event, built by the composition root."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from bot.config import Settings
from bot.core.issue_state import Trust
from state.db import Database

if TYPE_CHECKING:
    from bot.gitea import GiteaClient
    from bot.verbs.runtime import VerbRuntime

PERMISSION_TTL_S = 60.0


class PermissionReader(Protocol):
    """The Gitea read the permission cache makes (bot.gitea.GiteaClient provides it)."""

    async def get_user_permission(self, login: str) -> str: ...


class PermissionCache:
    """Gitea permissions per login for a short while (in-process); only answers are cached, never failures."""

    def __init__(self, ttl_s: float = PERMISSION_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[float, str]] = {}
        self._teams: dict[str, tuple[float, Trust]] = {}

    async def permission(self, gitea: PermissionReader, login: str) -> str:
        key = login.lower()
        now = self._clock()
        held = self._entries.get(key)
        if held is not None and now - held[0] < self.ttl_s:
            return held[1]
        permission = await gitea.get_user_permission(login)
        self._entries[key] = (now, permission)
        return permission

    async def team_trust(self, login: str, compute: Callable[[], Awaitable[Trust]]) -> Trust:
        """The team answer for a ``read`` login, held as long as a permission (1 + N Gitea reads otherwise)."""
        key = login.lower()
        now = self._clock()
        held = self._teams.get(key)
        if held is not None and now - held[0] < self.ttl_s:
            return held[1]
        trust = await compute()
        self._teams[key] = (now, trust)
        return trust


@dataclass(frozen=True, slots=True)
class HandlerDeps:
    """Everything a handler may use besides the event, never the Service: one per served repository, built by
    bot.repositories.

    ``gitea`` is None until the client exists (no token: no client at all); ``bot_login`` is read when needed,
    because the service learns the login from Gitea after start. ``permissions`` lives as long as the service.
    ``door`` is the repository's one door to the verbs (comment commands and auto-allocation go through it).
    """

    settings: Settings
    db: Database
    bot_login: Callable[[], str]
    door: VerbRuntime[GiteaClient]
    gitea: GiteaClient | None = None
    permissions: PermissionCache = field(default_factory=PermissionCache)
