"""Typed, retrying Gitea REST client over gidgethub, for exactly the endpoints the bot uses."""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import logging
import random
import re
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, Literal

import aiohttp
import gidgethub
import gidgethub.aiohttp

from bot.core.errors import Envelope

if TYPE_CHECKING:
    from bot.config import Settings

log = logging.getLogger(__name__)

#: Gitea caps every page at ``[api] MAX_RESPONSE_ITEMS`` (50 by default).
MAX_PAGE_SIZE: Final = 50
#: Headers of the last response seen by the current task (to read ``X-Total-Count``).
_LAST_HEADERS: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "gitea_last_headers", default=None
)

#: Set for one call that must not be retried by the transport (its 500 is read, not waited out).
_SINGLE_ATTEMPT: contextvars.ContextVar[bool] = contextvars.ContextVar("gitea_single_attempt", default=False)

IssueState = Literal["open", "closed", "all"]
IssueType = Literal["issues", "pulls"]


# ---------------------------------------------------------------------- errors


class GiteaError(Exception):
    """A Gitea API call failed. ``status`` is the HTTP status (None when no answer came back).

    The text names the method, the path and Gitea's message; it never contains the token.
    """

    def __init__(self, message: str, *, status: int | None = None, method: str = "", path: str = "") -> None:
        self.message = message
        self.status = status
        self.method = method
        self.path = path
        where = f"{method} {path}: " if method else ""
        code = f"{status} " if status is not None else ""
        super().__init__(f"{where}{code}{message}")


class GiteaNotFound(GiteaError):
    """404: no such repository, issue, comment, branch or user (or not visible to this token)."""


class GiteaForbidden(GiteaError):
    """401/403: the token is missing, wrong, or lacks the permission for this call."""


class GiteaInvalid(GiteaError):
    """400/422: Gitea rejected the request's content; ``message`` is Gitea's reason."""


class GiteaConflict(GiteaError):
    """409: the object changed meanwhile (e.g. a stale ``content_version``)."""


class GiteaUnavailable(GiteaError):
    """5xx, timeouts or connection failures that outlasted every retry."""


class GiteaIssueGone(GiteaNotFound):
    """The issue does not exist (any more): Gitea answers the comment routes of a missing or deleted issue
    with a **500** (routers/api/v1/repo/issue_comment.go ListIssueComments/CreateIssueComment send the
    GetIssueByIndex error to APIErrorInternal), so the client asks ``GET /issues/{n}`` (a real 404) before
    calling it unavailable. Never retried."""

    def __init__(self, number: int, *, method: str, path: str) -> None:
        super().__init__(f"issue #{number} does not exist (deleted?)", status=404, method=method, path=path)
        self.number = number

    @property
    def envelope(self) -> Envelope:
        return Envelope(
            error="not_found",
            message=f"issue #{self.number} does not exist on Gitea any more (deleted, or never existed)",
            remediate="nothing can be written to a deleted issue; its outbox entries are not sent",
            exact_next_action=f"check that issue #{self.number} was deleted on purpose; open a new issue for the work",
            details={"issue_number": self.number},
        )


class GiteaUnassignable(GiteaInvalid):
    """Logins Gitea cannot assign on this repository: unknown accounts (services/issue/issue.go
    UpdateAssignees, GetUserByName) or accounts without access (models/perm/access/repo_permission.go
    CanBeAssigned: Write on a unit or Read on pull requests). Gitea answers both with a 500. Never retried."""

    def __init__(self, logins: Sequence[str], reasons: Mapping[str, str], *, method: str, path: str) -> None:
        detail = ", ".join(f"{login} ({reasons.get(login, 'no access')})" for login in logins)
        super().__init__(f"cannot be assigned: {detail}", status=500, method=method, path=path)
        self.logins = tuple(logins)
        self.reasons = dict(reasons)

    @property
    def envelope(self) -> Envelope:
        names = ", ".join(self.logins)
        return Envelope(
            error="invalid_input",
            message=f"Gitea cannot assign {names} on this repository (unknown account or no access)",
            remediate="give each account at least read access to the repository (read on pull requests, or "
            "write on any unit), or fix the login; the other assignees were left as they were",
            exact_next_action=f"grant {names} access to the repository (or correct the login), then "
            "`foreman outbox retry ID`",
            details={"logins": list(self.logins), "reasons": self.reasons},
        )


def refusal_text(exc: GiteaError) -> str:
    """An error as the outbox stores it: the class, the message, and the envelope when the error has one."""
    text = f"{type(exc).__name__}: {exc}"
    envelope = getattr(exc, "envelope", None)
    if isinstance(envelope, Envelope):
        text += f" | exact_next_action: {envelope.exact_next_action}"
    return text


