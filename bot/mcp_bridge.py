"""`foreman mcp --url URL`: an MCP stdio server that forwards every message to foreman's Streamable HTTP `/mcp`.

For MCP hosts that only start stdio servers. Standard library only: it reads no config file, opens no database and
imports nothing of the service (``python -m bot mcp --url ...`` loads this module, ``bot/__main__.py`` and the
standard-library-only ``bot.core.json_depth``, nothing else of the package). The agent holds only the endpoint's
URL and its own token (``FOREMAN_MCP_TOKEN``).

The wire, as the MCP specification (2025-06-18) defines its two transports:

- stdin: newline-delimited JSON-RPC messages from the host. Each one is POSTed to the URL with
  ``Authorization: Bearer <token>``, ``Content-Type: application/json`` and ``Accept: application/json,
  text/event-stream``. The ``initialize`` request is sent alone (nothing else is read until it is answered); its
  answer's ``Mcp-Session-Id`` header and ``protocolVersion`` go on every later request (``Mcp-Session-Id``,
  ``MCP-Protocol-Version``). Notifications and responses are sent in stdin's order; requests run concurrently
  (at most :data:`MAX_IN_FLIGHT` at once; stdin is not read while that many are unanswered).
- stdout: every JSON-RPC message the server answers, one per line: an ``application/json`` body (one message or a
  batch) or each ``data:`` event of a ``text/event-stream`` body. Whole lines, under a lock.
- A request the server refuses (any status but 2xx: 401, 403, 404, 413, 429 ...) or cannot be reached for is
  answered on stdout with a JSON-RPC error (:data:`REFUSED_CODE`, ``"<error>: <message>"``, ``data`` the server's
  JSON body, or ``{"status", "body"}``), so the host shows the reason instead of waiting. A session the server no
  longer knows (404 to a request that carried the session id, e.g. after its idle timeout) is opened again with the
  host's own ``initialize`` and the request is sent once more.
- stdin's end (or SIGTERM): the requests in flight are answered, the session is ended with ``DELETE``, exit 0.

Diagnostics are single lines on stderr; the token is never printed. A missing token or an unusable URL is refused at
start: one JSON line on stderr, the host's first request answered with the same refusal, exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import IO, Any
from urllib.parse import urlsplit

from bot.core.json_depth import collapsed

TOKEN_ENV = "FOREMAN_MCP_TOKEN"  # noqa: S105 (the name of the variable, not a token)
URL_ENV = "FOREMAN_MCP_URL"

#: JSON-RPC error code of a refusal: a start that cannot serve, or a request the server refused or never answered
#: (the implementation-defined server error range, as ``foreman mcp`` in-process uses it).
REFUSED_CODE = -32001
PARSE_ERROR = -32700
INVALID_REQUEST = -32600

#: The longest stdin line (one JSON-RPC message) forwarded; a longer one is refused with INVALID_REQUEST.
MAX_LINE_BYTES = 4 << 20
#: The largest answer read from the server: a JSON body, or one SSE event.
MAX_ANSWER_BYTES = 32 << 20
#: How much of a refusal's body is read (and at most 500 characters of it shown when it is not JSON).
MAX_REFUSAL_BYTES = 64 << 10
#: Requests sent and not yet answered, at most; stdin waits while that many are.
MAX_IN_FLIGHT = 32
#: How many times an SSE stream that ended before its answer is resumed (GET with ``Last-Event-ID``).
MAX_RESUMES = 3

CONNECT_TIMEOUT_S = 10.0
#: The longest silence on an answer being read (a verb may take a while; the server never sends nothing for this long).
READ_TIMEOUT_S = 600.0
#: How long the ``DELETE`` that ends the session may take.
DELETE_TIMEOUT_S = 5.0
#: How long a refused start waits for the host's first request, to answer it with the refusal.
REFUSAL_WAIT_S = 10.0

EXIT_OK = 0
EXIT_USAGE = 2

_ACCEPT_POST = "application/json, text/event-stream"
_ACCEPT_GET = "text/event-stream"
_NAME = "foreman mcp"


# --- the command line -------------------------------------------------------------------------------------------------

#: The options of `foreman` before its command that take a value (a command line is read past them).
_GLOBAL_VALUED = frozenset({"--config", "--repository"})


def mcp_arguments(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``mcp`` when ``mcp`` is the command of the ``foreman`` command line ``argv``, else None."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg in _GLOBAL_VALUED:
            index += 2
        elif arg.startswith("-"):
            index += 1
        else:
            return list(argv[index + 1:]) if arg == "mcp" else None
    return None


def wants_bridge(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the ``foreman`` command line ``argv`` asks for the bridge: ``mcp`` with ``--url`` (or
    ``FOREMAN_MCP_URL`` set), and not ``--help`` (which the full command line answers)."""
    rest = mcp_arguments(argv)
    if rest is None or "-h" in rest or "--help" in rest:
        return False
    return any(arg == "--url" or arg.startswith("--url=") for arg in rest) or bool(environ.get(URL_ENV))


