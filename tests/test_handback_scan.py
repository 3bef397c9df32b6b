"""Auto-allocation's first step looks for requested changes waiting for their implementer (``waiting_hand_backs``)
on every run. It read the repository's 500 newest leases in full (every time parsed, every request decoded: ~20 ms of
the event loop per run once 500 leases existed, measured with py-spy over a 700-issue loop), and a hand-back older
than those 500 was never found. It asks the database for exactly the review leases waiting now, whatever their age."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import state.leases
from bot.verbs.handback import AWAITING, waiting_hand_backs
from state.db import Database
from state.leases import _RELEASED_NAMING, LeaseStore
from tests.conftest import DbOpener

NOW = datetime(2026, 12, 6, tzinfo=UTC)
REPO = "o/r"


async def _lease(store: LeaseStore, db: object, issue: int, action: str, *, at: datetime, ended: str | None,
                 **detail: object) -> None:
    async with db.transaction() as conn:  # type: ignore[attr-defined]
        lease = await store.acquire(conn, repo=REPO, issue_number=issue, owner="bob" if action == "review" else "al",
                                    role="reviewer" if action == "review" else "author", action=action,
                                    ttl=timedelta(hours=1), now=at, actor="test", fingerprint=None, request={"x": 1})
        if ended is not None:
            await store.release(conn, lease.lease_id, actor="test", reason=ended, now=at + timedelta(seconds=1),
                                **detail)


async def test_the_waiting_hand_backs_without_reading_a_full_lease(
    tmp_path: Path, open_db: DbOpener, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await open_db(tmp_path / "leases.db")
    store = LeaseStore(db)
    at = NOW
    await _lease(store, db, 900, "review", at=at, ended="reviewed", **{AWAITING: "old", "pull_request": 5})
    for issue in range(1, 41):  # history: implemented and reviewed, nobody waiting
        await _lease(store, db, issue, "implement", at=at, ended="pull request opened")
        await _lease(store, db, issue, "review", at=at + timedelta(minutes=1), ended="reviewed")
        at += timedelta(minutes=2)
    await _lease(store, db, 41, "implement", at=at, ended="pull request opened")
    await _lease(store, db, 41, "review", at=at, ended="reviewed", **{AWAITING: "al", "pull_request": 7})
    await _lease(store, db, 42, "review", at=at, ended="reviewed", **{AWAITING: "al", "pull_request": 8})
    await _lease(store, db, 42, "implement", at=at, ended=None)  # leased back since: no longer waiting
    await _lease(store, db, 43, "review", at=at, ended="reviewed", **{AWAITING: "cy", "pull_request": 9})

    def no_full_rows(row: object) -> object:
        raise AssertionError("the hand-back scan decoded a whole lease row")

    monkeypatch.setattr(state.leases, "_lease", no_full_rows)
    found = await waiting_hand_backs(store, REPO)
    assert [(issue, owner, detail["pull_request"]) for issue, owner, detail in found] == [
        (41, "al", 7), (43, "cy", 9), (900, "old", 5)]


async def test_a_hand_back_behind_more_than_500_newer_leases_is_found(tmp_path: Path, open_db: DbOpener) -> None:
    db = await open_db(tmp_path / "leases.db")
    store = LeaseStore(db)
    await _lease(store, db, 1, "review", at=NOW, ended="reviewed", **{AWAITING: "al", "pull_request": 3})
    for issue in range(2, 603):  # 601 newer leases, of other issues
        await _lease(store, db, issue, "implement", at=NOW + timedelta(seconds=issue), ended="done")
    assert [(issue, owner) for issue, owner, _ in await waiting_hand_backs(store, REPO)] == [(1, "al")]


async def test_sqlite_seeks_the_waiting_reviews_and_each_issues_newest_lease(tmp_path: Path) -> None:
    path = tmp_path / "leases.db"
    db = await Database.open(path)
    try:
        store = LeaseStore(db)
        for issue in range(1, 30):
            await _lease(store, db, issue, "implement", at=NOW, ended="done")
            await _lease(store, db, issue, "review", at=NOW, ended="reviewed", **{AWAITING: "al"})
    finally:
        await db.close()
    with sqlite3.connect(path) as conn:
        conn.execute("ANALYZE")
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {_RELEASED_NAMING}", (REPO, '%"awaiting_author"%'))]
    assert not any(line.startswith("SCAN l") or line.startswith("SCAN n") for line in plan), plan
    assert any("leases_issue" in line for line in plan) and any("leases_reviewed" in line for line in plan), plan
