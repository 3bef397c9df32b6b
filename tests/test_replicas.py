"""Several processes on one PostgreSQL store: the write guarantees SQLite's single writer gave, kept across replicas.

Each "replica" here is its own PostgresDatabase (its own server connections), as two `foreman serve` processes
would hold; the process-level burst is at the end of this file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import aiohttp
import psycopg
import pytest
from aiohttp import web

from bot.config_writer import write_config
from bot.core.intake import Delivery
from state.db import Database, DatabaseNotWritable, utcnow
from state.db_postgres import CONNECTION_DEFAULTS, PgConnection, PostgresDatabase
from state.deliveries import DeliveryStore
from state.leases import LeaseStore, LeaseTaken
from state.sql import IntegrityError
from tests.gitea_fixtures import OWNER, live_emulator, scratch_dir
from tests.serve_support import ServeProcess
from tests.support import HANG_S, SECRET, eventually
from tests.test_crash_burst import (
    REPOSITORIES,
    Burst,
    Kill,
    _config,
    burst_seed,
    plan_kills,
    seed_burst,
)

pytestmark = [pytest.mark.process]

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


# --- two `foreman serve` replicas behind a load balancer, one SIGKILLed at seeded points ----------------------------


class Balancer:
    """A load balancer in front of the replicas: each webhook to a seeded choice among them; a replica that does
    not answer is a 502 to Gitea (which never retries: the burst's operator replays what was not acknowledged)."""

    def __init__(self, replicas: list[ServeProcess], rng: random.Random) -> None:
        self.replicas = replicas
        self.rng = rng
        self.port = 0
        self.sent: Counter[int] = Counter()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/webhook", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._session = aiohttp.ClientSession()
        return f"http://127.0.0.1:{self.port}/webhook"

    async def _forward(self, request: web.Request) -> web.Response:
        index = self.rng.randrange(len(self.replicas))
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        assert self._session is not None
        try:
            async with self._session.post(f"{self.replicas[index].url}/webhook", data=body, headers=headers) as resp:
                self.sent[index] += 1
                return web.Response(status=resp.status, body=await resp.read(), content_type=resp.content_type)
        except aiohttp.ClientError:
            return web.Response(status=502, text="replica down")

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class ReplicaBurst(Burst):
    """The crash burst's driver, killing one of several replicas (a seeded choice) at each kill point."""

    replicas: list[ServeProcess] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)

    def stopped_by(self, kill: Kill) -> list[ServeProcess]:
        """An outage stops every replica (nobody listens); a kill takes down one, a seeded choice."""
        if kill.moment == "outage":
            return list(self.replicas)
        index = self.rng.randrange(len(self.replicas))
        self.victims.append(index)
        return [self.replicas[index]]

    def named(self, stopped: list[ServeProcess]) -> str:
        return "".join(f":replica-{self.replicas.index(proc)}" for proc in stopped)


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = scratch_dir("foreman-replicas-")
    yield root
    shutil.rmtree(root, ignore_errors=True)


