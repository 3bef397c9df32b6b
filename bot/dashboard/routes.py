"""The dashboard's HTTP side: the token check and the read-only GET routes, HTML and JSON (docs/operating.md)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import re
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from bot.config import Settings
from bot.core.errors import Envelope
from bot.core.vocabulary import MAX_ISSUE_NUMBER
from bot.dashboard import model, render
from state.db import Database

if TYPE_CHECKING:
    from bot.verbs.runtime import VerbRuntime

#: The door of a served repository by its key, or None (the service's ``ServedRepositories.door_of``).
DoorOf = Callable[[str], "VerbRuntime[Any] | None"]
#: ``/readyz``'s document, read again (``Service.readiness``).
Health = Callable[[], Awaitable[dict[str, Any]]]
#: The webhook door's refused requests (``RefusedDeliveries.to_dict``).
Refused = Callable[[], dict[str, Any]]

log = logging.getLogger("foreman.dashboard")

COOKIE = "foreman_dashboard"
#: How often a page reloads itself unless ``?refresh=`` says otherwise.
REFRESH_S = 30
PREFIX = "/dashboard"
_DIGITS = re.compile(r"[0-9]{1,19}")
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def session_value(token: str) -> str:
    """What the cookie carries: derived from the token, useless anywhere else."""
    return hmac.new(token.encode(), b"foreman-dashboard-session-v1", hashlib.sha256).hexdigest()


def _refusal(status: int, envelope: Envelope) -> web.Response:
    return web.json_response(envelope.to_dict(), status=status, headers=_HEADERS)


def _unauthorized(message: str) -> web.Response:
    response = _refusal(401, Envelope(
        error="not_authorized",
        message=message,
        remediate="Send the dashboard token ([dashboard] token or token_file) as 'Authorization: Bearer <token>',"
        " or open /dashboard?token=<token> once in the browser (it sets a session cookie).",
        exact_next_action="open /dashboard?token=<the configured dashboard token>",
    ))
    response.headers["WWW-Authenticate"] = 'Bearer realm="foreman dashboard"'
    return response


def _same(given: str, expected: bytes) -> bool:
    """Whether what the client sent is ``expected``, in constant time, whatever it sent: aiohttp hands over
    header bytes that are not UTF-8 as lone surrogates (surrogateescape), which a plain ``encode()`` refuses with
    an exception (a 500 before authentication); encoded with ``surrogatepass`` they are bytes no UTF-8 text has,
    so they never match and the client gets the same 401 as for any wrong token."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected)


