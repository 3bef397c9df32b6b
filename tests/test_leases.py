"""The lease store's reads: every lease, the recent ones, several leases' events at once, the count by state."""

from __future__ import annotations

from datetime import timedelta

from state.db import Database, utcnow
from state.leases import Lease, LeaseStore

NOW = utcnow()


async def _lease(db: Database, number: int, owner: str, *, repo: str = "acme/widgets", ago_h: float = 0,
                 request: dict[str, object] | None = None) -> Lease:
    async with db.transaction() as conn:
        return await LeaseStore(db).acquire(
            conn, repo=repo, issue_number=number, owner=owner, role="author", action="implement",
            ttl=timedelta(hours=1), now=NOW - timedelta(hours=ago_h), actor="controller-bot", fingerprint=None,
            request=request or {})


async def _release(db: Database, lease: Lease) -> None:
    async with db.transaction() as conn:
        await LeaseStore(db).release(conn, lease.lease_id, actor=lease.owner, reason="done", now=NOW)


async def test_every_lease_is_read_oldest_first_with_its_request(db: Database) -> None:
    first = await _lease(db, 2, "a", request={"exclude": [5, 3]})
    second = await _lease(db, 1, "b", repo="other/repo")
    found = await LeaseStore(db).every_lease()
    assert [lease.lease_id for lease in found] == [first.lease_id, second.lease_id]
    assert found[0].request == {"exclude": [5, 3]} == first.request
    assert found[1].request == {}


async def test_recent_leases_filter_by_repository_issue_and_live_mark_newest_first(db: Database) -> None:
    old = await _lease(db, 1, "a")
    await _release(db, old)
    again = await _lease(db, 1, "b")
    other = await _lease(db, 2, "c")
    await _lease(db, 1, "d", repo="other/repo")
    store = LeaseStore(db)
    assert [x.lease_id for x in await store.recent("acme/widgets")] == [other.lease_id, again.lease_id, old.lease_id]
    assert [x.lease_id for x in await store.recent("acme/widgets", limit=2)] == [other.lease_id, again.lease_id]
    assert [x.lease_id for x in await store.recent("acme/widgets", issue=1)] == [again.lease_id, old.lease_id]
    assert [x.lease_id for x in await store.recent("acme/widgets", issue=1, marked_live=True)] == [again.lease_id]
    assert [x.lease_id for x in await store.recent("acme/widgets", marked_live=True)] == [
        other.lease_id, again.lease_id]


async def test_events_of_several_leases_come_in_one_read_in_the_order_they_happened(db: Database) -> None:
    one = await _lease(db, 1, "a")
    two = await _lease(db, 2, "b")
    await _release(db, one)
    await _lease(db, 3, "c")
    events = await LeaseStore(db).events_of([two.lease_id, one.lease_id, one.lease_id])
    assert [(e["lease_id"], e["kind"]) for e in events] == [
        (one.lease_id, "acquired"), (two.lease_id, "acquired"), (one.lease_id, "released")]
    assert events[2]["detail"] == {"reason": "done"}
    assert events[0]["actor"] == "controller-bot"
    assert await LeaseStore(db).events_of([]) == []


async def test_count_by_state_tells_expired_live_leases_apart(db: Database) -> None:
    await _lease(db, 1, "a")
    await _lease(db, 2, "b", ago_h=2)
    await _release(db, await _lease(db, 3, "c"))
    assert await LeaseStore(db).count_by_state(NOW) == {"live": 1, "live_expired": 1, "released": 1}
    assert await LeaseStore(db).count_by_state(NOW + timedelta(hours=2)) == {"live_expired": 2, "released": 1}
