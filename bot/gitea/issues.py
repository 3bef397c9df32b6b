"""The issue calls of the Gitea client: issues and their assignees."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from bot.gitea.endpoint import MAX_PAGE_SIZE, IssueState
from bot.gitea.errors import GiteaNotFound, GiteaUnassignable, GiteaUnavailable
from bot.gitea.labels import label_refs
from bot.gitea.repository import RepositoryCalls
from bot.gitea.values import Issue

IssueType = Literal["issues", "pulls"]


class IssueCalls(RepositoryCalls):
    """Mixed into ``GiteaClient``; an unassignable login is told by the permission API (``RepositoryCalls``)."""

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