class Dashboard:
    """The routes over one database and configuration (the running service's)."""

    def __init__(self, db: Database, settings: Settings, token: str, doors: DoorOf | None = None, *,
                 health: Health | None = None, refused: Refused | None = None) -> None:
        self.db = db
        self.settings = settings
        self._token = token.encode()
        self._session = session_value(token)
        #: The served repositories' doors by repository key (the service's own: the queues are read through them,
        #: with their Gitea clients); None for a repository without a Gitea client.
        self._doors: DoorOf = doors or (lambda key: None)
        #: ``/readyz``'s document (``Service.readiness``) and the webhook door's refusals; None outside the service.
        self._health = health
        self._refused = refused

    def _door(self, view: Settings) -> VerbRuntime[Any] | None:
        """The door of the repository ``view`` shows, when it has a Gitea client (None without one)."""
        door = self._doors(view.repo_key)
        return door if door is not None and door.gitea is not None else None

    # --- access -------------------------------------------------------------------------------------------------------
    def _token_ok(self, given: str) -> bool:
        return _same(given, self._token)

    def _check(self, request: web.Request) -> web.StreamResponse | None:
        """None: let in. Otherwise the answer (a redirect that sets the cookie, or 401)."""
        query_token = request.query.get("token")
        if query_token is not None:
            if not self._token_ok(query_token):
                log.warning("dashboard: a wrong ?token= from %s", request.remote)
                return _unauthorized("the token in ?token= is not the dashboard token")
            query = {k: v for k, v in request.query.items() if k != "token"}
            target = request.rel_url.with_query(query) if query else request.rel_url.with_query(None)
            response = web.Response(status=303, headers={**_HEADERS, "Location": str(target)})
            response.set_cookie(COOKIE, self._session, httponly=True, samesite="Strict", path=PREFIX,
                                secure=request.secure, max_age=7 * 24 * 3600)
            return response
        header = request.headers.get("Authorization", "")
        if header:
            scheme, _, value = header.partition(" ")
            if scheme.lower() == "bearer" and self._token_ok(value.strip()):
                return None
            return _unauthorized("the Authorization header does not carry the dashboard token")
        cookie = request.cookies.get(COOKIE)
        if cookie is not None and _same(cookie, self._session.encode()):
            return None
        return _unauthorized("the dashboard needs its token")

    def _guarded(self, handler: Handler) -> Handler:
        async def guarded(request: web.Request) -> web.StreamResponse:
            refused = self._check(request)
            if refused is not None:
                return refused
            return await handler(request)

        return guarded

    # --- answers ------------------------------------------------------------------------------------------------------
    @staticmethod
    def _html(text: str, nonce: str | None = None) -> web.Response:
        headers = dict(_HEADERS)
        if nonce is not None:  # the page's one script (its refresh) runs; nothing else does
            headers["Content-Security-Policy"] += f"; script-src 'nonce-{nonce}'"
        return web.Response(text=text, content_type="text/html", charset="utf-8", headers=headers)

    @staticmethod
    def _refresh_s(request: web.Request) -> int:
        """How often the page reloads itself: ``?refresh=N`` seconds (2 to 3600, 0 never), else every 30 s."""
        text = request.query.get("refresh", "")
        if not _DIGITS.fullmatch(text):
            return REFRESH_S
        return min(int(text), 3600) if int(text) == 0 or int(text) >= 2 else 2

    @staticmethod
    def _json(doc: Any) -> web.Response:
        return web.json_response(doc, headers=_HEADERS, dumps=_dumps)

    @staticmethod
    def _issue_number(request: web.Request) -> int | web.Response:
        text = request.match_info["number"]
        number = int(text) if _DIGITS.fullmatch(text) else 0
        if not 0 < number <= MAX_ISSUE_NUMBER:
            return _refusal(400, Envelope(
                error="invalid_input",
                message=f"{text[:40]!r} is not an issue number (1 to {MAX_ISSUE_NUMBER})",
                remediate="Use the issue's number as Gitea shows it.",
                exact_next_action="open /dashboard/issues/<number>",
            ))
        return number

    def _view(self, request: web.Request) -> Settings | web.Response:
        """The settings of the repository a page shows: ``?repository=owner/name``, else the first served one; a
        repository not served is a 400 envelope listing them."""
        keys = self.settings.repository_keys()
        given = request.query.get("repository")
        if given is None:
            return self.settings.for_repository(keys[0])
        key = self.settings.find_repository(given)
        if key is None:
            return _refusal(400, Envelope(
                error="invalid_input",
                message=f"repository {given[:150]!r} is not served here ({', '.join(keys)})",
                remediate="Pick one of the served repositories.",
                exact_next_action=f"open {PREFIX}?repository={keys[0]}",
                details={"repositories": keys},
            ))
        return self.settings.for_repository(key)

    def _served(self, view: Settings) -> list[dict[str, Any]]:
        """Every served repository, the one shown marked; each with the link that shows it."""
        several = len(self.settings.repository_keys()) > 1
        return [{"owner": entry.owner, "name": entry.name, "key": key, "gitea_url": self.settings.gitea.url,
                 "selected": key == view.repo_key,
                 "link": f"{PREFIX}?{urllib.parse.urlencode({'repository': key})}" if several else None}
                for key, entry in zip(self.settings.repository_keys(), self.settings.served_repositories(),
                                      strict=True)]

    async def _overview(self, request: web.Request) -> dict[str, Any] | web.Response:
        view = self._view(request)
        if isinstance(view, web.Response):
            return view
        readiness = await self._health() if self._health is not None else None
        refused = self._refused() if self._refused is not None else None
        gitea = ((readiness or {}).get("checks") or {}).get("gitea") or {}
        if gitea.get("reachable") is False:  # the probe failed: not read again, so the page answers at once
            queues = {"repository": view.repo_key, "error": "unavailable",
                      "message": f"not read: Gitea is unreachable ({gitea.get('detail')})"}
        else:
            queues = await self._queues_of(view)
        return {**await model.overview(self.db, view, queues=queues, readiness=readiness, refused=refused),
                "repositories": self._served(view)}

    async def _queues_of(self, view: Settings) -> dict[str, Any]:
        """One repository's review and merge queues (``model.queues``), or why they cannot be read now: no Gitea
        token, Gitea failing or slower than ``gitea.timeout_s`` for the whole read."""
        from bot.gitea import GiteaError

        door = self._door(view)
        bound = view.gitea.timeout_s
        unavailable = {"repository": view.repo_key, "error": "unavailable"}
        if door is None:
            return {**unavailable, "message": "the queues are read from Gitea: configure gitea.token"}
        try:
            return await asyncio.wait_for(model.queues(door), timeout=bound)
        except TimeoutError:
            return {**unavailable, "message": f"Gitea did not answer the queues' reads within {bound:g} s"}
        except GiteaError as exc:
            return {**unavailable, "message": f"Gitea could not be read: {exc}"}

    async def api_queue(self, request: web.Request) -> web.Response:
        """Every served repository's queues (``?repository=owner/name``: that one's)."""
        views = [self.settings.for_repository(key) for key in self.settings.repository_keys()]
        if request.query.get("repository") is not None:
            view = self._view(request)
            if isinstance(view, web.Response):
                return view
            views = [view]
        return self._json({"repositories": [await self._queues_of(view) for view in views]})

    async def _issue_doc(self, request: web.Request) -> dict[str, Any] | web.Response:
        number = self._issue_number(request)
        view = self._view(request)
        if isinstance(number, web.Response):
            return number
        if isinstance(view, web.Response):
            return view
        return {**await model.issue_view(self.db, view, number), "repositories": self._served(view)}

    async def overview(self, request: web.Request) -> web.Response:
        doc = await self._overview(request)
        if isinstance(doc, web.Response):
            return doc
        nonce = secrets.token_urlsafe(18)
        return self._html(render.overview_page(doc, nonce=nonce, refresh_s=self._refresh_s(request)), nonce)

    async def issue(self, request: web.Request) -> web.Response:
        doc = await self._issue_doc(request)
        if isinstance(doc, web.Response):
            return doc
        nonce = secrets.token_urlsafe(18)
        return self._html(render.issue_page(doc, nonce=nonce, refresh_s=self._refresh_s(request)), nonce)

    async def api_overview(self, request: web.Request) -> web.Response:
        doc = await self._overview(request)
        return doc if isinstance(doc, web.Response) else self._json(doc)

    async def api_issue(self, request: web.Request) -> web.Response:
        doc = await self._issue_doc(request)
        return doc if isinstance(doc, web.Response) else self._json(doc)

    async def api_section(self, request: web.Request) -> web.Response:
        name = request.match_info["section"]
        view = self._view(request)
        if isinstance(view, web.Response):
            return view
        readers: dict[str, Callable[[], Awaitable[Any]]] = {
            "leases": lambda: model.leases(self.db, view),
            "journal": lambda: model.journal(self.db, view),
            "outbox": lambda: model.outbox(self.db),
            "deliveries": lambda: model.deliveries(self.db, view),
            "grants": lambda: model.grants(self.db, repo=view.repo_key),
            "allocator": lambda: self._allocator(view),
        }
        reader = readers.get(name)
        if reader is None:
            return _refusal(404, Envelope(
                error="not_found", message=f"no dashboard section {name[:40]!r}",
                remediate=f"Sections: overview, issues/<n>, queue, {', '.join(sorted(readers))}.",
                exact_next_action="open /dashboard/api/overview",
            ))
        return self._json(await reader())

    async def _allocator(self, view: Settings) -> dict[str, Any]:
        return {"ready_candidates": await model.ready_candidates(self.db, view),
                "now": await model.current_decisions(self.db, view),
                "recorded": await model.recorded_decisions(self.db, view)}

    def add_routes(self, app: web.Application) -> None:
        g = self._guarded
        app.router.add_get(PREFIX, g(self.overview))
        app.router.add_get(PREFIX + "/", g(self.overview))
        app.router.add_get(PREFIX + "/issues/{number}", g(self.issue))
        app.router.add_get(PREFIX + "/api/overview", g(self.api_overview))
        app.router.add_get(PREFIX + "/api/issues/{number}", g(self.api_issue))
        app.router.add_get(PREFIX + "/api/queue", g(self.api_queue))
        app.router.add_get(PREFIX + "/api/{section}", g(self.api_section))


def _dumps(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, default=str, ensure_ascii=False)


def add_dashboard(app: web.Application, db: Database, settings: Settings, doors: DoorOf | None = None, *,
                  health: Health | None = None, refused: Refused | None = None) -> Dashboard | None:
    """Add the dashboard's routes when ``[dashboard] token`` is set; without one it stays off (None). ``doors``: the
    served repositories' doors (the queues are read through them); ``health``: ``/readyz``'s document;
    ``refused``: the webhook door's refusals."""
    token = settings.dashboard.token
    if token is None:
        return None
    dashboard = Dashboard(db, settings, token.get_secret_value().strip(), doors, health=health, refused=refused)
    dashboard.add_routes(app)
    return dashboard
