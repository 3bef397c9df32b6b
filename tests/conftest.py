"""Shared fixtures: where ../shared lives, and the database backends every store test runs on."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from state.db import Database
from state.db_postgres import PostgresDatabase
from state.db_sqlite import SqliteDatabase
from state.sql import with_search_path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FOREMAN_SHARED", str(REPO_ROOT.parent / "shared")))


#: The one line a test that needs ../shared is skipped with in a clone without it (CI always has it, and
#: `.ci/run` fails on any skip, so there these tests always run).
SHARED_MISSING = f"needs ../shared (Gitea's spec, real payloads, seeds): not found at {SHARED}; set FOREMAN_SHARED"


#: The slices of the suite (``python3 dev.py test --quick`` runs what is none of them): a module declares its own in
#: ``pytestmark``; ``postgres`` is given here to every case of a store test run on PostgreSQL.
SLICES = {
    "process": "starts a real process (foreman serve, foreman mcp, the CLI, git over HTTP) or a Unix user",
    "postgres": "runs on the PostgreSQL server (FOREMAN_TEST_POSTGRES_URL)",
    "browser": "drives Chromium",
    "slow": "crash, soak, benchmark smoke and whole-demo runs",
}


#: The whole-test hang detector (pytest-timeout) of a test of the process, browser or slow slices: its own waits are
#: hang detectors of minutes (``tests.support.HANG_S``), and the pyproject's 120 s, right for an in-process test, would
#: cut a crash burst or a bench smoke that a machine at load 15 runs ten times slower than an idle one.
SLOW_SLICE_TIMEOUT_S = 900


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_shared: reads ../shared; skipped with one line where it is absent")
    for name, what in SLICES.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    postgres = pytest.mark.postgres
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "postgresql" in params.values() or any(f.startswith("postgres") for f in getattr(item, "fixturenames", ())):
            item.add_marker(postgres)
        if item.get_closest_marker("timeout") is None and any(
            item.get_closest_marker(name) is not None for name in ("process", "browser", "slow")
        ):
            item.add_marker(pytest.mark.timeout(SLOW_SLICE_TIMEOUT_S))
    if SHARED.is_dir():
        return
    skip = pytest.mark.skip(reason=SHARED_MISSING)
    for item in items:
        if item.get_closest_marker("needs_shared") is not None or "shared_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The read-only ../shared folder (seeds, Gitea facts, swagger, payloads)."""
    if not SHARED.is_dir():
        pytest.skip(SHARED_MISSING)
    return SHARED


