"""Helpers for tests against the Gitea emulator: the seeded acme/widgets, a live server, a webhook sink."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bot.core.vocabulary import status_labels
from bot.emulator import Emulator, start_emulator
from bot.gitea import GiteaClient

OWNER = "acme"
REPO = "widgets"
BOT = "foreman-bot"
#: login -> token. acme owns the repo; the bot is repo admin; alice writes; bob reads; root is site admin.
TOKENS = {
    OWNER: "tok-acme-0001",
    BOT: "tok-bot-secret-0002",
    "alice": "tok-alice-0003",
    "bob": "tok-bob-0004",
    "root": "tok-root-0005",
}
LABELS = ("bug", "feature", "status/ready", "status/in-progress", "priority:p0")
HOOK_SECRET = "hook-secret-0123456789"


def scratch_dir(prefix: str = "gitea-emu-") -> Path:
    """A fresh directory on tmpfs when there is one (git is much faster there, DESIGN §4)."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() else None))


def seed_acme_widgets(emu: Emulator) -> None:
    """Users, the ``acme/widgets`` repository with a README, permissions and labels (status/* exclusive)."""
    emu.add_user(OWNER, token=TOKENS[OWNER], full_name="Acme Corp")
    emu.add_user(BOT, token=TOKENS[BOT])
    emu.add_user("alice", token=TOKENS["alice"])
    emu.add_user("bob", token=TOKENS["bob"])
    emu.add_user("root", token=TOKENS["root"], admin=True)
    emu.create_repo(OWNER, REPO, files={"README.md": "# widgets\n"})
    emu.set_permission(OWNER, REPO, BOT, "admin")
    emu.set_permission(OWNER, REPO, "alice", "write")
    emu.set_permission(OWNER, REPO, "bob", "read")
    for name in LABELS:
        emu.create_label(OWNER, REPO, name, exclusive=name.startswith("status/"), description=f"{name} label")


def seed_foreman(emu: Emulator, users: Mapping[str, str], *, writers: Iterable[str] = ()) -> None:
    """What foreman adds to the seeded acme/widgets: its roster's users (login -> token) and its status labels;
    ``writers`` may write to it."""
    for login, token in users.items():
        emu.add_user(login, token=token)
    for login in writers:
        emu.set_permission(OWNER, REPO, login, "write")
    for label in status_labels():
        emu.create_label(OWNER, REPO, label, color="#00aa00")


def seed_sibling_repository(emu: Emulator, name: str, *, authors: Mapping[str, str] | None = None) -> None:
    """Another repository of ``acme``, seeded as ``seed_acme_widgets`` and ``seed_foreman`` seed acme/widgets (a
    README, the same permissions and labels, foreman's status labels), with ``authors`` (login -> token) added as
    users who may write to it: two repositories served by one process, each with its own issue numbers."""
    for login, token in (authors or {}).items():
        if emu.find_user(login) is None:
            emu.add_user(login, token=token)
    emu.create_repo(OWNER, name, files={"README.md": f"# {name}\n"})
    emu.set_permission(OWNER, name, BOT, "admin")
    emu.set_permission(OWNER, name, "alice", "write")
    emu.set_permission(OWNER, name, "bob", "read")
    for label in LABELS:
        emu.create_label(OWNER, name, label, exclusive=label.startswith("status/"), description=f"{label} label")
    for label in status_labels():
        emu.create_label(OWNER, name, label, color="#00aa00")


@dataclass
class LiveEmulator:
    """A seeded emulator served on loopback, with a client session for tests."""

    emulator: Emulator
    base_url: str
    session: aiohttp.ClientSession

    def client(self, login: str = BOT, *, repo: str = REPO, **options: Any) -> GiteaClient:
        """A GiteaClient for ``acme/<repo>`` (default acme/widgets) authenticated as ``login`` (fast backoff for
        tests)."""
        options.setdefault("backoff_base_s", 0.005)
        options.setdefault("timeout_s", 5.0)
        return GiteaClient(self.session, base_url=self.base_url, token=TOKENS[login], owner=OWNER, repo=repo, **options)

    def api(self, path: str) -> str:
        """Absolute URL of an API path (``/repos/...``)."""
        return f"{self.base_url}/api/v1{path}"

    @staticmethod
    def auth(login: str = BOT, scheme: str = "token") -> dict[str, str]:
        """An Authorization header for ``login``."""
        return {"Authorization": f"{scheme} {TOKENS[login]}"}


@asynccontextmanager
async def live_emulator(*, seed: bool = True, **emulator_options: Any) -> AsyncIterator[LiveEmulator]:
    """Start a (seeded) emulator on 127.0.0.1; everything, git repos included, is removed afterwards."""
    root = scratch_dir()
    emu = Emulator(root, **emulator_options)
    if seed:
        seed_acme_widgets(emu)
    runner, base_url = await start_emulator(emu)
    session = aiohttp.ClientSession()
    try:
        yield LiveEmulator(emu, base_url, session)
    finally:
        await session.close()
        await runner.cleanup()
        await emu.aclose()
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class ReceivedHook:
    """One webhook request as the receiver saw it: headers and the raw body bytes."""

    headers: dict[str, str]
    body: bytes


@dataclass
class WebhookSink:
    """A loopback HTTP endpoint that records every webhook it receives and answers ``status``."""

    url: str = ""
    status: int = 200
    received: list[ReceivedHook] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        """Record and answer."""
        self.received.append(ReceivedHook(dict(request.headers), await request.read()))
        return web.Response(status=self.status, text="ok")


@asynccontextmanager
async def webhook_sink(status: int = 200) -> AsyncIterator[WebhookSink]:
    """Serve a WebhookSink on 127.0.0.1 for the duration of the block."""
    sink = WebhookSink(status=status)
    app = web.Application()
    app.router.add_post("/hook", sink.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sink.url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    try:
        yield sink
    finally:
        await runner.cleanup()
