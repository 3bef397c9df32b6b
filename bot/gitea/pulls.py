"""The pull-request calls of the Gitea client: open, read, review, update from the base, merge and delete a branch."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any, Literal

from bot.gitea.endpoint import MAX_PAGE_SIZE, IssueState, RepositoryEndpoint
from bot.gitea.errors import GiteaError, GiteaInvalid, GiteaNotFound
from bot.gitea.transport import LAST_HEADERS
from bot.gitea.values import PullRequest, Review


class PullRequestCalls(RepositoryEndpoint):
    """Mixed into ``GiteaClient`` over the shared ``RepositoryEndpoint``."""

    async def create_pull(
        self,
        head: str,
        *,
        title: str,
        base: str,
        body: str = "",
        assignees: Sequence[str] = (),
        labels: Sequence[int] = (),
    ) -> PullRequest:
        """Open a PR from branch ``head`` into ``base``; a second open PR for the same pair is GiteaConflict (409)."""
        data: dict[str, Any] = {"head": head, "base": base, "title": title, "body": body}
        if assignees:
            data["assignees"] = list(assignees)
        if labels:
            data["labels"] = list(labels)
        return PullRequest.from_json(await self._call("POST", f"{self._repo_path}/pulls", data=data))

    async def get_pull(self, number: int) -> PullRequest:
        """PR ``number``; GiteaNotFound for a missing number or a plain issue."""
        return PullRequest.from_json(await self._call("GET", f"{self._repo_path}/pulls/{int(number)}"))

    async def list_pulls(
        self, *, state: IssueState = "open", base_branch: str | None = None, limit: int = MAX_PAGE_SIZE
    ) -> list[PullRequest]:
        """Every matching PR over all pages, newest first (pages followed by ``Link`` as in ``iter_issues``)."""
        query: dict[str, str] = {"state": state, "limit": str(max(1, min(limit, MAX_PAGE_SIZE)))}
        if base_branch is not None:
            query["base_branch"] = base_branch
        return [PullRequest.from_json(item) async for item in self._pages(f"{self._repo_path}/pulls", query)]

    async def list_reviews(self, number: int) -> list[Review]:
        """Every review of PR ``number``, oldest first, page by page. Gitea answers this listing with
        ``X-Total-Count`` but no ``Link`` (routers/api/v1/repo/pull_review.go ``ListPullReviews``, 1.22 to 1.26) and
        30 a page by default: pages of ``MAX_PAGE_SIZE`` are read until one comes back short or the count is
        reached (the latest verdicts are on the last page). A server that ignored ``page`` (the same page again)
        ends the listing rather than looping."""
        path = f"{self._repo_path}/pulls/{int(number)}/reviews"
        out: list[Review] = []
        seen: set[int] = set()
        page = 1
        while True:
            LAST_HEADERS.set(None)
            data = list(await self._call("GET", path, query={"page": str(page), "limit": str(MAX_PAGE_SIZE)}) or ())
            fresh = [Review.from_json(item) for item in data]
            fresh = [review for review in fresh if review.id not in seen]
            out.extend(fresh)
            seen.update(review.id for review in fresh)
            headers = LAST_HEADERS.get()
            total = _count(headers.get("X-Total-Count") if headers is not None else None)
            if len(data) < MAX_PAGE_SIZE or not fresh or (total is not None and len(out) >= total):
                return out
            page += 1

    async def submit_review(
        self,
        number: int,
        event: Literal["APPROVED", "REQUEST_CHANGES", "COMMENT"],
        *,
        body: str = "",
        commit_id: str = "",
    ) -> Review:
        """Review PR ``number`` (``commit_id``: the head the verdict is about; empty = the current head).

        The PR's poster approving or requesting changes, REQUEST_CHANGES or COMMENT without a body, and a verdict
        on a closed PR are GiteaInvalid (422). Never retried (a POST)."""
        data = {"event": event, "body": body, "commit_id": commit_id}
        return Review.from_json(await self._call("POST", f"{self._repo_path}/pulls/{int(number)}/reviews", data=data))

    async def merge_pull(
        self,
        number: int,
        *,
        style: Literal["merge", "rebase", "rebase-merge", "squash", "fast-forward-only"] = "merge",
        head_commit_id: str = "",
        message: str = "",
        delete_branch_after_merge: bool = False,
    ) -> None:
        """Merge PR ``number``, only if its head is still ``head_commit_id`` (when given).

        A moved head is GiteaConflict (409 "head out of date"); already merged, not mergeable, a disallowed
        style or no write access is GiteaInvalid (Gitea's 405); a closed PR is GiteaNotFound (404)."""
        data: dict[str, Any] = {"do": style, "delete_branch_after_merge": delete_branch_after_merge}
        if head_commit_id:
            data["head_commit_id"] = head_commit_id
        if message:
            data["merge_title_field"] = message
        path = f"{self._repo_path}/pulls/{int(number)}/merge"
        try:
            await self._call("POST", path, data=data)
        except GiteaError as exc:
            if exc.status == 405:
                raise GiteaInvalid(exc.message, status=405, method="POST", path=path) from exc
            raise

    async def update_pull(self, number: int, *, style: Literal["merge", "rebase"] = "merge") -> None:
        """Bring PR ``number``'s head branch up to date with its base (``POST /pulls/{index}/update?style=``, Gitea's
        ``UpdatePullRequest``): ``merge`` commits the base into the head ("Merge branch '<base>' into <head>", as the
        calling account), ``rebase`` rebases the head onto the base and force-pushes it.

        A conflict is GiteaConflict (409 "merge failed because of conflict" / "rebase failed because of conflict",
        1.22 to 1.26); a merged or closed PR GiteaInvalid (422); an account that may not push to the head branch
        (or rebase-update it) GiteaForbidden (403, empty body); no such PR GiteaNotFound. A head already up to date
        is Gitea's **500** (services/pull/update.go: "HeadBranch of PR N is up to date" goes to APIErrorInternal),
        indistinguishable from an outage: ask only about a PR that is behind. Never retried (a POST)."""
        await self._call("POST", f"{self._repo_path}/pulls/{int(number)}/update", data=b"", query={"style": style})

    async def is_merged(self, number: int) -> bool:
        """Whether PR ``number`` was merged (Gitea: 204 merged, 404 not merged or no such PR)."""
        try:
            await self._call("GET", f"{self._repo_path}/pulls/{int(number)}/merge")
        except GiteaNotFound:
            return False
        return True

    async def delete_branch(self, name: str) -> None:
        """Delete a branch (write on code); the default or a protected branch is GiteaForbidden, a missing one
        GiteaNotFound. Gitea closes the open PRs whose head or base it was."""
        await self._call("DELETE", f"{self._repo_path}/branches/{urllib.parse.quote(name, safe='/')}")


def _count(value: str | None) -> int | None:
    """``X-Total-Count`` as a number (None: absent or not a count)."""
    return int(value) if value is not None and value.isdigit() else None

