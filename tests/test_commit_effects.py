"""The transaction's commit wakes the outbox sender (``Database.on_commit``, ``note_commit``): whoever enqueues,
the sender learns of it when, and only when, the entry is committed (on SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from bot.core.evidence import marker
from state.db import Database
from state.outbox import OUTBOX_TOPIC, OutboxIntent, OutboxStore, enqueue

REPO = "acme/widgets"


def comment(key: str, number: int = 1) -> OutboxIntent:
    return OutboxIntent(key, number, "comment", {"body": f"hello\n{marker(key)}"})


def woken(db: Database) -> list[str]:
    calls: list[str] = []
    db.on_commit(OUTBOX_TOPIC, lambda: calls.append("wake"))
    return calls


async def test_a_committed_entry_wakes_the_sender_once_per_transaction(db: Database) -> None:
    calls = woken(db)
    async with db.transaction() as conn:
        await enqueue(conn, comment("k1"), repo=REPO)
        await enqueue(conn, comment("k2", 2), repo=REPO)
        assert calls == []  # not before the commit: the sender would find nothing
    assert calls == ["wake"]


async def test_a_rolled_back_entry_wakes_nobody(db: Database) -> None:
    calls = woken(db)
    with pytest.raises(RuntimeError):
        async with db.transaction() as conn:
            await enqueue(conn, comment("k1"), repo=REPO)
            raise RuntimeError("the cause failed")
    assert calls == [] and await OutboxStore(db).list(limit=10) == []


async def test_a_transaction_that_stored_no_entry_wakes_nobody(db: Database) -> None:
    await OutboxStore(db).add(comment("k1"), repo=REPO)
    calls = woken(db)
    async with db.transaction() as conn:
        assert not await enqueue(conn, comment("k1"), repo=REPO)  # the same key again: nothing new
    async with db.transaction() as conn:
        await conn.execute("SELECT 1")
    assert calls == []


async def test_a_failing_listener_never_undoes_the_commit(db: Database) -> None:
    def broken() -> None:
        raise RuntimeError("listener failed")

    db.on_commit(OUTBOX_TOPIC, broken)
    calls = woken(db)
    await OutboxStore(db).add(comment("k1"), repo=REPO)
    assert calls == ["wake"] and [e.key for e in await OutboxStore(db).list(limit=10)] == ["k1"]
