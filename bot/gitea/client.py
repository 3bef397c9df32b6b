"""The typed Gitea REST client of one repository, for exactly the endpoints the bot uses."""

from __future__ import annotations

import email.utils
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import aiohttp
import gidgethub

from bot.gitea.errors import (
    GiteaError,
    GiteaInvalid,
    GiteaIssueGone,
    GiteaNotFound,
    GiteaUnassignable,
    GiteaUnavailable,
    error_for,
)
from bot.gitea.pulls import MAX_PAGE_SIZE, IssueState, PullRequestCalls
from bot.gitea.transport import LAST_HEADERS, SINGLE_ATTEMPT, RetryingAPI, next_page
from bot.gitea.values import Branch, Comment, Hook, Issue, Label, Repository, Team, User

if TYPE_CHECKING:
    from bot.config import Settings

IssueType = Literal["issues", "pulls"]


def _q(segment: str | int) -> str:
    return urllib.parse.quote(str(segment), safe="")


def _label_refs(labels: Sequence[int] | Sequence[str], method: str, path: str) -> list[int] | list[str]:
    """Gitea wants all label ids or all names; a mix (or anything else) is refused before sending."""
    if isinstance(labels, str | bytes):
        raise GiteaInvalid("labels must be a sequence of ids or names, not one string", method=method, path=path)
    items = list(labels)
    ids = [x for x in items if isinstance(x, int) and not isinstance(x, bool)]
    names = [x for x in items if isinstance(x, str)]
    if (ids and names) or len(ids) + len(names) != len(items):
        raise GiteaInvalid("labels must be all integer ids or all string names", method=method, path=path)
    return ids if ids else names


class GiteaClient(PullRequestCalls):
    """The Gitea API calls of one repository, typed, with retries (the aiohttp session is injected).

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

    def __repr__(self) -> str:
        return f"GiteaClient({self.base_url!r}, {self.owner}/{self.repo})"

    def with_token(self, token: str) -> GiteaClient:
        """The same repository, session and timings, authenticated by ``token`` (another Gitea account)."""
        return GiteaClient(self._session, base_url=self.base_url, token=token, owner=self.owner, repo=self.repo,
                           **self._options)

    @property
    def _repo_path(self) -> str:
        return f"/repos/{_q(self.owner)}/{_q(self.repo)}"

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

    async def _issue_gone(self, number: int, method: str, path: str) -> GiteaIssueGone | None:
        """After a 500 on an issue's sub-route: GiteaIssueGone when ``GET /issues/{n}`` says 404, else None."""
        try:
            await self.get_issue(number)
        except GiteaNotFound:
            return GiteaIssueGone(number, method=method, path=path)
        return None

    # --- server, identity and hooks -----------------------------------------------------------------------------------

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
        data = await self._call("GET", f"{self._repo_path}/collaborators/{_q(login)}/permission")
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

    # --- issues and their comments ------------------------------------------------------------------------------------

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
            data["labels"] = _label_refs(labels, "POST", path)
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

    # --- labels and teams ---------------------------------------------------------------------------------------------

    async def list_issue_labels(self, number: int) -> list[Label]:
        """The labels on an issue."""
        data = await self._call("GET", f"{self._repo_path}/issues/{int(number)}/labels")
        return [Label.from_json(item) for item in data or ()]

    async def add_labels(self, number: int, labels: Sequence[int] | Sequence[str]) -> list[Label]:
        """Add labels (all ids or all names; unknown names are ignored); returns the full list after."""
        path = f"{self._repo_path}/issues/{int(number)}/labels"
        data = await self._call("POST", path, data={"labels": _label_refs(labels, "POST", path)})
        return [Label.from_json(item) for item in data or ()]

    async def replace_labels(self, number: int, labels: Sequence[int] | Sequence[str]) -> list[Label]:
        """Replace the labels (all ids or all names); returns the full list after."""
        path = f"{self._repo_path}/issues/{int(number)}/labels"
        data = await self._call("PUT", path, data={"labels": _label_refs(labels, "PUT", path)})
        return [Label.from_json(item) for item in data or ()]

    async def remove_label(self, number: int, label_id: int) -> None:
        """Remove one label by id (Gitea has no remove-by-name); GiteaInvalid when the label is unknown."""
        await self._call("DELETE", f"{self._repo_path}/issues/{int(number)}/labels/{int(label_id)}")

    async def clear_labels(self, number: int) -> None:
        """Remove every label (sends ``label_cleared``)."""
        await self._call("DELETE", f"{self._repo_path}/issues/{int(number)}/labels")

    async def list_repo_labels(self, *, page_size: int = MAX_PAGE_SIZE) -> list[Label]:
        """Every repository label. Gitea sends no Link header here: page until a short or empty page,
        or until ``X-Total-Count`` labels were read."""
        path = f"{self._repo_path}/labels"
        size = max(1, min(page_size, MAX_PAGE_SIZE))
        labels: list[Label] = []
        page = 1
        while True:
            LAST_HEADERS.set(None)
            data = await self._call("GET", path, query={"page": page, "limit": size})
            items = list(data or ())
            labels.extend(Label.from_json(item) for item in items)
            headers = LAST_HEADERS.get()
            total = headers.get("X-Total-Count") if headers is not None else None
            if not items:
                break
            if total is not None and total.isdigit():
                if len(labels) >= int(total):
                    break
            elif len(items) < size:
                break
            page += 1
        return labels

    async def list_org_labels(self, org: str, *, page_size: int = MAX_PAGE_SIZE) -> list[Label]:
        """Every label of organization ``org`` (``GET /orgs/{org}/labels``: X-Total-Count, no Link header);
        GiteaNotFound when ``org`` is no organization."""
        path = f"/orgs/{_q(org)}/labels"
        size = max(1, min(page_size, MAX_PAGE_SIZE))
        labels: list[Label] = []
        page = 1
        while True:
            LAST_HEADERS.set(None)
            items = list(await self._call("GET", path, query={"page": page, "limit": size}) or ())
            labels.extend(Label.from_json(item) for item in items)
            headers = LAST_HEADERS.get()
            total = headers.get("X-Total-Count") if headers is not None else None
            if not items or (total is not None and total.isdigit() and len(labels) >= int(total)):
                break
            if total is None and len(items) < size:
                break
            page += 1
        return labels

    async def list_org_repos(self, org: str, *, page_size: int = MAX_PAGE_SIZE) -> list[Repository]:
        """Every repository of organization ``org`` the token may see (``GET /orgs/{org}/repos``: by id, private
        ones included, ``archived`` in each), page by page while ``Link`` has a ``rel="next"``: one call per
        ``page_size`` repositories (Gitea caps it at 50). GiteaNotFound when ``org`` is no organization."""
        query = {"limit": str(max(1, min(page_size, MAX_PAGE_SIZE)))}
        return [Repository.from_json(item) async for item in self._pages(f"/orgs/{_q(org)}/repos", query)]

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
            await self._call("GET", f"/teams/{int(team_id)}/members/{_q(login)}")
        except GiteaNotFound:
            return False
        return True

    async def create_label(self, name: str, *, color: str, description: str = "", exclusive: bool = False) -> Label:
        """Create a repository label (``color`` as ``#rrggbb`` or ``rrggbb``)."""
        data = {"name": name, "color": color, "description": description, "exclusive": exclusive}
        return Label.from_json(await self._call("POST", f"{self._repo_path}/labels", data=data))


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
