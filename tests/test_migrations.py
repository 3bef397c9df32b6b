"""Schema migrations applied to a database that already holds data (not only to an empty one)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

import state.db_base as state_db
from state.db import Database, SchemaTooNew, read_only
from state.db_postgres import PostgresDatabase
from state.db_sqlite import SqliteDatabase
from state.migrations import MIGRATIONS
from state.sql import IntegrityError
from tests.conftest import DbOpener, database_env, sqlite_path

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

    db = await SqliteDatabase.open_file(tmp_path / "foreman.db")
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


async def test_a_begin_cancelled_in_flight_leaves_no_transaction_open(tmp_path: Path) -> None:
    """A task cancelled while its BEGIN IMMEDIATE waits on the database thread (another process holds SQLite's write
    lock): the BEGIN still runs once the lock is free, so the ROLLBACK must be queued after it whatever the loop
    sees at the cancellation. On the old code the transaction stayed open on the connection and every later write
    failed (`cannot start a transaction within a transaction`)."""
    import sqlite3

    db = await Database.open(tmp_path / "foreman.db")
    other = sqlite3.connect(tmp_path / "foreman.db", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write transaction: our BEGIN waits in SQLite's busy handler

    async def write() -> None:
        async with db.transaction() as conn:
            await conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (998, 'x', 't')")

    released: list[bool] = []

    def release() -> None:
        other.execute("ROLLBACK")  # the waiting BEGIN now succeeds on the thread
        other.close()
        released.append(True)

    task = asyncio.ensure_future(write())
    await asyncio.sleep(0.2)  # the BEGIN is waiting on the database thread
    task.cancel()
    # The other process lets go while the cancelled BEGIN still waits (not after the task ended: the task waits for
    # its ROLLBACK, queued behind that BEGIN, which would otherwise only give up at the 5 s busy timeout).
    asyncio.get_running_loop().call_later(0.2, release)
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.2)
    assert released  # the other process let go before the write below
    async with db.transaction() as conn:  # the connection holds no stray transaction
        await conn.execute("INSERT INTO schema_migrations (version, name, applied_at) VALUES (997, 'y', 't')")
    async with db.reader.execute("SELECT version FROM schema_migrations WHERE version >= 997") as cur:
        assert [tuple(row) for row in await cur.fetchall()] == [(997,)]
    await db.close()


async def test_a_database_migrated_by_a_newer_foreman_is_refused_unchanged(
    open_db: DbOpener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A schema version this foreman does not know is refused at open on both backends (a typed error naming
    both versions and what to run), before any migration or write; `foreman` answers with the envelope."""
    known = max(version for version, _, _ in MIGRATIONS)
    db = await open_db(tmp_path / "foreman.db")
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'from the future', 't')",
            (known + 1,),
        )
    await db.close()
    with pytest.raises(SchemaTooNew) as refused:
        await open_db(tmp_path / "foreman.db")
    assert (refused.value.found, refused.value.known) == (known + 1, known)
    assert f"schema version {known + 1}" in str(refused.value) and f"up to version {known}" in str(refused.value)
    assert "restore a backup" in refused.value.exact_next_action

    from bot.cli import main

    for name, value in database_env(db, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FOREMAN_WEBHOOK__SECRETS", '["a-long-enough-test-secret"]')
    assert await asyncio.to_thread(main, ["leases", "--json"]) == 1
    envelope = json.loads(capsys.readouterr().err)
    assert envelope["error"] == "schema_too_new"
    assert (envelope["found_version"], envelope["known_version"]) == (known + 1, known)
    assert envelope["exact_next_action"] == refused.value.exact_next_action

    monkeypatch.setattr(state_db, "MIGRATIONS", (*MIGRATIONS, (known + 1, "from the future", "SELECT 1;")))
    again = await open_db(tmp_path / "foreman.db")  # the foreman that knows it opens it
    assert await again.schema_version() == known + 1


async def test_migration_7_keeps_the_inbox_rows_on_both_backends(
    open_db: DbOpener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 7 (a rebuild on SQLite, ALTER TABLE on PostgreSQL) keeps every row, allows 'ignored' and adds
    ignored_reason; ids still come from the database after it."""
    monkeypatch.setattr(state_db, "MIGRATIONS", tuple(m for m in MIGRATIONS if m[0] <= 6))
    db = await open_db(tmp_path / "foreman.db")
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO deliveries (delivery_id, body_sha256, event, headers_json, body, received_at, status)"
            " VALUES ('d-1', 'h-1', 'issues', '{}', ?, 't', 'queued')",
            (b"{}",),
        )
        with pytest.raises(IntegrityError):
            await conn.execute("UPDATE deliveries SET status = 'ignored'")
    await db.close()
    monkeypatch.setattr(state_db, "MIGRATIONS", MIGRATIONS)
    db = await open_db(tmp_path / "foreman.db")
    async with db.transaction() as conn:
        await conn.execute("UPDATE deliveries SET status = 'ignored', ignored_reason = 'another repository'")
        async with conn.execute(
            "INSERT INTO deliveries (delivery_id, body_sha256, event, headers_json, body, received_at, status)"
            " VALUES ('d-2', 'h-2', 'issues', '{}', ?, 't', 'queued') RETURNING id",
            (b"{}",),
        ) as cur:
            row = await cur.fetchone()
    assert row is not None and row[0] == 2
    async with db.reader.execute("SELECT id, delivery_id, status, ignored_reason FROM deliveries ORDER BY id") as cur:
        assert [tuple(r) for r in await cur.fetchall()] == [
            (1, "d-1", "ignored", "another repository"), (2, "d-2", "queued", None)]
    assert await db.schema_version() == max(version for version, _, _ in MIGRATIONS)


async def test_a_read_only_open_refuses_a_schema_newer_than_this_foreman_too(
    open_db: DbOpener, tmp_path: Path
) -> None:
    """The read-only openers (a checker or demo beside a running service) never migrate, and must not misread a
    newer foreman's tables either: SchemaTooNew there too, on both backends; the known version still opens."""
    known = max(version for version, _, _ in MIGRATIONS)
    db = await open_db(tmp_path / "foreman.db")
    target: Path | str = db.url if isinstance(db, PostgresDatabase) else sqlite_path(db)
    async with read_only(target) as reader:
        assert await reader.schema_version() == known
    async with db.transaction() as conn:
        await conn.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, 'from the future', 't')",
            (known + 1,),
        )
    with pytest.raises(SchemaTooNew) as refused:
        async with read_only(target):
            pass
    assert (refused.value.found, refused.value.known) == (known + 1, known)