class _UsageError(Exception):
    """A bridge command line that cannot be read."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing its usage and exiting (a refusal is one JSON line)."""

    def error(self, message: str) -> Any:  # argparse's signature is NoReturn; raising keeps it so
        raise _UsageError(message)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = _Parser(prog="foreman mcp", add_help=False)
    parser.add_argument("--url", action="append", default=[])
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--repository", action="append", default=[])
    rest = mcp_arguments(argv)
    args = parser.parse_args([] if rest is None else rest)
    if len(args.url) > 1:
        raise _UsageError("--url given more than once; give it once")
    return args


# --- refusals ---------------------------------------------------------------------------------------------------------


def _refusal(error: str, key: str, message: str, remediate: str, next_action: str) -> dict[str, Any]:
    return {"error": error, "key": key, "message": message, "remediate": remediate, "exact_next_action": next_action}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The server's ``/mcp`` URL, split for http.client; ``shown`` is what diagnostics print (no query string)."""

    https: bool
    host: str
    port: int
    target: str
    shown: str


def endpoint_of(url: str) -> Endpoint | str:
    """The endpoint a URL names, or why it cannot be used (not http or https, no host, a bad port, credentials)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"--url is not a URL ({exc})"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return f"--url must be an http:// or https:// URL (got scheme {parts.scheme or 'none'!r})"
    host = parts.hostname
    if not host:
        return "--url names no host"
    if parts.username is not None or parts.password is not None:
        return "--url must not hold credentials; the token goes in FOREMAN_MCP_TOKEN"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return "--url holds whitespace or control characters"
    https = scheme == "https"
    port = port or (443 if https else 80)
    path = parts.path or "/"
    target = f"{path}?{parts.query}" if parts.query else path
    netloc = f"[{host}]" if ":" in host else host
    return Endpoint(https=https, host=host, port=port, target=target, shown=f"{scheme}://{netloc}:{port}{path}")


def token_problem(token: str | None) -> str | None:
    """Why ``FOREMAN_MCP_TOKEN`` cannot be sent as a bearer token, or None. Never quotes the token."""
    if not token:
        return f"{TOKEN_ENV} is not set; the bridge sends it to the service as the bearer token"
    if not all("!" <= ch <= "~" for ch in token):
        return f"{TOKEN_ENV} holds characters a bearer token cannot carry (spaces, control or non-ASCII characters)"
    return None


def answer_refusal_on_the_wire(
    refusal: dict[str, Any], *, timeout_s: float = REFUSAL_WAIT_S, max_bytes: int = 1 << 20
) -> None:
    """An MCP client shows a JSON-RPC error to its first request, but only "connection closed" for a server that
    exits: answer that request (normally ``initialize``) with the refusal, then let the process exit. Reads at most
    ``max_bytes`` of standard input for at most ``timeout_s``; nothing is written when no request comes (EOF)."""
    deadline = time.monotonic() + timeout_s
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    pending, read = b"", 0
    while fd >= 0 and read < max_bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        read += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and "id" in message and "method" in message:
                error = {"code": REFUSED_CODE, "message": f"{refusal['error']}: {refusal['message']}", "data": refusal}
                with contextlib.suppress(OSError):
                    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}) + "\n")
                    sys.stdout.flush()
                return


def _refuse(refusal: dict[str, Any]) -> int:
    print(json.dumps(refusal, sort_keys=True), file=sys.stderr, flush=True)
    answer_refusal_on_the_wire(refusal)
    return EXIT_USAGE


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"{_NAME}: {text}", file=sys.stderr, flush=True)


# --- JSON-RPC on the stdio side ---------------------------------------------------------------------------------------


class Stdout:
    """The host's side of the wire: whole JSON-RPC lines, one writer at a time; ``closed`` once the host is gone."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self.closed = False

    def send(self, message: Any) -> None:
        self.send_line(json.dumps(message, separators=(",", ":")).encode("utf-8"))

    def send_line(self, line: bytes) -> None:
        """Write one line (``line`` holds no newline)."""
        with self._lock:
            if self.closed:
                return
            try:
                self._stream.write(line + b"\n")
                self._stream.flush()
            except (OSError, ValueError):
                self.closed = True

    def error(self, request_id: Any, code: int, message: str, data: Any = None) -> None:
        error: dict[str, Any] = {"code": code, "message": message}
        if data is not None:
            error["data"] = data
        self.send({"jsonrpc": "2.0", "id": request_id, "error": error})


