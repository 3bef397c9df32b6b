"""Auto-allocation's first step looks for requested changes waiting for their implementer (``waiting_hand_backs``)
on every run. It read the repository's 500 newest leases in full (every time parsed, every request decoded: ~20 ms of
the event loop per run once 500 leases existed, measured with py-spy over a 700-issue loop); it reads five columns
of them now, with the same answer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import state.leases
from bot.verbs.handback import AWAITING, waiting_hand_backs
from state.leases import LeaseStore
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
    assert [(issue, owner, detail["pull_request"]) for issue, owner, detail in found] == [(41, "al", 7), (43, "cy", 9)]
