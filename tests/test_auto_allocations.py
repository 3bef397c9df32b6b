"""The auto-allocation store: decisions are appended and read back newest first, per repository."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from state.auto_allocations import AutoAllocationStore, AutoDecision
from state.db import to_db_time, utcnow
from tests.conftest import DbOpener


async def test_decisions_are_recorded_and_read_back_newest_first_per_repository(
    open_db: DbOpener, tmp_path: Path
) -> None:
    db = await open_db(tmp_path / "foreman.db")
    try:
        store = AutoAllocationStore(db)
        now = utcnow()
        await store.record("acme/widgets", decided_at=now, trigger="label", delivery_id="d1", doc={"leased": [1]})
        await store.record("other/repo", decided_at=now, trigger="label", delivery_id="d2", doc={"leased": [9]})
        await store.record("acme/widgets", decided_at=now + timedelta(seconds=1), trigger="reconcile",
                           delivery_id=None, doc={"leased": [], "at": now})
        found = await store.recent("acme/widgets")
        assert found == [
            AutoDecision(to_db_time(now + timedelta(seconds=1)), "reconcile", None, {"leased": [], "at": str(now)}),
            AutoDecision(to_db_time(now), "label", "d1", {"leased": [1]}),
        ]
        assert [d.delivery_id for d in await store.recent("acme/widgets", limit=1)] == [None]
        assert await store.recent("nobody/here") == []
    finally:
        await db.close()
