"""The comment calls of the Gitea client: an issue's comments and every comment of the repository."""

from __future__ import annotations

from collections.abc import AsyncIterator

from bot.gitea.endpoint import MAX_PAGE_SIZE
from bot.gitea.errors import GiteaIssueGone, GiteaNotFound, GiteaUnavailable
from bot.gitea.issues import IssueCalls
from bot.gitea.values import Comment


class CommentCalls(IssueCalls):
    """Mixed into ``GiteaClient``; a comment call answered 500 asks ``get_issue`` whether the issue is gone."""

    async def _issue_gone(self, number: int, method: str, path: str) -> GiteaIssueGone | None:
        """After a 500 on an issue's sub-route: GiteaIssueGone when ``GET /issues/{n}`` says 404, else None."""
        try:
            await self.get_issue(number)
        except GiteaNotFound:
            return GiteaIssueGone(number, method=method, path=path)
        return None

    async def iter_repo_comments(
        self, *, since: str | None = None, limit: int = MAX_PAGE_SIZE
    ) -> AsyncIterator[Comment]:
        """Every plain comment of the repository (issues and pull requests), oldest created first, page by page.

        ``since`` (RFC 3339): only comments with ``updated_at`` at or after it (routers/api/v1/repo/issue_comment.go
        ``ListRepoIssueComments`` → models/issues/comment.go ``FindComments``: ``comment.updated_unix >= since``,
        ordered by ``created_unix, id``). A comment names its issue by ``issue_url`` / ``pull_request_url``.
        """
        query: dict[str, str] = {"limit": str(max(1, min(limit, MAX_PAGE_SIZE)))}
        if since is not None:
            query["since"] = since
        async for item in self._pages(f"{self._repo_path}/issues/comments", query):
            yield Comment.from_json(item)

    async def list_issue_comments(self, number: int) -> list[Comment]:
        """Every plain comment of an issue, oldest first (Gitea does not paginate this list).

        A missing issue is Gitea's 500 here: GiteaIssueGone after one ``GET /issues/{n}``, never retried."""
        path = f"{self._repo_path}/issues/{int(number)}/comments"
        try:
            data = await self._once("GET", path)
        except GiteaUnavailable as exc:
            if exc.status is None or (gone := await self._issue_gone(number, "GET", path)) is None:
                data = await self._call("GET", path)  # a real outage: the usual retries
            else:
                raise gone from exc
        return [Comment.from_json(item) for item in data or ()]

    async def create_comment(self, number: int, body: str) -> Comment:
        """Post a comment on an issue or PR (GiteaIssueGone when the issue does not exist: Gitea's 500)."""
        path = f"{self._repo_path}/issues/{int(number)}/comments"
        try:
            return Comment.from_json(await self._call("POST", path, data={"body": body}))
        except GiteaUnavailable as exc:
            if exc.status is not None and (gone := await self._issue_gone(number, "POST", path)) is not None:
                raise gone from exc
            raise

    async def get_comment(self, comment_id: int) -> Comment:
        """A comment by id; GiteaNotFound when missing or when the id is a non-comment timeline item."""
        path = f"{self._repo_path}/issues/comments/{int(comment_id)}"
        data = await self._call("GET", path)
        if data is None:
            raise GiteaNotFound("not a plain comment (timeline event)", status=204, method="GET", path=path)
        return Comment.from_json(data)

    async def edit_comment(self, comment_id: int, body: str) -> Comment:
        """Replace a comment's body (poster or writer); unchanged bodies send no webhook."""
        path = f"{self._repo_path}/issues/comments/{int(comment_id)}"
        data = await self._call("PATCH", path, data={"body": body})
        if data is None:
            raise GiteaNotFound("not a plain comment (timeline event)", status=204, method="PATCH", path=path)
        return Comment.from_json(data)

    async def delete_comment(self, comment_id: int) -> None:
        """Delete a comment (poster or writer)."""
        await self._call("DELETE", f"{self._repo_path}/issues/comments/{int(comment_id)}")
