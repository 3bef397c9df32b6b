"""A running foreman service wired to a seeded Gitea emulator by a real webhook: the end-to-end test world."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

from aiohttp.test_utils import TestClient

from bot.app import Service
from bot.config_writer import merged
from bot.core.issue_state import IssueSnapshot
from bot.emulator import EmuHook
from bot.gitea import GiteaClient
from state.issues import IssueStore
from state.outbox import OutboxEntry
from tests.conftest import database_env
from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS, LiveEmulator, live_emulator, seed_foreman
from tests.support import HANG_S, SECRET, Started, emulator_sections, make_settings

FULL_NAME = f"{OWNER}/{REPO}"
ROSTER_AUTHOR = "author-1"
ROSTER_TOKEN = "tok-author-1-0006"
#: Extra emulator users a world can have, with their tokens (roster identities).
EXTRA_TOKENS = {ROSTER_AUTHOR: ROSTER_TOKEN, "controller-bot": "tok-controller-0007", "author-2": "tok-author-2-0008",
                "author-3": "tok-author-3-0009", "reviewer-1": "tok-reviewer-1-0010",
                "reviewer-2": "tok-reviewer-2-0011", "merger-1": "tok-merger-1-0012"}


class Clock:
    """The emulator's clock: whole seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_780_000_000.0

    def __call__(self) -> float:
        return self.now


class Sections(TypedDict, total=False):
    """The settings sections a world's caller may set, each laid over the world's own ([repository] and the
    roster are the world's; [gitea] keys are laid over the emulator's url, token and bot login)."""

    gitea: Mapping[str, Any]
    server: Mapping[str, Any]
    webhook: Mapping[str, Any]
    database: Mapping[str, Any]
    worker: Mapping[str, Any]
    outbox: Mapping[str, Any]
    allocator: Mapping[str, Any]
    bootstrap: Mapping[str, Any]
    reconcile: Mapping[str, Any]
    mcp: Mapping[str, Any]
    grants: Mapping[str, Any]
    dashboard: Mapping[str, Any]
    lifecycle: Mapping[str, Any]
    merge: Mapping[str, Any]
    publish: Mapping[str, Any]


