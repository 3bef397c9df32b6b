"""Test harness shared by every test module: settings and config files, signed requests, an in-process service."""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import hmac
import inspect
import json
import os
import random
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web import BaseRunner
from gidgethub import routing, sansio
from pydantic import SecretStr

from bot.app import Service, open_service
from bot.config import Settings
from bot.config_writer import Document, merged
from bot.core.canonical import CanonicalState
from bot.core.dispatch import OrderedRouter
from bot.http_server import ServiceRunner, runner_options
from bot.worker import HandlerContext
from handlers import build_router
from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS

SECRET = "test-secret-0123456789abcdef"

#: The hang detector of a test's waits (for a process, its answer or a condition), never a timing: on a machine at
#: load 15 (another suite beside this one) a Python process runs ten times slower than on an idle one, so a wait
#: that is a moment's work there can take a minute here. A passing test never waits it out.
HANG_S = 120.0
#: The hang detector of a whole run of a benchmark, the demo or a package build in a subprocess (minutes idle).
SLOW_HANG_S = 600.0
#: How long a probe of a busy live service (/healthz while it works) may take before the test calls it frozen: a
#: frozen event loop never answers, a machine at load 15 answers within seconds.
PROBE_S = 30.0

#: Ports handed out by ``free_port``: below the kernel's ephemeral range (where every port-0 bind draws from, ours
#: and aiohttp's test servers'), each held by an ``flock`` in ``_PORT_LOCKS`` for the life of the test process that
#: took it, so no other test process on the machine (another xdist worker, another run) is given it.
_PORT_LOW, _PORT_SPAN = 20000, 12000
_PORT_LOCKS = Path(tempfile.gettempdir()) / "foreman-test-ports"
_held_ports: list[int] = []  # the lock files' descriptors: closed (released) when the process ends


def free_port() -> int:
    """A loopback port free now and reserved for this test process: a port-0 bind released before a child process
    binds it could be given meanwhile to another test process's server (which then answered the health check), or
    be taken when a test needs nothing to listen there."""
    _PORT_LOCKS.mkdir(exist_ok=True)
    start = random.randrange(_PORT_SPAN)
    for step in range(_PORT_SPAN):
        port = _PORT_LOW + (start + step) % _PORT_SPAN
        fd = os.open(_PORT_LOCKS / f"{port}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", port))
        except OSError:  # held by another test process, or bound by something else
            os.close(fd)
            continue
        _held_ports.append(fd)
        return port
    raise RuntimeError(f"no free loopback port in {_PORT_LOW}..{_PORT_LOW + _PORT_SPAN - 1}")


def make_settings(tmp_path: Path, **sections: Mapping[str, Any]) -> Settings:
    """Settings for a test: database under tmp_path, a known secret, fast worker timings."""
    data = offline_config(tmp_path / "foreman.db", {
        "database": {"synchronous": "NORMAL"},
        "gitea": {"bot_login": "foreman-bot"},
        "worker": {"backoff_base_s": 0.05, "backoff_max_s": 0.2, "poll_interval_s": 0.05, "claim_ttl_s": 1.0},
        "server": {"shutdown_grace_s": 2.0},
        # Never the default var/checkouts in the working directory: control checkouts live with the test.
        "repository": {"checkout_root": str(tmp_path / "checkouts")},
    }, sections)
    if "url" in data["database"]:  # PostgreSQL: [database] url alone
        del data["database"]["path"]
    settings = Settings.model_validate(data)
    secrets = settings.webhook.secrets or [SecretStr(SECRET)]
    return settings.model_copy(update={"webhook": settings.webhook.model_copy(update={"secrets": secrets})})


def offline_config(database: Path, *overrides: Document) -> dict[str, Any]:
    """A foreman.toml document without Gitea: the known secret, SQLite at ``database``, ``overrides`` laid over it."""
    return merged({"webhook": {"secrets": [SECRET]}, "database": {"path": database}}, *overrides)


def emulator_sections(base_url: str) -> dict[str, Any]:
    """``[gitea]`` as the seeded emulator's bot and ``[repository]`` naming its acme/widgets."""
    return {"gitea": {"url": base_url, "token": TOKENS[BOT], "bot_login": BOT},
            "repository": {"owner": OWNER, "name": REPO}}


def serve_config(port: int, database: Path, base_url: str, root: Path, *overrides: Document) -> dict[str, Any]:
    """The foreman.toml document of a `foreman serve` process against the live emulator, checkouts under ``root``."""
    own = {"server": {"port": port, "shutdown_grace_s": 1.0}, "database": {"synchronous": "NORMAL"}}
    return merged(offline_config(database, own), emulator_sections(base_url), {
        "gitea": {"timeout_s": 5.0},
        "repository": {"checkout_root": root / "checkouts"},
        "worker": {"poll_interval_s": 0.05, "claim_ttl_s": 1.5, "backoff_base_s": 0.05, "backoff_max_s": 0.5},
    }, *overrides)


