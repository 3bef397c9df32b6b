"""The emulator's HTTP API: one route table of (method, swagger path, handler), served by aiohttp."""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from bot.emulator.core import Emulator
from bot.emulator.http_helpers import (
    API_PREFIX,
    DOER_KEY,
    NOT_FOUND_MESSAGE,
    error_response,
)
from bot.emulator.model import EmuUser
from bot.emulator.routes_comments import (
    create_comment,
    delete_comment,
    edit_comment,
    get_comment,
    list_comments,
    list_repo_comments,
)
from bot.emulator.routes_issues import create_issue, delete_issue, edit_issue, get_issue, list_issues
from bot.emulator.routes_labels import (
    add_issue_labels,
    clear_issue_labels,
    create_label,
    list_issue_labels,
    list_labels,
    remove_issue_label,
    replace_issue_labels,
)
from bot.emulator.routes_protection import (
    create_protection,
    delete_protection,
    edit_protection,
    get_protection,
    list_protections,
)
from bot.emulator.routes_pulls import (
    create_pull,
    create_review,
    delete_branch,
    dismiss_review,
    download_pull_diff,
    get_pull,
    is_merged,
    list_pull_files,
    list_pulls,
    list_review_comments,
    list_reviews,
    merge_pull,
    submit_review,
    undismiss_review,
    update_pull,
)
from bot.emulator.routes_repo import (
    create_hook,
    get_branch,
    get_own_user,
    get_permission,
    get_repo,
    get_team_member,
    get_version,
    list_org_labels,
    list_org_repos,
    list_repo_teams,
)
from bot.emulator.routes_statuses import combined_status, create_status, list_statuses, list_statuses_by_ref
from bot.emulator.state import ApiError

EMULATOR_KEY: Final = web.AppKey("emulator", Emulator)
_PARAM_PATTERNS: Final = {"diffType": "diff|patch", "index": "[0-9]+", "id": "[0-9]+", "branch": ".+", "name": ".+",
                           "ref": ".+"}

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


# --- the table --------------------------------------------------------------------------------------------------------

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
    Route("GET", "/orgs/{org}/repos", list_org_repos),
    Route("POST", f"{_REPO}/labels", create_label),
    Route("DELETE", f"{_REPO}/branches/{{branch}}", delete_branch),
    Route("GET", f"{_REPO}/pulls", list_pulls),
    Route("POST", f"{_REPO}/pulls", create_pull),
    Route("GET", f"{_REPO}/pulls/{{index}}", get_pull),
    Route("GET", f"{_REPO}/pulls/{{index}}/merge", is_merged),
    Route("POST", f"{_REPO}/pulls/{{index}}/merge", merge_pull),
    Route("GET", f"{_REPO}/pulls/{{index}}/reviews", list_reviews),
    Route("POST", f"{_REPO}/pulls/{{index}}/reviews", create_review),
    # the merge's checks (issue 32): the protection rules, a head's combined status, the author's update
    Route("GET", f"{_REPO}/branch_protections", list_protections),
    Route("GET", f"{_REPO}/commits/{{ref}}/status", combined_status),
    Route("POST", f"{_REPO}/pulls/{{index}}/update", update_pull),
    Route("GET", f"{_REPO}/pulls/{{index}}/files", list_pull_files),
    Route("GET", f"{_REPO}/pulls/{{index}}.{{diffType}}", download_pull_diff),
    Route("GET", f"{_REPO}/pulls/{{index}}/reviews/{{id}}/comments", list_review_comments),
)


#: Routes the emulator serves that the bot's client does not use (yet): branch protection, commit statuses, review
#: submission and dismissal, update-by-merge. Kept apart from ``ROUTES`` (the client's contract, which
#: tests/test_contract.py drives in full); a route moves into ``ROUTES`` when the client starts calling it.
EMULATOR_ONLY_ROUTES: Final[tuple[Route, ...]] = (
    Route("POST", f"{_REPO}/pulls/{{index}}/reviews/{{id}}", submit_review),
    Route("POST", f"{_REPO}/pulls/{{index}}/reviews/{{id}}/dismissals", dismiss_review),
    Route("POST", f"{_REPO}/pulls/{{index}}/reviews/{{id}}/undismissals", undismiss_review),
    Route("POST", f"{_REPO}/branch_protections", create_protection),
    Route("GET", f"{_REPO}/branch_protections/{{name}}", get_protection),
    Route("PATCH", f"{_REPO}/branch_protections/{{name}}", edit_protection),
    Route("DELETE", f"{_REPO}/branch_protections/{{name}}", delete_protection),
    Route("POST", f"{_REPO}/statuses/{{sha}}", create_status),
    Route("GET", f"{_REPO}/statuses/{{sha}}", list_statuses),
    Route("GET", f"{_REPO}/commits/{{ref}}/statuses", list_statuses_by_ref),
)


# --- auth, middleware, app --------------------------------------------------------------------------------------------


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
            request[DOER_KEY] = doer
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
    """The answer's JSON, or the text of a ``text/plain`` answer (a diff: swagger's ``string`` response)."""
    if isinstance(response, web.Response) and response.body:
        body = response.body
        if isinstance(body, bytes | bytearray):
            if response.content_type == "application/json":
                return json.loads(body)
            if response.content_type == "text/plain":
                return body.decode("utf-8", "replace")
    return None


@web.middleware
async def _middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    emu = request.app[EMULATOR_KEY]
    route = _template_of(request)
    try:
        raw = await request.read() if request.can_read_body else b""
    except RequestPayloadError:  # a Content-Encoding the body does not decode with (aiohttp decodes it)
        return web.Response(status=400, text="the request body does not decode as its Content-Encoding says\n")
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
    """The aiohttp application: every route of ``ROUTES`` and ``EMULATOR_ONLY_ROUTES`` under ``/api/v1``."""
    app = web.Application(middlewares=[_middleware], client_max_size=16 << 20)
    app[EMULATOR_KEY] = emu
    for route in (*ROUTES, *EMULATOR_ONLY_ROUTES):
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
