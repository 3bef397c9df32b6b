"""gidgethub's aiohttp transport with timeouts and retries, and the Link header's next page."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import urllib.parse
from collections.abc import Mapping
from typing import Final

import aiohttp
import gidgethub.aiohttp

from bot.core import backoff
from bot.gitea.errors import GiteaUnavailable

log = logging.getLogger(__name__)

#: Headers of the last response seen by the current task (to read ``X-Total-Count``).
LAST_HEADERS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "gitea_last_headers", default=None
)

#: Set for one call that must not be retried by the transport (its 500 is read, not waited out).
SINGLE_ATTEMPT: contextvars.ContextVar[bool] = contextvars.ContextVar("gitea_single_attempt", default=False)

#: Set for one call whose body is read only up to this many bytes (a diff): the rest is never read.
BODY_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar("gitea_body_limit", default=None)


class RetryingAPI(gidgethub.aiohttp.GitHubAPI):
    """gidgethub's aiohttp transport with a per-attempt timeout and retries on 5xx and lost connections."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        requester: str,
        *,
        oauth_token: str,
        base_url: str,
        timeout_s: float,
        max_attempts: int,
        backoff_base_s: float,
    ) -> None:
        super().__init__(session, requester, oauth_token=oauth_token, base_url=base_url)
        self._timeout_s = timeout_s
        self._max_attempts = max(1, max_attempts)
        self._backoff_base_s = backoff_base_s

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: half fixed, half random, doubling per attempt."""
        return backoff.delay(attempt, base=self._backoff_base_s, jitter="equal")

    async def _request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> tuple[int, Mapping[str, str], bytes]:
        path = urllib.parse.urlsplit(url).path
        # A POST is not idempotent (a comment would be posted twice when only its answer was lost), so it
        # gets one attempt; the outbox retries it after looking for its marker.
        attempts = 1 if method.upper() == "POST" or SINGLE_ATTEMPT.get() else self._max_attempts
        for attempt in range(1, attempts + 1):
            try:
                async with asyncio.timeout(self._timeout_s):
                    async with self._session.request(method, url, headers=headers, data=body) as response:
                        status, response_headers = response.status, response.headers
                        payload = await _bounded_read(response, BODY_LIMIT.get())
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if attempt == attempts:
                    raise GiteaUnavailable(
                        f"no answer after {attempt} attempts ({problem})", method=method, path=path
                    ) from exc
                log.warning("gitea %s %s attempt %d/%d failed: %s", method, path, attempt, attempts, problem)
            else:
                LAST_HEADERS.set(response_headers)
                if status < 500 or attempt == attempts:
                    return status, response_headers, payload
                log.warning("gitea %s %s attempt %d/%d answered %d", method, path, attempt, attempts, status)
            await self.sleep(self.backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover


async def _bounded_read(response: aiohttp.ClientResponse, limit: int | None) -> bytes:
    """The whole body, or (with ``limit``) at most ``limit + 1`` bytes of it: one more than asked tells the caller
    that the body went on."""
    if limit is None:
        return await response.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    return b"".join(chunks)[: limit + 1]


_LINK_RE: Final = re.compile(r'<([^>]*)>\s*;\s*rel="?next"?')


def next_page(link: str | None) -> int | None:
    """The ``page`` number of a Link header's ``rel="next"`` URL (None when there is none)."""
    if not link:
        return None
    for part in link.split(","):
        match = _LINK_RE.search(part)
        if match is None:
            continue
        values = urllib.parse.parse_qs(urllib.parse.urlsplit(match[1]).query).get("page", [])
        if values and values[0].isdigit():
            return int(values[0])
    return None
