"""Auto-allocation's idle time per author (``LeaseStore.last_ended``): the same answer as reading every ended lease,
on both databases, and on SQLite one index seek per owner (the statement read every ended lease of the repository,
three times per auto-allocation, and a long-lived deployment keeps every lease as history)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiosqlite

from state.db import Database
from state.leases import _LAST_ENDED, LeaseStore
from tests.conftest import DbOpener

START = datetime(2026, 12, 1, tzinfo=UTC)
OWNERS = ("alice", "bob", "carol", "dave")


async def _leases(store: LeaseStore, db: object, rng: random.Random, count: int) -> dict[tuple[str, str], datetime]:
    """``count`` leases over two repositories and four owners, most of them ended; the expected MAX per (repo,
    owner) computed here."""
    expected: dict[tuple[str, str], datetime] = {}
    for number in range(1, count + 1):
        repo = rng.choice(("o/one", "o/two"))
        owner = rng.choice(OWNERS)
        acquired = START + timedelta(minutes=number)
        async with db.transaction() as conn:  # type: ignore[attr-defined]
            lease = await store.acquire(conn, repo=repo, issue_number=number, owner=owner, role="author",
                                        action="implement", ttl=timedelta(hours=1), now=acquired, actor="test",
                                        fingerprint=None, request={})
            if rng.random() < 0.8:
                ended = acquired + timedelta(seconds=rng.randrange(1, 7200))
                await store.release(conn, lease.lease_id, actor=owner, reason="done", now=ended)
                key = (repo, owner)
                expected[key] = max(expected.get(key, ended), ended)
    return expected


async def test_each_owners_latest_end_as_every_ended_lease_says(tmp_path: Path, open_db: DbOpener) -> None:
    db = await open_db(tmp_path / "leases.db")
    store = LeaseStore(db)
    expected = await _leases(store, db, random.Random(19), 120)
    for repo in ("o/one", "o/two"):
        wanted = {owner: at for (r, owner), at in expected.items() if r == repo}
        assert await store.last_ended(repo, [*OWNERS, "nobody", "alice"]) == wanted
        assert await store.last_ended(repo, ["bob"]) == {k: v for k, v in wanted.items() if k == "bob"}
    assert await store.last_ended("o/one", []) == {}


async def test_more_owners_than_one_statement_takes(tmp_path: Path, open_db: DbOpener) -> None:
    db = await open_db(tmp_path / "leases.db")
    store = LeaseStore(db)
    ended = START + timedelta(hours=3)
    async with db.transaction() as conn:
        lease = await store.acquire(conn, repo="o/one", issue_number=1, owner="owner-450", role="author",
                                    action="implement", ttl=timedelta(hours=1), now=START, actor="test",
                                    fingerprint=None, request={})
        await store.release(conn, lease.lease_id, actor="owner-450", reason="done", now=ended)
    roster = [f"owner-{i}" for i in range(700)]  # SQLite refuses a compound SELECT of more than 500 terms
    assert await store.last_ended("o/one", roster) == {"owner-450": ended}


async def test_sqlite_reads_one_index_range_per_owner_never_the_table(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    db = await Database.open(path)
    try:
        await _leases(LeaseStore(db), db, random.Random(7), 40)
    finally:
        await db.close()
    async with aiosqlite.connect(path) as conn:
        await conn.execute("ANALYZE")
        plan = [row[3] async for row in await conn.execute(
            f"EXPLAIN QUERY PLAN {_LAST_ENDED} UNION ALL {_LAST_ENDED}", ("alice", "o/one", "alice") * 2)]
    assert sum("leases_owner_ended" in line for line in plan) == 2, plan
    assert not any("SCAN leases" in line for line in plan), plan
