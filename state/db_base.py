"""What both database backends share: the ``Database`` they implement, its typed refusals, and the migration runner.

``Database`` is what every store holds: ``transaction()`` (one write transaction at a time, serialized across
processes), ``reader`` (autocommit reads), ``check_writable()``, ``close()``. SQLite (state/db_sqlite.py) is the
embedded default; PostgreSQL (state/db_postgres.py) serves several replicas. state/db.py opens them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from state.migrations import MIGRATIONS
from state.migrations_pg import render_postgres
from state.records import to_db_time, utcnow
from state.sql import Connection, Dialect, Row

log = logging.getLogger("foreman.db")

#: check_writable() refuses when the database's file system has less free space than this.
MIN_FREE_BYTES = 2 * 1024 * 1024


class DatabaseNotWritable(RuntimeError):
    """The database cannot take a write now: read-only file or folder, full database or disk, or locked.

    ``reason`` is one of ``read_only``, ``full``, ``locked``, ``unavailable``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class DatabaseFileUnusable(DatabaseNotWritable):
    """``database.path`` names a file SQLite cannot open and write at start: read-only (its owner's write bit off,
    its folder's, or the file system's), immutable, another user's, or not a database. A configuration error:
    the CLI and ``foreman serve`` report it as one line naming the key, never a traceback.

    ``reason`` is ``read_only``, ``not_a_database`` or ``unavailable``."""

    def __init__(self, reason: str, path: Path, detail: str) -> None:
        super().__init__(reason, f"database.path {path}: {detail}")
        self.path = path
        self.detail = detail
        self.exact_next_action = (
            f"make {path} and its folder writable by this user (chmod u+w, chown, chattr -i), or set database.path"
            " to a writable SQLite file (a new one is created), then run foreman check-config"
            if reason != "not_a_database" else
            f"set database.path to foreman's SQLite file (or a new path: it is created); {path} is not one"
        )


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer foreman: this one does not know its schema and must not write it."""

    def __init__(self, found: int, known: int, where: str) -> None:
        self.found = found
        self.known = known
        self.exact_next_action = (
            f"run a foreman that knows schema version {found} against {where}, or restore a backup taken before"
            " the upgrade"
        )
        super().__init__(
            f"the database {where} has schema version {found}; this foreman knows up to version {known}:"
            f" {self.exact_next_action}"
        )


#: What the write transaction in progress noted to announce once it commits (``note_commit``), by topic; each
#: backend's ``transaction()`` opens the set for its block (``noting_commits``) and runs the topics' listeners after
#: its COMMIT, never after a rollback.
_NOTED: ContextVar[set[str] | None] = ContextVar("foreman_noted_commits", default=None)


def note_commit(topic: str) -> None:
    """Inside a write transaction: once it commits, ``topic``'s listeners run (the outbox notes every entry it stores,
    so its sender is woken by the commit itself, never by the callers). Outside one it is nothing."""
    noted = _NOTED.get()
    if noted is not None:
        noted.add(topic)


@dataclass(frozen=True, slots=True)
class Written:
    """What ``write_one`` did: the rows the statement changed (``rowcount``), and those it returned."""

    rowcount: int
    rows: list[Row]


class EmbeddedBackend(Protocol):
    """What ``Database.open`` and ``Database.open_read_only`` ask of the embedded backend's class (SQLite's)."""

    async def open_file(self, path: Path, *, synchronous: str = ..., busy_timeout_ms: int = ...) -> Database: ...

    async def open_file_read_only(self, path: Path, *, busy_timeout_ms: int = ...) -> Database: ...


Backend = TypeVar("Backend", bound=EmbeddedBackend)


def embedded(backend: Backend) -> Backend:
    """Class decorator: ``backend`` is the embedded backend that ``Database.open`` opens. state/db_sqlite.py names
    its class so as it is defined, and state/db.py, the face every store imports, imports it: this module imports no
    backend, which both import."""
    Database.embedded_backend = backend
    return backend


class Database:
    """An opened database. All writes go through ``transaction()``, one at a time across every process."""

    dialect: Dialect
    #: What the database is, for messages and logs: a file path, or a PostgreSQL URL without its password.
    where: str
    #: The class ``open`` and ``open_read_only`` open a file with (``embedded``).
    embedded_backend: ClassVar[EmbeddedBackend | None] = None

    @classmethod
    async def open(cls, path: Path, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000) -> Database:
        """The SQLite database at ``path``, created and migrated."""
        return await _embedded().open_file(path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)

    @classmethod
    async def open_read_only(cls, path: Path, *, busy_timeout_ms: int = 5000) -> Database:
        """A SQLite database another process writes, for reads only: never created or migrated, writes refused."""
        return await _embedded().open_file_read_only(path, busy_timeout_ms=busy_timeout_ms)

    def on_commit(self, topic: str, listener: Callable[[], None]) -> None:
        """Run ``listener`` after every committed transaction that noted ``topic`` (``note_commit``), in the
        committing task, once per transaction however many times it was noted. A failing listener is logged by
        the caller's loop, never undoes the commit."""
        self.__dict__.setdefault("_commit_listeners", {}).setdefault(topic, []).append(listener)

    @contextmanager
    def noting_commits(self) -> Iterator[set[str]]:
        """For a backend's ``transaction()``: the topics its block notes (a nested block shares its outer set)."""
        outer = _NOTED.get()
        if outer is not None:
            yield outer
            return
        noted: set[str] = set()
        token = _NOTED.set(noted)
        try:
            yield noted
        finally:
            _NOTED.reset(token)

    def committed(self, noted: set[str]) -> None:
        """After a COMMIT: the listeners of each topic the transaction noted."""
        listeners: dict[str, list[Callable[[], None]]] = self.__dict__.get("_commit_listeners", {})
        for topic in sorted(noted):
            for listener in listeners.get(topic, ()):
                try:
                    listener()
                except Exception:
                    log.exception("a listener of %s commits failed (the commit stands)", topic)

    def transaction(self, *, durable: bool = True) -> AbstractAsyncContextManager[Connection]:
        """One write transaction: committed at the end of the block, rolled back on any exception.

        ``durable=False``: it survives a process crash but may be lost on power loss. Only bookkeeping whose
        loss means "do it again" (worker claims, handler results) uses it; an acknowledged delivery is always
        committed durably.
        """
        raise NotImplementedError

    async def write_one(self, sql: str, parameters: Sequence[Any], *, durable: bool = True) -> Written:
        """One write statement as a transaction of its own (``durable`` as for ``transaction()``): how many rows it
        changed, and the rows it returns (``RETURNING``). Here (SQLite) exactly ``transaction()`` around the
        statement; PostgreSQL sends it in one round trip, so that its lock is never held while this process waits."""
        async with self.transaction(durable=durable) as conn, conn.execute(sql, parameters) as cursor:
            rows = list(await cursor.fetchall())
            return Written(cursor.rowcount, rows)

    async def write_rows(self, sql: str, parameters: Sequence[Any]) -> list[Row]:
        """One write statement as a durable transaction of its own, and the rows it returns (``RETURNING``).

        The webhook door's group commit stores a batch this way: on SQLite one trip to the database thread
        (an autocommit statement is atomic: all its rows or none), where a transaction block takes three.
        """
        async with self.transaction() as conn, conn.execute(sql, parameters) as cursor:
            return list(await cursor.fetchall())

    @property
    def reader(self) -> Connection:
        """For reads outside a transaction (autocommit: each statement sees the latest commit)."""
        raise NotImplementedError

    async def check_writable(self, *, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        """Raise DatabaseNotWritable unless the database can take a write now (used by /readyz)."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def schema_version(self) -> int:
        async with self.reader.execute("SELECT MAX(version) FROM schema_migrations") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0

    async def _has_schema_table(self) -> bool:
        """Whether schema_migrations exists (a database never migrated has none)."""
        raise NotImplementedError

    async def _refuse_newer_schema(self) -> None:
        """For a read-only open (never migrated): SchemaTooNew when a newer foreman migrated the database, whose
        tables this one would misread."""
        known = max(version for version, _, _ in MIGRATIONS)
        if await self._has_schema_table() and (found := await self.schema_version()) > known:
            raise SchemaTooNew(found, known, self.where)

    async def _prepare_schema(self, conn: Connection) -> None:
        """Backend objects every migration may use (PostgreSQL: its trigger and JSON functions)."""

    async def _migrate(self) -> None:
        """Apply the numbered migrations not applied yet, in one transaction; refuse a newer schema."""
        known = max(version for version, _, _ in MIGRATIONS)
        async with self.transaction() as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
            )
            async with conn.execute("SELECT version FROM schema_migrations") as cur:
                applied = {int(row[0]) for row in await cur.fetchall()}
            if applied and max(applied) > known:
                raise SchemaTooNew(max(applied), known, self.where)
            await self._prepare_schema(conn)
            for version, name, sql in MIGRATIONS:
                if version in applied:
                    continue
                text = render_postgres(version, sql) if self.dialect == "postgresql" else sql
                for statement in _split_sql(text):
                    await conn.execute(statement)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, to_db_time(utcnow())),
                )


def _embedded() -> EmbeddedBackend:
    """The embedded backend ``embedded`` named (a RuntimeError before state/db_sqlite.py is imported)."""
    if Database.embedded_backend is None:
        raise RuntimeError("no embedded database backend: import state.db (it imports state/db_sqlite.py)")
    return Database.embedded_backend


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
