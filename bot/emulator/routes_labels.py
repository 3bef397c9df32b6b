"""The emulator's label routes: an issue's labels and the repository's."""

from __future__ import annotations

import re
from typing import Any, Final

from aiohttp import web

from bot.emulator import convert
from bot.emulator.core import Emulator
from bot.emulator.http_helpers import (
    is_writer,
    json_response,
    list_options,
    no_content,
    read_json_body,
    request_doer,
    request_issue,
    request_repo,
    total_count_headers,
)
from bot.emulator.model import EmuIssue, EmuUser
from bot.emulator.state import ApiError

_COLOR_RE: Final = re.compile(r"^#?([0-9a-fA-F]{6}|[0-9a-fA-F]{3})$")


def _label_list(emu: Emulator, issue: EmuIssue) -> web.Response:
    return json_response([convert.label_json(emu, label) for label in convert.issue_labels(emu, issue)])


async def list_issue_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET .../issues/{index}/labels."""
    repo, _ = request_repo(emu, request)
    return _label_list(emu, request_issue(repo, request))


def _writable_issue(emu: Emulator, request: web.Request) -> tuple[EmuIssue, EmuUser]:
    """The issue of the URL and the caller, who must be able to write issues (403 otherwise)."""
    repo, perm = request_repo(emu, request)
    doer = request_doer(request)
    issue = request_issue(repo, request)
    if not is_writer(perm):
        raise ApiError(403, "must have write access to issues", bare=True)
    return issue, doer


async def _labels_option(emu: Emulator, request: web.Request) -> tuple[EmuIssue, EmuUser, list[Any]]:
    repo, perm = request_repo(emu, request)
    doer = request_doer(request)
    issue = request_issue(repo, request)
    # prepareForReplaceOrAdd: from 1.23 the write check comes first, as JSON "write permission is required";
    # in 1.22 it comes after the labels were resolved, as ctx.Status(403) with an empty body.
    if emu.at_least("1.23") and not is_writer(perm):
        raise ApiError(403, "write permission is required")
    form = await read_json_body(request)
    items = form.get("labels") or []
    if not isinstance(items, list):
        raise ApiError(422, "labels must be a list")
    labels = emu.resolve_issue_labels(repo, items)
    if not is_writer(perm):
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
    issue, doer = _writable_issue(emu, request)
    emu._op_clear_labels(issue, doer, notify=True)
    return no_content()


async def remove_issue_label(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """DELETE .../issues/{index}/labels/{id}: by id only; 422 for an unknown label; ``label_updated``."""
    issue, doer = _writable_issue(emu, request)
    label_id = int(request.match_info["id"])
    label = emu.label(label_id)
    if label is None:
        raise ApiError(422, f"label does not exist [label_id: {label_id}]")
    emu._op_remove_label(issue, doer, label, notify=True)
    return no_content()


async def list_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/labels: by name, page/limit, X-Total-Count and **no** Link header."""
    repo, _ = request_repo(emu, request)
    labels = sorted(repo.labels.values(), key=lambda label: (label.name, label.id))
    page, limit = list_options(request)
    chosen = labels[(page - 1) * limit : page * limit]
    return json_response(
        [convert.label_json(emu, label) for label in chosen], headers=total_count_headers(len(labels))
    )


async def create_label(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/labels: writers; name and a hex colour are required. 201."""
    repo, perm = request_repo(emu, request)
    if not is_writer(perm):
        raise ApiError(403, "must have write access to issues")
    form = await read_json_body(request)
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