async def test_two_replicas_on_one_postgresql_survive_a_burst_with_one_sigkilled(
    scratch: Path, postgres_url: str
) -> None:
    """Two `foreman serve` processes on one PostgreSQL schema and one shared checkout root serving two repositories
    over one organization hook, a ~200-delivery burst
    split between them by a load balancer, one of them SIGKILLed at 2-4 seeded points and restarted, the lost
    deliveries replayed: every acknowledged delivery processed exactly once, one lease per issue, one comment per
    evidence marker, one worktree per transition (`bot.invariants` over PostgreSQL, Gitea and the checkout)."""
    seed = burst_seed("replica-burst")
    async with live_emulator() as live:
        emu = live.emulator
        seed_burst(emu, "Replica burst")
        replicas = []
        for name in ("a", "b"):
            (scratch / name).mkdir()
            proc = ServeProcess(scratch / name)
            write_config(proc.config, _config(proc, live.base_url, scratch, postgres_url))
            replicas.append(proc)
        balancer = Balancer(replicas, random.Random(seed ^ 0xB41))
        hook_url = await balancer.start()
        emu.add_org_hook(OWNER, url=hook_url, secret=SECRET, events=["issues"])
        burst = ReplicaBurst(seed, live, replicas[0], hook_url, postgres_url, replicas=replicas)
        kills = plan_kills(random.Random(seed ^ 0x5EED))
        try:
            for proc in replicas:
                await proc.serve()
            replayed, each, violations = await burst.run(kills, scratch)
            for proc in replicas:
                assert await proc.terminate() == 0
        finally:
            for proc in replicas:
                await proc.stop()
            await balancer.stop()
        summary: dict[str, Any] = {
            "seed": seed, "kills": burst.kills, "split": dict(balancer.sent), "replayed": replayed,
            "leases": {name: len(each[name].db.leases) for name in REPOSITORIES},
            "transitions": {name: len(each[name].db.transitions) for name in REPOSITORIES},
        }
        print("replica-burst summary:", json.dumps(summary))
        tails = "\n".join(p.stderr.read_text(errors="replace")[-1500:] for p in replicas)
        assert not violations, (f"seed {seed}: {len(violations)} violation(s):\n"
                                + "\n".join(map(str, violations[:40])) + f"\n{summary}\n{tails}")
        assert min(balancer.sent[0], balancer.sent[1]) > 20, summary  # both replicas really took deliveries
        assert len(burst.kills) == len(kills) >= 2, summary
        assert all(len(each[name].db.leases) >= 2 and each[name].db.transitions for name in REPOSITORIES), summary


async def test_a_replica_whose_sessions_the_server_ended_while_idle_works_on_the_very_next_call(
    postgres_url: str,
) -> None:
    """A server restart or an administrator ends the sessions while they are idle: the next call (a read, a write
    transaction) opens a new session and succeeds; it never fails first (a lone webhook would get a 503, and Gitea
    never retries)."""
    db = await PostgresDatabase.connect(postgres_url)
    try:
        store = DeliveryStore(db)
        await store.insert_batch([(_delivery(1), False)])
        for call in ("read", "write"):
            sessions = [db._writer.raw.info.backend_pid, db._reader.raw.info.backend_pid]
            _terminate(postgres_url, sessions)
            if call == "read":
                assert (await store.counts())["queued"] == 1
            [result] = await store.insert_batch([(_delivery(2 if call == "read" else 3), False)])
            assert result.outcome == "queued"
        assert (await store.counts())["queued"] == 3
    finally:
        await db.close()


def _terminate(url: str, pids: list[int]) -> None:
    with psycopg.connect(url, autocommit=True) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        assert [row[0] for row in ended.fetchall()] == [True] * len(pids)
        # Terminated means gone: wait (a hang detector) until the server no longer lists them.
        deadline = time.monotonic() + HANG_S
        while True:
            left = admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchone()
            if left is not None and left[0] == 0:
                return
            assert time.monotonic() < deadline, f"sessions {pids} still listed {HANG_S:.0f} s after their end"
            time.sleep(0.01)


async def test_a_session_that_dies_inside_a_write_raises_its_own_error(postgres_url: str) -> None:
    """The writer's session ended in the middle of a transaction: the statement fails with the server's error
    (not "the connection is closed" from going back to the savepoint), and the next transaction works."""
    db = await PostgresDatabase.connect(postgres_url)
    try:
        with pytest.raises(psycopg.OperationalError) as died:
            async with db.transaction() as conn:
                await conn.execute("CREATE TABLE t (x INTEGER)")
                _terminate(postgres_url, [db._writer.raw.info.backend_pid])
                await conn.execute("INSERT INTO t (x) VALUES (?)", (1,))
        assert "connection is closed" not in str(died.value), died.value
        async with db.transaction() as conn:
            await conn.execute("CREATE TABLE t (x INTEGER)")  # the first transaction was rolled back
    finally:
        await db.close()