#: The PostgreSQL server the PostgreSQL cases use; each test gets its own schema there, dropped after it.
POSTGRES_URL = os.environ.get("FOREMAN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
POSTGRES_MISSING = (
    "needs PostgreSQL: none reachable at FOREMAN_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/test);"
    " set FOREMAN_TEST_POSTGRES_URL=postgresql://USER@HOST:PORT/DB to a server this user may create schemas on"
)
BACKENDS = ("sqlite", "postgresql")
_reachable: list[bool] = []


def postgres_reachable() -> bool:
    if not _reachable:
        try:
            psycopg.connect(POSTGRES_URL, connect_timeout=30).close()  # a hang detector: a refusal is at once
            _reachable.append(True)
        except psycopg.Error:
            _reachable.append(False)
    return _reachable[0]


def _close_read_sessions(url: str) -> None:
    session = _read_sessions.pop(url, None)
    if session is not None:
        session.close()


class PostgresSchemas:
    """Fresh schemas on the test server, each dropped (with everything in it) at the end of the test."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def new(self) -> str:
        """A URL whose sessions work in a new empty schema."""
        name = f"t_{secrets.token_hex(6)}"
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        self.names.append(name)
        return with_search_path(POSTGRES_URL, name)

    def drop(self) -> None:
        if not self.names:
            return
        for url in [u for u in _read_sessions if any(f"search_path%3D{name}" in u for name in self.names)]:
            _close_read_sessions(url)
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            for name in self.names:
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """``sqlite`` or ``postgresql``: a test taking this runs once on each (PostgreSQL skipped where absent)."""
    name: str = request.param
    if name == "postgresql" and not postgres_reachable():
        pytest.skip(POSTGRES_MISSING)
    return name


@pytest.fixture
def pg_schemas(backend: str) -> Any:
    schemas = PostgresSchemas()
    yield schemas
    schemas.drop()


@pytest.fixture
def postgres_schemas() -> Any:
    """Schemas a test creates when it wants them (``new()``), dropped at its end. Ask for it before ``start``:
    fixtures are torn down in reverse, so the schemas outlive the services using them."""
    schemas = PostgresSchemas()
    yield schemas
    schemas.drop()


DbOpener = Callable[..., Awaitable[Database]]


@pytest.fixture
def postgres_url() -> Any:
    """For a test about PostgreSQL itself: a URL with a fresh schema (skipped where no server is reachable)."""
    if not postgres_reachable():
        pytest.skip(POSTGRES_MISSING)
    schemas = PostgresSchemas()
    yield schemas.new()
    schemas.drop()


@pytest.fixture
def database_url(backend: str, pg_schemas: PostgresSchemas) -> str | None:
    """A PostgreSQL URL with a fresh schema on the postgresql backend; None on SQLite (use a path)."""
    return pg_schemas.new() if backend == "postgresql" else None


@pytest.fixture
async def open_db(backend: str, pg_schemas: PostgresSchemas) -> AsyncIterator[DbOpener]:
    """``await open_db(path, **options)``: the database a test would open at ``path``, on this backend. On
    PostgreSQL each path is one schema, so opening a path again opens the same data."""
    urls: dict[Path, str] = {}
    opened: list[Database] = []

    async def opener(path: Path, *, synchronous: str = "FULL", busy_timeout_ms: int = 5000) -> Database:
        db: Database
        if backend == "sqlite":
            db = await Database.open(path, synchronous=synchronous, busy_timeout_ms=busy_timeout_ms)
        else:
            url = urls.setdefault(path, pg_schemas.new())
            db = await PostgresDatabase.connect(url, busy_timeout_ms=busy_timeout_ms)
        opened.append(db)
        return db

    yield opener
    for db in opened:
        await db.close()


#: What a read of a database another process writes may raise while that process starts, dies or migrates.
READ_ERRORS = (sqlite3.Error, psycopg.Error)


_read_sessions: dict[str, psycopg.Connection[Any]] = {}


def read_rows(target: Path | str, sql: str) -> list[tuple[Any, ...]]:
    """Rows of one query against a database a foreman process writes, read-only: a SQLite file or a PostgreSQL
    URL (so a test watching a `foreman serve` reads either backend the same way)."""
    if isinstance(target, str):
        session = _read_sessions.get(target)
        if session is None or session.closed or session.broken:
            # Kept between calls: a poll every few milliseconds must not have the server start a backend each time.
            session = _read_sessions[target] = psycopg.connect(target, autocommit=True, connect_timeout=30)
        return [tuple(row) for row in session.execute(sql).fetchall()]
    with sqlite3.connect(f"file:{target}?mode=ro", uri=True) as lite:
        return [tuple(row) for row in lite.execute(sql).fetchall()]


def sqlite_path(db: Database) -> Path:
    """The file of a SQLite database (for a test that opens it with sqlite3 itself)."""
    assert isinstance(db, SqliteDatabase)
    return db.path


def database_env(db: Database, folder: Path) -> dict[str, str]:
    """The environment that points a foreman process (CLI, serve) at ``db``: SQLite by FOREMAN_DATABASE__PATH
    over the embedded config; PostgreSQL by a config file under ``folder`` that names only ``database.url``
    (the embedded config names a path, and path and url together are refused)."""
    if isinstance(db, PostgresDatabase):
        config = folder / "foreman-pg.toml"
        config.write_text(f"[database]\nurl = {json.dumps(db.url)}\n", encoding="utf-8")
        return {"FOREMAN_CONFIG": str(config)}
    assert isinstance(db, SqliteDatabase)
    return {"FOREMAN_DATABASE__PATH": str(db.path), "FOREMAN_CONFIG": ""}


@pytest.fixture
async def db(open_db: DbOpener, tmp_path: Path) -> Database:
    """A fresh migrated database, once on SQLite and once on PostgreSQL."""
    return await open_db(tmp_path / "foreman.db")


from tests.support import start  # noqa: E402, F401  (fixture shared by the service tests)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI (FOREMAN_FAIL_ON_SKIP=1) a skipped test is a failure: a skip proves nothing."""
    if os.environ.get("FOREMAN_FAIL_ON_SKIP") != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    skipped = len(reporter.stats.get("skipped", []))
    if skipped and session.exitstatus == 0:
        reporter.write_line(f"FOREMAN_FAIL_ON_SKIP: {skipped} test(s) skipped; failing the run", red=True)
        session.exitstatus = 1
