"""The emulator's HTTP API: one route table of (method, swagger path, handler), served by aiohttp."""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from aiohttp import web

from bot.emulator import convert, gitrepo
from bot.emulator.core import Emulator
from bot.emulator.model import PERM_LEVEL, UNITS, EmuIssue, EmuRepo, EmuTeam, EmuUser, Perm
from bot.emulator.state import ApiError

API_PREFIX: Final = "/api/v1"
DEFAULT_PAGING_NUM: Final = 30
MAX_RESPONSE_ITEMS: Final = 50
NOT_FOUND_MESSAGE: Final = "The target couldn't be found."
EMULATOR_KEY: Final = web.AppKey("emulator", Emulator)
_DOER_KEY: Final = web.RequestKey("emulator.doer", EmuUser)
_PARAM_PATTERNS: Final = {"index": "[0-9]+", "id": "[0-9]+", "branch": ".+"}
_COLOR_RE: Final = re.compile(r"^#?([0-9a-fA-F]{6}|[0-9a-fA-F]{3})$")
_HOOK_TYPES: Final = ("gitea", "gogs")

Handler = Callable[[Emulator, web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Route:
    """One API operation: HTTP method, swagger path template (relative to ``/api/v1``), handler."""

    method: str
    path: str
    handler: Handler
    auth: bool = True

    @property
    def aiohttp_path(self) -> str:
        """The aiohttp route path, with the patterns Gitea's router uses (numeric ids, slashed branches)."""

        def pattern(match: re.Match[str]) -> str:
            name = match[1]
            return f"{{{name}:{_PARAM_PATTERNS[name]}}}" if name in _PARAM_PATTERNS else match[0]

        return API_PREFIX + re.sub(r"\{(\w+)\}", pattern, self.path)


@dataclass(slots=True)
class RecordedRequest:
    """One request the emulator served, as the contract test needs it."""

    method: str
    route: str | None
    path: str
    query: list[tuple[str, str]]
    json: Any
    login: str | None = None
    status: int | None = None
    response_json: Any = None
    response_headers: dict[str, str] = field(default_factory=dict)
    fault: str | None = None


# ---------------------------------------------------------------------- responses


def _dumps(data: Any) -> bytes:
    """Gitea's API encoder: compact JSON, HTML characters escaped, newline-terminated."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, escaped)
    return (text + "\n").encode("utf-8")


def json_response(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON answer as Gitea sends it."""
    return web.Response(
        body=_dumps(data), status=status, headers=headers, content_type="application/json", charset="utf-8"
    )


def error_response(emu: Emulator, status: int, message: str) -> web.Response:
    """Gitea's API error body (``services/context/api.go``)."""
    body: dict[str, Any] = {"message": message, "url": f"{emu.app_url}api/swagger"}
    if status == 404:
        body["errors"] = None
    return json_response(body, status=status)


def _no_content() -> web.Response:
    return web.Response(status=204)


# ---------------------------------------------------------------------- request helpers


def _doer(request: web.Request) -> EmuUser:
    user: EmuUser | None = request.get(_DOER_KEY)
    if user is None:
        raise ApiError(401, "token is required")
    return user


def _repo(emu: Emulator, request: web.Request) -> tuple[EmuRepo, Perm]:
    """The repository and the caller's mode on its **Issues** unit (what ``CanWriteIssuesOrPulls`` reads:
    a team's per-unit Write counts here, though the permission API reports the team's access mode)."""
    repo = emu.find_repo(request.match_info["owner"], request.match_info["repo"])
    if repo is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    doer = request.get(_DOER_KEY)
    if emu.perm_of(repo, doer) == "none":
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return repo, emu.unit_perm(repo, doer, "repo.issues")


def _access(emu: Emulator, repo: EmuRepo, request: web.Request) -> Perm:
    """The caller's repository access mode (repo admin checks, ``permissions`` in the repository JSON)."""
    return emu.perm_of(repo, request.get(_DOER_KEY))


def internal_error(request: web.Request, err: str) -> ApiError:
    """``ctx.APIErrorInternal`` (services/context/api.go): 500, with the error text only for a site admin
    (``setting.IsProd``: everyone else gets an empty message)."""
    doer: EmuUser | None = request.get(_DOER_KEY)
    return ApiError(500, err if doer is not None and doer.admin else "")


def _issue_or_500(repo: EmuRepo, request: web.Request) -> EmuIssue:
    """``GetIssueByIndex`` where the handler sends every error to ``APIErrorInternal``: a missing issue is a 500
    (routers/api/v1/repo/issue_comment.go ListIssueComments, CreateIssueComment; 1.22.3 to 1.26.3)."""
    index = int(request.match_info["index"])
    issue = repo.issues.get(index)
    if issue is None:
        raise internal_error(request, f"issue does not exist [id: 0, repo_id: {repo.id}, index: {index}]")
    return issue


def _can_be_assigned(emu: Emulator, repo: EmuRepo, user: EmuUser) -> bool:
    """models/perm/access/repo_permission.go ``CanBeAssigned``: Write on any unit, or Read on pull requests."""
    if user.is_org:
        return False
    if PERM_LEVEL[emu.unit_perm(repo, user, "repo.pulls")] >= PERM_LEVEL["read"]:
        return True
    return any(PERM_LEVEL[emu.unit_perm(repo, user, unit)] >= PERM_LEVEL["write"] for unit in UNITS)


def _can_write(perm: Perm) -> bool:
    return PERM_LEVEL[perm] >= PERM_LEVEL["write"]


def _issue(repo: EmuRepo, request: web.Request) -> EmuIssue:
    issue = repo.issues.get(int(request.match_info["index"]))
    if issue is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return issue


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        data = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise ApiError(422, f"invalid JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(422, "the request body must be a JSON object")
    return data


def _form_int(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def _list_options(request: web.Request) -> tuple[int, int]:
    """``utils.GetListOptions``: page from 1, limit defaulting to 30 and capped at 50."""
    page = max(1, _form_int(request.query.get("page")))
    limit = _form_int(request.query.get("limit"))
    if limit <= 0:
        limit = DEFAULT_PAGING_NUM
    limit = min(limit, MAX_RESPONSE_ITEMS)
    return page, limit


def _parse_time(value: str, name: str) -> int:
    try:
        return int(datetime.fromisoformat(value).timestamp())
    except ValueError:
        raise ApiError(422, f"invalid {name}: {value!r}") from None


def link_header(emu: Emulator, request: web.Request, total: int, page_size: int) -> str | None:
    """RFC 5988 links like ``genAPILinks``: absolute AppURL-based URLs, rel next/last/first/prev."""
    total_pages = 1 if total == 0 else (total + page_size - 1) // page_size
    current = min(max(1, _form_int(request.query.get("page"))), total_pages)
    has_next = total > current * page_size
    is_last = total == 0 or (total > (current - 1) * page_size and not has_next)

    def url_for(page: int) -> str:
        query = [(k, v) for k, v in request.query.items() if k != "page"] + [("page", str(page))]
        encoded = urllib.parse.urlencode(sorted(query, key=lambda kv: kv[0]))
        return f"{emu.app_url}{request.path.lstrip('/')}?{encoded}"

    links: list[str] = []
    if has_next:
        links.append(f'<{url_for(current + 1)}>; rel="next"')
    if not is_last:
        links.append(f'<{url_for(total_pages)}>; rel="last"')
    if current != 1:
        links.append(f'<{url_for(1)}>; rel="first"')
    if current > 1:
        links.append(f'<{url_for(current - 1)}>; rel="prev"')
    return ",".join(links) or None


def _total_count_headers(total: int, link: str | None = None) -> dict[str, str]:
    headers = {"X-Total-Count": str(total), "Access-Control-Expose-Headers": "X-Total-Count, Link"}
    if link:
        headers["Link"] = link
    return headers


# ---------------------------------------------------------------------- handlers: misc, repo, permissions


async def get_version(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /version."""
    return json_response({"version": emu.version})


async def get_own_user(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /user: the caller, seen by itself."""
    doer = _doer(request)
    return json_response(convert.user_json(emu, doer, doer))


async def get_repo(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}."""
    repo, _ = _repo(emu, request)
    host_url = f"{request.scheme}://{request.host}/"
    return json_response(convert.repo_json(emu, repo, _access(emu, repo, request), host_url=host_url))


async def get_branch(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/branches/{branch}: read from the bare repository."""
    repo, perm = _repo(emu, request)
    name = request.match_info["branch"]
    head = await asyncio.to_thread(gitrepo.branch_head, repo.path, name)
    if head is None:
        raise ApiError(404, f"branch does not exist [name: {name}]")
    return json_response(convert.branch_json(emu, repo, name, head, perm))


async def get_permission(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET .../collaborators/{collaborator}/permission: site admin, repo admin or the user themself."""
    repo, _ = _repo(emu, request)
    perm = _access(emu, repo, request)
    doer = _doer(request)
    login = request.match_info["collaborator"]
    if not doer.admin and doer.login.lower() != login.lower() and PERM_LEVEL[perm] < PERM_LEVEL["admin"]:
        raise ApiError(
            403,
            "Only admins can query all permissions, repo admins can query all repo permissions, "
            "collaborators can query only their own",
        )
    target = emu.find_user(login)
    if target is None:
        raise ApiError(404, f"user does not exist [name: {login}]")
    access = emu.perm_of(repo, target)
    return json_response({"permission": access, "role_name": access, "user": convert.user_json(emu, target, doer)})


async def create_hook(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/hooks (repo admin); ``active`` defaults to false, as in Gitea."""
    repo, _ = _repo(emu, request)
    perm = _access(emu, repo, request)
    if PERM_LEVEL[perm] < PERM_LEVEL["admin"]:
        raise ApiError(403, "must be a repository admin")
    form = await _json_body(request)
    hook_type = form.get("type")
    if hook_type not in _HOOK_TYPES:
        raise ApiError(422, f"Invalid hook type: {hook_type!r} (the emulator delivers gitea and gogs hooks)")
    config = form.get("config")
    if not isinstance(config, dict):
        raise ApiError(422, "Missing config option: url")
    for key in ("url", "content_type"):
        if not isinstance(config.get(key), str) or not config[key]:
            raise ApiError(422, f"Missing config option: {key}")
    if config["content_type"] not in ("json", "form"):
        raise ApiError(422, "Invalid content type")
    events = form.get("events") or []
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        raise ApiError(422, "events must be a list of strings")
    hook = emu._op_create_hook(
        repo,
        url=config["url"],
        secret=str(config.get("secret", "")),
        events=events,
        content_type=config["content_type"],
        active=bool(form.get("active", False)),
        authorization_header=str(form.get("authorization_header", "")),
        branch_filter=str(form.get("branch_filter", "")),
        name=str(form.get("name", "")),
        hook_type=str(hook_type),
    )
    return json_response(convert.hook_json(emu, hook), status=201)


# ---------------------------------------------------------------------- handlers: issues


async def list_issues(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/issues: state/labels(AND)/type filters, newest first, paginated."""
    repo, _ = _repo(emu, request)
    query = request.query
    state = query.get("state", "")
    issues = list(repo.issues.values())
    if state == "closed":
        issues = [i for i in issues if i.closed is not None]
    elif state != "all":
        issues = [i for i in issues if i.closed is None]
    if query.get("labels", ""):
        names = query["labels"].split(",")
        label_ids = [label.id for label in repo.labels.values() if label.name in names]
        issues = [i for i in issues if all(lid in i.label_ids for lid in label_ids)]
    kind = query.get("type", "")
    if kind == "pulls":
        issues = [i for i in issues if i.is_pull]
    elif kind == "issues":
        issues = [i for i in issues if not i.is_pull]
    if keyword := query.get("q", "").strip().lower():
        issues = [i for i in issues if keyword in i.title.lower() or keyword in i.body.lower()]
    if created_by := query.get("created_by", ""):
        issues = [i for i in issues if i.poster.login.lower() == created_by.lower()]
    if assigned_by := query.get("assigned_by", ""):
        issues = [i for i in issues if any(u.login.lower() == assigned_by.lower() for u in i.assignees)]
    if mentioned_by := query.get("mentioned_by", ""):
        issues = [i for i in issues if f"@{mentioned_by.lower()}" in i.body.lower()]
    if since := query.get("since", ""):
        floor = _parse_time(since, "since")
        issues = [i for i in issues if i.updated >= floor]
    if before := query.get("before", ""):
        ceiling = _parse_time(before, "before")
        issues = [i for i in issues if i.updated <= ceiling]
    issues.sort(key=lambda i: (i.created, i.id), reverse=True)
    page, limit = _list_options(request)
    total = len(issues)
    chosen = issues[(page - 1) * limit : page * limit]
    doer = request.get(_DOER_KEY)
    return json_response(
        [convert.issue_json(emu, i, doer) for i in chosen],
        headers=_total_count_headers(total, link_header(emu, request, total, limit)),
    )


async def create_issue(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/issues: labels/assignees only count for writers, as in Gitea."""
    repo, perm = _repo(emu, request)
    doer = _doer(request)
    form = await _json_body(request)
    title = form.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ApiError(422, "[Title]: Required")
    labels: list[Any] = []
    assignees: list[EmuUser] = []
    if _can_write(perm):
        raw_labels = form.get("labels") or []
        if not isinstance(raw_labels, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in raw_labels
        ):
            raise ApiError(422, "labels must be a list of label ids")
        # CreateIssueOption.labels: ids only; the repo's and its org's labels are kept (NewIssueWithIndex).
        labels = [label for x in raw_labels if (label := emu.label(x)) is not None and emu.usable_label(repo, label)]
        logins = list(form.get("assignees") or [])
        if form.get("assignee"):
            logins.append(form["assignee"])
        for login in dict.fromkeys(logins):
            user = emu.find_user(str(login))
            if user is None:
                raise ApiError(422, f"Assignee does not exist: [name: {login}]")
            if not _can_be_assigned(emu, repo, user):
                raise ApiError(422, f"user does not have access to repo [user_id: {user.id}, repo_name: {repo.name}]")
            assignees.append(user)
    issue = emu._op_create_issue(
        repo,
        doer,
        title=title,
        body=str(form.get("body") or ""),
        labels=labels,
        assignees=assignees,
        closed=bool(form.get("closed", False)),
        pull=False,
        head="",
        base="",
        notify=True,
    )
    return json_response(convert.issue_json(emu, issue, doer), status=201)


async def get_issue(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/issues/{index} (also for PR numbers)."""
    repo, _ = _repo(emu, request)
    return json_response(convert.issue_json(emu, _issue(repo, request), request.get(_DOER_KEY)))


async def edit_issue(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """PATCH /repos/{owner}/{repo}/issues/{index}: poster or writer; answers **201**."""
    repo, perm = _repo(emu, request)
    doer = _doer(request)
    issue = _issue(repo, request)
    can_write = _can_write(perm)
    if issue.poster is not doer and not can_write:
        raise ApiError(403, "only the poster or a writer may edit this issue", bare=True)  # EditIssue: ctx.Status
    form = await _json_body(request)
    title, body, state = form.get("title"), form.get("body"), form.get("state")
    if any(v is not None and not isinstance(v, str) for v in (title, body, state)):
        raise ApiError(422, "title, body and state must be strings")
    content_version = form.get("content_version")
    if content_version is not None and not isinstance(content_version, int):
        raise ApiError(422, "content_version must be an integer")
    # routers/api/v1/repo/issue.go EditIssue: title, then body (ChangeContent checks content_version: 409,
    # only when a body is sent), then the assignees, then the state; an error stops there, what came
    # before stays done.
    emu._op_edit_issue(
        issue, doer, title=title, body=body, state=None, assignees=None, content_version=content_version, notify=True
    )
    assignees: list[EmuUser] | None = None
    if can_write and (form.get("assignees") is not None or form.get("assignee") is not None):
        logins = list(form.get("assignees") or [])
        if form.get("assignee"):
            logins.append(form["assignee"])
        # services/issue/issue.go UpdateAssignees: every name is looked up first (GetUserByName; its error,
        # like any but ErrBlockedUser, is a 500 in EditIssue), before anything changes.
        assignees = []
        for login in dict.fromkeys(logins):
            user = emu.find_user(str(login))
            if user is None:
                raise internal_error(request, f"user does not exist [uid: 0, name: {login}]")
            assignees.append(user)
    if assignees is not None:
        # Then DeleteNotPassedAssignee removes the others, then AddAssigneeIfNotAssigned adds each new one and
        # fails on CanBeAssigned with ErrUserDoesNotHaveAccessToRepo: a 500 after the removals were made.
        keep = [u for u in issue.assignees if u in assignees]
        emu._op_edit_issue(
            issue, doer, title=None, body=None, state=None, assignees=keep, content_version=None, notify=True
        )
        for user in assignees:
            if user in issue.assignees:
                continue
            if not _can_be_assigned(emu, repo, user):
                raise internal_error(
                    request, f"user doesn't have access to repo [user_id: {user.id}, repo_name: {repo.name}]"
                )
            emu._op_edit_issue(
                issue,
                doer,
                title=None,
                body=None,
                state=None,
                assignees=[*issue.assignees, user],
                content_version=None,
                notify=True,
            )
    emu._op_edit_issue(
        issue, doer, title=None, body=None, state=state, assignees=None, content_version=None, notify=True
    )
    return json_response(convert.issue_json(emu, issue, doer), status=201)


async def delete_issue(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """DELETE /repos/{owner}/{repo}/issues/{index} (routers/api/v1/repo/issue.go DeleteIssue; reqAdmin): 204,
    404 when missing; services/webhook/notifier.go DeleteIssue sends ``issues``/``deleted`` from 1.25.0."""
    repo, _ = _repo(emu, request)
    doer = _doer(request)
    if PERM_LEVEL[_access(emu, repo, request)] < PERM_LEVEL["admin"]:
        raise ApiError(403, "must be a repository admin")
    emu._op_delete_issue(_issue(repo, request), doer, notify=True)
    return _no_content()


# ---------------------------------------------------------------------- handlers: comments


async def list_comments(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET .../issues/{index}/comments: every plain comment, oldest first, no pagination."""
    repo, _ = _repo(emu, request)
    comments = _issue_or_500(repo, request).comments
    if since := request.query.get("since", ""):
        floor = _parse_time(since, "since")
        comments = [c for c in comments if c.updated >= floor]
    if before := request.query.get("before", ""):
        ceiling = _parse_time(before, "before")
        comments = [c for c in comments if c.updated <= ceiling]
    comments.sort(key=lambda c: (c.created, c.id))
    return json_response([convert.comment_json(emu, c) for c in comments], headers=_total_count_headers(len(comments)))


async def list_repo_comments(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/issues/comments, as Gitea 1.22-1.26 routers/api/v1/repo/issue_comment.go
    ``ListRepoIssueComments``: plain comments only (``Type: CommentTypeComment``) of the repository's issues and
    pull requests; ``since``/``before`` compare ``comment.updated_unix`` inclusively (models/issues/comment.go
    ``FindCommentsOptions.ToConds``: ``Gte``/``Lte``, whole seconds from services/context/utils.go
    ``parseFormTime``, 422 for a time that is not RFC 3339); ordered ``created_unix, id`` ascending
    (``FindComments``); paginated by ``utils.GetListOptions`` with ``X-Total-Count`` and ``Link``."""
    repo, _ = _repo(emu, request)
    comments = [c for issue in repo.issues.values() for c in issue.comments]
    if since := request.query.get("since", ""):
        floor = _parse_time(since, "since")
        comments = [c for c in comments if c.updated >= floor]
    if before := request.query.get("before", ""):
        ceiling = _parse_time(before, "before")
        comments = [c for c in comments if c.updated <= ceiling]
    comments.sort(key=lambda c: (c.created, c.id))
    page, limit = _list_options(request)
    total = len(comments)
    chosen = comments[(page - 1) * limit : page * limit]
    return json_response(
        [convert.comment_json(emu, c) for c in chosen],
        headers=_total_count_headers(total, link_header(emu, request, total, limit)),
    )


async def create_comment(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST .../issues/{index}/comments: readers may comment; a locked issue needs a writer. 201."""
    repo, perm = _repo(emu, request)
    doer = _doer(request)
    issue = _issue_or_500(repo, request)
    form = await _json_body(request)
    body = form.get("body")
    if not isinstance(body, str) or not body:
        raise ApiError(422, "[Body]: Required")
    if issue.is_locked and not _can_write(perm) and not doer.admin:
        raise ApiError(403, "IssueLocked")
    comment = emu._op_create_comment(issue, doer, body, notify=True)
    return json_response(convert.comment_json(emu, comment), status=201)


def _comment(emu: Emulator, repo: EmuRepo, request: web.Request) -> Any:
    comment = emu.comment(int(request.match_info["id"]))
    if comment is None or comment.issue.repo is not repo:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return comment


async def get_comment(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET .../issues/comments/{id}: 204 for a timeline item that is not a plain comment."""
    repo, _ = _repo(emu, request)
    comment = _comment(emu, repo, request)
    if comment.kind != "comment":
        return _no_content()
    return json_response(convert.comment_json(emu, comment))


async def edit_comment(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """PATCH .../issues/comments/{id}: poster or writer; webhook only when the body changes."""
    repo, perm = _repo(emu, request)
    doer = _doer(request)
    comment = _comment(emu, repo, request)
    if comment.poster is not doer and not _can_write(perm):
        raise ApiError(403, "only the poster or a writer may edit this comment", bare=True)  # editIssueComment
    if comment.kind != "comment":
        return _no_content()
    form = await _json_body(request)
    body = form.get("body")
    if not isinstance(body, str) or not body:
        raise ApiError(422, "[Body]: Required")
    emu._op_edit_comment(comment, doer, body, notify=True)
    return json_response(convert.comment_json(emu, comment))


async def delete_comment(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """DELETE .../issues/comments/{id}: poster or writer; 204."""
    repo, perm = _repo(emu, request)
    doer = _doer(request)
    comment = _comment(emu, repo, request)
    if comment.poster is not doer and not _can_write(perm):
        raise ApiError(403, "only the poster or a writer may delete this comment", bare=True)
    if comment.kind != "comment":
        # deleteIssueComment: ctx.Status(400) when !comment.Type.HasContentSupport() (audit #17).
        raise ApiError(400, "this timeline item has no content", bare=True)
    emu._op_delete_comment(comment, doer, notify=True)
    return _no_content()


# ---------------------------------------------------------------------- handlers: labels


def _label_list(emu: Emulator, issue: EmuIssue) -> web.Response:
    return json_response([convert.label_json(emu, label) for label in convert.issue_labels(emu, issue)])


async def list_issue_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET .../issues/{index}/labels."""
    repo, _ = _repo(emu, request)
    return _label_list(emu, _issue(repo, request))


async def _labels_option(emu: Emulator, request: web.Request) -> tuple[EmuIssue, EmuUser, list[Any]]:
    repo, perm = _repo(emu, request)
    doer = _doer(request)
    issue = _issue(repo, request)
    # prepareForReplaceOrAdd: from 1.23 the write check comes first, as JSON "write permission is required";
    # in 1.22 it comes after the labels were resolved, as ctx.Status(403) with an empty body.
    if emu.at_least("1.23") and not _can_write(perm):
        raise ApiError(403, "write permission is required")
    form = await _json_body(request)
    items = form.get("labels") or []
    if not isinstance(items, list):
        raise ApiError(422, "labels must be a list")
    labels = emu.resolve_issue_labels(repo, items)
    if not _can_write(perm):
        raise ApiError(403, "must have write access to issues", bare=True)
    return issue, doer, labels


async def add_issue_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST .../issues/{index}/labels: add; 200 with the full list; ``label_updated``."""
    issue, doer, labels = await _labels_option(emu, request)
    emu._op_add_labels(issue, doer, labels, notify=True)
    return _label_list(emu, issue)


async def replace_issue_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """PUT .../issues/{index}/labels: replace; 200 with the full list; ``label_updated``."""
    issue, doer, labels = await _labels_option(emu, request)
    emu._op_replace_labels(issue, doer, labels, notify=True)
    return _label_list(emu, issue)


async def clear_issue_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """DELETE .../issues/{index}/labels: 204 and ``label_cleared``."""
    repo, perm = _repo(emu, request)
    doer = _doer(request)
    issue = _issue(repo, request)
    if not _can_write(perm):
        raise ApiError(403, "must have write access to issues", bare=True)
    emu._op_clear_labels(issue, doer, notify=True)
    return _no_content()


async def remove_issue_label(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """DELETE .../issues/{index}/labels/{id}: by id only; 422 for an unknown label; ``label_updated``."""
    repo, perm = _repo(emu, request)
    doer = _doer(request)
    issue = _issue(repo, request)
    if not _can_write(perm):
        raise ApiError(403, "must have write access to issues", bare=True)
    label_id = int(request.match_info["id"])
    label = emu.label(label_id)
    if label is None:
        raise ApiError(422, f"label does not exist [label_id: {label_id}]")
    emu._op_remove_label(issue, doer, label, notify=True)
    return _no_content()


async def list_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/labels: by name, page/limit, X-Total-Count and **no** Link header."""
    repo, _ = _repo(emu, request)
    labels = sorted(repo.labels.values(), key=lambda label: (label.name, label.id))
    page, limit = _list_options(request)
    chosen = labels[(page - 1) * limit : page * limit]
    return json_response(
        [convert.label_json(emu, label) for label in chosen], headers=_total_count_headers(len(labels))
    )


async def create_label(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/labels: writers; name and a hex colour are required. 201."""
    repo, perm = _repo(emu, request)
    if not _can_write(perm):
        raise ApiError(403, "must have write access to issues")
    form = await _json_body(request)
    name, color = form.get("name"), form.get("color")
    if not isinstance(name, str) or not name:
        raise ApiError(422, "[Name]: Required")
    if not isinstance(color, str) or not (match := _COLOR_RE.match(color)):
        raise ApiError(422, f"invalid color: {color!r}")
    digits = match[1] if len(match[1]) == 6 else "".join(ch * 2 for ch in match[1])
    label = emu._op_create_label(
        repo,
        name,
        f"#{digits.lower()}",
        str(form.get("description") or ""),
        bool(form.get("exclusive", False)),
        bool(form.get("is_archived", False)),
    )
    return json_response(convert.label_json(emu, label), status=201)


# ---------------------------------------------------------------------- handlers: organizations and teams


def team_json(emu: Emulator, team: EmuTeam) -> dict[str, Any]:
    """services/convert/convert.go ``ToTeams``: ``permission`` is the team's AccessMode, ``units_map`` the
    per-unit modes."""
    units = {unit: mode for unit, mode in team.units.items() if mode != "none"}
    return {
        "id": team.id,
        "name": team.name,
        "description": team.description,
        "organization": convert.org_json(emu, team.org),
        "includes_all_repositories": team.includes_all,
        "permission": team.access,
        "units": sorted(units),
        "units_map": units,
        "can_create_org_repo": team.access == "owner",
    }


async def list_repo_teams(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/teams (routers/api/v1/repo/teams.go ListTeams; any repo reader): the teams
    with access to the repository (``GetRepoTeams``); 405 when the owner is no organization."""
    repo, _ = _repo(emu, request)
    _doer(request)
    if not repo.owner.is_org:
        raise ApiError(405, "repo is not owned by an organization")
    teams = [t for t in emu.teams_of(repo.owner) if t.covers(repo)]
    return json_response([team_json(emu, t) for t in sorted(teams, key=lambda t: t.name.lower())])


async def get_team_member(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /teams/{id}/members/{username} (routers/api/v1/org/team.go GetTeamMember behind
    reqTeamReadAccess, 1.26.3): site admins, org owners and the team's members may ask; another org member
    gets 403 "Must be a team member", anyone else 404. 200 with the user when a member, else 404."""
    doer = _doer(request)
    team = emu.team(int(request.match_info["id"]))
    if team is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    privileged = doer.admin or emu.is_org_owner(team.org, doer) or doer in team.members
    if not privileged:
        if emu.is_org_member(team.org, doer):
            raise ApiError(403, "Must be a team member")
        raise ApiError(404, NOT_FOUND_MESSAGE)
    user = emu.find_user(request.match_info["username"])
    if user is None:
        raise ApiError(404, f"user does not exist [uid: 0, name: {request.match_info['username']}]")
    if user not in team.members:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return json_response(convert.user_json(emu, user, doer))


async def list_org_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /orgs/{org}/labels (routers/api/v1/org/label.go ListLabels): by name, page/limit, X-Total-Count."""
    org = emu.find_user(request.match_info["org"])
    if org is None or not org.is_org:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    labels = sorted(emu.org_labels(org), key=lambda label: (label.name, label.id))
    page, limit = _list_options(request)
    chosen = labels[(page - 1) * limit : page * limit]
    return json_response(
        [convert.label_json(emu, label) for label in chosen], headers=_total_count_headers(len(labels))
    )


# ---------------------------------------------------------------------- the table

_REPO: Final = "/repos/{owner}/{repo}"
ROUTES: Final[tuple[Route, ...]] = (
    Route("GET", "/version", get_version, auth=False),
    Route("GET", "/user", get_own_user),
    Route("GET", _REPO, get_repo),
    Route("GET", f"{_REPO}/branches/{{branch}}", get_branch),
    Route("GET", f"{_REPO}/collaborators/{{collaborator}}/permission", get_permission),
    Route("POST", f"{_REPO}/hooks", create_hook),
    Route("GET", f"{_REPO}/issues", list_issues),
    Route("POST", f"{_REPO}/issues", create_issue),
    Route("GET", f"{_REPO}/issues/{{index}}", get_issue),
    Route("PATCH", f"{_REPO}/issues/{{index}}", edit_issue),
    Route("DELETE", f"{_REPO}/issues/{{index}}", delete_issue),
    Route("GET", f"{_REPO}/issues/comments", list_repo_comments),
    Route("GET", f"{_REPO}/issues/{{index}}/comments", list_comments),
    Route("POST", f"{_REPO}/issues/{{index}}/comments", create_comment),
    Route("GET", f"{_REPO}/issues/comments/{{id}}", get_comment),
    Route("PATCH", f"{_REPO}/issues/comments/{{id}}", edit_comment),
    Route("DELETE", f"{_REPO}/issues/comments/{{id}}", delete_comment),
    Route("GET", f"{_REPO}/issues/{{index}}/labels", list_issue_labels),
    Route("POST", f"{_REPO}/issues/{{index}}/labels", add_issue_labels),
    Route("PUT", f"{_REPO}/issues/{{index}}/labels", replace_issue_labels),
    Route("DELETE", f"{_REPO}/issues/{{index}}/labels", clear_issue_labels),
    Route("DELETE", f"{_REPO}/issues/{{index}}/labels/{{id}}", remove_issue_label),
    Route("GET", f"{_REPO}/labels", list_labels),
    Route("GET", f"{_REPO}/teams", list_repo_teams),
    Route("GET", "/teams/{id}/members/{username}", get_team_member),
    Route("GET", "/orgs/{org}/labels", list_org_labels),
    Route("POST", f"{_REPO}/labels", create_label),
)


# ---------------------------------------------------------------------- auth, middleware, app


def authenticate(emu: Emulator, header: str | None) -> EmuUser | None:
    """``Authorization: token X`` / ``Bearer X`` (``token`` case-insensitive from 1.25) or Basic with the token.

    None when there is no header; ApiError 401 when a credential is given but unknown.
    """
    if not header:
        return None
    scheme, _, credential = header.strip().partition(" ")
    credential = credential.strip()
    user: EmuUser | None = None
    # modules/auth/httpauth ParseAuthorizationHeader (1.25+): both scheme words in any case; before
    # (services/auth/oauth2.go parseToken), ``token`` had to be lowercase and ``bearer`` any case.
    schemes = ("token", "bearer") if emu.at_least("1.25") else ("bearer",)
    if scheme.lower() in schemes or scheme == "token":
        user = emu.user_by_token(credential)
    elif scheme.lower() == "basic":
        try:
            name, _, password = base64.b64decode(credential, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            name = password = ""
        if password in ("", "x-oauth-basic"):
            user = emu.user_by_token(name)
        if user is None and password:
            user = emu.user_by_token(password)
    if user is None:
        raise ApiError(401, "invalid username, password or token")
    return user


def _wrap(emu: Emulator, route: Route) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        doer = authenticate(emu, request.headers.get("Authorization"))
        if doer is not None:
            request[_DOER_KEY] = doer
        elif route.auth:
            raise ApiError(401, "token is required")
        return await route.handler(emu, request)

    return handle


def _template_of(request: web.Request) -> str | None:
    resource = request.match_info.route.resource
    if resource is None or request.match_info.http_exception is not None:
        return None
    canonical = resource.canonical
    return canonical[len(API_PREFIX) :] if canonical.startswith(API_PREFIX) else canonical


def _response_json(response: web.StreamResponse) -> Any:
    if isinstance(response, web.Response) and response.body and response.content_type == "application/json":
        body = response.body
        if isinstance(body, bytes | bytearray):
            return json.loads(body)
    return None


@web.middleware
async def _middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    emu = request.app[EMULATOR_KEY]
    route = _template_of(request)
    raw = await request.read() if request.can_read_body else b""
    try:
        body: Any = json.loads(raw) if raw else None
    except ValueError:
        body = raw.decode("utf-8", "replace")
    doer: EmuUser | None = None
    try:
        doer = authenticate(emu, request.headers.get("Authorization"))
    except ApiError:
        pass
    record = RecordedRequest(
        method=request.method,
        route=route,
        path=request.path,
        query=list(request.query.items()),
        json=body,
        login=doer.login if doer else None,
    )
    emu.requests.append(record)
    delays, action = emu.faults.take(request.method, route)
    for rule in delays:
        if not rule.after_store:
            await asyncio.sleep(rule.delay_s)
    if action is not None and action.kind == "status":
        record.fault = f"status {action.status}"
        response: web.StreamResponse = error_response(emu, action.status, action.message)
    else:
        try:
            response = await handler(request)
        except ApiError as exc:
            response = web.Response(status=exc.status) if exc.bare else error_response(emu, exc.status, exc.message)
        except web.HTTPException as exc:
            message = NOT_FOUND_MESSAGE if exc.status == 404 else exc.reason
            response = error_response(emu, exc.status, message)
        emu._sender.kick()
        for rule in delays:
            if rule.after_store:
                await asyncio.sleep(rule.delay_s)
    record.status = response.status
    record.response_json = _response_json(response)
    if action is not None and action.kind == "alter_stored":
        record.fault = "alter_stored"
        written = record.response_json if isinstance(record.response_json, dict) else {}
        stored = emu.comment(int(written["id"])) if "id" in written else None
        if stored is not None:
            stored.body = stored.body + action.suffix
    # Go's net/http dates every answer by the server's clock (here: the emulator's, which tests may hold still).
    if not response.prepared:
        response.headers["Date"] = email.utils.formatdate(emu.now(), usegmt=True)
    record.response_headers = dict(response.headers)
    if action is not None and action.kind == "drop_after_store":
        record.fault = "drop_after_store"
        if request.transport is not None:
            request.transport.abort()
        # Nothing can be written any more; aiohttp treats this as a client that went away.
        raise asyncio.CancelledError
    return response


def build_app(emu: Emulator) -> web.Application:
    """The aiohttp application: every route of ``ROUTES`` under ``/api/v1``."""
    app = web.Application(middlewares=[_middleware], client_max_size=16 << 20)
    app[EMULATOR_KEY] = emu
    for route in ROUTES:
        app.router.add_route(route.method, route.aiohttp_path, _wrap(emu, route))
    from bot.emulator.githttp import add_git_routes

    add_git_routes(app, emu)
    return app


async def start_emulator(emulator: Emulator, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve ``emulator`` on ``host:port`` (0 picks a free port); returns the runner and the base URL.

    The emulator's ``app_url`` (ROOT_URL) is set to the real address, so Link headers and html URLs point
    at it, unless the emulator was made with an explicit ``root_url`` (then it stays, as Gitea's would).
    Stop with ``await runner.cleanup()`` and ``await emulator.aclose()``.
    """
    runner = web.AppRunner(emulator.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_port = runner.addresses[0][1]
    base_url = f"http://{host}:{bound_port}"
    emulator.listen_url = base_url
    if not emulator.root_url_fixed:
        emulator.app_url = base_url + "/"
    return runner, base_url
