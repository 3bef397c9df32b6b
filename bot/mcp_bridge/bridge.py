"""The bridge: stdin to the server, the server's answers to stdout, one MCP session of one host."""

from __future__ import annotations

import json
import threading
import time
from typing import IO, Any

from bot.mcp_bridge.upstream import Upstream
from bot.mcp_bridge.wire import (
    INVALID_REQUEST,
    MAX_IN_FLIGHT,
    MAX_LINE_BYTES,
    MAX_RESUMES,
    PARSE_ERROR,
    REFUSED_CODE,
    Answer,
    Refused,
    SessionGone,
    Stdout,
    is_answer,
    loads,
    request_ids,
    say,
)

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
            if is_answer(answer.message):
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
                say(f"a notification or response was not delivered: {refused.message}")
            for request_id in [item for item in request_ids(message) if _key(item) in waiting]:
                self.stdout.error(request_id, REFUSED_CODE, refused.message, refused.data)
        except Exception as exc:  # never a traceback on stdout, never an unanswered request
            failure = self.upstream.redact(f"{type(exc).__name__}: {exc}")
            say(f"unexpected failure: {failure}")
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
            say(f"the server no longer knows the session ({gone.message}); opening a new one")
            try:
                self.upstream.post(self._initialize, lambda _answer: None, initialize=True)
                if self._initialized is not None:
                    self.upstream.post(self._initialized, lambda _answer: None)
            except Refused as refused:
                say(f"a new session could not be opened: {refused.message}")
                return False
            return self.upstream.session_id != stale

    def close(self) -> None:
        """End the session on the server (``DELETE``) and close the connections."""
        status = self.upstream.delete()
        if status is not None and not 200 <= status < 300 and status != 405:
            say(f"ending the session was answered HTTP {status}")
        self.upstream.close()


def _key(request_id: Any) -> str:
    """A request id as a set member (ids are strings or numbers; ``1`` and ``"1"`` are different ids)."""
    return json.dumps(request_id, sort_keys=True)
