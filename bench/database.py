"""The benchmarks' view of foreman's database while a `foreman serve` writes it: a SQLite file or a PostgreSQL URL.

``--database-url`` makes a benchmark run once more on PostgreSQL, beside the SQLite run: each PostgreSQL run
works in a schema of its own on that server, created for it and dropped after (kept with ``--keep``).
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from state.sql import with_search_path

#: Where a foreman keeps its state: the SQLite file, or the PostgreSQL URL (with its schema).
Target = Path | str


#: One session per PostgreSQL URL, kept between polls: a new session per poll would have the server start a
#: backend process every 20 ms, a load the SQLite runs do not carry (opening a SQLite file is cheap).
_sessions: dict[str, psycopg.Connection[Any]] = {}


def _session(url: str) -> psycopg.Connection[Any]:
    session = _sessions.get(url)
    if session is None or session.closed or session.broken:
        session = _sessions[url] = psycopg.connect(url, autocommit=True, connect_timeout=5)
    return session


def rows(target: Target, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows of one read-only query (``?`` placeholders), each a dict by column name."""
    if isinstance(target, str):
        cursor = _session(target).execute(sql.replace("?", "%s"), params)
        names = [c.name for c in cursor.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    lite = sqlite3.connect(f"file:{target}?mode=ro", uri=True, timeout=5.0)
    try:
        lite.row_factory = sqlite3.Row
        return [dict(row) for row in lite.execute(sql, params).fetchall()]
    finally:
        lite.close()


def exists(target: Target) -> bool:
    return isinstance(target, str) or target.exists()


@contextmanager
def scratch_schema(url: str, *, keep: bool = False) -> Iterator[str]:
    """A new schema on the server at ``url`` for one run: the URL whose sessions use it; dropped afterwards."""
    name = f"foreman_bench_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    scoped = with_search_path(url, name)
    try:
        yield scoped
    finally:
        session = _sessions.pop(scoped, None)
        if session is not None:
            session.close()
        if not keep:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
