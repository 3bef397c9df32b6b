"""Whose comment may set an issue's state: the bot, a roster identity, or a Gitea writer (the pure reading of
permissions and teams is bot.core.trust; these are its reads). The issue-state handler and the read verbs ask it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from bot.config import Settings
from bot.core.issue_state import Trust
from bot.core.trust import (
    TeamGrant,
    issue_writing_teams,
    permission_trusts,
    team_reason,
    unseen_membership_reason,
)
from bot.handler_deps import PermissionCache

if TYPE_CHECKING:
    from bot.gitea import Team


class TrustGitea(Protocol):
    """The Gitea reads trust needs (bot.gitea.GiteaClient provides them): a login's permission, and on org
    repositories the teams that write on Issues and their members."""

    async def get_user_permission(self, login: str) -> str: ...

    async def list_repo_teams(self) -> list[Team]: ...

    async def is_team_member(self, team_id: int, login: str) -> bool: ...


def _is_not_found(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404


async def trust_of(
    author: str, settings: Settings, gitea: TrustGitea | None, bot_login: str, cache: PermissionCache
) -> Trust:
    """Whether ``author`` may set an issue's state: the bot, a roster identity, or write permission per Gitea
    (directly, or through a team that writes on Issues). Payload fields such as ``sender.is_admin`` are never
    consulted. When Gitea cannot answer, the error propagates (fail closed: nobody is trusted meanwhile)."""
    login = author.lower()
    if bot_login and login == bot_login.lower():
        return Trust(True, "bot")
    if login in {name.lower() for name in settings.roster}:
        return Trust(True, "roster")
    if gitea is None:
        return Trust(False, "no_gitea_client: write permission cannot be checked without gitea.token")
    try:
        permission = await cache.permission(gitea, author)
    except Exception as exc:
        if _is_not_found(exc):
            return Trust(False, f"unknown_user: {exc}"[:300])
        raise
    if permission_trusts(permission) or permission == "none":
        return Trust(permission_trusts(permission), f"permission:{permission}")
    return await cache.team_trust(author, lambda: _team_trust(gitea, author, permission, bot_login, cache))


async def _team_trust(
    gitea: TrustGitea, author: str, permission: str, bot_login: str, cache: PermissionCache
) -> Trust:
    """A ``read`` on an org repository may hide a team's Write on Issues (bot.core.trust): ask the teams.

    ``GET /teams/{id}/members/{login}`` answers 404 both for "not a member" and for a caller who may not
    read the team (1.26 reqTeamReadAccess), so a 404 is definitive only when the bot itself is ``owner``
    (site admin or org owner); otherwise the reason says what the bot cannot see. Fail closed either way."""
    teams = issue_writing_teams(
        TeamGrant(t.id, t.name, t.permission, t.units_map) for t in await gitea.list_repo_teams()
    )
    if not teams:
        return Trust(False, f"permission:{permission}")
    unreadable = False
    for team in teams:
        try:
            if await gitea.is_team_member(team.id, author):
                return Trust(True, team_reason(team))
        except Exception as exc:
            if getattr(exc, "status", None) != 403:
                raise
            unreadable = True
    if not unreadable and bot_login:
        unreadable = await cache.permission(gitea, bot_login) != "owner"
    if unreadable:
        return Trust(False, unseen_membership_reason(permission, teams)[:300])
    return Trust(False, f"permission:{permission}")
