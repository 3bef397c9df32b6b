"""Fail closed: one bad input never stops, freezes or fails anyone else's work, against real services."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from gidgethub import sansio

from bot.core.canonical import HEADING_TEXT, MAX_BLOCKS, MAX_COMMENT_CHARS, parse_comment
from bot.core.dispatch import OrderedRouter
from bot.core.intake import Delivery, admit
from bot.worker import HandlerContext
from state.deliveries import DeliveryStore
from tests.support import SECRET, Started, payload, sign, wait_status, webhook_headers
from tests.test_process import ServeProcess

# --- helpers ----------------------------------------------------------------------------------------------------------


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


# --- item 2: served repository only -----------------------------------------------------------------------------------


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


# --- item 3: loops never die ------------------------------------------------------------------------------------------


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
    await wait_status(service, "full-1", "done", timeout=20)
    assert failures["left"] == 0
    assert service.worker.loops_alive() == service.settings.worker.concurrency
    text = (await (await client.get("/metrics")).read()).decode()
    assert re.search(r"^foreman_worker_loop_errors_total [3-9]", text, re.M), text
    assert f"foreman_worker_loops_alive {float(service.settings.worker.concurrency)}" in text


async def test_a_real_serve_survives_unroutable_deliveries(tmp_path: Path) -> None:
    """Against a real `foreman serve`: bad deliveries beside good ones; /readyz stays 200."""
    proc = ServeProcess(tmp_path, module="bot")
    await proc.start("serve", "--config", str(proc.config))
    try:
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
                lambda: all(proc.status(f"d-{i}") is not None and proc.status(f"d-{i}")[0] in ("done", "failed")
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
    finally:
        await proc.kill()


# --- item 4: a bad row alone ------------------------------------------------------------------------------------------


async def test_a_bad_header_beside_valid_deliveries_fails_only_itself(tmp_path: Path) -> None:
    """A non-UTF-8 X-Gitea-Event beside valid deliveries used to fail the whole group commit."""
    proc = ServeProcess(tmp_path, module="bot")
    await proc.start("serve", "--config", str(proc.config))
    try:
        bodies = {f"ok-{i}": payload(number=i + 1) for i in range(120)}
        bad_body = payload(number=999)
        surrogate = json.loads(payload(number=998))
        surrogate_body = json.dumps(surrogate, indent=2).replace('"opened"', '"open\\ud800ed"').encode()

        async def good(delivery: str, body: bytes) -> tuple[int, dict[str, Any]]:
            return await raw_post(proc.port, signed_headers(body, delivery=delivery), body)

        tasks = [good(d, b) for d, b in bodies.items()]
        tasks.insert(40, raw_post(proc.port, signed_headers(bad_body, event=b"issu\xff\xfees", delivery="bad-h"),
                                  bad_body))
        tasks.insert(80, raw_post(proc.port, signed_headers(surrogate_body, delivery="bad-s"), surrogate_body))
        results = await asyncio.gather(*tasks)
        bad_s, bad_h = results.pop(80), results.pop(40)
        assert bad_h[0] == 400 and bad_h[1]["error"] == "bad_header"
        assert bad_s[0] == 400 and bad_s[1]["error"] == "malformed_json"
        assert [r[0] for r in results] == [202] * len(bodies)
        assert sorted(r[1]["delivery"] for r in results) == sorted(bodies)  # each 202 names its own request
        with sqlite3.connect(proc.db) as conn:
            stored = {row[0] for row in conn.execute("SELECT delivery_id FROM deliveries")}
        assert stored == set(bodies)
    finally:
        await proc.kill()


async def test_the_writer_stores_each_row_alone_when_the_batch_fails(start: Started) -> None:
    """The class behind 12.4: a row that admission let through but the database refuses fails alone."""
    service, _client = await start()
    good = [admit(webhook_headers(b, delivery=f"w-{i}"), b, secrets=[SECRET.encode()], max_body_bytes=10**6)
            for i, b in enumerate(payload(number=n + 1) for n in range(5))]
    assert all(isinstance(d, Delivery) for d in good)
    first = good[0]
    assert isinstance(first, Delivery)
    unstorable = Delivery(  # a lone surrogate cannot be bound as UTF-8 text: the batch's INSERT raises
        delivery_id="w-bad", event="iss\udcffues", event_type=None, action=None, sender_login=None,
        body=b"{}", body_sha256="0" * 64, headers={}, payload={},
    )
    futures = [asyncio.ensure_future(service.writer.submit(d, False)) for d in [*good[:2], unstorable, *good[2:]]]
    done = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(done[2], Exception)
    assert [getattr(r, "outcome", None) for i, r in enumerate(done) if i != 2] == ["queued"] * 5


async def test_each_acknowledgement_belongs_to_its_own_request(start: Started) -> None:
    """A duplicate by body must not take the row of a later delivery that reuses its id (one batch)."""
    service, _client = await start()
    body_a, body_b = payload(number=1), payload(number=2)
    first = admit(webhook_headers(body_a, delivery="X"), body_a, secrets=[SECRET.encode()], max_body_bytes=10**6)
    same_body = admit(webhook_headers(body_a, delivery="Y"), body_a, secrets=[SECRET.encode()], max_body_bytes=10**6)
    same_id = admit(webhook_headers(body_b, delivery="Y"), body_b, secrets=[SECRET.encode()], max_body_bytes=10**6)
    assert isinstance(first, Delivery) and isinstance(same_body, Delivery) and isinstance(same_id, Delivery)
    results = await service.store.insert_batch([(first, False), (same_body, False), (same_id, False)])
    assert [r.outcome for r in results] == ["queued", "duplicate", "queued"]
    row = await service.store.get("Y")
    assert row is not None and results[2].pk == row.pk and row.body == body_b


# --- item 5: linear parsing, no freeze --------------------------------------------------------------------------------


def _hostile_heading(size: int) -> str:
    return "# a" + " " * size + "x"


def test_the_heading_check_is_linear_in_the_line() -> None:
    """The ATX closing-sequence regex was quadratic (48 KB held the loop ~18 s).

    A ratio, not a time: 16x the input may cost at most ~4x of 16x (quadratic would be 256x)."""
    def cost(size: int) -> float:
        text = _hostile_heading(size)
        best = float("inf")
        for _ in range(5):
            began = time.perf_counter()
            parse_comment(text)
            best = min(best, time.perf_counter() - began)
        return best

    small, large = cost(4_000), cost(64_000)
    assert large < max(small, 1e-5) * 64, (small, large)


async def test_a_hostile_comment_does_not_freeze_a_real_serve(tmp_path: Path) -> None:
    """Against a real `foreman serve`: a 48 KB hostile comment; /healthz answers throughout."""
    proc = ServeProcess(tmp_path, module="bot")
    await proc.start("serve", "--config", str(proc.config))
    try:
        doc = json.loads(payload())
        doc.update(action="created", comment={"id": 5, "body": _hostile_heading(48_000), "user": {"login": "reader"},
                                                 "created_at": "2026-12-01T10:00:00Z",
                                                 "updated_at": "2026-12-01T10:00:00Z"})
        body = json.dumps(doc, indent=2).encode()
        async with aiohttp.ClientSession() as session:
            headers = webhook_headers(body, event="issue_comment", delivery="hostile-1")
            async with session.post(f"{proc.url}/webhook", data=body, headers=headers) as resp:
                assert resp.status == 202
            worst = 0.0
            while proc.status("hostile-1") is None or proc.status("hostile-1")[0] != "done":  # type: ignore[index]
                began = time.perf_counter()
                async with session.get(f"{proc.url}/healthz", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    assert resp.status == 200
                worst = max(worst, time.perf_counter() - began)
                await asyncio.sleep(0.01)
            async with session.get(f"{proc.url}/metrics") as resp:
                text = await resp.text()
        assert worst < 0.1, worst
        lag = float(re.search(r"^foreman_event_loop_lag_max_seconds (\S+)", text, re.M).group(1))  # type: ignore[union-attr]
        assert lag < 0.05, lag
    finally:
        await proc.kill()


# --- item 6: metric labels --------------------------------------------------------------------------------------------


async def test_unsigned_requests_never_mint_metric_series(start: Started) -> None:
    """Labels came from unsigned headers (3,000 requests, 3,000 series; `\\xff` broke /metrics)."""
    _service, client = await start()
    before = (await (await client.get("/metrics")).read()).count(b"\n")
    for i in range(300):
        body = b"{}"
        await client.post("/webhook", data=body, headers={"Content-Type": "application/json",
                                                           "X-Gitea-Event": f"evil-{i}", "X-Gitea-Delivery": str(i),
                                                           "X-Gitea-Signature": "00"})
    status, _ = await raw_post(client.port or 0, [(b"Content-Type", b"application/json"), (b"X-Gitea-Event", b"\xff"),
                                                  (b"X-Gitea-Delivery", b"1"), (b"X-Gitea-Signature", b"00")], b"{}")
    assert status == 401
    resp = await client.get("/metrics")
    assert resp.status == 200
    text = await resp.text()
    assert "evil-" not in text
    assert text.count("\n") - before <= 4  # one new series (unverified, rejected_401) and its help lines at most


async def test_a_signed_unknown_event_is_counted_as_other(start: Started) -> None:
    _service, client = await start()
    body = payload()
    await client.post("/webhook", data=body, headers=webhook_headers(body, event="made_up_event", delivery="u-1"))
    text = await (await client.get("/metrics")).text()
    assert 'event="made_up_event"' not in text and 'event="other",outcome="queued"' in text


# --- item 7: typed refusals -------------------------------------------------------------------------------------------


def _signed(body: bytes, **extra: str) -> dict[str, str]:
    return {**webhook_headers(body, delivery=f"t-{hash(body)}"), **extra}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"[" * 1000 + b"]" * 1000, "malformed_json"),
        (b'{"a":' * 1000 + b"1" + b"}" * 1000, "malformed_json"),
        (b'{"n": ' + b"7" * 5000 + b"}", "malformed_json"),
        (b'{"n": NaN}', "malformed_json"),
        (b'{"n": Infinity}', "malformed_json"),
        (b'{"n": -Infinity}', "malformed_json"),
        (b'{"s": "\\udc00"}', "malformed_json"),
        (b'{"\\ud800": 1}', "malformed_json"),
        (b'\xff{"a": 1}', "malformed_json"),
    ],
    ids=["deep-array", "deep-object", "5000-digits", "nan", "infinity", "-infinity", "lone-surrogate",
         "surrogate-key", "not-utf8"],
)
async def test_hostile_json_gets_a_typed_400(start: Started, body: bytes, error: str) -> None:
    """Deep nesting, huge integers, NaN/Infinity gave 500s or were accepted."""
    service, client = await start()
    resp = await client.post("/webhook", data=body, headers=_signed(body))
    assert resp.status == 400
    doc = await resp.json()
    assert doc["error"] == error and doc["message"]
    assert await service.store.list() == []


async def test_a_non_ascii_signature_header_is_a_401_not_a_500(start: Started) -> None:
    _service, client = await start()
    body = payload()
    headers = [(b"Content-Type", b"application/json"), (b"X-Gitea-Event", b"issues"),
               (b"X-Gitea-Delivery", b"sig-1"), (b"X-Gitea-Signature", "é".encode() * 32)]
    status, doc = await raw_post(client.port or 0, headers, body)
    assert status == 401 and doc["error"] == "bad_signature"
    headers[-1] = (b"X-Hub-Signature-256", b"sha256=\xff\xfe")
    status, doc = await raw_post(client.port or 0, headers, body)
    assert status == 401 and doc["error"] == "bad_signature"


async def test_a_content_encoding_on_a_plain_body_is_refused_typed(start: Started) -> None:
    _service, client = await start()
    body = payload()
    for coding in ("gzip", "deflate", "br"):
        resp = await client.post("/webhook", data=body, headers=_signed(body, **{"Content-Encoding": coding}))
        assert resp.status == 415, coding
        assert (await resp.json())["error"] == "unsupported_media_type"
    resp = await client.post("/webhook", data=body, headers=_signed(body, **{"Content-Encoding": "identity"}))
    assert resp.status == 202


def test_a_comment_past_the_length_bound_is_refused_unread() -> None:
    """Untrusted text is parsed only as far as needed; a huge comment is not read at all."""
    block = f"## {HEADING_TEXT}\nSTATE: ready\n"
    result = parse_comment("x" * MAX_COMMENT_CHARS + "\n" + block)
    assert result.block_count == 0 and result.current is None
    assert [e.code for e in result.errors] == ["comment_too_long"]
    assert parse_comment("x" * (MAX_COMMENT_CHARS - len(block) - 1) + "\n" + block).block_count == 1


def test_a_comment_with_too_many_blocks_is_refused() -> None:
    """Each block costs ~10 us in errors alone: the count of blocks is bounded too, or 64 KB of headings hold 30 ms."""
    heading = f"## {HEADING_TEXT}\n"
    assert parse_comment(heading * MAX_BLOCKS).block_count == MAX_BLOCKS
    result = parse_comment(heading * (MAX_BLOCKS + 1))
    assert result.block_count == 0 and [e.code for e in result.errors] == ["too_many_blocks"]


async def test_readyz_is_503_naming_why_when_the_database_cannot_take_a_write(start: Started) -> None:
    """/readyz called a read-only or full database writable."""
    service, client = await start()
    assert (await client.get("/readyz")).status == 200
    service.settings.database.path.chmod(0o400)
    try:
        resp = await client.get("/readyz")
        doc = await resp.json()
        assert resp.status == 503 and doc["checks"]["database"]["reason"] == "read_only", doc
    finally:
        service.settings.database.path.chmod(0o600)
    await service.db.reader.execute("PRAGMA query_only = ON")
    resp = await client.get("/readyz")
    doc = await resp.json()
    assert resp.status == 503 and doc["checks"]["database"]["ok"] is False, doc
    await service.db.reader.execute("PRAGMA query_only = OFF")
    assert (await client.get("/readyz")).status == 200


# --- the review's untested guards -------------------------------------------------------------------------------------


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
    await wait_status(service, "pass-1", "done", timeout=20)
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
    await wait_status(service, "settle-1", "done", timeout=20)
    row = await service.store.get("settle-1")
    assert row is not None and row.attempts == 1  # retried in place, never reclaimed and run again
    assert calls == ["settle-1"]
    handler = "tests.test_fail_closed.recording_router.<locals>.record"
    assert seen_recorded[0] == set() and handler in seen_recorded[1]
    assert not service.worker.settles_retrying


def test_backoff_stays_finite_however_many_attempts() -> None:
    """A settle retried for days must not overflow the backoff (2**1024 is past a float)."""
    from bot.worker import backoff_delay

    assert 0 < backoff_delay(5_000, base_s=0.5, max_s=300.0) <= 300.0


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


async def test_a_body_with_too_many_values_is_refused_before_parsing(start: Started) -> None:
    """Parsing costs per value: 5 MB of `[],` held the loop ~0.5 s. Gitea sends a few hundred."""
    service, client = await start()
    for body in (b"[" + b",".join([b"[]"] * 60_000) + b"]", b'{"a": [' + b",".join([b"1"] * 150_000) + b"]}"):
        resp = await client.post("/webhook", data=body, headers=_signed(body))
        assert resp.status == 413 and (await resp.json())["error"] == "payload_too_complex"
    assert await service.store.list() == []


async def test_every_kept_header_must_be_printable_utf8(start: Started) -> None:
    """Not only X-Gitea-Event: any header stored with the delivery (X-Gitea-Event-Type, User-Agent)."""
    _service, client = await start()
    body = payload()
    for name in (b"X-Gitea-Event-Type", b"User-Agent", b"X-Gitea-Hook-Installation-Target-Type"):
        headers = [*signed_headers(body, delivery=f"hdr-{name.decode()}"), (name, b"x\xff\xfey")]
        status, doc = await raw_post(client.port or 0, headers, body)
        assert status == 400 and doc["error"] == "bad_header" and name.decode() in doc["message"], (name, doc)


def test_admission_itself_refuses_a_content_encoding() -> None:
    """The pure admission refuses it too (the HTTP edge checks first, before reading the body)."""
    body = payload()
    verdict = admit(
        {**webhook_headers(body), "Content-Encoding": "gzip"}, body, secrets=[SECRET.encode()], max_body_bytes=10**6
    )
    assert not isinstance(verdict, Delivery) and verdict.status == 415


def test_an_atx_closing_run_needs_a_blank_before_it() -> None:
    """CommonMark: `## Canonical Issue State#` keeps its `#` (not a heading here); ` ##` closes the heading."""
    assert parse_comment(f"## {HEADING_TEXT}#\nSTATE: ready").block_count == 0
    assert parse_comment(f"## {HEADING_TEXT} ##\nSTATE: ready").block_count == 1
    assert parse_comment(f"## {HEADING_TEXT}\t#\nSTATE: ready").block_count == 1


def test_the_comment_bound_is_64_kib() -> None:
    """Pinned by value: the bound is part of the contract in docs/canonical-state.md."""
    block = f"## {HEADING_TEXT}\nSTATE: ready\n"
    assert parse_comment(block + "x" * (65_536 - len(block))).block_count == 1
    assert parse_comment(block + "x" * (65_537 - len(block))).block_count == 0


@pytest.mark.parametrize(("argument", "value"), [("owner", "author-1\n"), ("owner", "author-1\r")])
def test_a_trailing_line_break_is_not_part_of_a_login(argument: str, value: str) -> None:
    """`$` in a Python pattern also matches before a final newline; the schema must not."""
    from bot.core.verbs import VERBS

    _, problems = VERBS["allocate_next_work"].check_arguments({argument: value})
    assert [p["argument"] for p in problems] == [argument]


@pytest.mark.parametrize("reason", ["done\n", "done\r\n", "done\n\n"])
def test_a_trailing_line_break_is_not_part_of_one_line_of_text(reason: str) -> None:
    from bot.core.verbs import VERBS

    _, problems = VERBS["release_lease"].check_arguments({"issue_number": 1, "reason": reason})
    assert [p["argument"] for p in problems] == ["reason"]


def test_a_state_with_an_unknown_key_is_refused() -> None:
    from bot.core.verbs import VERBS
    from tests.test_verbs_table import VALID_STATE

    verb = VERBS["post_issue_state"]
    base = {"issue_number": 1, "state": dict(VALID_STATE)}
    assert verb.check_arguments(base)[1] == []
    _, problems = verb.check_arguments({**base, "state": {**VALID_STATE, "stat": "ready"}})
    assert [p["argument"] for p in problems] == ["state"]
