"""The bridge's wire: its limits and names, the JSON-RPC lines of the host's side (stdio), and the refusal that
answers a request the server did not (Refused)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from dataclasses import dataclass
from typing import IO, Any

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

ACCEPT_POST = "application/json, text/event-stream"
ACCEPT_GET = "text/event-stream"
_NAME = "foreman mcp"


def say(text: str) -> None:
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


def is_answer(message: Any) -> bool:
    return isinstance(message, dict) and "id" in message and ("result" in message or "error" in message)


# --- refused ----------------------------------------------------------------------------------------------------------


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
