"""The issue calls of the Gitea client: issues, their assignees and their comments."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from bot.gitea.endpoint import MAX_PAGE_SIZE, IssueState
from bot.gitea.errors import GiteaIssueGone, GiteaNotFound, GiteaUnassignable, GiteaUnavailable
from bot.gitea.labels import label_refs
from bot.gitea.repository import RepositoryCalls
from bot.gitea.values import Comment, Issue

IssueType = Literal["issues", "pulls"]


class IssueCalls(RepositoryCalls):
    """Mixed into ``GiteaClient``; an unassignable login is told by the permission API (``RepositoryCalls``)."""

    async def _issue_gone(self, number: int, method: str, path: str) -> GiteaIssueGone | None:
        """After a 500 on an issue's sub-route: GiteaIssueGone when ``GET /issues/{n}`` says 404, else None."""
        try:
            await self.get_issue(number)
        except GiteaNotFound:
            return GiteaIssueGone(number, method=method, path=path)
        return None

    async def get_issue(self, number: int) -> Issue:
        """Issue (or PR) ``number``."""
        return Issue.from_json(await self._call("GET", f"{self._repo_path}/issues/{int(number)}"))

    async def iter_issues(
        self,
        *,
        state: IssueState = "open",
        labels: Sequence[str] = (),
        type_: IssueType | None = "issues",
        limit: int = MAX_PAGE_SIZE,
        since: str | None = None,
    ) -> AsyncIterator[Issue]:
        """Every matching issue, newest first, page by page while ``Link`` has a ``rel="next"``.

        Gitea builds its Link URLs from ROOT_URL (services/context/api.go ``genAPILinks``), which need not
        be the URL foreman reaches it by: only the next page *number* is read from the link, and every page
        is asked of the configured base URL, so the token never goes to another host.

        ``labels`` are names and must ALL be present (Gitea ignores unknown names); ``type_=None``
        includes pull requests; ``limit`` is the page size (Gitea caps it at 50). ``since`` (RFC 3339): only
        issues with ``updated_at`` at or after it (routers/api/v1/repo/issue.go ``ListIssues``,
        ``UpdatedAfterUnix``: ``issue.updated_unix >= since``, whole seconds).
        """
        query: dict[str, str] = {"state": state, "limit": str(max(1, min(limit, MAX_PAGE_SIZE)))}
        if labels:
            query["labels"] = ",".join(labels)
        if type_ is not None:
            query["type"] = type_
        if since is not None:
            query["since"] = since
        async for item in self._pages(f"{self._repo_path}/issues", query):
            yield Issue.from_json(item)

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

    async def list_issues(
        self,
        *,
        state: IssueState = "open",
        labels: Sequence[str] = (),
        type_: IssueType | None = "issues",
        limit: int = MAX_PAGE_SIZE,
    ) -> list[Issue]:
        """All matching issues over all pages (see ``iter_issues``)."""
        return [issue async for issue in self.iter_issues(state=state, labels=labels, type_=type_, limit=limit)]

    async def create_issue(
        self,
        title: str,
        *,
        body: str = "",
        labels: Sequence[int] = (),
        assignees: Sequence[str] = (),
        closed: bool = False,
    ) -> Issue:
        """Open an issue; ``labels`` are ids here (Gitea accepts no names on create)."""
        path = f"{self._repo_path}/issues"
        data: dict[str, Any] = {"title": title, "body": body}
        if labels:
            data["labels"] = label_refs(labels, "POST", path)
        if assignees:
            data["assignees"] = list(assignees)
        if closed:
            data["closed"] = True
        return Issue.from_json(await self._call("POST", path, data=data))

    async def edit_issue(
        self,
        number: int,
        *,
        title: str | None = None,
        body: str | None = None,
        state: Literal["open", "closed"] | None = None,
        assignees: Sequence[str] | None = None,
        content_version: int | None = None,
    ) -> Issue:
        """Change an issue (Gitea answers 201); a stale ``content_version`` raises GiteaConflict."""
        data: dict[str, Any] = {}
        if title is not None:
            data["title"] = title
        if body is not None:
            data["body"] = body
        if state is not None:
            data["state"] = state
        if assignees is not None:
            data["assignees"] = list(assignees)
        if content_version is not None:
            data["content_version"] = content_version
        return Issue.from_json(await self._call("PATCH", f"{self._repo_path}/issues/{int(number)}", data=data))

    async def delete_issue(self, number: int) -> None:
        """Delete an issue (repo admin; sends ``issues``/``deleted`` from Gitea 1.25)."""
        await self._call("DELETE", f"{self._repo_path}/issues/{int(number)}")

    async def set_assignees(self, number: int, logins: Sequence[str]) -> Issue:
        """Make ``logins`` the issue's whole assignee set without ever losing the others on a refusal.

        Gitea's UpdateAssignees removes the unlisted assignees *before* it finds that a new one cannot be
        assigned (a 500). So: first PATCH the union of the current and the wanted set (removes nothing; one
        attempt); a 500 there is checked with the permission API, and unknown or no-access logins raise
        GiteaUnassignable with the assignees as they were. Then PATCH exactly the wanted set (only removals).
        """
        path = f"{self._repo_path}/issues/{int(number)}"
        wanted = list(dict.fromkeys(logins))
        current = [user.login for user in (await self.get_issue(number)).assignees]
        lowered = {login.lower() for login in current}
        union = current + [login for login in wanted if login.lower() not in lowered]
        try:
            await self._once("PATCH", path, data={"assignees": union})
        except GiteaUnavailable as exc:
            if exc.status is None:
                raise
            reasons = await self._unassignable(number, [x for x in wanted if x.lower() not in lowered])
            if not reasons:
                raise
            after = [user.login for user in (await self.get_issue(number)).assignees]
            if {x.lower() for x in after} != lowered:
                # Gitea adds in map order: put back what it added before the refusal (removals only).
                await self._call("PATCH", path, data={"assignees": current})
            raise GiteaUnassignable(sorted(reasons), reasons, method="PATCH", path=path) from exc
        return Issue.from_json(await self._call("PATCH", path, data={"assignees": wanted}))

    async def _unassignable(self, number: int, logins: Sequence[str]) -> dict[str, str]:
        reasons: dict[str, str] = {}
        for login in logins:
            try:
                permission = await self.get_user_permission(login)
            except GiteaNotFound:
                reasons[login] = "no such user"
                continue
            if permission == "none":
                reasons[login] = "no access to the repository"
        return reasons

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
