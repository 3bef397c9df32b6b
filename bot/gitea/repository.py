"""The server, identity and repository calls of the Gitea client: version and clock, accounts, the repository and
its branches, who may do what in it (permissions, teams), and its webhooks."""

from __future__ import annotations

import email.utils
import urllib.parse
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

from bot.gitea.endpoint import MAX_PAGE_SIZE, RepositoryEndpoint, quote_segment
from bot.gitea.errors import GiteaError, GiteaNotFound
from bot.gitea.transport import LAST_HEADERS
from bot.gitea.values import Branch, Hook, Repository, Team, User


class RepositoryCalls(RepositoryEndpoint):
    """Mixed into ``GiteaClient`` over the shared ``RepositoryEndpoint``."""

    async def get_version(self) -> str:
        """The Gitea server version."""
        data = await self._call("GET", "/version")
        return str(data["version"])

    async def get_own_user(self) -> User:
        """The account the token belongs to (use its ``login`` to ignore self-sent webhooks)."""
        return User.from_json(await self._call("GET", "/user"))

    async def get_repo(self) -> Repository:
        """The repository."""
        return Repository.from_json(await self._call("GET", self._repo_path))

    async def get_branch(self, name: str) -> Branch:
        """A branch (slashes allowed) and its head commit; GiteaNotFound when missing."""
        path = f"{self._repo_path}/branches/{urllib.parse.quote(name, safe='/')}"
        return Branch.from_json(await self._call("GET", path))

    async def get_user_permission(self, login: str) -> str:
        """Effective access of ``login``: ``none``/``read``/``write``/``admin``/``owner``.

        The token must be a site admin, a repo admin, or ``login`` itself (else GiteaForbidden).
        """
        data = await self._call("GET", f"{self._repo_path}/collaborators/{quote_segment(login)}/permission")
        return str(data["permission"])

    async def create_hook(
        self,
        *,
        url: str,
        secret: str,
        events: Sequence[str] = ("issues",),
        content_type: Literal["json", "form"] = "json",
        active: bool = True,
    ) -> Hook:
        """Register a ``gitea`` webhook (needs repo admin). ``issues`` covers comments and labels too."""
        data = {
            "type": "gitea",
            "config": {"url": url, "content_type": content_type, "secret": secret},
            "events": list(events),
            "active": active,
        }
        return Hook.from_json(await self._call("POST", f"{self._repo_path}/hooks", data=data))

    async def server_time(self) -> datetime | None:
        """Gitea's clock: the ``Date`` header of ``GET /version`` (Go's net/http sets it on every answer)."""
        LAST_HEADERS.set(None)
        await self._call("GET", "/version")
        headers = LAST_HEADERS.get()
        value = headers.get("Date") if headers is not None else None
        if not value:
            return None
        try:
            return email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None

    async def list_org_repos(self, org: str, *, page_size: int = MAX_PAGE_SIZE) -> list[Repository]:
        """Every repository of organization ``org`` the token may see (``GET /orgs/{org}/repos``: by id, private
        ones included, ``archived`` in each), page by page while ``Link`` has a ``rel="next"``: one call per
        ``page_size`` repositories (Gitea caps it at 50). GiteaNotFound when ``org`` is no organization."""
        query = {"limit": str(max(1, min(page_size, MAX_PAGE_SIZE)))}
        return [Repository.from_json(item) async for item in self._pages(f"/orgs/{quote_segment(org)}/repos", query)]

    async def list_repo_teams(self) -> list[Team]:
        """The teams with access to the repository (``GET /repos/{o}/{r}/teams``); [] for a user-owned one
        (Gitea answers 405 there)."""
        try:
            data = await self._call("GET", f"{self._repo_path}/teams")
        except GiteaError as exc:
            if exc.status == 405:
                return []
            raise
        return [Team.from_json(item) for item in data or ()]

    async def is_team_member(self, team_id: int, login: str) -> bool:
        """Whether ``login`` is in team ``team_id`` (``GET /teams/{id}/members/{login}``: 200 or 404).

        The caller must be a site admin, an org owner or a member of that team (1.26 reqTeamReadAccess);
        otherwise Gitea answers 403 or 404, and 404 cannot be told from "not a member"."""
        try:
            await self._call("GET", f"/teams/{int(team_id)}/members/{quote_segment(login)}")
        except GiteaNotFound:
            return False
        return True
