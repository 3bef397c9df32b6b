"""Fail closed in dispatch and the worker: only the served repository acts; no bad delivery ends a loop."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gidgethub import sansio

from bot.core.dispatch import OrderedRouter
from bot.worker import HandlerContext
from state.deliveries import DeliveryStore
from tests.serve_support import serve_process
from tests.support import Started, payload, wait_status, webhook_headers

pytestmark = [pytest.mark.process]


def recording_router(calls: list[str]) -> OrderedRouter:
    router = OrderedRouter()

    @router.register("issues")
    async def record(event: sansio.Event, ctx: HandlerContext) -> None:
        calls.append(event.delivery_id)

    return router


def foreign_ready_label(number: int = 7) -> bytes:
    """Seed 000's incident shape: a signed status:ready label for another repository."""
    return json.dumps(
        {
            "action": "label_updated",
            "number": number,
            "issue": {"id": 9000 + number, "number": number, "title": "theirs", "state": "open",
                      "labels": [{"id": 1, "name": "status:ready"}]},
            "repository": {"id": 99, "name": "other", "full_name": "elsewhere/other", "owner": {"login": "elsewhere"}},
            "sender": {"id": 7, "login": "maintainer", "username": "maintainer"},
            "commit_id": "",
        },
        indent=2,
    ).encode()

# --- served repository only -------------------------------------------------------------------------------------------


async def test_an_event_for_another_repository_reaches_no_handler_and_is_recorded_ignored(start: Started) -> None:
    """Org- and system-level hooks send every repository's events; only the served one acts."""
    calls: list[str] = []
    service, client = await start(router=recording_router(calls))
    body = foreign_ready_label()
    resp = await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="foreign-1"))
    assert resp.status == 202
    await wait_status(service, "foreign-1", "ignored")
    row = await service.store.get("foreign-1")
    assert row is not None and row.ignored_reason is not None
    assert row.ignored_reason.startswith("foreign_repository") and "elsewhere/other" in row.ignored_reason
    ours = payload("label_updated")
    await client.post("/webhook", data=ours, headers=webhook_headers(ours, delivery="ours-1"))
    await wait_status(service, "ours-1", "done")
    assert calls == ["ours-1"]


async def test_the_served_repository_is_matched_without_regard_to_case(start: Started) -> None:
    """Gitea owner and repository names are case-insensitive: ORG/Repo is org/repo."""
    calls: list[str] = []
    service, client = await start(router=recording_router(calls))
    doc = json.loads(payload())
    doc["repository"]["full_name"] = "ORG/Repo"
    body = json.dumps(doc, indent=2).encode()
    await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="case-1"))
    await wait_status(service, "case-1", "done")
    assert calls == ["case-1"]


async def test_a_payload_without_a_repository_is_ignored_with_its_reason(start: Started) -> None:
    calls: list[str] = []
    service, client = await start(router=recording_router(calls))
    body = json.dumps({"action": "opened", "sender": {"login": "alice"}}).encode()
    await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="norepo-1"))
    await wait_status(service, "norepo-1", "ignored")
    row = await service.store.get("norepo-1")
    assert row is not None and row.ignored_reason is not None and row.ignored_reason.startswith("no_repository")
    assert calls == []


async def test_a_forced_replay_of_an_ignored_delivery_is_checked_again(start: Started) -> None:
    """The check sits before the handlers, not at intake: a replay cannot carry a foreign event past it."""
    calls: list[str] = []
    service, client = await start(router=recording_router(calls))
    body = foreign_ready_label()
    await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="foreign-2"))
    await wait_status(service, "foreign-2", "ignored")
    await service.store.replay("foreign-2", requested_by="test", force=True)
    service.worker.wakeup.set()
    await asyncio.sleep(0.2)
    await wait_status(service, "foreign-2", "ignored")
    assert calls == []


# --- loops never die, a delivery settles once -------------------------------------------------------------------------


async def test_an_unroutable_action_is_parked_failed_and_every_loop_lives(start: Started) -> None:
    """`"action": []` used to raise outside the handler isolation and kill each loop in turn."""
    calls: list[str] = []
    service, client = await start(router=recording_router(calls))
    for i in range(service.settings.worker.concurrency * 2):
        doc = json.loads(payload(number=100 + i))
        doc["action"] = [] if i % 2 == 0 else {"x": 1}
        body = json.dumps(doc, indent=2).encode()
        await client.post("/webhook", data=body, headers=webhook_headers(body, delivery=f"bad-{i}"))
    for i in range(service.settings.worker.concurrency * 2):
        await wait_status(service, f"bad-{i}", "failed")
        row = await service.store.get(f"bad-{i}")
        assert row is not None and row.last_error is not None and "undispatchable" in row.last_error
        assert row.attempts == 1  # parked at once: retrying cannot route it
    good = payload()
    await client.post("/webhook", data=good, headers=webhook_headers(good, delivery="good-1"))
    await wait_status(service, "good-1", "done")
    assert calls == ["good-1"]
    assert service.worker.loops_alive() == service.settings.worker.concurrency
    ready = await (await client.get("/readyz")).json()
    assert ready["ready"] is True and ready["checks"]["worker"]["loops_alive"] == service.settings.worker.concurrency


