"""The database edge: what every store imports, and the openers. SQLite (state/db_sqlite.py) is the embedded
default; PostgreSQL (state/db_postgres.py) serves several replicas; ``open_database`` picks by config.

The ``Database`` both implement, its refusals and the migration runner live in state/db_base.py, the record helpers
in state/records.py; this module hands them on, so that ``from state.db import Database, utcnow, ...`` stays the
one import of every store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from state.db_base import (
    MIN_FREE_BYTES,
    Database,
    DatabaseFileUnusable,
    DatabaseNotWritable,
    SchemaTooNew,
    note_commit,
)
from state.db_sqlite import SqliteDatabase
from state.records import from_db_time, from_row, to_db_time, utcnow

if TYPE_CHECKING:
    from bot.config_sections import DatabaseConfig

__all__ = [
    "MIN_FREE_BYTES", "Database", "DatabaseFileUnusable", "DatabaseNotWritable", "SchemaTooNew", "from_db_time",
    "from_row", "is_postgres_url", "note_commit", "open_database", "read_only", "to_db_time", "utcnow",
]


def is_postgres_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


async def open_database(config: DatabaseConfig) -> Database:
    """The configured database, created and migrated: PostgreSQL at ``database.url``, else SQLite at
    ``database.path``. Every opener (serve, the CLI, foreman mcp) goes through here."""
    url = config.postgres_url()
    if url is not None:
        from state.db_postgres import PostgresDatabase

        return await PostgresDatabase.connect(url, busy_timeout_ms=config.busy_timeout_ms)
    return await SqliteDatabase.open_file(config.path, synchronous=config.synchronous,
                                          busy_timeout_ms=config.busy_timeout_ms)


@asynccontextmanager
async def read_only(target: Path | str) -> AsyncIterator[Database]:
    """A database another process writes, read-only, for the length of a block (a demo or checker beside a
    running service): a SQLite file path, or a PostgreSQL URL (a read-only session there)."""
    if isinstance(target, str) and is_postgres_url(target):
        from state.db_postgres import PostgresDatabase

        db: Database = await PostgresDatabase.connect(target, read_only=True)
    else:
        db = await SqliteDatabase.open_file_read_only(Path(target))
    try:
        yield db
    finally:
        await db.close()
