"""What `foreman demo`, its whole life (bot/demo_life.py) and bench/e2e*.py share: the demo repository's names
and accounts, the harness around a `foreman serve` subprocess and the emulator, and the steps' read-back helpers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TextIO, TypeVar

import aiohttp
from aiohttp import web

from bot.core.evidence import find_marker
from bot.core.issue_state import repo_key
from bot.emulator import Emulator
from bot.emulator.model import Perm
from state.db import Database, read_only
from state.issues import IssueStore
from state.leases import Lease, LeaseStore
from state.outbox import OutboxEntry, OutboxStore

T = TypeVar("T")

OWNER, REPO = "demo", "widgets"
FULL_NAME = repo_key(f"{OWNER}/{REPO}")
MAINTAINER, CONTROLLER, AUTHOR, BOT = "maintainer", "controller-bot", "author-1", "foreman-bot"
REVIEWER, MERGER = "reviewer-1", "merger-1"
#: The four roster identities of an issue's whole life, each with its own Gitea and MCP token (``life_config``).
LIFE_ROSTER = {CONTROLLER: ["controller"], AUTHOR: ["author"], REVIEWER: ["reviewer"], MERGER: ["merger"]}
#: The demo's accounts besides its owner: login, permission on demo/widgets, what the account stands for.
USERS: tuple[tuple[str, Perm, str], ...] = (
    (MAINTAINER, "admin", "labels issues status:ready, reviews"),
    (CONTROLLER, "write", "controller: allocates work"),
    (AUTHOR, "write", "author: receives leases"),
    (BOT, "admin", "the bot account foreman acts as"),
)
#: The accounts ``foreman demo`` and bench/e2e.py add for the rest of an issue's life.
LIFE_USERS: tuple[tuple[str, Perm, str], ...] = (
    (REVIEWER, "write", "reviewer: reviews pull requests"),
    (MERGER, "write", "merger: merges approved pull requests"),
)
PROJECT_ROOT = Path(__file__).resolve().parents[1]
_LISTENING = re.compile(r"listening on http://[^:\s]+:(\d+)")
class StepFailed(Exception):
    """A step's evidence did not verify (or never appeared in time)."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


def _subprocess_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for our subprocesses: this one, the project importable, no inherited FOREMAN_* keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


