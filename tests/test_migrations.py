"""Schema migrations applied to a database that already holds data (not only to an empty one)."""

from __future__ import annotations

from pathlib import Path

import pytest

import state.db as state_db
from state.db import Database
from state.migrations import MIGRATIONS

STATUSES_V6 = ("queued", "processing", "done", "failed", "ignored_self")


async def test_migration_7_keeps_every_inbox_row_handler_result_and_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 7 rebuilds the deliveries table (a new status needs a new CHECK): ids, statuses, attempts,
    claims and versions survive, and the handler and replay rows still point at their deliveries."""
    path = tmp_path / "foreman.db"
    monkeypatch.setattr(state_db, "MIGRATIONS", tuple(m for m in MIGRATIONS if m[0] <= 6))
    db = await Database.open(path)
    async with db.transaction() as conn:
        for i, status in enumerate(STATUSES_V6, start=1):
            await conn.execute(
                "INSERT INTO deliveries (id, delivery_id, body_sha256, event, headers_json, body, received_at,"
                " status, attempts, claimed_by, version) VALUES (?, ?, ?, 'issues', '{}', ?, 't', ?, ?, ?, ?)",
                (i * 10, f"d-{i}", f"h-{i}", b"{}", status, i, "w-1" if status == "processing" else None, i + 1),
            )
            await conn.execute(
                "INSERT INTO delivery_handlers (delivery_pk, handler, status, attempts, updated_at)"
                " VALUES (?, 'h', 'done', 1, 't')",
                (i * 10,),
            )
        await conn.execute(
            "INSERT INTO delivery_replays (delivery_pk, from_status, requested_at, requested_by)"
            " VALUES (40, 'failed', 't', 'operator')"
        )
    await db.close()

    monkeypatch.setattr(state_db, "MIGRATIONS", MIGRATIONS)
    db = await Database.open(path)
    try:
        async with db.reader.execute(
            "SELECT id, delivery_id, status, attempts, claimed_by, version, ignored_reason FROM deliveries ORDER BY id"
        ) as cur:
            rows = [tuple(row) for row in await cur.fetchall()]
        assert rows == [
            (i * 10, f"d-{i}", s, i, "w-1" if s == "processing" else None, i + 1, None)
            for i, s in enumerate(STATUSES_V6, start=1)
        ]
        async with db.reader.execute("SELECT delivery_pk FROM delivery_handlers ORDER BY delivery_pk") as cur:
            assert [row[0] for row in await cur.fetchall()] == [10, 20, 30, 40, 50]
        async with db.reader.execute("SELECT delivery_pk, requested_by FROM delivery_replays") as cur:
            assert [tuple(row) for row in await cur.fetchall()] == [(40, "operator")]
        async with db.reader.execute("PRAGMA foreign_key_check") as cur:
            assert await cur.fetchall() == []
        async with db.reader.execute("PRAGMA integrity_check") as cur:
            assert [tuple(row) for row in await cur.fetchall()] == [("ok",)]
        async with db.transaction() as conn:
            await conn.execute("UPDATE deliveries SET status = 'ignored', ignored_reason = 'x' WHERE id = 10")
            with pytest.raises(Exception, match="FOREIGN KEY"):
                await conn.execute(
                    "INSERT INTO delivery_handlers (delivery_pk, handler, status, attempts, updated_at)"
                    " VALUES (999, 'h', 'done', 1, 't')"
                )
    finally:
        await db.close()


async def test_a_commit_cancelled_in_flight_never_turns_into_a_rollback_error(tmp_path: Path) -> None:
    """Shutdown can cancel a task while its COMMIT is queued on the database thread: the COMMIT still runs, so
    the ROLLBACK queued after it finds no transaction. The cancellation must stay a cancellation (it became
    `OperationalError: cannot rollback`, logged with a traceback by `foreman serve` on a taken port)."""
    import asyncio

    db = await Database.open(tmp_path / "foreman.db")
    real = db._conn.execute  # the seam between the store and aiosqlite's thread
    pending: list[asyncio.Future[object]] = []

    def execute(sql: str, *args: object) -> object:
        if sql == "COMMIT":
            pending.append(asyncio.ensure_future(real(sql, *args)))  # queued on the thread, then cancelled
            raise asyncio.CancelledError
        return real(sql, *args)

    db._conn.execute = execute  # type: ignore[method-assign,assignment]
    try:
        with pytest.raises(asyncio.CancelledError):
            async with db.transaction() as conn:
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'x', 't')"
                )
    finally:
        db._conn.execute = real  # type: ignore[method-assign]
    await asyncio.gather(*pending)
    async with db.transaction() as conn:  # the write lock was released, the connection is usable
        async with conn.execute("SELECT COUNT(*) FROM schema_migrations WHERE version = 999") as cur:
            assert [tuple(row) for row in await cur.fetchall()] == [(1,)]  # the COMMIT that ran is kept
    await db.close()
