"""The typed Gitea REST client of one repository, for exactly the endpoints the bot uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import aiohttp

from bot.gitea.checks import CheckCalls
from bot.gitea.comments import CommentCalls
from bot.gitea.issues import IssueCalls
from bot.gitea.labels import LabelCalls
from bot.gitea.pull_reads import PullReadCalls
from bot.gitea.pulls import PullRequestCalls
from bot.gitea.repository import RepositoryCalls

if TYPE_CHECKING:
    from bot.config import Settings


class GiteaClient(CheckCalls, CommentCalls, IssueCalls, LabelCalls, PullRequestCalls, PullReadCalls, RepositoryCalls):
    """The Gitea API calls of one repository, typed, with retries (the aiohttp session is injected): its concerns
    (merge checks, comments, issues, labels, pull requests, the server and the repository) over one
    ``RepositoryEndpoint``, which says how every call is bounded and retried."""

    def __repr__(self) -> str:
        return f"GiteaClient({self.base_url!r}, {self.owner}/{self.repo})"

    def with_token(self, token: str) -> GiteaClient:
        """The same repository, session and timings, authenticated by ``token`` (another Gitea account)."""
        return GiteaClient(self._session, base_url=self.base_url, token=token, owner=self.owner, repo=self.repo,
                           **self._options)


G = TypeVar("G")


@dataclass(frozen=True, slots=True)
class Acting(Generic[G]):
    """A Gitea client acting for a roster identity, and the Gitea account its calls are posted as."""

    client: G | GiteaClient
    login: str
    own_token: bool


def client_as(gitea: G, settings: Settings, login: str, *, bot_login: str = "") -> Acting[G]:
    """The client that acts as ``login``: with the identity's own token (``gitea.identity_tokens``) when it has
    one, else ``gitea`` itself, which posts as the bot. The one place that chooses whose account a call uses."""
    token = settings.identity_token(login)
    if token is not None and isinstance(gitea, GiteaClient):
        return Acting(gitea.with_token(token), login, True)
    return Acting(gitea, bot_login or settings.gitea.bot_login, False)


def client_for(session: aiohttp.ClientSession, settings: Settings, **options: Any) -> GiteaClient | None:
    """The configured repository's client, or None when no token is configured (Gitea calls are then off)."""
    token = settings.gitea_token()
    if not token:
        return None
    options.setdefault("timeout_s", settings.gitea.timeout_s)
    return GiteaClient(
        session,
        base_url=settings.gitea.url,
        token=token,
        owner=settings.repository.owner,
        repo=settings.repository.name,
        **options,
    )
