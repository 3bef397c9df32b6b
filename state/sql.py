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
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

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


class AmbiguousPlaceholder(ValueError):
    """SQL whose ``?`` could be a placeholder or PostgreSQL's JSONB operator (``?``, ``?|``, ``?&``): a programming
    error in the statement, refused when it is first translated. Use ``jsonb_exists``/``jsonb_exists_any``."""


_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")


def placeholders_to_dollar(sql: str) -> str:
    """``?`` to ``$1``, ``$2``... outside quoted literals and identifiers, ``--`` and ``/* */`` comments,
    ``E'...'`` strings (backslash escapes) and ``$tag$...$tag$`` bodies (PostgreSQL's own numbered form).

    A ``?`` directly followed by ``|`` or ``&`` reads as a JSONB operator: refused (AmbiguousPlaceholder)."""
    out: list[str] = []
    number = 0
    i = 0
    n = len(sql)
    while i < n:
        char = sql[i]
        if char == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            end = n if end < 0 else end + 1
        elif char == "/" and sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
        elif char in ("'", '"'):
            escapes = char == "'" and i > 0 and sql[i - 1] in "eE" and (i < 2 or not _word(sql[i - 2]))
            end = _quoted_end(sql, i, char, escapes)
        elif char == "$" and (i == 0 or not _word(sql[i - 1])) and (tag := _DOLLAR_TAG.match(sql, i)):
            close = sql.find(tag[0], tag.end())
            end = n if close < 0 else close + len(tag[0])
        elif char == "?":
            if sql[i + 1 : i + 2] in ("|", "&"):
                raise AmbiguousPlaceholder(f"{sql[i:i + 2]!r} at offset {i} reads as a JSONB operator: {sql!r}")
            number += 1
            out.append(f"${number}")
            i += 1
            continue
        else:
            end = i + 1
        out.append(sql[i:end])
        i = end
    return "".join(out)


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _quoted_end(sql: str, start: int, quote_char: str, escapes: bool) -> int:
    """Where the literal or identifier opened at ``start`` ends (after its closing quote; doubled quotes and, in
    an E'' string, backslash escapes stay inside)."""
    i = start + 1
    while i < len(sql):
        if escapes and sql[i] == "\\":
            i += 2
            continue
        if sql[i] == quote_char:
            if sql[i + 1 : i + 2] == quote_char:
                i += 2
                continue
            return i + 1
        i += 1
    return len(sql)


def _password_span(url: str) -> tuple[int, int] | None:
    """Where the password of ``url``'s userinfo is (start, end), by string surgery only: everything between the
    first ``:`` of the userinfo and the last ``@`` before the query (over-hiding rather than leaking; a multi-host
    list, a port out of range or bad percent-encoding never stops it)."""
    scheme_end = url.find("://")
    if scheme_end < 0:
        return None
    start = scheme_end + 3
    query = url.find("?", start)
    before_query = url[start:] if query < 0 else url[start:query]
    at = before_query.rfind("@")
    if at < 0:
        return None
    colon = before_query.find(":", 0, at)
    if colon < 0:
        return None
    return start + colon + 1, start + at


def url_password(url: str) -> str | None:
    """The password written in ``url`` (userinfo or ``password=`` parameter), as written; None when there is none."""
    span = _password_span(url)
    if span is not None and span[1] > span[0]:
        return url[span[0] : span[1]]
    found = re.search(r"(?i)[?&]password=([^&#]*)", url)
    return found[1] if found and found[1] else None


def redact_url(url: str) -> str:
    """The URL without its password (for logs, messages and check-config); never parses host or port."""
    span = _password_span(url)
    if span is not None:
        url = url[: span[0]] + "***" + url[span[1] :]
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


def scrub(text: str, url: str) -> str:
    """``text`` (an error's message) with ``url``'s password replaced, should the message quote it."""
    password = url_password(url)
    if not password:
        return text
    for form in {password, unquote(password)}:
        if form:
            text = text.replace(form, "***")
    return text


def postgres_url_problem(url: str) -> str | None:
    """Why libpq would refuse ``url`` (the URL shown without its password, the parser's class only: its message
    quotes the URL), or None when libpq parses it."""
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except (psycopg.Error, ValueError) as exc:
        return (
            f"{redact_url(url)} is not a URL libpq accepts ({type(exc).__name__}): check its percent-encoding"
            " (a % in the password is written %25), host list and port"
        )
    return None


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose sessions work in ``schema`` (libpq's options parameter, -c search_path=..., added to any
    options the URL already carries)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = " ".join([*(value for key, value in query if key == "options"), f"-c search_path={schema}"])
    kept = [(key, value) for key, value in query if key != "options"]
    encoded = urlencode([*kept, ("options", options)], quote_via=quote)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, encoded, parts.fragment))
