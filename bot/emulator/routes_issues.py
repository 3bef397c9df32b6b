"""The emulator's issue routes: list, create, read, edit and delete."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bot.emulator import convert
from bot.emulator.core import Emulator
from bot.emulator.http_helpers import (
    DOER_KEY,
    can_be_assigned,
    internal_error,
    is_writer,
    json_response,
    link_header,
    list_options,
    no_content,
    parse_time,
    read_json_body,
    request_access,
    request_doer,
    request_issue,
    request_repo,
    total_count_headers,
)
from bot.emulator.model import PERM_LEVEL, EmuUser
from bot.emulator.state import ApiError


async def list_issues(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/issues: state/labels(AND)/type filters, newest first, paginated."""
    repo, _ = request_repo(emu, request)
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
        floor = parse_time(since, "since")
        issues = [i for i in issues if i.updated >= floor]
    if before := query.get("before", ""):
        ceiling = parse_time(before, "before")
        issues = [i for i in issues if i.updated <= ceiling]
    issues.sort(key=lambda i: (i.created, i.id), reverse=True)
    page, limit = list_options(request)
    total = len(issues)
    chosen = issues[(page - 1) * limit : page * limit]
    doer = request.get(DOER_KEY)
    return json_response(
        [convert.issue_json(emu, i, doer) for i in chosen],
        headers=total_count_headers(total, link_header(emu, request, total, limit)),
    )


async def create_issue(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/issues: labels/assignees only count for writers, as in Gitea."""
    repo, perm = request_repo(emu, request)
    doer = request_doer(request)
    form = await read_json_body(request)
    title = form.get("title")
    if not isinstance(title, str) or not title.strip():
        raise ApiError(422, "[Title]: Required")
    labels: list[Any] = []
    assignees: list[EmuUser] = []
    if is_writer(perm):
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
            if not can_be_assigned(emu, repo, user):
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
    repo, _ = request_repo(emu, request)
    return json_response(convert.issue_json(emu, request_issue(repo, request), request.get(DOER_KEY)))


async def edit_issue(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """PATCH /repos/{owner}/{repo}/issues/{index}: poster or writer; answers **201**."""
    repo, perm = request_repo(emu, request)
    doer = request_doer(request)
    issue = request_issue(repo, request)
    can_write = is_writer(perm)
    if issue.poster is not doer and not can_write:
        raise ApiError(403, "only the poster or a writer may edit this issue", bare=True)  # EditIssue: ctx.Status
    form = await read_json_body(request)
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
            if not can_be_assigned(emu, repo, user):
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
    repo, _ = request_repo(emu, request)
    doer = request_doer(request)
    if PERM_LEVEL[request_access(emu, repo, request)] < PERM_LEVEL["admin"]:
        raise ApiError(403, "must be a repository admin")
    emu._op_delete_issue(request_issue(repo, request), doer, notify=True)
    return no_content()