async def test_a_settling_commit_that_fails_is_retried_and_the_loop_lives(
    start: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed settle commit (disk full) used to kill its loop for good."""
    service, client = await start()
    real_finish = DeliveryStore.finish
    failures = {"left": 3}

    async def flaky_finish(self: DeliveryStore, *args: Any, **kwargs: Any) -> bool:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise sqlite3.OperationalError("database or disk is full")
        return await real_finish(self, *args, **kwargs)

    monkeypatch.setattr(DeliveryStore, "finish", flaky_finish)
    body = payload()
    await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="full-1"))
    await wait_status(service, "full-1", "done")
    assert failures["left"] == 0
    assert service.worker.loops_alive() == service.settings.worker.concurrency
    text = (await (await client.get("/metrics")).read()).decode()
    assert re.search(r"^foreman_worker_loop_errors_total [3-9]", text, re.M), text
    assert f"foreman_worker_loops_alive {float(service.settings.worker.concurrency)}" in text


async def test_a_real_serve_survives_unroutable_deliveries(tmp_path: Path) -> None:
    """Against a real `foreman serve`: bad deliveries beside good ones; /readyz stays 200."""
    async with serve_process(tmp_path, serve=True) as proc:
        async with aiohttp.ClientSession() as session:
            for i in range(12):
                doc = json.loads(payload(number=i + 1))
                if i % 3 == 0:
                    doc["action"] = []
                body = json.dumps(doc, indent=2).encode()
                async with session.post(
                    f"{proc.url}/webhook", data=body, headers=webhook_headers(body, delivery=f"d-{i}")
                ) as resp:
                    assert resp.status == 202
            await proc.wait_for(
                lambda: all((status := proc.status(f"d-{i}")) is not None and status[0] in ("done", "failed")
                            for i in range(12)),
                "every delivery settled",
            )
            assert [proc.status(f"d-{i}")[0] for i in range(12)] == [  # type: ignore[index]
                "failed" if i % 3 == 0 else "done" for i in range(12)
            ]
            await asyncio.sleep(1.5)  # several claim TTLs (0.6 s): a dead loop would show by now
            async with session.get(f"{proc.url}/readyz") as resp:
                doc = await resp.json()
                assert resp.status == 200, doc
                assert doc["checks"]["worker"]["loops_alive"] == doc["checks"]["worker"]["loops"]


async def test_a_pass_that_raises_does_not_end_its_loop(start: Started, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever one pass of a loop raises (here: reading finished handlers), the loop lives on."""
    calls: list[str] = []
    service, client = await start(router=recording_router(calls))
    real = DeliveryStore.done_handlers
    failures = {"left": 2}

    async def flaky(self: DeliveryStore, pk: int) -> set[str]:
        if failures["left"] > 0:
            failures["left"] -= 1
            raise sqlite3.OperationalError("disk I/O error")
        return await real(self, pk)

    monkeypatch.setattr(DeliveryStore, "done_handlers", flaky)
    body = payload()
    await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="pass-1"))
    await wait_status(service, "pass-1", "done")
    assert calls == ["pass-1"] and failures["left"] == 0
    assert service.worker.loops_alive() == service.settings.worker.concurrency


async def test_a_retried_settle_runs_the_handler_once_and_records_its_result_first(
    start: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The settle commit is retried (not left to the reaper), and before the retry the handler's
    result is recorded on its own, so a shutdown during the retries never runs a finished handler again."""
    calls: list[str] = []
    service, client = await start(router=recording_router(calls))
    real_finish = DeliveryStore.finish
    seen_recorded: list[set[str]] = []

    async def flaky_finish(self: DeliveryStore, pk: int, *args: Any, **kwargs: Any) -> bool:
        seen_recorded.append(await self.done_handlers(pk))
        if len(seen_recorded) < 3:
            raise sqlite3.OperationalError("database or disk is full")
        return await real_finish(self, pk, *args, **kwargs)

    monkeypatch.setattr(DeliveryStore, "finish", flaky_finish)
    body = payload()
    await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="settle-1"))
    await wait_status(service, "settle-1", "done")
    row = await service.store.get("settle-1")
    assert row is not None and row.attempts == 1  # retried in place, never reclaimed and run again
    assert calls == ["settle-1"]
    handler = "tests.test_fail_closed.recording_router.<locals>.record"
    assert seen_recorded[0] == set() and handler in seen_recorded[1]
    assert not service.worker.settles_retrying


def test_backoff_stays_finite_however_many_attempts() -> None:
    """A settle retried for days must not overflow the backoff (2**1024 is past a float)."""
    from bot.core import backoff

    assert 0 < backoff.delay(5_000, base=0.5, cap=300.0, jitter="full") <= 300.0


async def test_each_loop_claims_under_its_own_id(start: Started) -> None:
    """Settles are conditional on the claim's owner: two loops of one worker must not share it."""
    gate = asyncio.Event()
    router = OrderedRouter()

    @router.register("issues")
    async def hold(event: sansio.Event, ctx: HandlerContext) -> None:
        await gate.wait()

    service, client = await start(router=router)
    for i in range(2):
        body = payload(number=i + 1)
        await client.post("/webhook", data=body, headers=webhook_headers(body, delivery=f"own-{i}"))
    for i in range(2):
        await wait_status(service, f"own-{i}", "processing")
    async with service.db.reader.execute("SELECT claimed_by FROM deliveries ORDER BY id") as cur:
        owners = [row[0] for row in await cur.fetchall()]
    gate.set()
    assert len(set(owners)) == 2 and all(o.startswith(service.worker.worker_id) for o in owners), owners
    for i in range(2):
        await wait_status(service, f"own-{i}", "done")
