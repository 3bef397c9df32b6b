"""Gitea's system webhooks against a real `foreman serve`: one admin hook brings every repository's events."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from bot.config_writer import write_config
from tests.gitea_fixtures import OWNER, REPO, LiveEmulator, live_emulator, scratch_dir
from tests.support import SECRET, serve_config
from tests.test_process import ServeProcess

WIDGETS = f"{OWNER}/{REPO}"
#: A repository owned by a user, not by the organization: an org hook never sees it, a system hook does.
STRAY_OWNER, STRAY = "alice", "scratch"


class SystemHooked:
    """A live emulator with one system hook pointing at a `foreman serve` that serves acme/widgets only."""

    def __init__(self, live: LiveEmulator, proc: ServeProcess) -> None:
        self.live, self.emu, self.proc = live, live.emulator, proc

    def db(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.proc.db) as conn:
            return conn.execute(sql, params).fetchall()

    async def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}; stderr tail: {self.proc.stderr.read_text()[-3000:]}")

    def deliveries_of(self, full_name: str) -> list[tuple[str, str | None, dict[str, str]]]:
        """(status, ignored_reason, headers) of every stored delivery whose payload names ``full_name``."""
        return [(status, reason, json.loads(headers)) for status, reason, headers, body in
                self.db("SELECT status, ignored_reason, headers_json, body FROM deliveries ORDER BY id")
                if json.loads(body)["repository"]["full_name"] == full_name]


@pytest.fixture
async def system_hooked() -> AsyncIterator[SystemHooked]:
    root = scratch_dir("foreman-system-hook-")
    async with live_emulator(clone_protocol="http") as live:
        emu = live.emulator
        emu.create_repo(STRAY_OWNER, STRAY, files={"README.md": "# scratch\n"})
        proc = ServeProcess(root, module="bot", config=root / "foreman.toml")
        write_config(proc.config, serve_config(proc.port, proc.db, live.base_url, root, {
            "reconcile": {"interval_s": 0, "overlap_s": 5},
        }))
        emu.add_system_hook(url=f"{proc.url}/webhook", secret=SECRET, events=["issues", "issue_comment"])
        try:
            yield SystemHooked(live, proc)
        finally:
            if proc.proc is not None and proc.proc.returncode is None:
                await proc.kill()
            shutil.rmtree(root, ignore_errors=True)


async def test_a_system_hook_brings_a_configured_repository_handled_and_another_ignored_with_its_reason(
    system_hooked: SystemHooked,
) -> None:
    t = system_hooked
    await t.proc.start("serve", "--config", str(t.proc.config))
    served = t.emu.create_issue(OWNER, REPO, title="Served work", author="alice", notify=True)
    stray = t.emu.create_issue(STRAY_OWNER, STRAY, title="Nobody serves this", author="alice", notify=True)
    sent = await t.emu.drain_webhooks()
    # The emulator sent both through the one system hook (no repository or org hook exists), marked `system`.
    assert {d.payload["repository"]["full_name"] for d in sent} == {WIDGETS, f"{STRAY_OWNER}/{STRAY}"}
    assert all(d.ok and d.headers["X-Gitea-Hook-Installation-Target-Type"] == "system" for d in sent)

    await t.wait(lambda: bool(t.db("SELECT 1 FROM issues WHERE repo = ? AND number = ?", (WIDGETS, served.number)))
                 and all(status == "done" for status, _, _ in t.deliveries_of(WIDGETS)),
                 "the configured repository's delivery handled")
    handled = t.deliveries_of(WIDGETS)
    assert handled and all(reason is None for _, reason, _ in handled)
    assert handled[0][2].get("X-Gitea-Hook-Installation-Target-Type") == "system"

    ignored = t.deliveries_of(f"{STRAY_OWNER}/{STRAY}")
    assert ignored and all(status == "ignored" for status, _, _ in ignored)
    assert all(reason is not None and reason.startswith("foreign_repository") and f"{STRAY_OWNER}/{STRAY}" in reason
               for _, reason, _ in ignored)
    assert not t.db("SELECT 1 FROM issues WHERE repo = ?", (f"{STRAY_OWNER}/{STRAY}",))
    assert not [c for c in t.emu.issue(STRAY_OWNER, STRAY, stray.number).comments]
