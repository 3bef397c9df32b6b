"""The emulator's comment routes: an issue's, the repository's, and one comment by id."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bot.emulator import convert
from bot.emulator.core import Emulator
from bot.emulator.http_helpers import (
    NOT_FOUND_MESSAGE,
    is_writer,
    issue_or_500,
    json_response,
    link_header,
    list_options,
    no_content,
    parse_time,
    read_json_body,
    request_doer,
    request_repo,
    total_count_headers,
)
from bot.emulator.model import EmuRepo, EmuUser
from bot.emulator.state import ApiError


def _in_window(comments: list[Any], request: web.Request) -> list[Any]:
    """The comments ``since``/``before`` select (``updated`` compared inclusively), ordered ``created, id``."""
    if since := request.query.get("since", ""):
        floor = parse_time(since, "since")
        comments = [c for c in comments if c.updated >= floor]
    if before := request.query.get("before", ""):
        ceiling = parse_time(before, "before")
        comments = [c for c in comments if c.updated <= ceiling]
    return sorted(comments, key=lambda c: (c.created, c.id))


async def list_comments(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET .../issues/{index}/comments: every plain comment, oldest first, no pagination."""
    repo, _ = request_repo(emu, request)
    comments = _in_window(issue_or_500(repo, request).comments, request)
    return json_response([convert.comment_json(emu, c) for c in comments], headers=total_count_headers(len(comments)))


async def list_repo_comments(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/issues/comments, as Gitea 1.22-1.26 routers/api/v1/repo/issue_comment.go
    ``ListRepoIssueComments``: plain comments only (``Type: CommentTypeComment``) of the repository's issues and
    pull requests; ``since``/``before`` compare ``comment.updated_unix`` inclusively (models/issues/comment.go
    ``FindCommentsOptions.ToConds``: ``Gte``/``Lte``, whole seconds from services/context/utils.go
    ``parseFormTime``, 422 for a time that is not RFC 3339); ordered ``created_unix, id`` ascending
    (``FindComments``); paginated by ``utils.GetListOptions`` with ``X-Total-Count`` and ``Link``."""
    repo, _ = request_repo(emu, request)
    comments = _in_window([c for issue in repo.issues.values() for c in issue.comments], request)
    page, limit = list_options(request)
    total = len(comments)
    chosen = comments[(page - 1) * limit : page * limit]
    return json_response(
        [convert.comment_json(emu, c) for c in chosen],
        headers=total_count_headers(total, link_header(emu, request, total, limit)),
    )


async def create_comment(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST .../issues/{index}/comments: readers may comment; a locked issue needs a writer. 201."""
    repo, perm = request_repo(emu, request)
    doer = request_doer(request)
    issue = issue_or_500(repo, request)
    form = await read_json_body(request)
    body = form.get("body")
    if not isinstance(body, str) or not body:
        raise ApiError(422, "[Body]: Required")
    if issue.is_locked and not is_writer(perm) and not doer.admin:
        raise ApiError(403, "IssueLocked")
    comment = emu._op_create_comment(issue, doer, body, notify=True)
    return json_response(convert.comment_json(emu, comment), status=201)


def _comment(emu: Emulator, repo: EmuRepo, request: web.Request) -> Any:
    comment = emu.comment(int(request.match_info["id"]))
    if comment is None or comment.issue.repo is not repo:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return comment


def _changeable_comment(emu: Emulator, request: web.Request, verb: str) -> tuple[Any, EmuUser]:
    """The comment of the URL and the caller, who must be its poster or a writer (403 otherwise)."""
    repo, perm = request_repo(emu, request)
    doer = request_doer(request)
    comment = _comment(emu, repo, request)
    if comment.poster is not doer and not is_writer(perm):
        raise ApiError(403, f"only the poster or a writer may {verb} this comment", bare=True)
    return comment, doer


async def get_comment(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET .../issues/comments/{id}: 204 for a timeline item that is not a plain comment."""
    repo, _ = request_repo(emu, request)
    comment = _comment(emu, repo, request)
    if comment.kind != "comment":
        return no_content()
    return json_response(convert.comment_json(emu, comment))


async def edit_comment(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """PATCH .../issues/comments/{id}: poster or writer (editIssueComment); webhook only when the body changes."""
    comment, doer = _changeable_comment(emu, request, "edit")
    if comment.kind != "comment":
        return no_content()
    form = await read_json_body(request)
    body = form.get("body")
    if not isinstance(body, str) or not body:
        raise ApiError(422, "[Body]: Required")
    emu._op_edit_comment(comment, doer, body, notify=True)
    return json_response(convert.comment_json(emu, comment))


async def delete_comment(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """DELETE .../issues/comments/{id}: poster or writer; 204."""
    comment, doer = _changeable_comment(emu, request, "delete")
    if comment.kind != "comment":
        # deleteIssueComment: ctx.Status(400) when !comment.Type.HasContentSupport() (audit #17).
        raise ApiError(400, "this timeline item has no content", bare=True)
    emu._op_delete_comment(comment, doer, notify=True)
    return no_content()
