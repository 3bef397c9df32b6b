"""The backend seam the stores write against: one connection shape, one row shape, one integrity error.

The stores' SQL is one source for SQLite and PostgreSQL: ``?`` placeholders, ``ON CONFLICT DO NOTHING``,
``RETURNING``. SQLite runs it as it is (through aiosqlite); the PostgreSQL connection (state/db_postgres.py)
translates the placeholders and gives rows that are addressable by name and by index, like ``sqlite3.Row``.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Generator, Iterable, Iterator
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg

Dialect = Literal["sqlite", "postgresql"]

#: What a unique index, a CHECK, a foreign key or a sealed grant's trigger answers on either backend.
IntegrityError: tuple[type[Exception], ...] = (sqlite3.IntegrityError, psycopg.errors.IntegrityError)


class Row(Protocol):
    """A result row: ``row["column"]`` and ``row[0]``, ``keys()`` in column order."""

    def __getitem__(self, key: int | str, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...

    def __len__(self) -> int: ...

    def keys(self) -> list[str]: ...


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    async def fetchone(self) -> Row | None: ...

    async def fetchall(self) -> Iterable[Row]: ...

    async def close(self) -> None: ...


class CursorResult(Protocol):
    """What ``execute`` returns: awaited for the cursor, or entered with ``async with``."""

    def __await__(self) -> Generator[Any, None, Cursor]: ...

    async def __aenter__(self) -> Cursor: ...

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None: ...


class Connection(Protocol):
    """A store's connection, inside a write transaction or for autocommit reads."""

    def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> CursorResult: ...

    def executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> CursorResult: ...


def placeholders_to_dollar(sql: str) -> str:
    """``?`` to ``$1``, ``$2``... outside quoted literals and identifiers (PostgreSQL's own numbered form)."""
    out: list[str] = []
    number = 0
    quote: str | None = None
    for char in sql:
        if quote is not None:
            if char == quote:
                quote = None
        elif char in ("'", '"'):
            quote = char
        elif char == "?":
            number += 1
            out.append(f"${number}")
            continue
        out.append(char)
    return "".join(out)


def redact_url(url: str) -> str:
    """The URL without its password (for logs, messages and check-config)."""
    parts = urlsplit(url)
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    netloc = parts.netloc
    if parts.password is not None:
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose sessions work in ``schema`` (libpq's options parameter, -c search_path=..., added to any
    options the URL already carries)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = " ".join([*(value for key, value in query if key == "options"), f"-c search_path={schema}"])
    kept = [(key, value) for key, value in query if key != "options"]
    encoded = urlencode([*kept, ("options", options)], quote_via=quote)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, encoded, parts.fragment))