@dataclass
class World:
    """The emulator (acme/widgets) with a hook to a running foreman service."""

    live: LiveEmulator
    service: Service
    client: TestClient[Any, Any]
    hook: EmuHook
    clock: Clock
    webhook_url: str
    settled: set[str] = field(default_factory=set)

    @property
    def store(self) -> IssueStore:
        return IssueStore(self.service.db)

    @property
    def gitea(self) -> GiteaClient:
        """The service's Gitea client (a world's service always has a token, so always has one)."""
        assert self.service.gitea is not None
        return self.service.gitea

    def cli_env(self) -> dict[str, str]:
        """The environment a `foreman` command needs to act on this world without a config file (the service's
        database, Gitea, repository and roster), as an operator's shell would set it."""
        settings = self.service.settings
        return {
            **database_env(self.service.db, Path(settings.repository.checkout_root).parent),
            "FOREMAN_WEBHOOK__SECRETS": json.dumps([SECRET]),
            "FOREMAN_GITEA__URL": self.live.base_url,
            "FOREMAN_GITEA__TOKEN": TOKENS[BOT],
            "FOREMAN_GITEA__BOT_LOGIN": BOT,
            "FOREMAN_REPOSITORY__OWNER": OWNER,
            "FOREMAN_REPOSITORY__NAME": REPO,
            "FOREMAN_REPOSITORY__CHECKOUT_ROOT": str(settings.repository.checkout_root),
            **{f"FOREMAN_ROSTER__{login}": json.dumps(roles) for login, roles in settings.roster.items()},
        }

    async def call(
        self, login: str, method: str, path: str, body: Any = None, *, tick: bool = True, settle: bool = True
    ) -> Any:
        """One API call to the emulator as ``login``, then wait until foreman has handled every webhook."""
        if tick:
            self.clock.now += 1
        token = EXTRA_TOKENS.get(login) or TOKENS[login]
        async with self.live.session.request(
            method, self.live.api(f"/repos/{FULL_NAME}{path}"), json=body, headers={"Authorization": f"token {token}"}
        ) as resp:
            assert resp.status < 300, f"{method} {path}: {resp.status} {await resp.text()}"
            data = None if resp.status == 204 else await resp.json()
        if settle:
            await self.settle()
        return data

    async def settle(self, timeout: float = HANG_S) -> None:
        """Drain the emulator's webhooks, wait until foreman settled each, and until the outbox settled
        (repeat: the outbox's writes send more webhooks, and its completion hook may queue more entries)."""
        emu = self.live.emulator
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            await emu.drain_webhooks()
            pending = [d for d in emu.deliveries if d.url == self.webhook_url and d.delivery_id not in self.settled]
            for delivery in pending:
                assert delivery.ok, f"delivery {delivery.event_type} answered {delivery.status}: {delivery.error}"
                if json.loads(delivery.response_body).get("status") == "duplicate":
                    # Same body as a stored delivery (e.g. two identical label changes in one second).
                    self.settled.add(delivery.delivery_id)
                    continue
                await self.wait_settled(delivery.delivery_id, deadline)
            if not pending and await self.outbox_settled() and await self.triggers_settled():
                await emu.drain_webhooks()
                if all(d.delivery_id in self.settled for d in emu.deliveries if d.url == self.webhook_url):
                    return
                continue
            assert loop.time() < deadline, f"the outbox never settled: {await self.service.outbox.counts()}"
            await asyncio.sleep(0.01)

    async def outbox_settled(self) -> bool:
        """Nothing is being sent (or run through the completion hook) and nothing is due: every pending entry
        waits behind an earlier entry of its issue that failed (verification_failed or parked)."""
        sender = self.service.outbox_sender
        assert sender is not None
        if sender.in_flight:
            return False
        entries = sorted(await self.service.outbox.list(limit=10_000), key=lambda e: e.id)
        stuck: set[int] = set()
        for entry in entries:
            if entry.status in ("verification_failed", "parked"):
                stuck.add(entry.issue_number)
            elif entry.status == "sending" or (entry.status == "pending" and entry.issue_number not in stuck):
                return False
        return not sender.in_flight

    async def triggers_settled(self) -> bool:
        """Every auto-allocation foreman queued in its own inbox (bot/loops/triggers.py) ran, or failed for good."""
        from bot.loops.triggers import TRIGGER_PREFIX

        queued = [d for d in await self.service.store.list(limit=10_000) if d.delivery_id.startswith(TRIGGER_PREFIX)]
        return all(d.status not in ("queued", "processing", "retrying") for d in queued)

    async def label_sync_entries(self, number: int) -> list[OutboxEntry]:
        prefix = f"label-sync:{FULL_NAME}#{number}:"
        return sorted(
            (e for e in await self.service.outbox.list(limit=10_000) if e.key.startswith(prefix)), key=lambda e: e.id
        )

    async def wait_settled(self, delivery_id: str, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            row = await self.service.store.get(delivery_id)
            if row is not None and row.status in ("done", "ignored_self"):
                self.settled.add(delivery_id)
                return
            assert row is None or row.status != "failed", f"{delivery_id} failed: {row.last_error}"
            assert loop.time() < deadline, f"{delivery_id} never settled: {row}"
            await asyncio.sleep(0.01)

    async def open_issue(self, login: str = "alice", title: str = "Bootstrap the worktree") -> int:
        issue = await self.call(login, "POST", "/issues", {"title": title})
        return int(issue["number"])

    async def comment(self, login: str, number: int, body: str) -> int:
        comment = await self.call(login, "POST", f"/issues/{number}/comments", {"body": body})
        return int(comment["id"])

    async def snapshot(self, number: int) -> IssueSnapshot:
        found = await self.store.snapshot(FULL_NAME, number)
        assert found is not None
        return found

    def labels(self, number: int) -> list[str]:
        return self.live.emulator.label_names(OWNER, REPO, number)

    def label_id(self, name: str) -> int:
        repo = self.live.emulator.repo(OWNER, REPO)
        return next(label.id for label in repo.labels.values() if label.name == name)

    def bot_label_writes(self) -> int:
        return sum(
            1
            for r in self.live.emulator.requests
            if r.login == BOT and r.method != "GET" and "labels" in (r.route or "")
        )


@asynccontextmanager
async def open_world(
    tmp_path: Path,
    start: Started,
    *,
    roster: Mapping[str, Sequence[str]] | None = None,
    clone_protocol: str = "http",
    version: str | None = None,
    **sections: Unpack[Sections],
) -> AsyncIterator[World]:
    """The emulator with every roster user and the status labels, and a service receiving its webhooks.

    The bootstrap clones and fetches over git smart HTTP with the bot's token (the emulator's ``git
    http-backend``, as from a real Gitea); ``clone_protocol="file"`` keeps the bare repositories' ``file://``;
    ``version`` is the emulated Gitea's (its default without)."""
    clock = Clock()
    roster = {ROSTER_AUTHOR: ["author"]} if roster is None else roster
    options = {"version": version} if version is not None else {}
    async with live_emulator(clock=clock, clone_protocol=clone_protocol, **options) as live:
        emu = live.emulator
        seed_foreman(emu, {login: EXTRA_TOKENS[login] for login in roster if emu.find_user(login) is None})
        own = {key: value for key, value in sections.items() if key != "gitea"}
        settings = make_settings(
            tmp_path,
            **merged(emulator_sections(live.base_url), {"gitea": sections.get("gitea", {})}),
            roster=dict(roster),
            **merged({"worker": {"concurrency": 4},
                      "outbox": {"backoff_base_s": 0.01, "backoff_max_s": 0.05, "poll_interval_s": 0.05}}, own),
        )
        service, client = await start(settings)
        url = str(client.make_url("/webhook"))
        hook = emu.add_hook(OWNER, REPO, url=url, secret=SECRET, events=["issues"])
        yield World(live, service, client, hook, clock, url)
