"""``/mcp`` in ``foreman serve``: the verb table over MCP Streamable HTTP, every request authenticated by its bearer.

An agent holds only the URL and its own token. The service resolves the token to a principal (an identity of
``[mcp.tokens]`` / ``[mcp.token_digests]``, or the run a ``frun_`` token names) before any MCP processing, and serves
that principal through the same server ``foreman mcp`` builds over stdio (``bot.mcp_server.build_server``: the same
verb table, door, published schemas, per-identity tool list and run broker). Each principal has its own session
manager, so a session id opened by one principal is unknown to every other (404, as the specification says for an
unknown session). Refusals before MCP (docs/mcp.md "Over HTTP"): 403 for a browser origin not allowed, 401 for a
missing or unknown token (429, after a second, once its client has failed too often: a right token is always served),
405 for a GET (the server sends nothing unprompted, so it offers no event stream), 503 past the open sessions' bounds,
429 past a principal's requests in flight, 413 for a body over ``[mcp] max_body_bytes``, 408 for one slower than
``[mcp] read_timeout_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from bot.config import Settings
from bot.core.errors import EnvelopeError
from bot.core.intake import Rejection
from bot.http_server import read_body
from bot.verbs.runs.start import is_run_token, token_digest
from state.db import Database
from state.grants import GrantStore

if TYPE_CHECKING:
    from mcp.server import Server

    from bot.metrics import Metrics
    from bot.verbs.runtime import VerbRuntime

log = logging.getLogger("foreman.mcp.http")

#: How often a request that waits for its client's disconnect (an open stream) looks at the connection.
DISCONNECT_POLL_S = 1.0
#: The window of ``[mcp] auth_failures_per_minute``.
THROTTLE_WINDOW_S = 60.0
#: Client addresses the throttle remembers at once (the least recently failed are forgotten first).
THROTTLE_ADDRESSES = 10_000
#: A principal's server with no open session for this long is stopped (a finished run's, an idle identity's).
IDLE_PRINCIPAL_S = 600.0
#: How long a failed authentication from a throttled client waits for its 429, and how many such waits at once.
THROTTLE_DELAY_S = 1.0
TARPIT_SLOTS = 256


class McpRepository(Protocol):
    """What ``/mcp`` needs of one served repository (``bot.repositories.RepositoryBundle``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def gitea(self) -> Any: ...
    @property
    def door(self) -> VerbRuntime[Any]: ...


class McpHost(Protocol):
    """What ``/mcp`` needs of the service that hosts it (``bot.app.Service``)."""

    @property
    def db(self) -> Database: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def bot_login(self) -> str | None: ...
    @property
    def repositories(self) -> Mapping[str, McpRepository]: ...
    @property
    def metrics(self) -> Metrics: ...
    def outbox_wakeup(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a bearer token stands for: an identity (``key`` ``identity:<login>``) or a run (``run:<id>``)."""

    key: str
    login: str | None = None
    run_token: str | None = field(default=None, repr=False)  # the run's own token: binds it, never shown


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused before MCP: its status, its ``foreman_mcp_auth_failures_total`` reason (or None when it is
    not an authentication failure), the JSON body and extra headers."""

    status: int
    reason: str | None
    body: dict[str, Any]
    headers: Mapping[str, str] | None = None

    def response(self) -> web.Response:
        return web.json_response(self.body, status=self.status, headers=dict(self.headers or {}))


def _refusal(status: int, reason: str | None, error: str, message: str, remediate: str, next_action: str,
             headers: Mapping[str, str] | None = None) -> Refusal:
    body = {"error": error, "message": message, "remediate": remediate, "exact_next_action": next_action}
    return Refusal(status, reason, body, headers)


class TokenTable:
    """Every bearer token an identity may present, held as SHA-256 digests (``McpConfig.digests``); a presented
    token is hashed once and compared with every stored digest in constant time."""

    def __init__(self, digests: list[tuple[str, str]]) -> None:
        self._digests = [(digest.encode(), login) for digest, login in digests]

    def login_for(self, token: bytes) -> str | None:
        presented = f"sha256:{hashlib.sha256(token).hexdigest()}".encode()
        found: str | None = None
        for digest, login in self._digests:  # no early exit: every digest is compared
            if hmac.compare_digest(digest, presented):
                found = login
        return found


class AuthThrottle:
    """Failed authentications per client (``throttle_key``) in a sliding minute; at the limit the client's further
    failures are slowed and refused 429 until the oldest failure leaves the window (``McpHttp._authenticate``; a
    right token is still served). Bounded: at most ``THROTTLE_ADDRESSES`` clients are remembered."""

    def __init__(self, per_minute: int, *, window_s: float = THROTTLE_WINDOW_S,
                 addresses: int = THROTTLE_ADDRESSES) -> None:
        self.per_minute = per_minute
        self.window_s = window_s
        self.addresses = addresses
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, address: str, now: float) -> float | None:
        """Seconds until ``address`` may try again, or None when it is not throttled."""
        times = self._failures.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        if len(times) < self.per_minute:
            return None
        return max(times[0] + self.window_s - now, 0.001)

    def failed(self, address: str, now: float) -> int:
        """Record one failure of ``address``; the number of failures in its window, this one included."""
        times = self._failures.pop(address, None)
        if times is None:
            times = deque(maxlen=self.per_minute)
        times.append(now)
        self._failures[address] = times
        while len(self._failures) > self.addresses:
            self._failures.popitem(last=False)
        return len(times)


@dataclass
class _Endpoint:
    """One principal's MCP server and the session manager that serves its sessions (started in its own task)."""

    manager: StreamableHTTPSessionManager
    ready: asyncio.Event
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    last_used: float = 0.0
    in_flight: int = 0  # requests holding it (a sweep leaves it alone)

    def sessions(self) -> int:
        # The SDK keeps its sessions in a private map; read it defensively (a missing attribute counts none).
        return len(getattr(self.manager, "_server_instances", {}))

    async def run(self) -> None:
        try:
            async with self.manager.run():
                self.ready.set()
                await self.stop.wait()
        finally:
            self.ready.set()  # a manager that failed to start never leaves a request waiting


class McpHttp:
    """The ``/mcp`` endpoint of one service: authentication, throttling and one endpoint per principal."""

    def __init__(self, host: McpHost, *, build: Callable[[Principal, McpHttp], Awaitable[Server[Any] | None]]
                 | None = None) -> None:
        self.host = host
        config = host.settings.mcp
        self.config = config
        self.tokens = TokenTable(config.digests())
        self.throttle = AuthThrottle(config.auth_failures_per_minute)
        self._build = build or _build_server
        self._endpoints: dict[str, _Endpoint] = {}
        self._creating = asyncio.Lock()
        self._last_sweep = 0.0
        self._sweeps: set[asyncio.Task[None]] = set()
        self._tarpit = asyncio.Semaphore(TARPIT_SLOTS)
        self._closed = False
        # Open sessions are counted when /metrics is read, not after every request: the count walks every
        # principal's endpoint (1,000 identities: 9% of serve's loop at 300 requests/s, bench/agents.py).
        host.metrics.mcp_sessions.set_function(self.sessions)

    # Principals and their servers.

    async def principal_for(self, token: str) -> Principal | None:
        """The principal a bearer token stands for, or None (unknown, or not UTF-8)."""
        try:
            raw = token.encode("utf-8")
        except UnicodeEncodeError:
            return None
        login = self.tokens.login_for(raw)
        if login is not None:
            return Principal(key=f"identity:{login}", login=login)  # the login exactly, as the roster knows it
        if is_run_token(token):
            record = await GrantStore(self.host.db).run_for_token(token_digest(token))
            if record is not None:
                return Principal(key=f"run:{record.run_id}", run_token=token)
        return None

    def runtimes(self) -> dict[str, VerbRuntime[Any]]:
        """The door of each served repository, as the service built it (its settings view, Gitea client and bot
        login, which the service keeps current)."""
        return {key: bundle.door for key, bundle in self.host.repositories.items()}

    async def _endpoint(self, principal: Principal) -> _Endpoint | Refusal:
        """The principal's endpoint, started if need be, counted in flight (the caller ends the count): a sweep never
        stops an endpoint a request holds."""
        endpoint = self._endpoints.get(principal.key)
        if endpoint is not None:
            endpoint.in_flight += 1
        else:
            async with self._creating:
                endpoint = self._endpoints.get(principal.key)
                if endpoint is None:
                    try:
                        server = await self._build(principal, self)
                    except EnvelopeError as refused:  # a run of a repository this service does not serve
                        return Refusal(403, None, refused.envelope.to_dict())
                    if server is None:  # the run ended between authentication and binding
                        return _unknown_token()
                    config = self.config
                    manager = StreamableHTTPSessionManager(
                        server, json_response=True, session_idle_timeout=config.session_idle_s,
                        max_request_body_size=config.max_body_bytes, max_sessions=config.max_sessions,
                        # Origin is checked before the manager (allowed_origins); the Host header is not (agents
                        # reach the service by any name the operator gives it).
                        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
                    )
                    endpoint = _Endpoint(manager, asyncio.Event(), asyncio.Event(), last_used=time.monotonic())
                    endpoint.task = asyncio.create_task(endpoint.run(), name=f"mcp-{principal.key}")
                    self._endpoints[principal.key] = endpoint
                endpoint.in_flight += 1
        await endpoint.ready.wait()
        if endpoint.task is not None and endpoint.task.done():
            endpoint.in_flight -= 1
            self._endpoints.pop(principal.key, None)
            log.error("mcp: the session manager of %s stopped; it is started again on the next request",
                      principal.key)
            return _refusal(503, None, "unavailable", "the MCP endpoint could not serve this request",
                            "Retry; an operator reads the service log if it keeps failing.",
                            "retry the request in a few seconds")
        return endpoint

    def sessions(self) -> int:
        """Open sessions over every principal."""
        return sum(endpoint.sessions() for endpoint in self._endpoints.values())

    def _sweep(self, now: float) -> None:
        """Stop the endpoints of principals with no open session and no request for ``IDLE_PRINCIPAL_S``: chosen and
        forgotten at once (no await in between, so no request takes one meanwhile), stopped in the background."""
        if now - self._last_sweep < 60.0:
            return
        self._last_sweep = now
        idle = [key for key, endpoint in self._endpoints.items()
                if endpoint.in_flight == 0 and endpoint.sessions() == 0 and now - endpoint.last_used > IDLE_PRINCIPAL_S]
        stopping = [self._endpoints.pop(key) for key in idle]
        for endpoint in stopping:
            endpoint.stop.set()
        if stopping:
            task = asyncio.create_task(_stopped(stopping), name="mcp-sweep")
            self._sweeps.add(task)
            task.add_done_callback(self._sweeps.discard)

    async def close(self) -> None:
        """Stop every endpoint (their sessions end); later requests are refused 503."""
        self._closed = True
        endpoints, self._endpoints = list(self._endpoints.values()), {}
        for endpoint in endpoints:
            endpoint.stop.set()
        await _stopped(endpoints)
        for sweep in list(self._sweeps):
            await sweep

    # The HTTP door.

    def _origin_refusal(self, request: web.Request) -> Refusal | None:
        origin = request.headers.get("Origin")
        if origin is None or origin in self.config.allowed_origins:
            return None
        return _refusal(403, "origin", "forbidden_origin",
                        f"requests from the browser origin {origin[:200]!a} are not allowed",
                        "Agents send no Origin header; a browser client's origin must be listed in [mcp] "
                        "allowed_origins.",
                        "call /mcp without an Origin header, or ask the operator to add the origin to [mcp] "
                        "allowed_origins")

    async def _authenticate(self, request: web.Request, key: str, now: float) -> Principal | Refusal:
        """The principal of the request's bearer token, or its refusal. A right token is always served: agents on
        one host share an address, and one of them failing must never lock the others out. A failure while ``key``
        is throttled is answered 429 only after ``THROTTLE_DELAY_S`` (at most ``TARPIT_SLOTS`` such waits at once,
        beyond them at once): 300 wrong guesses a second get a second's wait each."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        principal = await self.principal_for(token) if scheme.lower() == "bearer" and token else None
        if principal is not None:
            return principal
        wait = self.throttle.retry_after(key, now)
        if wait is not None:
            if self._tarpit.locked():
                await asyncio.sleep(0)
            else:
                async with self._tarpit:
                    await asyncio.sleep(THROTTLE_DELAY_S)
            return _refusal(429, "throttled", "too_many_failures",
                            "too many failed authentications from this client's address in the last minute",
                            "Use the token the operator gave you (a right token is always served).",
                            f"wait {wait:.0f} s, then call /mcp with your own token",
                            headers={"Retry-After": str(max(1, round(wait + 0.5)))})
        if scheme.lower() != "bearer" or not token:
            return _refusal(401, "missing", "unauthorized", "no bearer token: /mcp needs Authorization: Bearer "
                            "<token>", "Send the token the operator issued for your identity, or a run's token.",
                            "call /mcp again with the header Authorization: Bearer <your token>",
                            headers={"WWW-Authenticate": 'Bearer realm="foreman"'})
        return _unknown_token()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Every request to ``/mcp``: refused before MCP, or answered by the principal's session manager. A failure
        of the service itself (the database unreachable while a run token is looked up, a server that cannot be
        built) is logged and answered 503 in JSON, never a traceback to the client."""
        try:
            return await self._handle(request)
        except Exception:
            log.exception("mcp: a request failed")
            return _refusal(503, None, "unavailable", "foreman could not serve this request; see the service log",
                            "Retry in a moment; an operator reads the service log if it keeps failing.",
                            "retry the request in a few seconds").response()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        metrics = self.host.metrics
        now = time.monotonic()
        address = request.remote or "unknown"
        refused = self._origin_refusal(request)
        verdict = refused or await self._authenticate(request, throttle_key(address), now)
        if isinstance(verdict, Refusal):
            if verdict.reason is not None:
                metrics.mcp_auth_failures.labels(verdict.reason).inc()
            if verdict.reason in ("missing", "unknown"):
                count = self.throttle.failed(throttle_key(address), now)
                if count == 1 or count == self.throttle.per_minute:  # the first of a window, and the limit
                    log.warning("mcp: refused a request from %s: %s (%d failed in the last minute%s)", address,
                                verdict.body["error"], count,
                                "; the address is throttled" if count == self.throttle.per_minute else "")
            return verdict.response()
        principal = verdict
        metrics.mcp_requests.labels(request.method if request.method in ("POST", "DELETE", "GET") else "other").inc()
        if self._closed:
            return _refusal(503, None, "unavailable", "the service is stopping", "Reconnect once it is back.",
                            "retry the request once /readyz answers 200").response()
        if request.method == "GET":
            return _refusal(405, None, "method_not_allowed",
                            "this server sends nothing unprompted, so it offers no event stream (GET)",
                            "Send requests with POST; every answer comes in the POST's response.",
                            "POST your JSON-RPC messages to /mcp", headers={"Allow": "POST, DELETE"}).response()
        if "Mcp-Session-Id" not in request.headers and self.sessions() >= self.config.max_sessions_total:
            return _refusal(503, None, "too_many_sessions",
                            f"{self.config.max_sessions_total} MCP sessions are open ([mcp] max_sessions_total)",
                            "End sessions you no longer use (DELETE); idle ones close after [mcp] session_idle_s.",
                            "reuse your open session, or retry once others have ended").response()
        self._sweep(now)
        endpoint = await self._endpoint(principal)  # counted in flight from here (never swept while in flight)
        if isinstance(endpoint, Refusal):
            return endpoint.response()
        try:
            if endpoint.in_flight > self.config.max_requests_in_flight:
                return _refusal(429, None, "too_many_requests",
                                f"more than {self.config.max_requests_in_flight} requests of yours are in flight",
                                "Wait for your answers before sending more ([mcp] max_requests_in_flight).",
                                "retry once an earlier request is answered", headers={"Retry-After": "1"}).response()
            body = await _read_body(request, self.config.max_body_bytes, self.config.read_timeout_s)
            if isinstance(body, Refusal):
                return body.response()
            return await _serve_asgi(endpoint.manager.handle_request, request, await _answerable(body), principal)
        finally:
            endpoint.in_flight -= 1
            endpoint.last_used = time.monotonic()


def throttle_key(address: str) -> str:
    """What the throttle counts failures by: the client's address, every loopback address as one (a client on the
    host picks any of 127/8) and an IPv6 address by its /64 (a host holds the whole prefix)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)


async def _stopped(endpoints: list[_Endpoint]) -> None:
    """Wait for stopped endpoints' tasks; a manager that failed is logged, never raised into a request."""
    for endpoint in endpoints:
        if endpoint.task is not None:
            try:
                await endpoint.task
            except Exception:
                log.exception("mcp: a session manager failed while it stopped")


def _unknown_token() -> Refusal:
    return _refusal(401, "unknown", "unauthorized", "the bearer token is not one this service knows",
                    "Use the token the operator issued for your identity ([mcp.token_digests]), or the token "
                    "`foreman run start` printed for your run (a run's token ends with its run).",
                    "ask the operator for your token and call /mcp again with it",
                    headers={"WWW-Authenticate": 'Bearer realm="foreman", error="invalid_token"'})


async def _build_server(principal: Principal, http: McpHttp) -> Server[Any] | None:
    """The MCP server of a principal, as ``foreman mcp`` builds it over stdio (``bot.mcp_server``)."""
    from bot.mcp_server import RepositoryDoor, build_server, repositories_of, run_binding_of
    from bot.verbs.runtime import caller_for

    runtimes = http.runtimes()
    if not runtimes:
        return None
    if principal.run_token is not None:
        bound = await run_binding_of(runtimes, principal.run_token)
        if bound is None:
            return None
        runtime, binding = bound
        return binding.build_server(runtime)
    assert principal.login is not None
    login = principal.login
    keys = [key for key in repositories_of(http.host.settings, login) if key in runtimes] or list(runtimes)
    doors = {key: RepositoryDoor(runtimes[key], caller_for(runtimes[key].settings, login, "mcp")) for key in keys}
    first = doors[keys[0]]
    return build_server(first.runtime, first.caller, doors=doors)


async def _read_body(request: web.Request, limit: int, timeout_s: float) -> bytes | Refusal:
    """The request's body within ``[mcp]``'s bounds (``bot.http_server.read_body``), or its refusal with the next
    action."""
    body = await read_body(request, limit=limit, timeout_s=timeout_s, setting="[mcp] read_timeout_s")
    if not isinstance(body, Rejection):
        return body
    remediate, next_action = {
        413: ("Send smaller messages: one JSON-RPC message per request ([mcp] max_body_bytes).",
              "split the batch or shorten the arguments and send again"),
        408: ("Send the whole body at once.", "send the request again"),
    }.get(body.status, ("Send the whole body (Content-Length or a complete chunked body).", "send the request again"))
    return _refusal(body.status, None, body.error, body.message, remediate, next_action)


async def _answerable(body: bytes) -> bytes:
    """The body with a ``tools/call`` whose arguments the SDK's parser refuses made answerable (as over stdio:
    ``bot.mcp_server.readable``), so both transports answer it ``invalid_input``. The look at a suspicious body (a
    pass over up to ``max_body_bytes``) runs in a thread, never on the event loop."""
    from bot.mcp_server import needs_a_look, readable

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return body
    if not needs_a_look(text):
        return body
    repaired = await asyncio.to_thread(readable, text)
    return body if repaired is text else repaired.encode("utf-8")


def _asgi_scope(request: web.Request, principal: Principal) -> dict[str, Any]:
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) and len(peer) >= 2 else None
    user = AuthenticatedUser(AccessToken(token=principal.key, client_id=principal.key, scopes=[]))
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": f"{request.version.major}.{request.version.minor}",
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.raw_path.encode("latin-1", "replace"),
        "query_string": request.query_string.encode("latin-1", "replace"),
        "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": client,
        "server": None,
        "user": user,
        "state": {},
    }


