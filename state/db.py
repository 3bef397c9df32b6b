"""The SQLite edge: one connection for writes (explicit BEGIN IMMEDIATE transactions), WAL, migrations."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import aiosqlite

from state.migrations import MIGRATIONS


def utcnow() -> datetime:
    return datetime.now(UTC)


def to_db_time(moment: datetime) -> str:
    """Timestamps are stored as fixed-width UTC ISO strings, so text order is time order."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def from_db_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


class Database:
    """An opened SQLite database. All writes go through ``transaction()``, one at a time."""

    def __init__(self, conn: aiosqlite.Connection, path: Path, *, synchronous: str = "FULL") -> None:
        self._conn = conn
        self.path = path
        self._write_lock = asyncio.Lock()
        self._synchronous = synchronous
        self._current_sync = synchronous

    @classmethod
    async def open(cls, path: Path, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000) -> Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = await aiosqlite.connect(str(path), isolation_level=None)
        conn.row_factory = sqlite3.Row
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be FULL or NORMAL")
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute(f"PRAGMA synchronous={synchronous}")
        await conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        await conn.execute("PRAGMA foreign_keys=ON")
        db = cls(conn, path, synchronous=synchronous)
        await db._migrate()
        return db

    async def close(self) -> None:
        await self._conn.close()

    async def _migrate(self) -> None:
        async with self.transaction() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            async with conn.execute("SELECT version FROM schema_migrations") as cur:
                applied = {row[0] for row in await cur.fetchall()}
            for version, name, sql in MIGRATIONS:
                if version in applied:
                    continue
                for statement in _split_sql(sql):
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, to_db_time(utcnow())),
                )

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[aiosqlite.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception (including cancellation).

        ``durable=False`` commits with synchronous=NORMAL: it survives a process crash but may be lost on
        power loss. Only bookkeeping whose loss means "do it again" (worker claims, handler results) uses
        it; an acknowledged delivery is always committed with the configured (default FULL) setting.
        """
        async with self._write_lock:
            wanted = self._synchronous if durable else "NORMAL"
            if wanted != self._current_sync:
                await self._conn.execute(f"PRAGMA synchronous={wanted}")
                self._current_sync = wanted
            await self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                await self._conn.execute("COMMIT")
            except BaseException:
                # Also when COMMIT itself failed or was cancelled: never leave the write lock held.
                if self._conn.in_transaction:
                    await asyncio.shield(self._conn.execute("ROLLBACK"))
                raise

    @property
    def reader(self) -> aiosqlite.Connection:
        """For reads outside a transaction (autocommit: each statement sees the latest commit)."""
        return self._conn

    async def check_writable(self) -> None:
        """Raise if the database cannot take a write lock right now (used by /readyz)."""
        async with self.transaction() as conn:
            await conn.execute("SELECT 1")


def _split_sql(sql: str) -> list[str]:
    """Split a migration into statements on ';' at line ends (migrations hold no string literals with ';')."""
    parts: list[str] = []
    current: list[str] = []
    for line in sql.splitlines():
        if line.strip().startswith("--"):
            continue
        current.append(line)
        if line.rstrip().endswith(";"):
            statement = "\n".join(current).strip()
            if statement.strip(";").strip():
                parts.append(statement)
            current = []
    tail = "\n".join(current).strip()
    if tail:
        parts.append(tail)
    return parts