@dataclass
class LoopHarness:
    """The emulator (in this process, or in its own: ``gitea_process``), a ``foreman serve`` subprocess and the hook
    between them (reused by bench/e2e.py)."""

    root: Path
    in_process: Emulator | None  # the emulator when it runs in this process (None: ``gitea_process`` runs it)
    runner: web.AppRunner | None  # its server here (None with ``gitea_process``)
    gitea_url: str
    http: aiohttp.ClientSession
    tokens: dict[str, str]  # Gitea access tokens by login
    mcp_tokens: dict[str, str]  # foreman MCP tokens by roster login (the demo's config lists the author's only)
    webhook_secret: str
    config_path: Path
    db_path: Path
    checkout: Path
    serve_log: Path
    #: PostgreSQL instead of the SQLite file at db_path (bench/e2e.py --database-url).
    database_url: str | None = None
    serve: asyncio.subprocess.Process | None = None
    webhook_url: str = ""
    mcp_url: str = ""  # foreman serve's /mcp, where the agents connect
    hook_id: int | None = None
    #: The emulator's own process (bench/e2e.py --gitea-process): this process only drives it through its API.
    gitea_process: asyncio.subprocess.Process | None = None
    _log_task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def emulator(self) -> Emulator:
        """The emulator's objects, when it runs in this process."""
        if self.in_process is None:
            raise StepFailed("gitea", "the emulator runs in its own process: read it through its API")
        return self.in_process

    # --- Gitea as a user sees it, and foreman's database read-only ----------------------------------------------------
    async def api(self, login: str, method: str, path: str, body: Any = None) -> Any:
        """One API call as ``login`` (``path`` below ``/repos/{owner}/{repo}`` when it starts with ``/issues`` or
        ``/hooks``); a non-2xx answer fails the calling step."""
        url = f"{self.gitea_url}/api/v1/repos/{OWNER}/{REPO}{path}"
        headers = {"Authorization": f"token {self.tokens[login]}"}
        async with self.http.request(method, url, json=body, headers=headers) as resp:
            if resp.status >= 300:
                raise StepFailed("gitea", f"{method} {path} as {login} answered {resp.status}: {await resp.text()}")
            raw = await resp.text()  # 204, and Gitea's merge answers 200 with an empty body
            return json.loads(raw) if raw else None

    async def comments(self, number: int) -> list[dict[str, Any]]:
        """The issue's comments as Gitea serves them (read as the maintainer)."""
        found: list[dict[str, Any]] = await self.api(MAINTAINER, "GET", f"/issues/{number}/comments")
        return found

    async def comment_with_marker(self, number: int, key: str) -> list[dict[str, Any]]:
        return [c for c in await self.comments(number) if find_marker(str(c.get("body") or "")) == key]

    @asynccontextmanager
    async def foreman_db(self) -> AsyncIterator[Database]:
        """foreman's database for one look, opened read-only (foreman serve keeps writing in WAL mode)."""
        async with read_only(self.database_url or self.db_path) as db:
            yield db

    async def verified_entry(self, key: str) -> OutboxEntry | None:
        """The outbox entry ``key`` once foreman sent and verified it; None while it is on its way."""
        async with self.foreman_db() as db:
            entry = await OutboxStore(db).by_key(key)
        if entry is not None and entry.status in ("verification_failed", "parked"):
            raise StepFailed("outbox", f"foreman's outbox entry {key} ended {entry.status}: the write to Gitea did"
                             " not read back as intended (see `foreman outbox`)")
        return entry if entry is not None and entry.status == "done" else None

    def git(self, *args: str, cwd: Path | None = None) -> str:
        done = subprocess.run(
            ["git", *args], cwd=cwd or self.checkout, capture_output=True, text=True, timeout=60, check=False
        )
        if done.returncode != 0:
            raise StepFailed("git", f"git {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    async def start_serve(self, timeout_s: float = 30.0) -> None:
        """Start ``foreman serve`` on a free port and wait until it is ready and reaches Gitea."""
        log = self.serve_log.open("w", encoding="utf-8")
        self.serve = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "--config", str(self.config_path), "serve",
            cwd=self.root, env=_subprocess_env(), stdin=asyncio.subprocess.DEVNULL,
            stdout=log, stderr=asyncio.subprocess.PIPE,
        )
        port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._log_task = asyncio.create_task(self._pump_log(self.serve, log, port))
        try:
            bound = await asyncio.wait_for(asyncio.shield(port), timeout_s)
        except TimeoutError:
            raise StepFailed("serve", f"foreman serve did not start listening within {timeout_s:.0f}s") from None
        self.webhook_url = f"http://127.0.0.1:{bound}/webhook"
        self.mcp_url = f"http://127.0.0.1:{bound}/mcp"
        await until("serve", self._ready, timeout_s, f"http://127.0.0.1:{bound}/readyz never answered ready")

    async def _pump_log(self, proc: asyncio.subprocess.Process, log: IO[str], port: asyncio.Future[int]) -> None:
        assert proc.stderr is not None
        try:
            async for raw in proc.stderr:
                line = raw.decode("utf-8", "replace")
                log.write(line)
                log.flush()
                found = _LISTENING.search(line)
                if found and not port.done():
                    port.set_result(int(found.group(1)))
        finally:
            log.close()
            if not port.done():
                port.set_exception(StepFailed("serve", f"foreman serve exited ({proc.returncode}) before listening"))

    async def _ready(self) -> dict[str, Any] | None:
        if self.serve is not None and self.serve.returncode is not None:
            raise StepFailed("serve", f"foreman serve exited with {self.serve.returncode}")
        url = self.webhook_url.removesuffix("/webhook") + "/readyz"
        try:
            async with self.http.get(url) as resp:
                doc: dict[str, Any] = await resp.json()
        except aiohttp.ClientError:
            return None
        return doc if doc.get("ready") and doc["checks"]["gitea"]["ok"] else None

    async def register_hook(self, events: tuple[str, ...] = ("issues",)) -> dict[str, Any]:
        """The maintainer adds the repository webhook through the API, as an operator does in Gitea's UI."""
        hook: dict[str, Any] = await self.api(MAINTAINER, "POST", "/hooks", {
            "type": "gitea",
            "config": {"url": self.webhook_url, "content_type": "json", "secret": self.webhook_secret},
            "events": list(events),
            "active": True,
        })
        self.hook_id = int(hook["id"])
        return hook

    def serve_log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.serve_log.read_text(encoding="utf-8").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def stop(self) -> None:
        if self.serve is not None and self.serve.returncode is None:
            self.serve.terminate()
            try:
                await asyncio.wait_for(self.serve.wait(), 15)
            except TimeoutError:
                self.serve.kill()
                await self.serve.wait()
        if self._log_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._log_task, 5)