#: Integers longer than this are kept as their digits when a message is read (Python's int conversion limit is
#: 4,300 digits; the bridge forwards what it reads, it does not check it: the server answers such a call).
_MAX_INT_DIGITS = 4000


class _Digits(str):
    """An integer of more digits than :data:`_MAX_INT_DIGITS`, kept as its text."""

    __slots__ = ()


def _integer(text: str) -> int | str:
    return int(text) if len(text) <= _MAX_INT_DIGITS else _Digits(text)


def loads(data: bytes) -> Any:
    """A JSON-RPC message read only to see what it is (its bytes are what is forwarded): any integer is accepted,
    however long, and a value nested deeper than Python's parser goes is read as 0 (the server answers the message
    itself). Raises ValueError for text that is not JSON."""
    try:
        return json.loads(data, parse_int=_integer)
    except RecursionError:
        shallow = collapsed(data.decode("utf-8", "surrogateescape"))
        if shallow is None:
            raise ValueError("nested too deep, and its brackets do not balance") from None
        return json.loads(shallow, parse_int=_integer)


@dataclass(frozen=True, slots=True)
class Answer:
    """One JSON-RPC message from the server: as read (to see what it answers) and as the one line the host gets
    (the server's own bytes; the line breaks of a JSON text are whitespace, so they become spaces)."""

    message: Any
    line: bytes


def answers_of(data: bytes) -> list[Answer]:
    """The messages of a JSON body or an SSE event: one, or each of a batch. Raises Refused for text that is not
    JSON."""
    try:
        doc = loads(data)
    except ValueError as exc:
        raise Refused(f"bad_answer: the server sent a message that is not JSON ({exc})",
                      {"body": data[:2000].decode("utf-8", "replace")[:500]}) from None
    if isinstance(doc, list):
        return [Answer(item, json.dumps(item, separators=(",", ":")).encode()) for item in doc]
    return [Answer(doc, data.strip().replace(b"\r", b" ").replace(b"\n", b" "))]


def request_ids(message: Any) -> list[Any]:
    """The ids of the requests in a message (one, or each of a batch); notifications and responses have none here."""
    items = message if isinstance(message, list) else [message]
    return [item["id"] for item in items if isinstance(item, dict) and "method" in item and "id" in item]


def _is_answer(message: Any) -> bool:
    return isinstance(message, dict) and "id" in message and ("result" in message or "error" in message)


# --- the HTTP side ----------------------------------------------------------------------------------------------------


class Refused(Exception):
    """The server did not answer a message: a status other than 2xx, no connection, or an answer it cut short.
    ``error`` and ``data`` become the JSON-RPC error the host gets for each request of the message."""

    def __init__(self, message: str, data: dict[str, Any]) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class SessionGone(Refused):
    """404 to a request that carried the session id ``session``: the server no longer knows the session."""

    def __init__(self, message: str, data: dict[str, Any], session: str) -> None:
        super().__init__(message, data)
        self.session = session


