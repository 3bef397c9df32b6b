"""One repository's Gitea API over one transport: the calls every concern of the client shares (one request, one
attempt, every page of a listing) and the repository's path."""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final, Literal

import aiohttp
import gidgethub

from bot.gitea.errors import error_for
from bot.gitea.transport import LAST_HEADERS, SINGLE_ATTEMPT, RetryingAPI, next_page

#: Gitea caps every page at ``[api] MAX_RESPONSE_ITEMS`` (50 by default).
MAX_PAGE_SIZE: Final = 50

IssueState = Literal["open", "closed", "all"]


def quote_segment(segment: str | int) -> str:
    """One path segment (a login, an organization), every reserved character escaped."""
    return urllib.parse.quote(str(segment), safe="")


class RepositoryEndpoint:
    """The shared transport of ``GiteaClient``'s concerns (``RepositoryCalls``, ``IssueCalls``, ``CommentCalls``,
    ``LabelCalls``, ``PullRequestCalls``): made once, never changed; the concerns hold no state of their own.

    ``base_url`` is the Gitea root without ``/api/v1``. Every call is bounded by ``timeout_s`` per attempt
    and retried up to ``max_attempts`` times on 5xx, timeouts and connection errors, with exponential
    backoff and jitter from ``backoff_base_s``. POSTs are never retried here: when an answer was lost
    after Gitea stored the change, a retry would apply it twice; the outbox retries them with markers.
    Failures raise a ``GiteaError`` subclass grouped by meaning.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        base_url: str,
        token: str,
        owner: str,
        repo: str,
        requester: str = "gitea-foreman",
        timeout_s: float = 10.0,
        max_attempts: int = 4,
        backoff_base_s: float = 0.2,
    ) -> None:
        self.owner = owner
        self.repo = repo
        self.base_url = base_url.rstrip("/")
        self._session = session
        self._options: dict[str, Any] = {"requester": requester, "timeout_s": timeout_s,
                                         "max_attempts": max_attempts, "backoff_base_s": backoff_base_s}
        self._gh = RetryingAPI(
            session,
            requester,
            oauth_token=token,
            base_url=f"{self.base_url}/api/v1",
            timeout_s=timeout_s,
            max_attempts=max_attempts,
            backoff_base_s=backoff_base_s,
        )

    @property
    def _repo_path(self) -> str:
        return f"/repos/{quote_segment(self.owner)}/{quote_segment(self.repo)}"

    async def _call(self, method: str, path: str, *, data: Any = None, query: Mapping[str, Any] | None = None) -> Any:
        url = path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        try:
            if method == "GET":
                return await self._gh.getitem(url, {})
            if method == "POST":
                return await self._gh.post(url, {}, data=data)
            if method == "PATCH":
                return await self._gh.patch(url, {}, data=data)
            if method == "PUT":
                return await self._gh.put(url, {}, data=data)
            if method == "DELETE":
                await self._gh.delete(url, {})
                return None
            raise ValueError(f"unsupported method {method}")
        except gidgethub.HTTPException as exc:
            raise error_for(int(exc.status_code), str(exc), method, path) from exc

    async def _once(self, method: str, path: str, *, data: Any = None) -> Any:
        """One attempt, no transport retries (a 5xx comes back as GiteaUnavailable at once)."""
        token = SINGLE_ATTEMPT.set(True)
        try:
            return await self._call(method, path, data=data)
        finally:
            SINGLE_ATTEMPT.reset(token)

    async def _pages(self, path: str, query: Mapping[str, str]) -> AsyncIterator[Any]:
        """Every item of a paginated listing: only the next page *number* is read from ``Link``."""
        page = 1
        while True:
            LAST_HEADERS.set(None)
            data = await self._call("GET", path, query={**query, "page": str(page)})
            for item in data or ():
                yield item
            headers = LAST_HEADERS.get()
            following = next_page(headers.get("Link") if headers is not None else None)
            if following is None or following <= page:
                return
            page = following