async def until(step: str, probe: Callable[[], Awaitable[T | None]], timeout_s: float, message: str) -> T:
    """Poll ``probe`` until it returns something; fail ``step`` with ``message`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await probe()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise StepFailed(step, message)
        await asyncio.sleep(0.02)


@asynccontextmanager
async def mcp_session(h: LoopHarness, errlog: TextIO, login: str = AUTHOR) -> AsyncIterator[Any]:
    """An initialized SDK client session of ``foreman serve``'s ``/mcp`` holding only ``login``'s token, as a
    deployed agent connects (Streamable HTTP, ``Authorization: Bearer``). ``errlog``: the client's own log lines."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {h.mcp_tokens[login]}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=60.0) as http,
        streamable_http_client(h.mcp_url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call_tool(session: Any, step: str, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    doc = result.structured_content
    if not isinstance(doc, dict):
        raise StepFailed(step, f"{tool} answered no structured content")
    if result.is_error:
        raise StepFailed(step, f"{tool} was refused: {json.dumps(doc, sort_keys=True)}")
    return doc


class Printer:
    """The demo's output: a timeline, one line per verified step with the seconds since the start. Short by default
    (each step up to its first "; " and at most ``SHORT`` characters); ``verbose``: each step in full, and the
    blocks (evidence comments as Gitea serves them, with their JSON)."""

    SHORT = 110

    def __init__(self, out: TextIO, *, verbose: bool = False) -> None:
        self.out = out
        self.verbose = verbose
        self.started = time.monotonic()

    def step(self, name: str, text: str) -> None:
        if not self.verbose:
            if not name:
                return  # a step's continuation line
            text = short(text, self.SHORT)
        self.out.write(f"[{time.monotonic() - self.started:5.1f}s] {name:<10} {text}\n")
        self.out.flush()

    def block(self, title: str, body: str) -> None:
        if not self.verbose:
            return
        rule = "-" * 100
        self.out.write(f"{rule}\n{title}\n{rule}\n{body.rstrip()}\n{rule}\n")
        self.out.flush()


def short(text: str, width: int) -> str:
    """``text`` up to its first "; ", cut at a word boundary to at most ``width`` characters (marked " ...")."""
    head = text.split("; ", 1)[0]
    if len(head) <= width:
        return head
    cut = head[: width - 4].rsplit(" ", 1)[0]
    return f"{cut} ..."


async def state_comment_id(h: LoopHarness, n: int) -> int | None:
    """The comment whose block foreman holds as the issue's current state."""
    async with h.foreman_db() as db:
        snapshot = await IssueStore(db).snapshot(FULL_NAME, n)
    return None if snapshot is None else snapshot.state_comment_id


async def lease_by_id(h: LoopHarness, lease_id: str) -> Lease:
    async with h.foreman_db() as db:
        found = await LeaseStore(db).get(lease_id)
    if found is None:
        raise StepFailed("lease", f"foreman has no lease {lease_id}")
    return found


async def verified(h: LoopHarness, step: str, key: str, timeout_s: float) -> OutboxEntry:
    """The outbox entry ``key``, once foreman's sender wrote it, read it back and found it as intended."""

    async def done() -> OutboxEntry | None:
        try:
            return await h.verified_entry(key)
        except StepFailed as exc:
            raise StepFailed(step, exc.message) from None

    return await until(step, done, timeout_s, f"the outbox never verified {key}")


async def verified_comment(h: LoopHarness, step: str, n: int, key: str, timeout_s: float) -> dict[str, Any]:
    """The outbox entry ``key`` verified by foreman, and exactly one comment with its marker on Gitea, by the bot."""
    result = (await verified(h, step, key, timeout_s)).result or {}
    found = await h.comment_with_marker(n, key)
    if len(found) != 1:
        raise StepFailed(step, f"{len(found)} comments carry the marker {key} (expected exactly one)")
    comment = found[0]
    if comment["user"]["login"] != BOT or result.get("comment_id") != comment["id"] or not result.get("verified"):
        raise StepFailed(step, f"comment {comment['id']} is not the one foreman posted and verified: {result}")
    return comment