def _error_for(status: int, message: str, method: str, path: str) -> GiteaError:
    kind: type[GiteaError]
    if status == 404:
        kind = GiteaNotFound
    elif status in (401, 403):
        kind = GiteaForbidden
    elif status in (400, 422):
        kind = GiteaInvalid
    elif status == 409:
        kind = GiteaConflict
    elif status >= 500:
        kind = GiteaUnavailable
    else:
        kind = GiteaError
    return kind(message, status=status, method=method, path=path)


# ---------------------------------------------------------------------- values


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class User:
    """A Gitea account (``login`` is what to compare; payload e-mails may be placeholders)."""

    id: int
    login: str
    full_name: str
    email: str
    is_admin: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> User:
        """Parse ``User`` JSON."""
        return cls(
            id=int(data["id"]),
            login=str(data.get("login") or data.get("username") or ""),
            full_name=str(data.get("full_name") or ""),
            email=str(data.get("email") or ""),
            is_admin=bool(data.get("is_admin", False)),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Label:
    """A repository label; ``color`` is hex without ``#``."""

    id: int
    name: str
    color: str
    description: str
    exclusive: bool
    is_archived: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Label:
        """Parse ``Label`` JSON."""
        return cls(
            id=int(data["id"]),
            name=str(data["name"]),
            color=str(data.get("color") or "").lstrip("#"),
            description=str(data.get("description") or ""),
            exclusive=bool(data.get("exclusive", False)),
            is_archived=bool(data.get("is_archived", False)),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Issue:
    """An issue, or a pull request when ``is_pull`` (Gitea's non-null ``pull_request``)."""

    id: int
    number: int
    title: str
    body: str
    state: str
    user: User
    labels: tuple[Label, ...]
    assignees: tuple[User, ...]
    is_pull: bool
    comments: int
    created_at: datetime | None
    updated_at: datetime | None
    closed_at: datetime | None
    html_url: str
    content_version: int
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def label_names(self) -> frozenset[str]:
        """The names of the issue's labels."""
        return frozenset(label.name for label in self.labels)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Issue:
        """Parse ``Issue`` JSON (``assignees`` may be null)."""
        return cls(
            id=int(data["id"]),
            number=int(data["number"]),
            title=str(data.get("title") or ""),
            body=str(data.get("body") or ""),
            state=str(data.get("state") or "open"),
            user=User.from_json(data["user"]),
            labels=tuple(Label.from_json(x) for x in data.get("labels") or ()),
            assignees=tuple(User.from_json(x) for x in data.get("assignees") or ()),
            is_pull=data.get("pull_request") is not None,
            comments=int(data.get("comments") or 0),
            created_at=_time(data.get("created_at")),
            updated_at=_time(data.get("updated_at")),
            closed_at=_time(data.get("closed_at")),
            html_url=str(data.get("html_url") or ""),
            content_version=int(data.get("content_version") or 0),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Team:
    """An organization team: ``permission`` is its access mode, ``units_map`` the per-unit modes."""

    id: int
    name: str
    permission: str
    units_map: Mapping[str, str]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Team:
        """Parse ``Team`` JSON."""
        units = data.get("units_map") or {}
        return cls(
            id=int(data["id"]),
            name=str(data.get("name") or ""),
            permission=str(data.get("permission") or "none"),
            units_map={str(k): str(v) for k, v in units.items()} if isinstance(units, Mapping) else {},
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Comment:
    """A plain issue or PR comment."""

    id: int
    body: str
    user: User
    created_at: datetime | None
    updated_at: datetime | None
    html_url: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Comment:
        """Parse ``Comment`` JSON."""
        return cls(
            id=int(data["id"]),
            body=str(data.get("body") or ""),
            user=User.from_json(data["user"]),
            created_at=_time(data.get("created_at")),
            updated_at=_time(data.get("updated_at")),
            html_url=str(data.get("html_url") or ""),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Repository:
    """A repository; clone from ``clone_url`` as reported, never from an assembled URL."""

    id: int
    owner: str
    name: str
    full_name: str
    default_branch: str
    clone_url: str
    html_url: str
    private: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Repository:
        """Parse ``Repository`` JSON."""
        owner = data.get("owner") or {}
        return cls(
            id=int(data["id"]),
            owner=str(owner.get("login") or "") if isinstance(owner, Mapping) else str(owner),
            name=str(data["name"]),
            full_name=str(data.get("full_name") or ""),
            default_branch=str(data.get("default_branch") or ""),
            clone_url=str(data.get("clone_url") or ""),
            html_url=str(data.get("html_url") or ""),
            private=bool(data.get("private", False)),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Branch:
    """A branch and its head commit."""

    name: str
    commit_id: str
    commit_message: str
    protected: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Branch:
        """Parse ``Branch`` JSON."""
        commit = data.get("commit") or {}
        return cls(
            name=str(data["name"]),
            commit_id=str(commit.get("id") or ""),
            commit_message=str(commit.get("message") or ""),
            protected=bool(data.get("protected", False)),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Hook:
    """A repository webhook (the secret is never returned)."""

    id: int
    type: str
    active: bool
    events: tuple[str, ...]
    url: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Hook:
        """Parse ``Hook`` JSON."""
        config = data.get("config") or {}
        return cls(
            id=int(data["id"]),
            type=str(data.get("type") or ""),
            active=bool(data.get("active", False)),
            events=tuple(str(e) for e in data.get("events") or ()),
            url=str(config.get("url") or ""),
            raw=data,
        )


# ---------------------------------------------------------------------- transport


class _RetryingAPI(gidgethub.aiohttp.GitHubAPI):
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
        ceiling = self._backoff_base_s * (2.0 ** (attempt - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    async def _request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> tuple[int, Mapping[str, str], bytes]:
        path = urllib.parse.urlsplit(url).path
        # A POST is not idempotent (a comment would be posted twice when only its answer was lost), so it
        # gets one attempt; the outbox retries it after looking for its marker.
        attempts = 1 if method.upper() == "POST" or _SINGLE_ATTEMPT.get() else self._max_attempts
        for attempt in range(1, attempts + 1):
            try:
                async with asyncio.timeout(self._timeout_s):
                    async with self._session.request(method, url, headers=headers, data=body) as response:
                        status, response_headers = response.status, response.headers
                        payload = await response.read()
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                if attempt == attempts:
                    raise GiteaUnavailable(
                        f"no answer after {attempt} attempts ({problem})", method=method, path=path
                    ) from exc
                log.warning("gitea %s %s attempt %d/%d failed: %s", method, path, attempt, attempts, problem)
            else:
                _LAST_HEADERS.set(response_headers)
                if status < 500 or attempt == attempts:
                    return status, response_headers, payload
                log.warning("gitea %s %s attempt %d/%d answered %d", method, path, attempt, attempts, status)
            await self.sleep(self.backoff(attempt))
        raise AssertionError("unreachable")  # pragma: no cover


# ---------------------------------------------------------------------- the client


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


class GiteaClient:
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
        self._gh = _RetryingAPI(
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
            raise _error_for(int(exc.status_code), str(exc), method, path) from exc

    async def _once(self, method: str, path: str, *, data: Any = None) -> Any:
        """One attempt, no transport retries (a 5xx comes back as GiteaUnavailable at once)."""
        token = _SINGLE_ATTEMPT.set(True)
        try:
            return await self._call(method, path, data=data)
        finally:
            _SINGLE_ATTEMPT.reset(token)

    async def _issue_gone(self, number: int, method: str, path: str) -> GiteaIssueGone | None:
        """After a 500 on an issue's sub-route: GiteaIssueGone when ``GET /issues/{n}`` says 404, else None."""
        try:
            await self.get_issue(number)
        except GiteaNotFound:
            return GiteaIssueGone(number, method=method, path=path)
        return None

    # -- server and identity

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

    # -- issues

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
            _LAST_HEADERS.set(None)
            data = await self._call("GET", path, query={**query, "page": str(page)})
            for item in data or ():
                yield item
            headers = _LAST_HEADERS.get()
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
        _LAST_HEADERS.set(None)
        await self._call("GET", "/version")
        headers = _LAST_HEADERS.get()
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

    # -- comments

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

    # -- labels

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
            _LAST_HEADERS.set(None)
            data = await self._call("GET", path, query={"page": page, "limit": size})
            items = list(data or ())
            labels.extend(Label.from_json(item) for item in items)
            headers = _LAST_HEADERS.get()
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
            _LAST_HEADERS.set(None)
            items = list(await self._call("GET", path, query={"page": page, "limit": size}) or ())
            labels.extend(Label.from_json(item) for item in items)
            headers = _LAST_HEADERS.get()
            total = headers.get("X-Total-Count") if headers is not None else None
            if not items or (total is not None and total.isdigit() and len(labels) >= int(total)):
                break
            if total is None and len(items) < size:
                break
            page += 1
        return labels

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
