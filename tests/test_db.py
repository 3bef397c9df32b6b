"""The database edge: opened read-only it reads what a writer committed and refuses to write; writes wait for reads."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import psycopg
import pytest

from state.db import Database, read_only
from state.db_postgres import PostgresDatabase
from state.db_sqlite import SqliteDatabase
from state.outbox import OutboxIntent, OutboxStore
from tests.support import HANG_S


async def sees_the_commits_and_refuses_writes(
    writer: Database, target: Path | str, refusal: type[Exception], match: str | None = None
) -> None:
    """``read_only(target)`` reads what ``writer`` commits, and refuses a write of its own with ``refusal``."""
    async with read_only(target) as db:
        assert await OutboxStore(db).counts() == dict.fromkeys(await OutboxStore(writer).counts(), 0)
        await OutboxStore(writer).add(OutboxIntent("k", 1, "labels", {"add": ["x"]}), repo="org/repo")
        assert (await OutboxStore(db).counts())["pending"] == 1
        with pytest.raises(refusal, match=match):
            await OutboxStore(db).add(OutboxIntent("k2", 1, "labels", {"add": ["y"]}), repo="org/repo")


async def test_a_read_only_database_sees_the_writers_commits_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "with space?and#hash" / "foreman.db"
    writer = await Database.open(path)
    try:
        await sees_the_commits_and_refuses_writes(writer, path, sqlite3.OperationalError, "readonly")
    finally:
        await writer.close()


async def test_a_read_only_database_is_never_created(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await Database.open_read_only(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()


async def test_a_write_waits_for_a_read_left_pending_while_another_process_commits(tmp_path: Path) -> None:
    """SQLite answers BEGIN IMMEDIATE with SQLITE_BUSY_SNAPSHOT at once, without its busy timeout, while the same
    connection still reads an older snapshot and another process (a `foreman mcp`) has committed since. Every read
    shares the one connection, so a read another task has not finished made that write fail: a webhook then went
    unstored. The write must wait for the read instead."""
    db = await SqliteDatabase.open_file(tmp_path / "f.db")
    try:
        async with db.transaction() as conn:
            await conn.execute("CREATE TABLE t (x INTEGER)")
            await conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(50)])
        cursor = await db.reader.execute("SELECT x FROM t")
        assert await cursor.fetchone() is not None  # a read in progress: its snapshot is held
        other = sqlite3.connect(tmp_path / "f.db", isolation_level=None)
        other.execute("INSERT INTO t VALUES (1000)")  # another process commits after that snapshot
        other.close()

        async def write() -> None:
            async with db.transaction() as conn:
                await conn.execute("INSERT INTO t VALUES (2000)")

        writing = asyncio.create_task(write())
        await asyncio.sleep(0.05)
        assert not writing.done() or writing.exception() is None, writing.exception()
        await cursor.fetchall()
        await cursor.close()
        await asyncio.wait_for(writing, HANG_S)
        async with db.reader.execute("SELECT COUNT(*) FROM t") as cur:
            assert [tuple(row) for row in await cur.fetchall()] == [(52,)]
    finally:
        await db.close()


async def test_a_read_only_postgresql_session_sees_the_writers_commits_and_refuses_writes(postgres_url: str) -> None:
    """`read_only(url)` (the demo, `foreman invariants`): a session that never migrates and refuses every write,
    reading what another process commits."""
    writer = await PostgresDatabase.connect(postgres_url)
    try:
        await sees_the_commits_and_refuses_writes(writer, postgres_url, psycopg.errors.ReadOnlySqlTransaction)
        assert [e.key for e in await OutboxStore(writer).every_entry()] == ["k"]
    finally:
        await writer.close()
