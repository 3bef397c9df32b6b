"""Responses, Gitea's error bodies and request parsing shared by the emulator's route handlers."""

from __future__ import annotations

import json
import urllib.parse
from datetime import datetime
from typing import Any, Final

from aiohttp import web

from bot.emulator.core import Emulator
from bot.emulator.model import PERM_LEVEL, UNITS, EmuIssue, EmuRepo, EmuUser, Perm
from bot.emulator.state import ApiError

API_PREFIX: Final = "/api/v1"
DEFAULT_PAGING_NUM: Final = 30
MAX_RESPONSE_ITEMS: Final = 50
NOT_FOUND_MESSAGE: Final = "The target couldn't be found."
DOER_KEY: Final = web.RequestKey("emulator.doer", EmuUser)


# --- responses --------------------------------------------------------------------------------------------------------


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


def no_content() -> web.Response:
    return web.Response(status=204)


# --- request helpers --------------------------------------------------------------------------------------------------


def request_doer(request: web.Request) -> EmuUser:
    user: EmuUser | None = request.get(DOER_KEY)
    if user is None:
        raise ApiError(401, "token is required")
    return user


def request_repo(emu: Emulator, request: web.Request) -> tuple[EmuRepo, Perm]:
    """The repository and the caller's mode on its **Issues** unit (what ``CanWriteIssuesOrPulls`` reads:
    a team's per-unit Write counts here, though the permission API reports the team's access mode)."""
    repo = emu.find_repo(request.match_info["owner"], request.match_info["repo"])
    if repo is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    doer = request.get(DOER_KEY)
    if emu.perm_of(repo, doer) == "none":
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return repo, emu.unit_perm(repo, doer, "repo.issues")


def request_access(emu: Emulator, repo: EmuRepo, request: web.Request) -> Perm:
    """The caller's repository access mode (repo admin checks, ``permissions`` in the repository JSON)."""
    return emu.perm_of(repo, request.get(DOER_KEY))


def internal_error(request: web.Request, err: str) -> ApiError:
    """``ctx.APIErrorInternal`` (services/context/api.go): 500, with the error text only for a site admin
    (``setting.IsProd``: everyone else gets an empty message)."""
    doer: EmuUser | None = request.get(DOER_KEY)
    return ApiError(500, err if doer is not None and doer.admin else "")


def issue_or_500(repo: EmuRepo, request: web.Request) -> EmuIssue:
    """``GetIssueByIndex`` where the handler sends every error to ``APIErrorInternal``: a missing issue is a 500
    (routers/api/v1/repo/issue_comment.go ListIssueComments, CreateIssueComment; 1.22.3 to 1.26.3)."""
    index = int(request.match_info["index"])
    issue = repo.issues.get(index)
    if issue is None:
        raise internal_error(request, f"issue does not exist [id: 0, repo_id: {repo.id}, index: {index}]")
    return issue


def can_be_assigned(emu: Emulator, repo: EmuRepo, user: EmuUser) -> bool:
    """models/perm/access/repo_permission.go ``CanBeAssigned``: Write on any unit, or Read on pull requests."""
    if user.is_org:
        return False
    if PERM_LEVEL[emu.unit_perm(repo, user, "repo.pulls")] >= PERM_LEVEL["read"]:
        return True
    return any(PERM_LEVEL[emu.unit_perm(repo, user, unit)] >= PERM_LEVEL["write"] for unit in UNITS)


def is_writer(perm: Perm) -> bool:
    return PERM_LEVEL[perm] >= PERM_LEVEL["write"]


def request_issue(repo: EmuRepo, request: web.Request) -> EmuIssue:
    issue = repo.issues.get(int(request.match_info["index"]))
    if issue is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return issue


async def read_json_body(request: web.Request) -> dict[str, Any]:
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


def list_options(request: web.Request) -> tuple[int, int]:
    """``utils.GetListOptions``: page from 1, limit defaulting to 30 and capped at 50."""
    page = max(1, _form_int(request.query.get("page")))
    limit = _form_int(request.query.get("limit"))
    if limit <= 0:
        limit = DEFAULT_PAGING_NUM
    limit = min(limit, MAX_RESPONSE_ITEMS)
    return page, limit


def parse_time(value: str, name: str) -> int:
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


def total_count_headers(total: int, link: str | None = None) -> dict[str, str]:
    headers = {"X-Total-Count": str(total), "Access-Control-Expose-Headers": "X-Total-Count, Link"}
    if link:
        headers["Link"] = link
    return headers
