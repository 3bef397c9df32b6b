"""The delivery store's reads: an issue's deliveries, one event and action's, and every delivery's digest."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from typing import Any

import psycopg
import pytest

from bot.core.intake import Delivery
from state.db import Database
from state.deliveries import DeliveryStore


def _delivery(delivery_id: str, event: str, action: str | None, payload: Any) -> Delivery:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return Delivery(delivery_id=delivery_id, event=event, event_type=event, action=action, sender_login="alice",
                    body=body, body_sha256=hashlib.sha256(body).hexdigest(), headers={}, payload=None)


def _about(full_name: str, number: int, *, key: str = "issue", extra: str = "") -> dict[str, Any]:
    return {"repository": {"full_name": full_name}, key: {"number": number}, "extra": extra}


async def test_for_issue_reads_the_repositorys_issue_and_pull_request_deliveries_newest_first(db: Database) -> None:
    store = DeliveryStore(db)
    await store.insert_batch([
        (_delivery("d1", "issues", "opened", _about("Acme/Widgets", 7)), False),
        (_delivery("d2", "issue_comment", "created", _about("acme/widgets", 8)), False),
        (_delivery("d3", "pull_request", "opened", _about("acme/widgets", 7, key="pull_request")), False),
        (_delivery("d4", "issues", "opened", _about("other/repo", 7)), False),
        (_delivery("d5", "issues", "edited", b"not json"), False),
        (_delivery("d6", "issues", "edited", _about("acme/widgets", 7, extra="again")), True),
    ])
    found = await store.for_issue("acme/widgets", 7)
    assert [d.delivery_id for d in found] == ["d6", "d3", "d1"]
    assert [d.delivery_id for d in await store.for_issue("ACME/widgets", 7, limit=2)] == ["d6", "d3"]
    assert [d.delivery_id for d in await store.for_issue("acme/widgets", 8)] == ["d2"]


async def test_with_action_reads_one_event_and_action_oldest_first(db: Database) -> None:
    store = DeliveryStore(db)
    await store.insert_batch([
        (_delivery("a", "issues", "opened", _about("acme/widgets", 1)), False),
        (_delivery("b", "issues", "closed", _about("acme/widgets", 1)), False),
        (_delivery("c", "pull_request", "opened", _about("acme/widgets", 2)), False),
        (_delivery("d", "issues", "opened", _about("acme/widgets", 3)), False),
    ])
    assert [d.delivery_id for d in await store.with_action("issues", "opened")] == ["a", "d"]
    assert await store.with_action("issues", "deleted") == []


async def test_digests_are_every_deliverys_id_body_hash_and_status_oldest_first(db: Database) -> None:
    store = DeliveryStore(db)
    first, second = _delivery("x", "issues", "opened", {"n": 1}), _delivery("y", "push", None, {"n": 2})
    await store.insert_batch([(first, False), (second, True)])
    assert await store.digests() == [("x", first.body_sha256, "queued"), ("y", second.body_sha256, "ignored_self")]


async def test_a_batch_is_one_durable_statement_on_sqlite(tmp_path: Any) -> None:
    """The group commit's batch is one autocommit INSERT: no BEGIN/COMMIT trips around it, and after a non-durable
    transaction (a worker's claim, synchronous NORMAL) the commit mode is set back to FULL before it."""
    from state.db_sqlite import SqliteDatabase

    db = await SqliteDatabase.open_file(tmp_path / "foreman.db", synchronous="FULL")
    try:
        seen: list[str] = []
        await db.reader.set_trace_callback(seen.append)
        async with db.transaction(durable=False) as conn:
            await conn.execute("SELECT 1")
        seen.clear()
        store = DeliveryStore(db)
        results = await store.insert_batch([(_delivery(f"d-{n}", "issues", "opened", {"n": n}), False)
                                            for n in range(3)])
        assert [r.outcome for r in results] == ["queued"] * 3
        assert [s.split()[0] for s in seen] == ["PRAGMA", "INSERT"], seen
        assert seen[0] == "PRAGMA synchronous=FULL"
    finally:
        await db.close()


async def test_a_batch_is_committed_while_another_read_on_the_connection_is_unfinished(tmp_path: Any) -> None:
    """The autocommit statement commits when it completes even while another task's read cursor on the same
    connection is open mid-result (SQLite keeps that read's snapshot): another process sees the rows at once."""
    from state.db_sqlite import SqliteDatabase

    db = await SqliteDatabase.open_file(tmp_path / "foreman.db", synchronous="FULL")
    try:
        store = DeliveryStore(db)
        await store.insert_batch([(_delivery(f"d-{n}", "issues", "opened", {"n": n}), False) for n in range(3)])
        async with db.reader.execute("SELECT id FROM deliveries ORDER BY id") as unfinished:
            assert await unfinished.fetchone() is not None  # two rows still to read: the statement is active
            await store.insert_batch([(_delivery("d-late", "issues", "opened", {"n": 9}), False)])
            other = sqlite3.connect(tmp_path / "foreman.db")
            try:
                seen = other.execute("SELECT COUNT(*) FROM deliveries WHERE delivery_id = 'd-late'").fetchone()
            finally:
                other.close()
            assert seen == (1,)
    finally:
        await db.close()


async def test_a_batch_whose_statement_fails_stores_none_of_its_rows(db: Database) -> None:
    """All of a batch or nothing: one row the table refuses (event NOT NULL) fails the statement, and its
    neighbours in that statement are not stored either (the group commit then stores each alone)."""
    store = DeliveryStore(db)
    good = _delivery("d-good", "issues", "opened", {"n": 1})
    bad = dataclasses.replace(good, delivery_id="d-bad", body_sha256="0" * 64, event=None)  # type: ignore[arg-type]
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.NotNullViolation)):
        await store.insert_batch([(good, False), (bad, False)])
    assert await store.get("d-good") is None
    assert [r.outcome for r in await store.insert_batch([(good, False)])] == ["queued"]
