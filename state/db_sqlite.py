"""The SQLite backend: one connection for writes (explicit BEGIN IMMEDIATE transactions), WAL, 0600 files."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import aiosqlite

from state.db_base import MIN_FREE_BYTES, Database, DatabaseFileUnusable, DatabaseNotWritable, embedded
from state.sql import Dialect, Row

T = TypeVar("T")

#: Files SQLite keeps beside the database in WAL mode; SQLite creates them with the database file's mode.
SIDE_FILES = ("-wal", "-shm")


class _ProbeDone(Exception):
    """Raised inside the probe transaction to roll it back."""


def _owner_may_write(path: Path) -> bool:
    """os.access, and for a file we own the owner's write bit too (root passes os.access on a chmod 0400 file,
    but an operator who made the database read-only meant it)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return True
    if info.st_uid == os.geteuid() and not info.st_mode & stat.S_IWUSR:
        return False
    return os.access(path, os.W_OK)


def _file_problem(exc: BaseException) -> str | None:
    """What SQLite's refusal at open says about the file itself (a ``DatabaseFileUnusable`` reason), or None for
    anything else (a lock held elsewhere, say), which is not the configuration's fault."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return None
    text = str(exc).lower()
    if "readonly" in text or "read-only" in text:
        return "read_only"
    if "not a database" in text or "malformed" in text:
        return "not_a_database"
    if "unable to open" in text:
        return "unavailable"
    return None


def _private(path: Path) -> None:
    """Mode 0600 for the database and its side files (webhook bodies and tokens' digests live there)."""
    for candidate in (path, *(path.with_name(path.name + suffix) for suffix in SIDE_FILES)):
        try:
            if stat.S_IMODE(candidate.stat().st_mode) != 0o600:
                os.chmod(candidate, 0o600)
        except FileNotFoundError:
            continue


#: What a lock held elsewhere (another process, or a read on this connection) answers: worth waiting for.
_BUSY = frozenset({"SQLITE_BUSY", "SQLITE_BUSY_SNAPSHOT", "SQLITE_LOCKED"})


@embedded
class SqliteDatabase(Database):
    """An opened SQLite database. All writes go through ``transaction()``, one at a time (BEGIN IMMEDIATE)."""

    dialect: Dialect = "sqlite"

    def __init__(
        self, conn: aiosqlite.Connection, path: Path, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000
    ) -> None:
        self._conn = conn
        self.path = path
        self.where = str(path)
        self._write_lock = asyncio.Lock()
        self._synchronous = synchronous
        self._current_sync = synchronous
        self._busy_timeout_s = busy_timeout_ms / 1000

    @classmethod
    async def open_file(
        cls, path: Path, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000
    ) -> SqliteDatabase:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be FULL or NORMAL")
        # A file (or folder) its owner made read-only is refused as check_writable() refuses it, not made writable
        # by the chmod below: the operator meant it (and root would pass every other check).
        for candidate in (path, *(path.with_name(path.name + s) for s in SIDE_FILES), path.parent):
            if not _owner_may_write(candidate):
                mode = stat.S_IMODE(candidate.stat().st_mode)
                what = "its folder" if candidate == path.parent else "the file" if candidate == path else "its file"
                shown = "" if candidate == path else f" {candidate}"
                why = "read-only" if not mode & stat.S_IWUSR else \
                    "not writable by this user (immutable, another user's, or on a read-only file system)"
                raise DatabaseFileUnusable("read_only", path, f"{what}{shown} is {why} (mode {mode:04o})")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Created 0600 before SQLite opens it: SQLite gives the -wal and -shm files the database file's mode.
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            _private(path)
        except OSError as exc:  # another user's file, an immutable one, a read-only file system, a directory
            reason = "read_only" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else "unavailable"
            raise DatabaseFileUnusable(reason, path, f"cannot be opened for writing: {exc.strerror}") from None
        conn = await aiosqlite.connect(str(path), isolation_level=None)
        conn.row_factory = sqlite3.Row
        try:
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute(f"PRAGMA synchronous={synchronous}")
            await conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            await conn.execute("PRAGMA foreign_keys=ON")
            db = cls(conn, path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
            await db._migrate()
        except BaseException as exc:
            await conn.close()
            problem = _file_problem(exc)
            if problem is not None:
                raise DatabaseFileUnusable(problem, path, f"SQLite refused it: {exc}") from None
            raise
        _private(path)
        return db

    @classmethod
    async def open_file_read_only(cls, path: Path, *, busy_timeout_ms: int = 5000) -> SqliteDatabase:
        """A database another process writes, for reads only: never created or migrated, every write refused."""
        if not await asyncio.to_thread(path.is_file):
            # Checked first: aiosqlite's thread outlives a failed connect and may call back into a closed loop.
            raise FileNotFoundError(f"no database at {path}")
        conn = await aiosqlite.connect(f"file:{quote(str(path))}?mode=ro", uri=True, isolation_level=None)
        conn.row_factory = sqlite3.Row
        await conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        db = cls(conn, path, busy_timeout_ms=busy_timeout_ms)
        try:
            await db._refuse_newer_schema()
        except BaseException:
            await conn.close()
            raise
        return db

    async def close(self) -> None:
        await self._conn.close()

    async def _has_schema_table(self) -> bool:
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
        async with self._conn.execute(sql) as cur:
            return await cur.fetchone() is not None

    @asynccontextmanager
    async def transaction(self, *, durable: bool = True) -> AsyncIterator[aiosqlite.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any exception (including cancellation).

        ``durable=False`` commits with synchronous=NORMAL; durable ones with the configured (default FULL).
        """
        async with self._write_lock:
            await self._use_synchronous(self._synchronous if durable else "NORMAL")
            with self.noting_commits() as noted:
                try:
                    await self._begin()
                    yield self._conn
                    await self._conn.execute("COMMIT")
                except BaseException:
                    # Also when BEGIN or COMMIT failed or was cancelled: never leave the write lock held. A
                    # cancelled BEGIN may still run on the database thread after the loop saw the cancellation, so
                    # the ROLLBACK is queued behind it whatever ``in_transaction`` says now (it finds none: no error).
                    await asyncio.shield(self._rollback())
                    raise
        self.committed(noted)

    async def _use_synchronous(self, wanted: str) -> None:
        """The commit mode of the next write (only under the write lock)."""
        if wanted != self._current_sync:
            await self._conn.execute(f"PRAGMA synchronous={wanted}")
            self._current_sync = wanted

    async def write_rows(self, sql: str, parameters: Sequence[Any]) -> list[Row]:
        """One durable autocommit statement, executed and read in ONE trip to the database thread (no BEGIN /
        COMMIT around it: SQLite commits a statement outside a transaction when it completes, and undoes all of it
        when it fails). The write lock keeps every other transaction on this connection out meanwhile; a lock
        another process holds is waited for as ``_begin`` waits for it."""
        async with self._write_lock:
            await self._use_synchronous(self._synchronous)
            return list(await self._while_busy(lambda: self._conn.execute_fetchall(sql, parameters)))

    async def _begin(self) -> None:
        """BEGIN IMMEDIATE, waiting up to the busy timeout where SQLite will not (``_while_busy``)."""
        await self._while_busy(lambda: self._conn.execute("BEGIN IMMEDIATE"))

    async def _while_busy(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` again after short pauses while SQLite answers busy, up to the busy timeout. SQLite's own busy
        handler does not cover SQLITE_BUSY_SNAPSHOT, answered at once while a read on this connection (another
        task's, not finished) holds a snapshot older than another process's commit; the read ends within a few
        queued statements, then the write can start."""
        deadline = time.monotonic() + self._busy_timeout_s
        pause = 0.001
        while True:
            try:
                return await attempt()
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorname", "") not in _BUSY or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)

    async def _rollback(self) -> None:
        """ROLLBACK if a transaction is still open when it runs. A COMMIT whose caller was cancelled is still
        queued on the database thread ahead of it and may have ended the transaction by then; that is no error."""
        try:
            await self._conn.execute("ROLLBACK")
        except sqlite3.OperationalError:
            if self._conn.in_transaction:
                raise

    @property
    def reader(self) -> aiosqlite.Connection:
        return self._conn

    async def check_writable(self, *, min_free_bytes: int = MIN_FREE_BYTES) -> None:
        """Raise DatabaseNotWritable unless the database can take a write now (used by /readyz).

        SQLite checks, in order: the file and its folder are writable (mode bits included); the file system has
        ``min_free_bytes`` free; and a real write that needs new pages (a table and a page-sized row, rolled
        back, so nothing is left behind) is accepted by SQLite, which refuses it with SQLITE_READONLY on a
        read-only database and SQLITE_FULL on a full one.
        """
        folder = self.path.parent
        for candidate in (self.path, *(self.path.with_name(self.path.name + s) for s in SIDE_FILES)):
            if not _owner_may_write(candidate):
                mode = stat.S_IMODE(candidate.stat().st_mode)
                raise DatabaseNotWritable("read_only", f"the database file {candidate} is read-only (mode {mode:04o})")
        if not _owner_may_write(folder):
            raise DatabaseNotWritable(
                "read_only", f"the database folder {folder} is read-only: SQLite cannot create its -wal/-shm files"
            )
        try:
            free = shutil.disk_usage(folder).free
        except OSError as exc:
            raise DatabaseNotWritable("unavailable", f"cannot read the free space of {folder}: {exc}") from exc
        if free < min_free_bytes:
            raise DatabaseNotWritable(
                "full", f"only {free} bytes free on the file system of {folder} (at least {min_free_bytes} needed)"
            )
        try:
            async with self.transaction() as conn:
                async with conn.execute("PRAGMA page_size") as cur:
                    row = await cur.fetchone()
                page_size = int(row[0]) if row is not None else 4096
                await conn.execute("CREATE TABLE foreman_write_probe (pad BLOB)")
                await conn.execute("INSERT INTO foreman_write_probe (pad) VALUES (zeroblob(?))", (page_size,))
                raise _ProbeDone
        except _ProbeDone:
            return
        except sqlite3.Error as exc:
            raise _not_writable(exc, self.path) from exc


def _not_writable(exc: sqlite3.Error, path: Path) -> DatabaseNotWritable:
    name = getattr(exc, "sqlite_errorname", "") or ""
    text = str(exc)
    if name.startswith("SQLITE_READONLY") or "readonly" in text:
        return DatabaseNotWritable("read_only", f"the database {path} is read-only: {text}")
    if name.startswith("SQLITE_FULL") or "full" in text:
        return DatabaseNotWritable("full", f"the database {path} is full: {text}")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return DatabaseNotWritable("locked", f"the database {path} is locked by another writer: {text}")
    kind = name or type(exc).__name__
    return DatabaseNotWritable("unavailable", f"the database {path} refused a write: {kind}: {text}")
