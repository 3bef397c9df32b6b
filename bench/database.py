"""The benchmarks' view of foreman's database while a `foreman serve` writes it: a SQLite file or a PostgreSQL URL.

``--database-url`` makes a benchmark run once more on PostgreSQL, beside the SQLite run: each PostgreSQL run
works in a schema of its own on that server, created for it and dropped after (kept with ``--keep``), its sessions
named after the schema (``application_name``) so that ``footprint`` finds the server processes serving that run.
``footprint`` is the database's share of a run's memory and how it grows: SQLite lives inside the process that
opens it (its memory is that process's peak RSS), so only its files' size; PostgreSQL's server backends are
processes of their own, whose peak RSS (``VmHWM``, the server on this machine) is counted beside the schema's size.
"""

from __future__ import annotations

import secrets
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

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


def footprint(target: Target) -> dict[str, Any]:
    """The database's size in bytes (the SQLite file with its WAL, or the schema's tables and indexes), and on
    PostgreSQL the peak RSS of each server backend serving a session named as this target's (``application_name``,
    as ``scratch_schema`` names them; this process's own polling session left out), in KiB."""
    from bench.harness import peak_rss_kib  # bench.harness imports bench.intake, which imports this module

    if not isinstance(target, str):
        size = sum(p.stat().st_size for p in (target, Path(f"{target}-wal"), Path(f"{target}-shm")) if p.exists())
        return {"bytes": size, "backend_peak_rss_kib": []}
    size = rows(target, "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) AS b FROM pg_class c JOIN"
                       " pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = current_schema()"
                       " AND c.relkind IN ('r', 'm')")[0]["b"]
    pids = rows(target, "SELECT pid FROM pg_stat_activity WHERE application_name = current_setting('application_name')"
                        " AND application_name <> '' AND pid <> pg_backend_pid()")
    return {"bytes": int(size), "backend_peak_rss_kib": [peak_rss_kib(int(r["pid"])) for r in pids]}


def _with_application_name(url: str, name: str) -> str:
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "application_name"]
    encoded = urlencode([*query, ("application_name", name)], quote_via=quote)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, encoded, parts.fragment))


@contextmanager
def scratch_schema(url: str, *, keep: bool = False) -> Iterator[str]:
    """A new schema on the server at ``url`` for one run: the URL whose sessions use it; dropped afterwards."""
    name = f"foreman_bench_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    scoped = _with_application_name(with_search_path(url, name), name)
    try:
        yield scoped
    finally:
        session = _sessions.pop(scoped, None)
        if session is not None:
            session.close()
        if not keep:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
