"""Several processes on one PostgreSQL store: the write guarantees SQLite's single writer gave, kept across replicas.

Each "replica" here is its own PostgresDatabase (its own server connections), as two `foreman serve` processes
would hold; the process-level burst is at the end of this file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from datetime import timedelta

import pytest

from bot.core.intake import Delivery
from state.db import Database, utcnow
from state.db_postgres import PostgresDatabase
from state.deliveries import DeliveryStore
from state.leases import LeaseStore, LeaseTaken
from state.sql import IntegrityError

NOW = utcnow()


async def _replicas(url: str, count: int = 2) -> list[Database]:
    return [await PostgresDatabase.connect(url) for _ in range(count)]


def _delivery(n: int) -> Delivery:
    body = json.dumps({"action": "opened", "n": n}).encode()
    return Delivery(delivery_id=f"d-{n}", event="issues", event_type="issues", action="opened", sender_login="alice",
                    body=body, body_sha256=hashlib.sha256(body).hexdigest(), headers={}, payload=None)


async def test_write_transactions_of_two_replicas_never_interleave(postgres_url: str) -> None:
    """A read-then-write inside one transaction sees no other replica's write in between (PostgreSQL's READ
    COMMITTED alone would lose updates here: both read the same count, both write count + 1)."""
    one, two = await _replicas(postgres_url)
    try:
        async with one.transaction() as conn:
            await conn.execute("CREATE TABLE counter (n INTEGER NOT NULL)")
            await conn.execute("INSERT INTO counter (n) VALUES (0)")

        async def bump(db: Database, times: int) -> None:
            for _ in range(times):
                async with db.transaction() as conn:
                    async with conn.execute("SELECT n FROM counter") as cur:
                        row = await cur.fetchone()
                    assert row is not None
                    await asyncio.sleep(0)  # let the other replica try to write in between
                    await conn.execute("UPDATE counter SET n = ?", (row["n"] + 1,))

        await asyncio.gather(bump(one, 40), bump(two, 40))
        async with two.reader.execute("SELECT n FROM counter") as cur:
            assert [tuple(r) for r in await cur.fetchall()] == [(80,)]
    finally:
        for db in (one, two):
            await db.close()


async def test_racing_replicas_claim_each_delivery_exactly_once(postgres_url: str) -> None:
    one, two = await _replicas(postgres_url)
    try:
        stored = await DeliveryStore(one).insert_batch([(_delivery(n), False) for n in range(30)])
        assert {r.outcome for r in stored} == {"queued"}
        claimed: dict[str, list[int]] = {"one": [], "two": []}

        async def drain(name: str, db: Database) -> None:
            store = DeliveryStore(db)
            while (found := await store.claim_next(f"worker-{name}")) is not None:
                claimed[name].append(found.pk)
                assert await store.finish(found.pk, f"worker-{name}")

        await asyncio.gather(drain("one", one), drain("two", two))
        every = claimed["one"] + claimed["two"]
        assert sorted(every) == sorted(r.pk for r in stored if r.pk is not None)
        assert len(every) == len(set(every)) == 30
        assert (await DeliveryStore(two).counts())["done"] == 30
    finally:
        for db in (one, two):
            await db.close()


async def test_a_dead_replicas_claim_is_taken_over_once_its_heartbeat_lapses(postgres_url: str) -> None:
    one, two = await _replicas(postgres_url)
    try:
        await DeliveryStore(one).insert_batch([(_delivery(1), False)])
        taken = await DeliveryStore(one).claim_next("worker-one")
        assert taken is not None
        await one.close()  # the replica dies: its claim stays, heartbeating no more
        store = DeliveryStore(two)
        assert await store.claim_next("worker-two") is None  # still claimed
        assert await store.reclaim_stale(ttl_s=60) == 0  # not lapsed yet
        assert await store.reclaim_stale(ttl_s=60, now=utcnow() + timedelta(seconds=61)) == 1
        again = await store.claim_next("worker-two")
        assert again is not None and again.pk == taken.pk and again.attempts == 2
        assert await store.finish(again.pk, "worker-two")
        assert not await store.finish(taken.pk, "worker-one")  # the dead claim cannot settle it any more
    finally:
        await two.close()


async def test_one_live_lease_per_issue_across_replicas_and_a_refused_insert_leaves_the_transaction_usable(
    postgres_url: str,
) -> None:
    """The unique index refuses a second live lease whichever replica asks; the refusal is caught inside the
    transaction and the transaction goes on and commits (on PostgreSQL a failed statement would otherwise abort
    the whole transaction: each write runs under a savepoint)."""
    one, two = await _replicas(postgres_url)
    try:
        async with one.transaction() as conn:
            first = await LeaseStore(one).acquire(
                conn, repo="acme/widgets", issue_number=7, owner="author-1", role="author", action="implement",
                ttl=timedelta(hours=1), now=NOW, actor="t", fingerprint=None, request={})
        async with two.transaction() as conn:
            with pytest.raises(LeaseTaken):
                await LeaseStore(two).acquire(
                    conn, repo="acme/widgets", issue_number=7, owner="author-2", role="author", action="implement",
                    ttl=timedelta(hours=1), now=NOW, actor="t", fingerprint=None, request={})
            with pytest.raises(IntegrityError):
                await conn.execute("UPDATE leases SET status = 'bogus'")
            other = await LeaseStore(two).acquire(
                conn, repo="acme/widgets", issue_number=8, owner="author-2", role="author", action="implement",
                ttl=timedelta(hours=1), now=NOW, actor="t", fingerprint=None, request={})
        live = [(lease.issue_number, lease.owner) for lease in await LeaseStore(one).open_leases("acme/widgets")]
        assert sorted(live) == [(7, "author-1"), (8, "author-2")]
        assert first.lease_id != other.lease_id
    finally:
        for db in (one, two):
            await db.close()