async def _settings_inside(db: Database, durable: bool) -> dict[str, str]:
    names = ("synchronous_commit", "transaction_isolation", "idle_in_transaction_session_timeout", "lock_timeout")
    async with db.transaction(durable=durable) as conn:
        values = {}
        for name in names:
            async with conn.execute("SELECT current_setting(?)", (name,)) as cur:
                row = await cur.fetchone()
                assert row is not None
                values[name] = row[0]
    return values


async def test_each_transaction_pins_its_commit_mode_and_isolation_whatever_the_servers_defaults(
    postgres_url: str,
) -> None:
    """A server (or role, or URL) whose defaults are synchronous_commit = off and repeatable read: a durable
    transaction still commits with synchronous_commit on, a non-durable one off, and both run READ COMMITTED."""
    url = with_options(postgres_url, "-c synchronous_commit=off -c default_transaction_isolation=repeatable\\ read")
    db = await PostgresDatabase.connect(url, busy_timeout_ms=0)
    try:
        durable = await _settings_inside(db, durable=True)
        quick = await _settings_inside(db, durable=False)
        assert (durable["synchronous_commit"], quick["synchronous_commit"]) == ("on", "off")
        assert durable["transaction_isolation"] == quick["transaction_isolation"] == "read committed"
        assert durable["idle_in_transaction_session_timeout"] == "30s"
        assert durable["lock_timeout"] == "1ms"  # busy_timeout_ms = 0: do not wait (0 would wait forever)
        async with db.reader.execute("SELECT current_setting('transaction_isolation')") as cur:
            row = await cur.fetchone()
        assert row is not None and row[0] == "repeatable read"  # the URL's option did reach the session
    finally:
        await db.close()


def with_options(url: str, options: str) -> str:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    joined = " ".join([*(value for key, value in query if key == "options"), options])
    kept = [(key, value) for key, value in query if key != "options"]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode([*kept, ("options", joined)], quote_via=quote),
                       parts.fragment))


async def test_replicas_on_a_repeatable_read_server_still_never_lose_an_update(postgres_url: str) -> None:
    """Under default_transaction_isolation = repeatable read a replica waiting on the advisory lock would read a
    snapshot from before the other's commit (its first statement took it): BEGIN pins READ COMMITTED."""
    url = with_options(postgres_url, "-c default_transaction_isolation=repeatable\\ read")
    one, two = await _replicas(url)
    try:
        async with one.transaction() as conn:
            await conn.execute("CREATE TABLE counter (n INTEGER NOT NULL)")
            await conn.execute("INSERT INTO counter (n) VALUES (0)")
        entered = asyncio.Event()
        release = asyncio.Event()

        async def first() -> None:
            async with one.transaction() as conn:
                async with conn.execute("SELECT n FROM counter") as cur:
                    row = await cur.fetchone()
                entered.set()
                await release.wait()
                assert row is not None
                await conn.execute("UPDATE counter SET n = ?", (row["n"] + 1,))

        async def second() -> None:
            await entered.wait()
            async with two.transaction() as conn:  # waits on the lock until first commits
                async with conn.execute("SELECT n FROM counter") as cur:
                    row = await cur.fetchone()
                assert row is not None
                await conn.execute("UPDATE counter SET n = ?", (row["n"] + 1,))

        async def let_go() -> None:
            await entered.wait()
            # Wait until the second replica is really waiting on the advisory lock.
            async def waiting() -> bool:
                async with one.reader.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ) as cur:
                    row = await cur.fetchone()
                return row is not None and row[0] >= 1

            await eventually(waiting, "the second replica to wait on the advisory lock", poll_s=0.01)
            release.set()

        await asyncio.wait_for(asyncio.gather(first(), second(), let_go()), timeout=2 * HANG_S)
        async with two.reader.execute("SELECT n FROM counter") as cur:
            assert [tuple(r) for r in await cur.fetchall()] == [(2,)]
    finally:
        for db in (one, two):
            await db.close()