def refusal_of(status: int, reason: str, body: bytes, retry_after: str | None) -> Refused:
    """The refusal of a non-2xx answer: the server's JSON error body when it sent one (foreman's
    ``{"error", "message", ...}`` or a JSON-RPC error), else the status and the first 500 characters."""
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        doc = None
    later = f" (retry after {retry_after} s)" if retry_after else ""
    if isinstance(doc, dict):
        error: Any = doc.get("error")
        message: Any = doc.get("message")
        if isinstance(error, dict):  # a JSON-RPC error body, as the SDK's transport answers
            error, message = f"HTTP {status}", error.get("message")
        return Refused(f"{error or f'HTTP {status}'}: {message or reason}{later}", doc)
    shown = body[:2000].decode("utf-8", "replace")[:500]
    return Refused(f"HTTP {status}: {reason}{later}", {"status": status, "body": shown})


@dataclass(slots=True)
class _Sse:
    """What an SSE stream said about resuming it: the last event id and the retry delay it asked for."""

    last_id: str | None = None
    retry_s: float = 1.0


class Upstream:
    """foreman's ``/mcp``, reached with one token: the session's id and protocol version, and a pool of kept-alive
    connections (each used by one thread at a time)."""

    def __init__(self, endpoint: Endpoint, token: str) -> None:
        self.endpoint = endpoint
        self._token = token
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self.session_id: str | None = None
        self.protocol_version: str | None = None
        self._ssl: Any = None

    # connections

    def _connect(self) -> http.client.HTTPConnection:
        if not self.endpoint.https:
            return http.client.HTTPConnection(self.endpoint.host, self.endpoint.port, timeout=CONNECT_TIMEOUT_S)
        import ssl  # only for https: its import costs a few MiB

        with self._lock:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
        return http.client.HTTPSConnection(
            self.endpoint.host, self.endpoint.port, timeout=CONNECT_TIMEOUT_S, context=self._ssl
        )

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._connect(), False

    def _keep(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        if response.isclosed() and not response.will_close:
            with self._lock:
                self._idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # requests

    def headers(self, accept: str, *, body: bool, session: bool = True) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self._token}", "Accept": accept}
        if body:
            headers["Content-Type"] = "application/json"
        if session:
            if self.session_id is not None:
                headers["Mcp-Session-Id"] = self.session_id
            if self.protocol_version is not None:
                headers["MCP-Protocol-Version"] = self.protocol_version
        return headers

    @contextlib.contextmanager
    def exchange(
        self, method: str, body: bytes | None, headers: dict[str, str], *, timeout_s: float = READ_TIMEOUT_S
    ) -> Iterator[http.client.HTTPResponse]:
        """One HTTP exchange on a pooled connection; the connection goes back to the pool if its answer was read
        whole. A kept-alive connection the server closed meanwhile is replaced once. Raises Refused when the
        server cannot be reached."""
        for attempt in (1, 2):
            conn, reused = self._take()
            try:
                conn.request(method, self.endpoint.target, body=body, headers=headers)
                if conn.sock is not None:
                    conn.sock.settimeout(timeout_s)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                if reused and attempt == 1:
                    continue
                raise self._unreachable(exc) from None
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise self._unreachable(exc) from None
            try:
                yield response
            except BaseException:
                conn.close()
                raise
            self._keep(conn, response)
            return

    def redact(self, text: str) -> str:
        """``text`` without the token (a diagnostic never prints it)."""
        return text.replace(self._token, "<token>")

    def _unreachable(self, exc: BaseException) -> Refused:
        reason = self.redact(str(exc) or type(exc).__name__)
        message = f"unreachable: cannot reach foreman's MCP endpoint {self.endpoint.shown} ({reason})"
        return Refused(message, {"error": "unreachable", "url": self.endpoint.shown, "reason": reason,
                                 "remediate": "Check that foreman serve runs and that --url names its /mcp."})

    def post(self, body: bytes, deliver: Callable[[Answer], None], *, initialize: bool = False) -> _Sse | None:
        """POST one stdin message; each JSON-RPC message of the answer goes to ``deliver``. For ``initialize``,
        the session id and protocol version are taken from the answer (none are sent with it). The SSE stream's
        resumption state when the answer was one."""
        headers = self.headers(_ACCEPT_POST, body=True, session=not initialize)
        sent_session = headers.get("Mcp-Session-Id")
        with self.exchange("POST", body, headers) as response:
            if not 200 <= response.status < 300:
                refused = refusal_of(response.status, response.reason, _read_at_most(response, MAX_REFUSAL_BYTES),
                                     response.getheader("Retry-After"))
                if response.status == 404 and sent_session is not None:
                    raise SessionGone(refused.message, refused.data, sent_session)
                raise refused
            if initialize:
                session = response.getheader("Mcp-Session-Id")
                with self._lock:
                    self.session_id = session

                def take_version(answer: Answer) -> None:
                    result = answer.message.get("result") if isinstance(answer.message, dict) else None
                    version = result.get("protocolVersion") if isinstance(result, dict) else None
                    if isinstance(version, str) and version.isprintable() and version.isascii():
                        self.protocol_version = version
                    deliver(answer)

                return self._read_answer(response, take_version)
            return self._read_answer(response, deliver)

    def _read_answer(self, response: http.client.HTTPResponse, deliver: Callable[[Answer], None]) -> _Sse | None:
        kind = (response.getheader("Content-Type") or "").split(";", 1)[0].strip().lower()
        if response.status in (202, 204):
            response.read()
            return None
        if kind == "text/event-stream":
            sse = _Sse()
            for data in sse_events(response, sse):
                for answer in answers_of(data):
                    deliver(answer)
            return sse
        body = _read_at_most(response, MAX_ANSWER_BYTES + 1)
        if not body.strip():
            return None
        if kind != "application/json":
            raise Refused(f"bad_answer: the server answered {response.status} with {kind or 'no content type'}",
                          {"status": response.status, "body": body[:2000].decode("utf-8", "replace")[:500]})
        if len(body) > MAX_ANSWER_BYTES:
            raise Refused("too_large: the server's answer is larger than the bridge reads",
                          {"status": response.status, "limit_bytes": MAX_ANSWER_BYTES})
        for answer in answers_of(body):
            deliver(answer)
        return None

    def resume(self, sse: _Sse, deliver: Callable[[Answer], None]) -> _Sse | None:
        """GET the stream again from after ``sse.last_id`` (the server closed it before the answer came)."""
        headers = self.headers(_ACCEPT_GET, body=False)
        headers["Last-Event-ID"] = sse.last_id or ""
        with self.exchange("GET", None, headers) as response:
            if not 200 <= response.status < 300:
                raise refusal_of(response.status, response.reason, _read_at_most(response, MAX_REFUSAL_BYTES),
                                 response.getheader("Retry-After"))
            return self._read_answer(response, deliver)

    def delete(self) -> int | None:
        """End the session (``DELETE`` with its id); the status, or None when there was no session or no answer."""
        if self.session_id is None:
            return None
        try:
            with self.exchange("DELETE", None, self.headers(_ACCEPT_POST, body=False),
                               timeout_s=DELETE_TIMEOUT_S) as response:
                response.read()
                return response.status
        except Refused as exc:
            _say(f"the session could not be ended: {exc.message}")
            return None