async def _serve_asgi(app: Callable[..., Awaitable[None]], request: web.Request, body: bytes,
                      principal: Principal) -> web.StreamResponse:
    """Run one ASGI request of the SDK's session manager inside aiohttp: the body already read is its one
    ``http.request``; a whole answer is sent with its length, a streamed one as it comes."""
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        # aiohttp tells a handler of no disconnect, so it is looked for (only an answer still being streamed asks).
        while request.transport is not None and not request.transport.is_closing():  # noqa: ASYNC110
            await asyncio.sleep(DISCONNECT_POLL_S)
        return {"type": "http.disconnect"}

    status = 500
    headers: list[tuple[str, str]] = []
    chunks: list[bytes] = []
    stream: web.StreamResponse | None = None
    finished = False

    async def send(message: Mapping[str, Any]) -> None:
        nonlocal status, headers, stream, finished
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = [(bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
                       for name, value in message.get("headers", [])
                       if bytes(name).lower() not in (b"content-length", b"transfer-encoding", b"connection")]
            return
        if message["type"] != "http.response.body" or finished:
            return
        chunk = bytes(message.get("body", b""))
        more = bool(message.get("more_body", False))
        if stream is None and not more:
            chunks.append(chunk)
            finished = True
            return
        if stream is None:
            stream = web.StreamResponse(status=status)
            for name, value in headers:
                stream.headers.add(name, value)
            await stream.prepare(request)
            for pending in chunks:
                await stream.write(pending)
        await stream.write(chunk)
        if not more:
            finished = True
            await stream.write_eof()

    await app(_asgi_scope(request, principal), receive, send)
    if stream is not None:
        if not finished:
            await stream.write_eof()
        return stream
    if not finished and not chunks and status == 500:
        log.error("mcp: the session manager answered nothing for %s", principal.key)
        return _refusal(500, None, "internal_error", "the MCP request got no answer; see the service log",
                        "Retry; an operator reads the service log.", "retry the request").response()
    response = web.Response(status=status, body=b"".join(chunks))
    for name, value in headers:
        if name.lower() == "content-type":
            response.headers["Content-Type"] = value
        else:
            response.headers.add(name, value)
    return response