#: SHA-256 of each shipped migration's name and text, as it shipped: a shipped migration is never edited
#: (state/migrations.py writes the inbox's schema once for migrations 1 and 7; an edit there fails here too).
SHIPPED = {
    1: "6aa3238d57c05c5d8416989d2de57568ea0daaef4d3166d586842d386eadcc47",
    2: "c8660f9bcb509acdb62b51d52433ed87cd992e93b9487899644cfc3060b47e88",
    3: "cb1da6628363fc62edbca934cd3ae1d9b45eb33fe88e4aadab5929648e886c94",
    4: "0979dde03aa3053e29422fbcfcfcac511d80c557bebfbea5c383cbd87b465870",
    5: "a97d765a50104efe77fcabaf1fbf069d0aab6ffcfa3226153c0761f829cd8620",
    6: "a92b16ce927fbaf07a0509fd80f7a9cfe3957f129145b715cb656d58c419115d",
    7: "53ab9cbb3285d75b6445f6dcc89b16f0b98f4568eb92649aa21c7bffc170bb99",
    8: "68738ae764f79b371f7a9facf99ed4ae5e7e76ee1de49e65f40232dab7b0580d",
    9: "c4851eef5d979623f181a5f23f17f6645ceb55549eb88d16419dbc99ffb8125d",
    10: "543f469b2bcab489bc0fb1a5c47baa85252bc0c281a460363be362935743ae48",
    11: "6d074f59c7d14d86e8988b85727c9e38d6141ed3a3f510e84ea081f35eb4f866",
    12: "6b840eb2e7d0a57f6e89fbe7a13765cae0711158fcd9471fac2ec3114303cdc8",
    13: "d193ab0f8d1413295a79bd5ff4e2432ae8d32d9e7622517444d9a700aab3a5fb",
    14: "ddbdfbc8d19124eb3a291a874681a58fdeed45afd0ef9527baa0b9b95a3981c3",
    15: "37057eb445c2af1cf968233ad411f54e4e65061e6ea4dfb7a38125948bc9c14c",
    16: "7244f550c9ea08de81f360eff1ef2c7b498a0f793e96ac69a5101c2fac72f43c",
}


def test_no_shipped_migration_is_edited() -> None:
    texts = {number: hashlib.sha256(f"{name}\n{sql}".encode()).hexdigest() for number, name, sql in MIGRATIONS}
    assert {number: digest for number, digest in texts.items() if number in SHIPPED} == SHIPPED