def _read_at_most(response: http.client.HTTPResponse, limit: int) -> bytes:
    try:
        return response.read(limit)
    except (OSError, http.client.HTTPException):
        return b""


def sse_events(response: IO[bytes] | http.client.HTTPResponse, state: _Sse) -> Iterator[bytes]:
    """The data of each ``message`` event of a ``text/event-stream`` body, as it arrives (events without data, such
    as a priming event that only carries an id, are skipped). ``state`` follows the ``id:`` and ``retry:`` fields."""
    data: list[bytes] = []
    size = 0
    event = b""
    while True:
        line = response.readline(MAX_ANSWER_BYTES + 1)
        if not line:
            return
        if len(line) > MAX_ANSWER_BYTES:
            raise Refused("too_large: an event of the server's stream is larger than the bridge reads",
                          {"limit_bytes": MAX_ANSWER_BYTES})
        line = line.rstrip(b"\r\n")
        if not line:
            joined = b"\n".join(data)
            if joined and event in (b"", b"message"):  # an empty data buffer dispatches nothing (the SSE rules)
                yield joined
            data, size, event = [], 0, b""
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"data":
            size += len(value) + 1
            if size > MAX_ANSWER_BYTES:
                raise Refused("too_large: an event of the server's stream is larger than the bridge reads",
                              {"limit_bytes": MAX_ANSWER_BYTES})
            data.append(value)
        elif name == b"event":
            event = value
        elif name == b"id" and b"\0" not in value:
            state.last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit():
            state.retry_s = min(int(value) / 1000.0, 5.0)


