"""The PostgreSQL backend (psycopg 3): the stores' SQL unchanged, the same write guarantees as SQLite's.

Writes: one connection per process, one transaction at a time (an asyncio lock, as with SQLite), and each write
transaction first takes a transaction-scoped advisory lock on the schema, so write transactions serialize across
every replica exactly as SQLite's BEGIN IMMEDIATE serializes them across processes: a store's read-then-write
inside one transaction sees no other writer in between. Reads: a second connection in autocommit (each statement
sees the latest commit). ``durable=False`` commits with ``synchronous_commit = off`` for that transaction only.

Inside a transaction every INSERT/UPDATE/DELETE runs under a savepoint, so a statement refused by a constraint
leaves the transaction usable, as SQLite does (PostgreSQL would otherwise abort the whole transaction): a store
that catches the integrity error and goes on behaves the same on both.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Generator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from state.db import MIN_FREE_BYTES, Database, DatabaseNotWritable
from state.migrations_pg import PRELUDE
from state.sql import Connection, Dialect, placeholders_to_dollar, redact_url

_WRITES = ("INSERT", "UPDATE", "DELETE")


class PgRow(tuple[Any, ...]):
    """A row addressable by column name and by index, like sqlite3.Row."""

    _index: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self._index[key])
            except KeyError:
                raise IndexError(f"No item with that key: {key!r}") from None
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._index)


def _row_factory(cursor: Any) -> Any:
    index = {column.name: i for i, column in enumerate(cursor.description or ())}

    def make(values: Sequence[Any]) -> PgRow:
        row = PgRow(values)
        row._index = index
        return row

    return make


@functools.lru_cache(maxsize=1024)
def _translate(sql: str) -> str:
    return placeholders_to_dollar(sql)


def _arguments(parameters: Iterable[Any] | None) -> list[Any]:
    # SQLite stores booleans as 0/1 in INTEGER columns; PostgreSQL will not compare a boolean with a bigint.
    return [int(v) if isinstance(v, bool) else v for v in (parameters or ())]


class PgCursor:
    """The results of one statement, read like aiosqlite's cursor."""

    def __init__(self, cursor: psycopg.AsyncRawCursor[Any]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    async def fetchone(self) -> PgRow | None:
        if self._cursor.description is None:
            return None
        row: PgRow | None = await self._cursor.fetchone()
        return row

    async def fetchall(self) -> list[PgRow]:
        if self._cursor.description is None:
            return []
        rows: list[PgRow] = await self._cursor.fetchall()
        return rows

    async def close(self) -> None:
        await self._cursor.close()


class _Pending:
    """``execute``'s result: awaited for the cursor, or entered with ``async with`` (closed after)."""

    def __init__(self, work: Any) -> None:
        self._work = work
        self._cursor: PgCursor | None = None

    def __await__(self) -> Generator[Any, None, PgCursor]:
        cursor: PgCursor = yield from self._work.__await__()
        return cursor

    async def __aenter__(self) -> PgCursor:
        self._cursor = await self._work
        return self._cursor

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._cursor is not None:
            await self._cursor.close()


class PgConnection:
    """A psycopg connection shaped like the stores' ``Connection``: ``?`` placeholders, rows by name and index."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], conninfo: str, setup: Sequence[str] = ()) -> None:
        self.raw = conn
        self.in_transaction = False
        self._conninfo = conninfo
        self._setup = tuple(setup)

    @classmethod
    async def open(cls, conninfo: str, setup: Sequence[str] = ()) -> PgConnection:
        conn = cls(await psycopg.AsyncConnection.connect(conninfo, autocommit=True), conninfo, setup)
        for statement in conn._setup:
            await conn.raw.execute(statement)
        return conn

    async def reconnect_if_lost(self) -> None:
        """A new session when the server ended this one (a restart, a failover, an administrator): the work that
        was in flight on it failed; what comes next works again. Never inside a transaction."""
        if not (self.raw.closed or self.raw.broken) or self.in_transaction:
            return
        fresh = await PgConnection.open(self._conninfo, self._setup)
        self.raw = fresh.raw

    def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> _Pending:
        return _Pending(self._execute(sql, parameters))

    def executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> _Pending:
        return _Pending(self._executemany(sql, parameters))

    async def _execute(self, sql: str, parameters: Iterable[Any] | None) -> PgCursor:
        query = _translate(sql)
        await self.reconnect_if_lost()
        cursor = psycopg.AsyncRawCursor(self.raw, row_factory=_row_factory)
        if not self.in_transaction or not query.lstrip()[:6].upper().startswith(_WRITES):
            await cursor.execute(query, _arguments(parameters))
            return PgCursor(cursor)
        try:
            # One round trip for the three (pipeline mode): the savepoint, the statement, its release.
            async with self.raw.pipeline():
                await self.raw.execute("SAVEPOINT foreman_statement")
                await cursor.execute(query, _arguments(parameters))
                await self.raw.execute("RELEASE SAVEPOINT foreman_statement")
        except psycopg.Error:
            await self.raw.execute("ROLLBACK TO SAVEPOINT foreman_statement")
            raise
        return PgCursor(cursor)

    async def _executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> PgCursor:
        cursor = psycopg.AsyncRawCursor(self.raw, row_factory=_row_factory)
        await cursor.executemany(_translate(sql), [_arguments(p) for p in parameters])
        return PgCursor(cursor)


class PostgresDatabase(Database):
    """An opened PostgreSQL database (one schema of it: the connection's search_path)."""

    dialect: Dialect = "postgresql"

    def __init__(self, writer: PgConnection, reader: PgConnection, url: str) -> None:
        self._writer = writer
        self._reader = reader
        self.url = url
        self.where = redact_url(url)
        self._write_lock = asyncio.Lock()

    @classmethod
    async def connect(cls, url: str, *, busy_timeout_ms: int = 5000, read_only: bool = False) -> PostgresDatabase:
        """Connect (twice: writes and reads) and migrate, unless ``read_only`` (never migrated, writes refused)."""
        conninfo = url
        if read_only:
            options = psycopg.conninfo.conninfo_to_dict(url).get("options") or ""
            conninfo = psycopg.conninfo.make_conninfo(
                url, options=f"{options} -c default_transaction_read_only=on".strip()
            )
        # The longest a write waits for another replica's lock, like SQLite's busy timeout.
        setup = [f"SET lock_timeout = {int(busy_timeout_ms)}"] if busy_timeout_ms else []
        try:
            writer = await PgConnection.open(conninfo, setup)
            reader = await PgConnection.open(conninfo)
        except psycopg.OperationalError as exc:
            raise DatabaseNotWritable("unavailable", f"cannot connect to {redact_url(url)}: {exc}") from None
        db = cls(writer, reader, url)
        if not read_only:
            try:
                await db._migrate()
            except BaseException:
                await db.close()
                raise
        return db

    async def close(self) -> None:
        await self._writer.raw.close()
        await self._reader.raw.close()

    @property
    def reader(self) -> Connection:
        return self._reader

    async def _prepare_schema(self, conn: Connection) -> None:
        for statement in PRELUDE:
            await conn.execute(statement)

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[Connection]:
        """BEGIN, the schema's advisory lock (every replica's writes one at a time), ... COMMIT; or ROLLBACK."""
        async with self._write_lock:
            conn = self._writer
            await conn.reconnect_if_lost()
            conn.in_transaction = True
            try:
                # One round trip (the simple query protocol takes several statements): BEGIN, the lock, the commit mode.
                await conn.raw.execute(
                    "BEGIN; SELECT pg_advisory_xact_lock(hashtext(current_schema()))"
                    + ("" if durable else "; SET LOCAL synchronous_commit = off")
                )
                yield conn
                await conn.raw.execute("COMMIT")
            except BaseException:
                await asyncio.shield(self._rollback())
                raise
            finally:
                conn.in_transaction = False

    async def _rollback(self) -> None:
        """ROLLBACK if a transaction is open. A session the server ended has none left (and the error that ended
        it is the one to raise, not ROLLBACK's)."""
        raw = self._writer.raw
        if raw.closed or raw.broken:
            return
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await raw.execute("ROLLBACK")

    async def check_writable(self, *, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        """A real write (a table created and a row inserted, rolled back): refused on a read-only server or
        session (a standby, default_transaction_read_only), a full disk, or a lock held past lock_timeout."""
        del min_free_bytes  # the server's disk is the server's: its refusal of the write is the answer
        try:
            async with self.transaction() as conn:
                await conn.execute("CREATE TEMPORARY TABLE foreman_write_probe (pad BYTEA) ON COMMIT DROP")
                await conn.execute("INSERT INTO foreman_write_probe (pad) VALUES (?)", (b"\0" * 8192,))
                raise _ProbeDone
        except _ProbeDone:
            return
        except psycopg.Error as exc:
            raise _not_writable(exc, self.where) from None


class _ProbeDone(Exception):
    """Raised inside the probe transaction to roll it back."""


def _not_writable(exc: psycopg.Error, where: str) -> DatabaseNotWritable:
    text = str(exc).strip()
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return DatabaseNotWritable("read_only", f"the database {where} is read-only: {text}")
    if isinstance(exc, pg_errors.DiskFull | pg_errors.InsufficientResources):
        return DatabaseNotWritable("full", f"the database {where} is full: {text}")
    if isinstance(exc, pg_errors.LockNotAvailable | pg_errors.QueryCanceled):
        return DatabaseNotWritable("locked", f"the database {where} is locked by another writer: {text}")
    return DatabaseNotWritable("unavailable", f"the database {where} refused a write: {type(exc).__name__}: {text}")