async def test_a_zero_busy_timeout_refuses_at_once_instead_of_waiting_forever(postgres_url: str) -> None:
    """busy_timeout_ms = 0 means "do not wait" on PostgreSQL as on SQLite: a write while another replica holds
    the lock is refused (lock_timeout), not left waiting for as long as the other holds it."""
    holder = await PostgresDatabase.connect(postgres_url)
    waiter = await PostgresDatabase.connect(postgres_url, busy_timeout_ms=0)
    try:
        async with holder.transaction() as held:
            await held.execute("SELECT 1")  # the lock is taken with a transaction's first statement
            with pytest.raises(psycopg.errors.LockNotAvailable):
                # The hang guard only: without the fix this waits until the holder commits, i.e. forever here.
                await asyncio.wait_for(_one_write(waiter), timeout=HANG_S)
        await _one_write(waiter)  # free again: it writes
    finally:
        for db in (holder, waiter):
            await db.close()


async def _one_write(db: Database) -> None:
    async with db.transaction() as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS w (x INTEGER)")


async def test_sessions_carry_keepalives_unless_the_url_sets_them(postgres_url: str) -> None:
    """A replica host that vanishes is noticed by TCP keepalives and tcp_user_timeout, not after ~2 hours; a
    URL's own values are kept."""
    db = await PostgresDatabase.connect(postgres_url)
    own = await PostgresDatabase.connect(postgres_url + "&keepalives_idle=7")
    try:
        for conn in (db._writer, db._reader):
            given = conn.raw.info.get_parameters()
            assert {key: given.get(key) for key in CONNECTION_DEFAULTS} == CONNECTION_DEFAULTS
        assert own._writer.raw.info.get_parameters()["keepalives_idle"] == "7"
    finally:
        for each in (db, own):
            await each.close()


async def test_text_columns_order_bytewise_as_on_sqlite(postgres_url: str) -> None:
    """Every text column is collated "C": ORDER BY on a text key is binary, as SQLite orders, whatever the
    database's collation; and on a column of another collation (ICU English) the order would differ."""
    db = await PostgresDatabase.connect(postgres_url)
    try:
        async with db.reader.execute(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns"
            " WHERE table_schema = current_schema() AND data_type = 'text'"
            " AND table_name <> 'schema_migrations'"  # the runner's own bookkeeping, never ordered by text
        ) as cur:
            columns = [tuple(row) for row in await cur.fetchall()]
        assert len(columns) > 20
        assert [c for c in columns if c[2] != "C"] == []
        async with db.transaction() as conn:
            await conn.execute("CREATE TABLE keys (k TEXT COLLATE \"C\", icu TEXT)")
            for key in ("b", "B", "a", "_", "A"):
                await conn.execute("INSERT INTO keys (k, icu) VALUES (?, ?)", (key, key))
        async with db.reader.execute("SELECT k FROM keys ORDER BY k") as cur:
            assert [row[0] for row in await cur.fetchall()] == sorted(["b", "B", "a", "_", "A"])
        async with db.reader.execute("SELECT count(*) FROM pg_collation WHERE collname = 'en-x-icu'") as cur:
            row = await cur.fetchone()
        if row is not None and row[0]:
            async with db.reader.execute('SELECT icu FROM keys ORDER BY icu COLLATE "en-x-icu"') as cur:
                assert [r[0] for r in await cur.fetchall()] != sorted(["b", "B", "a", "_", "A"])
    finally:
        await db.close()


async def test_a_connect_whose_second_session_fails_leaves_no_session_open(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer's session opened, the reader's refused: the refusal is typed and the writer's session closed
    (a replica retrying its start would otherwise leak one server session per attempt)."""
    opened: list[PgConnection] = []
    real = PgConnection.open

    async def open_second_refused(conninfo: str, setup: Sequence[str] = ()) -> PgConnection:
        if opened:
            raise psycopg.OperationalError("the server refused the second session")
        conn = await real(conninfo, setup)
        opened.append(conn)
        return conn

    monkeypatch.setattr(PgConnection, "open", staticmethod(open_second_refused))
    with pytest.raises(DatabaseNotWritable) as refused:
        await PostgresDatabase.connect(postgres_url)
    assert refused.value.reason == "unavailable" and "second session" in str(refused.value)
    assert len(opened) == 1 and opened[0].raw.closed