# --- the bridge -------------------------------------------------------------------------------------------------------


class Bridge:
    """stdin to the server, the server's answers to stdout: one MCP session of one host."""

    def __init__(self, upstream: Upstream, stdout: Stdout, *, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.upstream = upstream
        self.stdout = stdout
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._in_flight = 0
        self._idle = threading.Condition()
        self._renew_lock = threading.Lock()
        self._initialize: bytes | None = None
        self._initialized: bytes | None = None

    # stdin

    def run(self, stdin: IO[bytes]) -> None:
        """Forward every line of ``stdin`` until its end, then wait until every request is answered."""
        while not self.stdout.closed:
            line = stdin.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                while (rest := stdin.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass  # the rest of the line is dropped with it
                self.stdout.error(None, INVALID_REQUEST,
                                  f"Invalid request: a message longer than {MAX_LINE_BYTES} bytes was dropped")
                continue
            if line.strip():
                self.forward(line.strip())
        self.wait_idle()

    def forward(self, line: bytes) -> None:
        """Send one stdin line on its way: parsed only to know what it is; the bytes sent are the host's own."""
        try:
            message = loads(line)
        except ValueError as exc:
            self.stdout.error(None, PARSE_ERROR, f"Parse error: {exc}")
            return
        if not isinstance(message, (dict, list)) or message == []:
            self.stdout.error(None, INVALID_REQUEST, "Invalid request: a message is a JSON object (or a batch)")
            return
        if isinstance(message, dict) and message.get("method") == "initialize" and "id" in message:
            self._initialize = line
            self.send(line, message, initialize=True)
        elif not request_ids(message):  # notifications and responses: in stdin's order, before what follows
            if isinstance(message, dict) and message.get("method") == "notifications/initialized":
                self._initialized = line
            self.send(line, message)
        else:
            self._slots.acquire()
            with self._idle:
                self._in_flight += 1
            threading.Thread(target=self._send_and_release, args=(line, message), daemon=True).start()

    def _send_and_release(self, line: bytes, message: Any) -> None:
        try:
            self.send(line, message)
        finally:
            self._slots.release()
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    def wait_idle(self) -> None:
        with self._idle:
            while self._in_flight:
                self._idle.wait()

    # one message

    def send(self, line: bytes, message: Any, *, initialize: bool = False) -> None:
        """POST one message; every request of it is answered on stdout, by the server or with the refusal."""
        waiting = set(map(_key, request_ids(message)))

        def deliver(answer: Answer) -> None:
            if _is_answer(answer.message):
                waiting.discard(_key(answer.message["id"]))
            self.stdout.send_line(answer.line)

        try:
            try:
                sse = self.upstream.post(line, deliver, initialize=initialize)
            except SessionGone as gone:
                if not self._renew(gone):
                    raise
                sse = self.upstream.post(line, deliver)
            for _ in range(MAX_RESUMES):  # an SSE stream that ended before its answer: resumed after its last event
                if not waiting or sse is None or sse.last_id is None:
                    break
                time.sleep(sse.retry_s)
                sse = self.upstream.resume(sse, deliver)
            if waiting:
                raise Refused("no_answer: the server ended the answer's stream without answering the request",
                              {"error": "no_answer", "url": self.upstream.endpoint.shown})
        except Refused as refused:
            if not waiting:
                _say(f"a notification or response was not delivered: {refused.message}")
            for request_id in [item for item in request_ids(message) if _key(item) in waiting]:
                self.stdout.error(request_id, REFUSED_CODE, refused.message, refused.data)
        except Exception as exc:  # never a traceback on stdout, never an unanswered request
            failure = self.upstream.redact(f"{type(exc).__name__}: {exc}")
            _say(f"unexpected failure: {failure}")
            for request_id in [item for item in request_ids(message) if _key(item) in waiting]:
                self.stdout.error(request_id, REFUSED_CODE, f"bridge_error: {failure}")

    def _renew(self, gone: SessionGone) -> bool:
        """Open the session again with the host's own ``initialize`` (its answer is not shown to the host) and
        ``notifications/initialized``; True when a session is open now."""
        stale = gone.session
        with self._renew_lock:
            if self.upstream.session_id != stale:  # another request renewed it meanwhile
                return True
            if self._initialize is None:
                return False
            _say(f"the server no longer knows the session ({gone.message}); opening a new one")
            try:
                self.upstream.post(self._initialize, lambda _answer: None, initialize=True)
                if self._initialized is not None:
                    self.upstream.post(self._initialized, lambda _answer: None)
            except Refused as refused:
                _say(f"a new session could not be opened: {refused.message}")
                return False
            return self.upstream.session_id != stale

    def close(self) -> None:
        """End the session on the server (``DELETE``) and close the connections."""
        status = self.upstream.delete()
        if status is not None and not 200 <= status < 300 and status != 405:
            _say(f"ending the session was answered HTTP {status}")
        self.upstream.close()


def _key(request_id: Any) -> str:
    """A request id as a set member (ids are strings or numbers; ``1`` and ``"1"`` are different ids)."""
    return json.dumps(request_id, sort_keys=True)


# --- entry point ------------------------------------------------------------------------------------------------------


class _Terminated(Exception):
    """SIGTERM: the host is stopping the bridge (the session is still ended)."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``foreman [...] mcp --url URL``: bridge stdio to the URL (or ``FOREMAN_MCP_URL``) with ``FOREMAN_MCP_TOKEN``
    until stdin ends. ``argv`` is the whole ``foreman`` command line (default: ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    try:
        args = _parse(argv)
    except _UsageError as exc:
        return _refuse(_refusal("invalid_input", "--url", f"foreman mcp: {exc}",
                                "Run it as: foreman mcp --url http://HOST:PORT/mcp (the token in FOREMAN_MCP_TOKEN).",
                                "start foreman mcp --url URL again"))
    ignored = [arg for arg in argv if arg.split("=", 1)[0] in _GLOBAL_VALUED]  # before mcp or after it
    return serve(args.url[0] if args.url else None, environ, ignored=ignored)


def serve(url: str | None, environ: Mapping[str, str], *, ignored: Sequence[object] = ()) -> int:
    """Bridge stdio to ``url`` (None: ``FOREMAN_MCP_URL``) with the token in ``FOREMAN_MCP_TOKEN``; exit 0 at
    stdin's end, 2 when the URL or the token cannot be used (refused at start, before anything is sent)."""
    url = url or environ.get(URL_ENV) or ""
    endpoint = endpoint_of(url) if url else f"no URL: give --url or set {URL_ENV}"
    if isinstance(endpoint, str):
        return _refuse(_refusal("invalid_input", "--url", endpoint,
                                "Give the URL of foreman serve's MCP endpoint, e.g. --url http://foreman:8080/mcp.",
                                "start foreman mcp --url http://HOST:PORT/mcp again"))
    token = environ.get(TOKEN_ENV)
    problem = token_problem(token)
    if problem is not None or token is None:
        return _refuse(_refusal("invalid_config", TOKEN_ENV, problem or f"{TOKEN_ENV} is not set",
                                f"Set {TOKEN_ENV} to this agent's own foreman token (an operator issues it).",
                                f"set {TOKEN_ENV} and start foreman mcp --url URL again"))
    if ignored:
        _say("--config and --repository are not read with --url: the service holds the configuration")
    bridge = Bridge(Upstream(endpoint, token), Stdout(sys.stdout.buffer))
    _say(f"bridging stdio to {endpoint.shown}")
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        bridge.run(sys.stdin.buffer)
    except (_Terminated, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the session is ended once, whatever comes next
        bridge.close()
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK
