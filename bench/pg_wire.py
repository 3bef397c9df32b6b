"""A counting proxy between foreman's processes and PostgreSQL: statements, round trips and transactions per
process, read off the wire protocol (no server extension needed: pg_stat_statements must be preloaded, which a
shared server may not allow).

``WireCounter(host, port)`` listens on a loopback port of its own and relays every session to the server, in a
thread of its own (its own event loop: it never waits on the benchmark's). ``url_through(url)`` is the same URL
through the proxy (``sslmode=disable``: the messages must be readable). Each session is attributed to the process
that opened it (the client port's owner, from ``ss``), so that a benchmark's own polling is told apart from
``foreman serve``'s work.

Counted, per process:
- ``round_trips``: each time the client sends after the server answered (a pipelined batch is one);
- ``statements``: each Execute of the extended protocol, and each statement of a simple Query;
- ``transactions``: each BEGIN; ``savepoints``: each SAVEPOINT (a statement the server runs, even when pipelined);
- ``by_text``: the statements by their first words, for a profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import struct
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

_SSL_REQUEST, _GSS_REQUEST, _CANCEL = 80877103, 80877104, 80877102


@dataclass
class SessionCounts:
    """What one client session sent."""

    pid: int | None = None
    name: str = "unknown"
    round_trips: int = 0
    statements: int = 0
    transactions: int = 0
    savepoints: int = 0
    by_text: Counter[str] = field(default_factory=Counter)
    #: Each committed or rolled back transaction's statements (their first words), counted by that sequence.
    by_transaction: Counter[tuple[str, ...]] = field(default_factory=Counter)
    _open: list[str] | None = None
    _prepared: dict[bytes, str] = field(default_factory=dict)
    _portal: str = ""

    def add(self, other: SessionCounts) -> None:
        self.round_trips += other.round_trips
        self.statements += other.statements
        self.transactions += other.transactions
        self.savepoints += other.savepoints
        self.by_text.update(other.by_text)
        self.by_transaction.update(other.by_transaction)


def _shape(sql: str) -> str:
    """A statement's first words, placeholders and literals left out: what a profile groups by."""
    words = re.sub(r"\s+", " ", sql.strip())
    return words[:90]


def _count_statement(counts: SessionCounts, sql: str) -> None:
    counts.statements += 1
    head = sql.lstrip().upper()
    if head.startswith("BEGIN"):
        counts.transactions += 1
        counts._open = []
    elif head.startswith("SAVEPOINT"):
        counts.savepoints += 1
    elif head.startswith(("COMMIT", "ROLLBACK")) and not head.startswith("ROLLBACK TO") and counts._open is not None:
        counts.by_transaction[(*counts._open, head[:8])] += 1
        counts._open = None
    elif counts._open is not None and not head.startswith(("RELEASE", "SET LOCAL", "SELECT PG_ADVISORY")):
        counts._open.append(_shape(sql)[:48])
    counts.by_text[_shape(sql)] += 1


def _read_client_message(counts: SessionCounts, kind: bytes, body: bytes) -> None:
    if kind == b"Q":
        text = body.rstrip(b"\0").decode(errors="replace")
        for part in (p for p in text.split(";") if p.strip()):
            _count_statement(counts, part)
    elif kind == b"P":
        name, _, rest = body.partition(b"\0")
        counts._prepared[name] = rest.partition(b"\0")[0].decode(errors="replace")
    elif kind == b"B":
        _portal, _, rest = body.partition(b"\0")
        counts._portal = counts._prepared.get(rest.partition(b"\0")[0], "?")
    elif kind == b"E":
        _count_statement(counts, counts._portal)


class WireCounter:
    """The proxy: start() it, point a URL through it (url_through), read counts() when the run is over."""

    def __init__(self, host: str = "127.0.0.1", port: int = 5432) -> None:
        self.server_host, self.server_port = host, port
        self.port = 0
        self._sessions: list[SessionCounts] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    def start(self) -> WireCounter:
        self._thread = threading.Thread(target=self._run, name="pg-wire-counter", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the PostgreSQL counting proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def url_through(self, url: str) -> str:
        parts = urlsplit(url)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                 if k not in ("sslmode", "gssencmode", "host", "port")]
        query += [("sslmode", "disable"), ("gssencmode", "disable")]
        user = parts.netloc.rpartition("@")[0]
        netloc = f"{user}@127.0.0.1:{self.port}" if user else f"127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, quote_via=quote), parts.fragment))

    def counts(self) -> dict[int | None, SessionCounts]:
        """The sessions' counts summed by the process that opened them."""
        by_pid: dict[int | None, SessionCounts] = {}
        with self._lock:
            for session in self._sessions:
                by_pid.setdefault(session.pid, SessionCounts(pid=session.pid, name=session.name)).add(session)
        return by_pid

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
        relays = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        pid = _owner_of(client_w.get_extra_info("peername")[1])
        counts = SessionCounts(pid=pid, name=process_name(pid))
        with self._lock:
            self._sessions.append(counts)
        try:
            server_r, server_w = await asyncio.open_connection(self.server_host, self.server_port)
        except OSError:
            client_w.close()
            return
        answered = [True]  # the server spoke since the client last did (the start counts as an answer)

        async def upstream() -> None:
            length = struct.unpack("!I", await client_r.readexactly(4))[0]
            first = await client_r.readexactly(length - 4)
            if struct.unpack("!I", first[:4])[0] in (_SSL_REQUEST, _GSS_REQUEST, _CANCEL):
                raise ConnectionError("the counting proxy needs sslmode=disable and gssencmode=disable")
            server_w.write(struct.pack("!I", length) + first)
            while True:
                kind = await client_r.readexactly(1)
                size = struct.unpack("!I", await client_r.readexactly(4))[0]
                body = await client_r.readexactly(size - 4)
                if answered[0]:
                    counts.round_trips += 1
                    answered[0] = False
                _read_client_message(counts, kind, body)
                server_w.write(kind + struct.pack("!I", size) + body)
                await server_w.drain()

        async def downstream() -> None:
            while chunk := await server_r.read(65536):
                answered[0] = True
                client_w.write(chunk)
                await client_w.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        with contextlib.suppress(asyncio.CancelledError):  # the proxy stopping: the session ends
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_w, server_w):
            writer.close()


def _owner_of(client_port: int) -> int | None:
    """The pid of the local process whose socket has ``client_port`` (``ss -tnp``), or None."""
    try:
        out = subprocess.run(["ss", "-Htnp", "state", "established", f"sport = :{client_port}"],
                             capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


def process_name(pid: int | None) -> str:
    """What a process is, for a report: ``foreman serve``, ``foreman mcp``, this benchmark, or its command line."""
    if pid is None:
        return "unknown"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid} (gone)"
    if pid == os.getpid():
        return "this benchmark (its polling)"
    words = [a.decode(errors="replace") for a in argv if a]
    if "serve" in words:
        return "foreman serve"
    if "mcp" in words:
        return "foreman mcp"
    return " ".join(words[-3:])[:60]
