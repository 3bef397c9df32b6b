"""The PostgreSQL backend (psycopg 3): the stores' SQL unchanged, the same write guarantees as SQLite's.

Writes: one connection per process, one transaction at a time (an asyncio lock, as with SQLite), and each write
transaction first takes a transaction-scoped advisory lock on the schema, so write transactions serialize across
every replica exactly as SQLite's BEGIN IMMEDIATE serializes them across processes: a store's read-then-write
inside one transaction sees no other writer in between. Reads: a second connection in autocommit (each statement
sees the latest commit). Each transaction pins what the server's defaults would otherwise decide: READ COMMITTED
(a write that waited for the lock sees the other's commit) and ``synchronous_commit`` (on when durable, off for
``durable=False``). A session the server ended while idle is replaced at the next BEGIN or read, which succeeds.

Inside a transaction every INSERT/UPDATE/DELETE runs under a savepoint, so a statement refused by a constraint
leaves the transaction usable, as SQLite does (PostgreSQL would otherwise abort the whole transaction): a store
that catches the integrity error and goes on behaves the same on both.

Round trips (each one a wait for the server, and on a loaded host for this process to be scheduled again): BEGIN
and the lock are not sent on their own but pipelined in front of the transaction's first statement (the lock is
still taken before that statement runs: the server runs a pipeline in order), so a transaction of n statements
costs n + 1 round trips (its COMMIT) where it cost n + 2, and one that ran no statement costs none. A write of one
statement as a transaction of its own (``write_one``, ``write_rows``: the webhook door's group commit, the
inbox's and outbox's claims and settlements) is ONE round trip, BEGIN, lock, statement and COMMIT pipelined: the
schema's lock is then never held while this process waits to be scheduled, which is what made replicas queue
behind one another ("idle in transaction" holding the lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import select
from collections.abc import AsyncIterator, Generator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from state.db_base import MIN_FREE_BYTES, Database, DatabaseNotWritable, Written
from state.migrations_pg import PRELUDE
from state.sql import Connection, Dialect, Row, placeholders_to_dollar, redact_url, scrub

_WRITES = ("INSERT", "UPDATE", "DELETE")

#: A writer session left idle inside a transaction this long (its process hung or its host vanished) is ended by
#: the server, which releases the schema's advisory lock every other replica's writes wait for.
IDLE_IN_TRANSACTION_TIMEOUT_MS = 30_000

#: Connection parameters added unless the URL sets them: a host that vanishes is noticed in about a minute
#: (TCP keepalives, and unacknowledged data given up after tcp_user_timeout), not after the kernel's ~2 hours.
CONNECTION_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}


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
        #: A transaction's opening statements (BEGIN, its commit mode and the lock) not sent yet: they go with its
        #: first statement, in one pipeline (``_begin_with``).
        self.pending_begin: tuple[str, ...] = ()
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
        was in flight on it failed; what comes next works again. Never inside a transaction.

        An idle session the server ended has its farewell (the server's error, the end of the stream) waiting in
        the socket: readable while idle (no LISTEN here, no statement in flight) is taken as ended, so that a
        one-trip write (``write_one``) starts on a live session rather than fail and need sending again (a write
        sent twice could have committed once already)."""
        if self.in_transaction:
            return
        if not self.lost and not self._spoke_while_idle():
            return
        with contextlib.suppress(psycopg.Error, OSError):
            await self.raw.close()
        fresh = await PgConnection.open(self._conninfo, self._setup)
        self.raw = fresh.raw

    def _spoke_while_idle(self) -> bool:
        if self.raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False  # a statement's answer may be on its way: not idle
        try:
            readable, _, _ = select.select([self.raw.fileno()], [], [], 0)
        except (OSError, ValueError, psycopg.Error):
            return True
        return bool(readable)

    def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> _Pending:
        return _Pending(self._execute(sql, parameters))

    @property
    def lost(self) -> bool:
        return self.raw.closed or self.raw.broken

    async def _execute(self, sql: str, parameters: Iterable[Any] | None) -> PgCursor:
        query = _translate(sql)
        await self.reconnect_if_lost()
        is_write = query.lstrip()[:6].upper().startswith(_WRITES)
        if not self.in_transaction:
            try:
                return await self._run(query, parameters)
            except psycopg.OperationalError:
                # A session the server ended while idle is only noticed now; a read is safe to send again.
                if is_write or not self.lost:
                    raise
                await self.reconnect_if_lost()
                return await self._run(query, parameters)
        if self.pending_begin:
            return await self._begin_with(query, parameters, is_write)
        if not is_write:
            return await self._run(query, parameters)
        return await self._guarded(query, parameters, ())

    async def _guarded(self, query: str, parameters: Iterable[Any] | None, before: Sequence[str]) -> PgCursor:
        """A write under its savepoint: ``before`` (the transaction's opening statements, when this is its first),
        the savepoint, the statement, its release, in one round trip (pipeline mode). A refused statement goes back
        to the savepoint (the transaction stays usable) and raises; when it is the opening statements that failed
        (the lock's timeout), no savepoint was made, and their error is raised."""
        cursor = psycopg.AsyncRawCursor(self.raw, row_factory=_row_factory)
        try:
            async with self.raw.pipeline():
                for statement in before:
                    await self.raw.execute(statement)
                await self.raw.execute("SAVEPOINT foreman_statement")
                await cursor.execute(query, _arguments(parameters))
                await self.raw.execute("RELEASE SAVEPOINT foreman_statement")
        except psycopg.Error as exc:
            if self.lost:
                raise  # the session died: its error is the one to tell, there is no savepoint to go back to
            try:
                await self.raw.execute("ROLLBACK TO SAVEPOINT foreman_statement")
            except pg_errors.InvalidSavepointSpecification:
                raise exc from None  # the opening statements failed: no savepoint was made
            raise
        return PgCursor(cursor)

    async def _begin_with(self, query: str, parameters: Iterable[Any] | None, is_write: bool) -> PgCursor:
        """The transaction's first statement, behind its opening statements in the same round trip. A session the
        server ended while idle fails here with nothing applied (nothing commits before COMMIT): one new session,
        and the same once more."""
        opening, self.pending_begin = self.pending_begin, ()
        for attempt in (1, 2):
            try:
                if is_write:
                    return await self._guarded(query, parameters, opening)
                cursor = psycopg.AsyncRawCursor(self.raw, row_factory=_row_factory)
                async with self.raw.pipeline():
                    for statement in opening:
                        await self.raw.execute(statement)
                    await cursor.execute(query, _arguments(parameters))
                return PgCursor(cursor)
            except psycopg.OperationalError:
                if attempt == 2 or not self.lost:
                    raise
                self.in_transaction = False
                await self.reconnect_if_lost()
                self.in_transaction = True
        raise AssertionError("unreachable")

    async def _run(self, query: str, parameters: Iterable[Any] | None) -> PgCursor:
        cursor = psycopg.AsyncRawCursor(self.raw, row_factory=_row_factory)
        await cursor.execute(query, _arguments(parameters))
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
        """Connect (twice: writes and reads) and migrate, unless ``read_only`` (never migrated, writes refused;
        a schema newer than this foreman's refused all the same)."""
        # The longest a write waits for another replica's lock, like SQLite's busy timeout; 0 is "do not wait"
        # (PostgreSQL's lock_timeout = 0 would wait forever), so the shortest PostgreSQL takes: 1 ms.
        setup = [
            f"SET lock_timeout = {max(1, int(busy_timeout_ms))}",
            f"SET idle_in_transaction_session_timeout = {IDLE_IN_TRANSACTION_TIMEOUT_MS}",
        ]
        writer: PgConnection | None = None
        try:
            conninfo = session_conninfo(url, read_only=read_only)
            writer = await PgConnection.open(conninfo, setup)
            reader = await PgConnection.open(conninfo)
        except (psycopg.Error, ValueError) as exc:
            if writer is not None:
                await writer.raw.close()
            raise DatabaseNotWritable("unavailable", _connect_failure(exc, url)) from None
        db = cls(writer, reader, url)
        try:
            if read_only:
                await db._refuse_newer_schema()
            else:
                await db._migrate()
        except BaseException:
            await db.close()
            raise
        return db

    async def close(self) -> None:
        await self._writer.raw.close()
        await self._reader.raw.close()

    async def _has_schema_table(self) -> bool:
        async with self.reader.execute("SELECT to_regclass('schema_migrations') IS NOT NULL") as cur:
            row = await cur.fetchone()
        return bool(row is not None and row[0])

    @property
    def reader(self) -> Connection:
        return self._reader

    async def _prepare_schema(self, conn: Connection) -> None:
        for statement in PRELUDE:
            await conn.execute(statement)

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[Connection]:
        """BEGIN, the schema's advisory lock (every replica's writes one at a time), ... COMMIT; or ROLLBACK. BEGIN
        and the lock go with the block's first statement (``PgConnection._begin_with``); a block that ran none sent
        nothing, and has nothing to commit."""
        async with self._write_lock:
            conn = self._writer
            await conn.reconnect_if_lost()
            conn.in_transaction = True
            conn.pending_begin = opening_statements(durable)
            with self.noting_commits() as noted:
                try:
                    yield conn
                    if conn.raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                        # A statement failed and the block went on: COMMIT would answer ROLLBACK, no error. Told.
                        raise pg_errors.InFailedSqlTransaction("the transaction failed; nothing of it was committed")
                    if not conn.pending_begin:
                        await conn.raw.execute("COMMIT")
                except BaseException:
                    await asyncio.shield(self._rollback())
                    raise
                finally:
                    conn.in_transaction = False
                    conn.pending_begin = ()
        self.committed(noted)

    async def write_one(self, sql: str, parameters: Sequence[Any], *, durable: bool = True) -> Written:
        return await self._one_trip(sql, parameters, opening_statements(durable))

    async def _one_trip(self, sql: str, parameters: Sequence[Any], opening: Sequence[str]) -> Written:
        """One write statement as a transaction of its own, in ONE round trip: BEGIN, the lock, the statement and
        COMMIT pipelined (no savepoint: the statement is the whole transaction, a refusal rolls all of it back).
        Never sent twice: a failure may follow a COMMIT the server made (a session the server ended while idle is
        replaced before, ``reconnect_if_lost``)."""
        async with self._write_lock:
            conn = self._writer
            await conn.reconnect_if_lost()
            conn.in_transaction = True
            with self.noting_commits() as noted:
                try:
                    cursor = psycopg.AsyncRawCursor(conn.raw, row_factory=_row_factory)
                    async with conn.raw.pipeline():
                        for statement in opening:
                            await conn.raw.execute(statement)
                        await cursor.execute(_translate(sql), _arguments(parameters))
                        await conn.raw.execute("COMMIT")
                    result = PgCursor(cursor)
                    written = Written(result.rowcount, list(await result.fetchall()))
                    await result.close()
                except BaseException:
                    await asyncio.shield(self._rollback())
                    raise
                finally:
                    conn.in_transaction = False
        self.committed(noted)
        return written

    async def write_rows(self, sql: str, parameters: Sequence[Any]) -> list[Row]:
        """The inbox's group commit (``DeliveryStore.insert_batch``, every delivery's one way in): one round trip,
        durable, and WITHOUT the schema's lock. The statement reads nothing it then writes: one INSERT ... ON
        CONFLICT DO NOTHING, atomic on its own (as SQLite's autocommit statement is), its duplicates decided by the
        unique indexes, which PostgreSQL enforces across concurrent transactions (the second waits for the first's
        commit, then skips). Taken under the lock, two replicas' batches committed one after the other, each
        waiting for the other's WAL flush; without it their commits share flushes, and no locked transaction
        sees less: a batch becomes visible all at once, at its commit, whichever replica stored it."""
        return (await self._one_trip(sql, parameters, UNLOCKED_OPENING)).rows

    async def _rollback(self) -> None:
        """ROLLBACK if a transaction is open. A session the server ended has none left (and the error that ended
        it is the one to raise, not ROLLBACK's)."""
        raw = self._writer.raw
        if self._writer.lost:
            return
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            await raw.execute("ROLLBACK")

    async def check_writable(self, *, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        """A real write (the probe table's one row updated, rolled back; no catalog write): refused on a
        read-only server or session (a standby, default_transaction_read_only), a full disk, or a lock held past
        lock_timeout."""
        del min_free_bytes  # the server's disk is the server's: its refusal of the write is the answer
        try:
            async with self.transaction() as conn:
                async with conn.execute("UPDATE foreman_write_probe SET probes = probes + 1 RETURNING probes") as cur:
                    if await cur.fetchone() is None:
                        raise DatabaseNotWritable("unavailable", f"the database {self.where} lost its probe row")
                raise _ProbeDone
        except _ProbeDone:
            return
        except psycopg.Error as exc:
            raise _not_writable(exc, self.where) from None


def opening_statements(durable: bool) -> tuple[str, str]:
    """What opens every write transaction: BEGIN at READ COMMITTED whatever the server's default (a write waiting
    for the lock must then see the other replica's commit), then in one statement the commit mode (durable: on,
    whatever the server's default; ``set_config(..., true)`` is SET LOCAL) and the schema's advisory lock."""
    mode = "on" if durable else "off"
    return (
        "BEGIN ISOLATION LEVEL READ COMMITTED",
        f"SELECT set_config('synchronous_commit', '{mode}', true), pg_advisory_xact_lock(hashtext(current_schema()))",
    )


#: ``write_rows``' opening: READ COMMITTED and a durable commit, pinned as every transaction's, but no lock.
UNLOCKED_OPENING = ("BEGIN ISOLATION LEVEL READ COMMITTED", "SELECT set_config('synchronous_commit', 'on', true)")


class _ProbeDone(Exception):
    """Raised inside the probe transaction to roll it back."""


def session_conninfo(url: str, *, read_only: bool = False) -> str:
    """The conninfo both sessions open: the URL, the keepalive defaults it does not set, and for a read-only
    database default_transaction_read_only. Raises psycopg.ProgrammingError on a URL libpq cannot parse (its
    message may quote the URL: never show it)."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    extra: dict[str, Any] = {key: value for key, value in CONNECTION_DEFAULTS.items() if key not in given}
    if read_only:
        extra["options"] = f"{given.get('options') or ''} -c default_transaction_read_only=on".strip()
    return psycopg.conninfo.make_conninfo(url, **extra)


def _connect_failure(exc: Exception, url: str) -> str:
    """What a failed connect says: the redacted URL and the error's class; a server's answer (unreachable,
    refused login) too, with any password it might quote hidden; never a parse error's text (it quotes the URL)."""
    where = redact_url(url)
    if isinstance(exc, psycopg.OperationalError):
        return f"cannot connect to {where}: {scrub(str(exc).strip(), url)}"
    return f"cannot connect to {where}: the URL is not one libpq accepts ({type(exc).__name__})"


def _not_writable(exc: psycopg.Error, where: str) -> DatabaseNotWritable:
    text = str(exc).strip()
    if isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        return DatabaseNotWritable("read_only", f"the database {where} is read-only: {text}")
    if isinstance(exc, pg_errors.DiskFull | pg_errors.InsufficientResources):
        return DatabaseNotWritable("full", f"the database {where} is full: {text}")
    if isinstance(exc, pg_errors.LockNotAvailable | pg_errors.QueryCanceled):
        return DatabaseNotWritable("locked", f"the database {where} is locked by another writer: {text}")
    return DatabaseNotWritable("unavailable", f"the database {where} refused a write: {type(exc).__name__}: {text}")
