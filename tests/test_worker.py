"""The worker: handler isolation, retries with backoff, parking as failed, replay, racing claims."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections import Counter
from pathlib import Path

import pytest
from gidgethub import routing, sansio

from bot.app import Service
from bot.cli import main
from bot.core import backoff
from bot.core.dispatch import OrderedRouter
from bot.core.intake import admit
from bot.handler_deps import HandlerDeps
from bot.worker import HandlerContext
from handlers import build_router
from state.db import Database
from state.deliveries import DeliveryStore
from tests.support import (
    SECRET,
    Started,
    eventually,
    make_settings,
    payload,
    recording_router,
    wait_status,
    webhook_headers,
)


def _flaky_router(calls: Counter[str], *, failures: int) -> routing.Router:
    """Two handlers on one event: `steady` always works, `flaky` fails `failures` times first."""
    router = routing.Router()

    @router.register("issues", action="opened")
    async def steady(event: sansio.Event, ctx: HandlerContext) -> None:
        calls["steady"] += 1

    @router.register("issues")
    async def flaky(event: sansio.Event, ctx: HandlerContext) -> None:
        calls["flaky"] += 1
        if calls["flaky"] <= failures:
            raise RuntimeError(f"flaky failure {calls['flaky']}")

    return router


async def _post(client: object, body: bytes, delivery: str) -> int:
    resp = await client.post("/webhook", data=body, headers=webhook_headers(body, delivery=delivery))  # type: ignore[attr-defined]
    return int(resp.status)


async def test_one_failing_handler_does_not_stop_its_sibling_and_is_retried_alone(
    tmp_path: Path, start: Started
) -> None:
    """A handler failure is logged, counted and retried without stopping or repeating siblings."""
    calls: Counter[str] = Counter()
    settings = make_settings(tmp_path, worker={"max_attempts": 5})
    service, client = await start(settings, build_router(_flaky_router(calls, failures=2)))
    assert await _post(client, payload(), "d-flaky") == 202
    await wait_status(service, "d-flaky", "done")
    assert calls == Counter({"steady": 1, "flaky": 3})
    row = await service.store.get("d-flaky")
    assert row is not None and row.attempts == 3
    results = {r["handler"].rsplit(".", 1)[-1]: r for r in await service.store.handler_results(row.pk)}
    assert results["steady"]["attempts"] == 1 and results["steady"]["status"] == "done"
    assert results["flaky"]["attempts"] == 3 and results["flaky"]["status"] == "done"
    text = service.metrics.render().decode()
    assert "foreman_handler_errors_total" in text and 'flaky"} 2.0' in text


async def test_a_delivery_that_keeps_failing_is_parked_then_replayed(tmp_path: Path, start: Started) -> None:
    """Failed deliveries retry with backoff, park as failed with the error, and can be replayed."""
    calls: Counter[str] = Counter()
    settings = make_settings(tmp_path, worker={"max_attempts": 3})
    service, client = await start(settings, build_router(_flaky_router(calls, failures=3)))
    await _post(client, payload(), "d-park")
    await wait_status(service, "d-park", "failed")
    row = await service.store.get("d-park")
    assert row is not None and row.attempts == 3
    assert row.last_error is not None and "flaky failure 3" in row.last_error
    assert calls == Counter({"steady": 1, "flaky": 3})
    replayed = await service.store.replay("d-park", requested_by="test")
    assert replayed.status == "queued"
    service.worker.wakeup.set()
    await wait_status(service, "d-park", "done")
    # The fourth call succeeds; the sibling that had finished is not run again.
    assert calls == Counter({"steady": 1, "flaky": 4})


async def test_racing_workers_process_each_delivery_exactly_once(
    tmp_path: Path, database_url: str | None, start: Started
) -> None:
    """Several worker loops claim concurrently; conditional claims give each delivery one run (SQLite and
    PostgreSQL)."""
    seen: Counter[str] = Counter()
    router = routing.Router()

    @router.register("issues")
    async def record(event: sansio.Event, ctx: HandlerContext) -> None:
        await asyncio.sleep(random.uniform(0, 0.01))
        seen[event.delivery_id] += 1

    database = {} if database_url is None else {"database": {"url": database_url}}
    settings = make_settings(tmp_path, worker={"concurrency": 4}, **database)
    service, client = await start(settings, build_router(router))
    ids = [f"race-{i}" for i in range(40)]
    statuses = await asyncio.gather(*(_post(client, payload(number=i + 1), d) for i, d in enumerate(ids)))
    assert set(statuses) == {202}
    for delivery in ids:
        await wait_status(service, delivery, "done")
    assert seen == Counter({d: 1 for d in ids})


def test_backoff_grows_exponentially_with_jitter_and_is_capped() -> None:
    """Retries back off exponentially, with jitter, never past the ceiling."""
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(30.0, 1.0 * 2 ** (attempt - 1))
        delays = [backoff.delay(attempt, base=1.0, cap=30.0, jitter="full", rng=rng) for _ in range(200)]
        assert all(0.5 <= d <= max(0.5, ceiling) for d in delays)
        if ceiling >= 4:
            assert max(delays) - min(delays) > ceiling / 4, "no jitter"
    assert backoff.delay(50, base=1.0, cap=30.0, jitter="full", rng=rng) <= 30.0


def _seed_failed_delivery(db_path: Path) -> None:
    async def seed() -> None:
        db = await Database.open(db_path, synchronous="NORMAL")
        store = DeliveryStore(db)
        body = payload()
        admitted = admit(webhook_headers(body, delivery="cli-1"), body, secrets=[SECRET.encode()], max_body_bytes=10**6)
        assert not hasattr(admitted, "status")
        await store.insert_batch([(admitted, False)])
        claimed = await store.claim_next("w")
        assert claimed is not None
        await store.park_failed(claimed.pk, "w", error="RuntimeError: boom")
        await db.close()

    asyncio.run(seed())


def test_cli_lists_failed_deliveries_and_replays_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`foreman deliveries --status failed` shows parked deliveries; `foreman replay ID` requeues."""
    settings = make_settings(tmp_path)
    _seed_failed_delivery(settings.database.path)
    monkeypatch.setenv("FOREMAN_DATABASE__PATH", str(settings.database.path))
    monkeypatch.setenv("FOREMAN_WEBHOOK__SECRETS", json.dumps([SECRET]))
    empty = tmp_path / "empty.toml"  # a missing config file now refuses; the environment sets all
    empty.write_text("", encoding="utf-8")
    monkeypatch.setenv("FOREMAN_CONFIG", str(empty))
    assert main(["deliveries", "--status", "failed", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["delivery"], row["status"], row["last_error"]) == ("cli-1", "failed", "RuntimeError: boom")
    assert main(["replay", "cli-1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "queued"
    # Replaying a queued delivery is refused with a structured envelope and exit 1.
    assert main(["replay", "cli-1"]) == 1
    refusal = json.loads(capsys.readouterr().out)
    assert refusal["error"] == "invalid_state" and refusal["exact_next_action"]
    assert main(["deliveries", "--status", "failed", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def _label_updated() -> sansio.Event:
    data = json.loads(payload("label_updated"))
    return sansio.Event(data, event="issues", delivery_id="order-0")


def test_the_issue_state_records_a_label_change_before_auto_allocation_acts_on_it() -> None:
    """The declared feature order, not the handlers' names, orders one delivery's handlers: the issue state
    records ``status:ready`` before auto-allocation acts on it (foreman demo's 'candidate' step raced before);
    declaring the features the other way round turns the order round."""
    from handlers import auto_allocate, issue_state

    declared = build_router().handlers_for(_label_updated())
    assert declared == (issue_state.on_issue_event, auto_allocate.on_ready_label)
    reversed_router = OrderedRouter(auto_allocate.router, issue_state.router)
    assert reversed_router.handlers_for(_label_updated()) == (auto_allocate.on_ready_label, issue_state.on_issue_event)


def _recording(order: list[str], name: str, *, fails: bool = False) -> OrderedRouter:
    router = OrderedRouter()

    @router.register("issues")
    async def handler(event: sansio.Event, ctx: HandlerContext) -> None:
        order.append(name)
        if fails:
            raise RuntimeError(f"{name} failed")

    handler.__qualname__ = f"{name}_handler"  # one name per handler: the worker records results by name
    return router


@pytest.mark.parametrize("declared", [("records", "acts"), ("acts", "records")])
async def test_the_worker_runs_handlers_in_the_declared_order_each_isolated(
    start: Started, declared: tuple[str, str]
) -> None:
    """The worker runs a delivery's handlers feature by feature as declared, whatever their names; the first
    failing does not stop the second."""
    order: list[str] = []
    first, second = declared
    router = OrderedRouter(_recording(order, first, fails=True), _recording(order, second))
    service, client = await start(router=router)
    body = payload()
    await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="order-1"))

    async def failed() -> bool:
        return bool((row := await service.store.get("order-1")) is not None and row.last_error)

    await eventually(failed, "the first handler's failure recorded", poll_s=0.01)
    row = await service.store.get("order-1")
    assert row is not None and row.last_error == f"tests.test_worker.{first}_handler: RuntimeError: {first} failed"
    assert order[:2] == [first, second]


def test_within_one_feature_handlers_keep_their_registration_order() -> None:
    """A feature's own handlers of one event run in the order it registered them, shallow or by action."""
    router = OrderedRouter()

    @router.register("issues", action="label_updated")
    async def z_first(event: sansio.Event, ctx: HandlerContext) -> None: ...

    @router.register("issues")
    async def a_second(event: sansio.Event, ctx: HandlerContext) -> None: ...

    assert OrderedRouter(router).handlers_for(_label_updated()) == (z_first, a_second)


async def test_handlers_get_typed_frozen_dependencies_and_never_the_service(start: Started) -> None:
    """Handlers see settings, database, Gitea client, bot login and the outbox wake-up, typed and frozen; nothing
    in them is the Service, and no handler can stash state in them."""
    seen: list[HandlerDeps] = []
    service, client = await start(router=recording_router(seen, lambda event, ctx: ctx.deps))
    body = payload()
    await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="deps-1"))
    await wait_status(service, "deps-1", "done")
    [deps] = seen
    assert isinstance(deps, HandlerDeps)
    assert (deps.settings, deps.db, deps.gitea, deps.bot_login()) == (service.settings, service.db, None, "foreman-bot")
    assert not any(isinstance(getattr(deps, f.name), Service) for f in dataclasses.fields(deps))
    with pytest.raises(dataclasses.FrozenInstanceError):
        deps.gitea = None  # type: ignore[misc]
    with pytest.raises((AttributeError, TypeError)):
        deps.cache = {}  # type: ignore[attr-defined]
