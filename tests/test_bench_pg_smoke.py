"""Smoke tests of the PostgreSQL benchmarks (bench/pg_loop.py, bench/replicas.py) and of the round trips the
PostgreSQL backend costs, counted on the wire by bench/pg_wire.py's proxy. Small workloads, correctness only: no
time is asserted. Skipped with one line where no PostgreSQL server is reachable."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from bench.pg_wire import SessionCounts, WireCounter
from state.db_postgres import PostgresDatabase
from tests.conftest import POSTGRES_MISSING, POSTGRES_URL, REPO_ROOT, PostgresSchemas, postgres_reachable
from tests.support import SLOW_HANG_S

pytestmark = [pytest.mark.slow]


@pytest.fixture
def postgres_server() -> str:
    """The test server's URL (each benchmark makes and drops a schema of its own there)."""
    if not postgres_reachable():
        pytest.skip(POSTGRES_MISSING)
    return POSTGRES_URL


def _bench(*argv: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", *argv, "--json"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=SLOW_HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_pg_loop_runs_the_loop_on_both_backends_in_alternating_rounds(postgres_server: str) -> None:
    doc = _bench("bench.pg_loop", "--issues", "2", "--rounds", "2", "--database-url", postgres_server)
    assert doc["ok"] is True and doc["errors"] == []
    assert doc["sqlite_ms"]["n"] == doc["postgresql_ms"]["n"] == 2
    assert [(p["round"], p["backend"]) for p in doc["parts"]] == [
        (1, "sqlite"), (1, "postgresql"), (2, "postgresql"), (2, "sqlite")]
    assert doc["ratio"] == doc["postgresql_ms"]["p50"] / doc["sqlite_ms"]["p50"]
    assert doc["pass"] == (doc["ratio"] <= doc["target"] == 1.3)


def test_pg_loop_counts_what_one_issue_sends_to_postgresql(postgres_server: str) -> None:
    doc = _bench("bench.pg_loop", "--count", "--issues", "1", "--database-url", postgres_server)
    assert doc["ok"] is True
    serve = doc["per_issue"]["foreman serve"]
    assert serve["statements"] >= serve["transactions"] > 0 and serve["round_trips"] > 0
    assert doc["serve_top_statements_per_issue"] and doc["serve_top_transactions_per_issue"]


def test_replicas_intake_stores_every_202_once_and_processes_it_once(postgres_server: str) -> None:
    doc = _bench("bench.replicas", "--requests", "40", "--rounds", "1", "--warmup", "0", "--concurrency", "4",
                 "--database-url", postgres_server)
    assert doc["ok"] is True and doc["errors"] == []
    assert doc["order"] == ["one", "two"]
    assert doc["one"]["accepted"] == doc["two"]["accepted"] == 40
    assert doc["ratio"] == round(doc["two"]["deliveries_per_s"] / doc["one"]["deliveries_per_s"], 3)
    assert doc["pass"] == (doc["ratio"] >= doc["target"] == 1.0)


async def _counted(url: str, what: str) -> SessionCounts:
    """Round trips of the writer's session for one operation ``what``, through the counting proxy."""
    counter = WireCounter().start()
    try:
        db = await PostgresDatabase.connect(counter.url_through(url))
        try:
            async with db.transaction() as conn:
                await conn.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER PRIMARY KEY)")
            before = _total(counter)
            if what == "write_one":
                await db.write_one("INSERT INTO t (x) VALUES (?)", (1,))
            elif what == "one statement":
                async with db.transaction() as conn:
                    await conn.execute("INSERT INTO t (x) VALUES (?)", (2,))
            elif what == "three statements":
                async with db.transaction() as conn:
                    for x in (3, 4, 5):
                        await conn.execute("INSERT INTO t (x) VALUES (?)", (x,))
            else:
                async with db.transaction():
                    pass
            after = _total(counter)
        finally:
            await db.close()
    finally:
        counter.stop()
    return SessionCounts(round_trips=after.round_trips - before.round_trips,
                         transactions=after.transactions - before.transactions)


def _total(counter: WireCounter) -> SessionCounts:
    """Every session's counts so far (between two of these only the writer speaks: the reader is not used)."""
    total = SessionCounts()
    for counts in counter.counts().values():
        total.add(counts)
    return total


async def test_a_one_statement_write_is_one_round_trip_and_begin_rides_with_the_first_statement(
    postgres_server: str,
) -> None:
    """Issue 35: BEGIN and the schema's lock travel with the transaction's first statement (n statements: n + 1
    round trips, with COMMIT), a write of its own (``write_one``) is one round trip, and a block that ran nothing
    sends nothing."""
    schemas = PostgresSchemas()
    try:
        url = schemas.new()
        assert (await _counted(url, "write_one")).round_trips == 1
        assert (await _counted(url, "one statement")).round_trips == 2
        assert (await _counted(url, "three statements")).round_trips == 4
        empty = await _counted(url, "nothing")
        assert (empty.round_trips, empty.transactions) == (0, 0)
    finally:
        schemas.drop()
