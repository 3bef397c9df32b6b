"""The pull-request reads an agent's reading needs: the changed files (paged), the unified diff (a bounded read of
text, not JSON) and the code comments of a review."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gidgethub import sansio

from bot.gitea.endpoint import MAX_PAGE_SIZE, RepositoryEndpoint
from bot.gitea.errors import error_for
from bot.gitea.transport import BODY_LIMIT, LAST_HEADERS
from bot.gitea.values import ChangedFile, ReviewComment


@dataclass(frozen=True, slots=True)
class FilesPage:
    """One page of a pull request's changed files, and how many it changes in all (``X-Total-Count``)."""

    files: tuple[ChangedFile, ...]
    total: int


@dataclass(frozen=True, slots=True)
class DiffText:
    """A pull request's unified diff as read: at most the bytes asked for; ``complete`` False when Gitea's answer
    went on (the rest was never read)."""

    text: str
    complete: bool


class PullReadCalls(RepositoryEndpoint):
    """Mixed into ``GiteaClient`` over the shared ``RepositoryEndpoint``."""

    async def list_pull_files(self, number: int, *, page: int = 1, limit: int = MAX_PAGE_SIZE) -> FilesPage:
        """Page ``page`` of the files PR ``number`` changes (``GET /repos/{owner}/{repo}/pulls/{index}/files``,
        routers/api/v1/repo/pull.go ``GetPullRequestFiles``: from the merge base to the head, ``limit`` a page
        (Gitea caps it at 50), ``X-Total-Count`` the number of files). GiteaNotFound for a plain issue."""
        size = max(1, min(limit, MAX_PAGE_SIZE))
        LAST_HEADERS.set(None)
        data = await self._call("GET", f"{self._repo_path}/pulls/{int(number)}/files",
                                query={"page": str(max(1, page)), "limit": str(size)})
        files = tuple(ChangedFile.from_json(item) for item in data or ())
        headers = LAST_HEADERS.get()
        total = headers.get("X-Total-Count") if headers is not None else None
        return FilesPage(files, int(total) if total is not None and total.isdigit() else len(files))

    async def pull_diff(self, number: int, *, max_bytes: int) -> DiffText:
        """PR ``number``'s unified diff (``GET /repos/{owner}/{repo}/pulls/{index}.diff``, pull.go
        ``DownloadPullDiffOrPatch``: ``git diff -p`` from the merge base to the head, as ``text/plain``), read up
        to ``max_bytes`` and never further; bytes that are not UTF-8 are replaced. GiteaNotFound for a plain
        issue."""
        path = f"{self._repo_path}/pulls/{int(number)}.diff"
        headers = sansio.create_headers(self._gh.requester, accept="text/plain", oauth_token=self._gh.oauth_token)
        token = BODY_LIMIT.set(max(0, max_bytes))
        try:
            status, _, body = await self._gh._request("GET", self._gh.base_url + path, headers)
        finally:
            BODY_LIMIT.reset(token)
        if status >= 400:
            try:
                message = str(json.loads(body).get("message") or "")
            except (ValueError, AttributeError):
                message = body[:200].decode("utf-8", "replace")
            raise error_for(status, message or f"HTTP {status}", "GET", path)
        complete = len(body) <= max_bytes
        return DiffText(body[:max_bytes].decode("utf-8", "replace"), complete)

    async def list_review_comments(self, number: int, review_id: int) -> list[ReviewComment]:
        """The code comments of review ``review_id`` on PR ``number`` (``GET .../pulls/{index}/reviews/{id}/comments``,
        pull_review.go ``GetPullReviewComments``, unpaged). GiteaNotFound for an unknown review or another PR's."""
        data = await self._call("GET", f"{self._repo_path}/pulls/{int(number)}/reviews/{int(review_id)}/comments")
        return [ReviewComment.from_json(item) for item in data or ()]
