"""The HTTP side: foreman's ``/mcp`` over kept-alive connections, its answers as JSON or SSE events."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from bot.mcp_bridge.refusals import Endpoint
from bot.mcp_bridge.wire import (
    ACCEPT_GET,
    ACCEPT_POST,
    CONNECT_TIMEOUT_S,
    DELETE_TIMEOUT_S,
    MAX_ANSWER_BYTES,
    MAX_REFUSAL_BYTES,
    READ_TIMEOUT_S,
    Answer,
    Refused,
    SessionGone,
    answers_of,
    say,
)

# --- the HTTP side ----------------------------------------------------------------------------------------------------


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
        headers = self.headers(ACCEPT_POST, body=True, session=not initialize)
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
        headers = self.headers(ACCEPT_GET, body=False)
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
            with self.exchange("DELETE", None, self.headers(ACCEPT_POST, body=False),
                               timeout_s=DELETE_TIMEOUT_S) as response:
                response.read()
                return response.status
        except Refused as exc:
            say(f"the session could not be ended: {exc.message}")
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