def canonical_state(state: str = "in-progress", who: str = "author", **fields: Any) -> CanonicalState:
    """A Canonical Issue State as a test posts it: ``state``, whose turn it is, and ``fields`` over plain values."""
    return CanonicalState(**{
        "state": state, "who_is_next": who, "next_action": "Implement the change", "next_prompt": "Do the work.",
        "what_happened": "Allocated", "why": "It was ready", "related_prs": (), "blockers": "none",
        "validation": "lease read back", "last_updated_by": "controller-bot", **fields})


def sign(body: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def payload(action: str = "opened", *, sender: str = "alice", number: int = 1, **extra: Any) -> bytes:
    """A Gitea-shaped issues payload, pretty-printed like Gitea (2-space indent, no trailing newline)."""
    doc = {
        "action": action,
        "number": number,
        "issue": {"id": 1000 + number, "number": number, "title": f"issue {number}", "labels": [], "state": "open"},
        "repository": {"id": 1, "name": "repo", "full_name": "org/repo", "owner": {"login": "org"}},
        "sender": {"id": 7, "login": sender, "username": sender},
        "commit_id": "",
        **extra,
    }
    return json.dumps(doc, indent=2).encode()


def webhook_headers(
    body: bytes,
    *,
    event: str = "issues",
    event_type: str | None = None,
    delivery: str | None = None,
    secret: str = SECRET,
    style: str = "gitea",
) -> dict[str, str]:
    """Headers as Gitea sends them; style 'github' sends only the X-GitHub-*/X-Hub-* copies."""
    delivery = delivery or str(uuid.uuid4())
    digest = sign(body, secret)
    if style == "github":
        return {
            "Content-Type": "application/json",
            "X-GitHub-Event": event,
            "X-GitHub-Event-Type": event_type or event,
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": f"sha256={digest}",
        }
    return {
        "Content-Type": "application/json",
        "X-Gitea-Event": event,
        "X-Gitea-Event-Type": event_type or event,
        "X-Gitea-Delivery": delivery,
        "X-Gitea-Signature": digest,
    }


async def raw_post(port: int, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, dict[str, Any]]:
    """POST /webhook with header bytes exactly as given (aiohttp's client would refuse non-UTF-8 ones)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    head += b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    writer.write(head + body)
    await writer.drain()
    response = await reader.read()
    writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    status = int(status_line.split()[1])
    head, _, content = rest.partition(b"\r\n\r\n")
    is_json = b"application/json" in head.lower()
    return status, json.loads(content) if is_json else {}


def signed_headers(body: bytes, *, event: bytes = b"issues", delivery: str) -> list[tuple[bytes, bytes]]:
    return [
        (b"Content-Type", b"application/json"),
        (b"X-Gitea-Event", event),
        (b"X-Gitea-Delivery", delivery.encode()),
        (b"X-Gitea-Signature", sign(body).encode()),
    ]


def recording_router(seen: list[Any], what: Callable[[sansio.Event, HandlerContext], Any]) -> OrderedRouter:
    """The product's handlers, and one more on ``issues`` that appends ``what(event, ctx)`` to ``seen``."""
    router = routing.Router()

    @router.register("issues")
    async def record(event: sansio.Event, ctx: HandlerContext) -> None:
        seen.append(what(event, ctx))

    return build_router(router)


Started = Callable[..., Awaitable[tuple[Service, TestClient[Any, Any]]]]


class ServiceTestServer(TestServer):
    """aiohttp's test server with the runner `foreman serve` uses (bot/http_server.py: JSON parser refusals)."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return ServiceRunner(self.app, **kwargs)


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Started]:
    """Start a real service on loopback; returns (service, client). Everything is closed afterwards."""
    clients: list[TestClient[Any, Any]] = []

    async def _start(
        settings: Settings | None = None, router: OrderedRouter | None = None
    ) -> tuple[Service, TestClient[Any, Any]]:
        service = await open_service(settings or make_settings(tmp_path), router or build_router())
        server = ServiceTestServer(service.make_app())
        await server.start_server(**runner_options(service.settings))  # as `foreman serve` runs it
        client: TestClient[Any, Any] = TestClient(server)
        await client.start_server()
        clients.append(client)
        return service, client

    yield _start
    for client in clients:
        await client.close()


async def holds(predicate: Callable[[], object]) -> bool:
    """Whether ``predicate()`` holds, awaiting what it returns when that is awaitable."""
    result = predicate()
    return bool(await result if inspect.isawaitable(result) else result)


async def eventually(
    predicate: Callable[[], object], what: str, timeout: float = HANG_S, *, poll_s: float = 0.02,
    detail: Callable[[], object] | None = None,
) -> float:
    """Until ``predicate()`` (or what it returns, when that is awaitable) holds, polling every ``poll_s``; the seconds
    it took. After ``timeout`` (a hang detector, never a timing) the test fails naming ``what`` and ``detail()``."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await holds(predicate):
        if loop.time() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                                 + (f": {detail()}" if detail is not None else ""))
        await asyncio.sleep(poll_s)
    return loop.time() - started


async def wait_status(service: Service, delivery: str, status: str, timeout: float = HANG_S) -> None:
    seen: list[object] = [None]

    async def reached() -> bool:
        row = seen[0] = await service.store.get(delivery)
        return row is not None and row.status == status

    await eventually(reached, f"{delivery} to reach {status}", timeout, detail=lambda: seen[0])
