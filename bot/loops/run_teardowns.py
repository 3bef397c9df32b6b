"""The reserved teardown by itself: every run whose grant expired, or that was aborted or failed, is torn down once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from bot.config import Settings
from bot.core.grants.admission import teardown_due
from bot.core.verbs import TOOLS
from bot.loops.teardown import remove_run_worktree
from bot.verbs.runs.broker import Broker
from bot.verbs.runs.inspect import run_teardown
from bot.verbs.runs.start import host_identity
from bot.verbs.runtime import Caller, VerbResult, caller_for
from state.db import Database, utcnow
from state.grants import GrantIntegrityError, GrantStore

log = logging.getLogger("foreman.grants")


class Door(Protocol):
    """The one door the teardown's call goes through (``bot.verbs.runtime.VerbRuntime``)."""

    async def call(self, verb_name: str, caller: Caller, arguments: Mapping[str, object]) -> VerbResult: ...


async def run_due_teardowns(
    db: Database, settings: Settings, door: Door, *, now: datetime | None = None,
    host: Callable[[], str] | None = None, refused: set[str] | None = None, served: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Run the reserved teardown of every run that is due (``teardown_due``), as ``foreman run teardown`` does:
    admitted by the run's broker, called through the door as the run's owner with the compiled arguments, settled.
    The broker's state makes it once: an admitted teardown is never pending again (a crash in between leaves it
    in flight, for an operator's reconciliation, never for a second run). A run sealed on another host is that
    host's to tear down; a teardown the broker refused (e.g. the issue's worktree is no longer the bound one) is
    added to ``refused`` and not tried again by this process (each try would record one more denial).

    ``served``: every repository this process serves (first first). A due run of none of them has no loop to tear
    it down: the first repository's loop logs it once (and adds it to ``refused``); `foreman grants` names it."""
    store = GrantStore(db)
    moment = now or utcnow()
    this_host = host or (lambda: host_identity(settings.database.path))
    skip = refused if refused is not None else set()
    reports: list[dict[str, Any]] = []
    for record in await store.pending_teardowns():
        try:
            grant = await store.grant(record.run_id)
        except GrantIntegrityError:
            log.error("run %s: its stored grant fails its digest; its teardown is left to an operator", record.run_id)
            continue
        if grant is None or record.run_id in skip or not teardown_due(grant, record.state, moment):
            continue
        if grant.repo != settings.repo_key:  # another served repository's run: its own loop tears it down
            if served and grant.repo not in served and settings.repo_key == served[0]:
                skip.add(record.run_id)
                log.warning("run %s acts for %s, which no configured repository serves: no teardown loop runs it;"
                            " serve %s again ([[repositories]]) or `foreman run teardown %s` with a config that"
                            " serves it", record.run_id, grant.repo, grant.repo, record.run_id)
            continue
        if grant.host_id != this_host():
            skip.add(record.run_id)
            log.warning("run %s was sealed on %s: its teardown is that host's (or `foreman run teardown` there)",
                        record.run_id, grant.host_id)
            continue
        broker = Broker(store, record.run_id, host=this_host, clock=lambda: moment)
        caller = caller_for(settings, grant.owner, "mcp")

        async def run_tool(
            tool: str, arguments: dict[str, Any], caller: Caller = caller
        ) -> tuple[bool, dict[str, Any]]:
            result = await door.call(TOOLS[tool].name, caller, arguments)
            return result.ok, result.doc

        report = await run_teardown(broker, run_tool)
        if report.get("refusal") is not None:
            skip.add(record.run_id)
        if report["ok"] and settings.lifecycle.remove_worktree_on_run_teardown:
            report["worktree"] = await remove_run_worktree(
                db, settings, grant.issue_number, bot_login=settings.gitea.bot_login or "",
                reason=f"run {record.run_id} ({record.state.outcome or 'expired'})",
            )
        log.info("run %s (%s): reserved teardown ran by itself: %s", record.run_id,
                 record.state.outcome or "expired", "ok" if report["ok"] else report.get("refusal") or "failed")
        reports.append(report)
    return reports


class TeardownLoop:
    """The service's check for due teardowns: once at start-up (a grant may have expired while it was down), then
    every ``interval_s`` (0: start-up only). Expiry is the passing of time, which no webhook or call announces."""

    def __init__(self, db: Database, settings: Settings, door: Door, *, interval_s: float,
                 on_ran: Callable[[], None] | None = None, served: Sequence[str] = ()) -> None:
        self._db, self._settings, self._door = db, settings, door
        #: every repository the process serves (``run_due_teardowns``)
        self.served = tuple(served)
        self.interval_s = interval_s
        self._on_ran = on_ran
        self._task: asyncio.Task[None] | None = None
        self.passes = 0
        #: runs whose teardown this process may not run (another host's, or refused by the broker)
        self.refused: set[str] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="run-teardowns")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run_once(self) -> list[dict[str, Any]]:
        try:
            reports = await run_due_teardowns(self._db, self._settings, self._door, refused=self.refused,
                                              served=self.served)
        except Exception:
            log.exception("checking for due run teardowns failed (the next check runs them)")
            return []
        finally:
            self.passes += 1
        if reports and self._on_ran is not None:
            self._on_ran()
        return reports

    async def _loop(self) -> None:
        await self.run_once()
        while self.interval_s > 0:
            await asyncio.sleep(self.interval_s)
            await self.run_once()
