"""The journal store's reads: recent transitions, a lease's first one, every one, outcomes, registrations."""

from __future__ import annotations

from datetime import timedelta

from bot.core.bootstrap import FORWARD_PHASES
from state.db import Database, to_db_time, utcnow
from state.journal import JournalStore, NewTransition, Registration, Transition
from state.leases import Lease, LeaseStore

NOW = utcnow()


async def _lease(db: Database, number: int, *, repo: str = "acme/widgets") -> Lease:
    async with db.transaction() as conn:
        return await LeaseStore(db).acquire(
            conn, repo=repo, issue_number=number, owner="author-1", role="author", action="implement",
            ttl=timedelta(hours=1), now=NOW, actor="controller-bot", fingerprint=None, request={})


async def _transition(db: Database, lease: Lease, key: str, *, at: timedelta = timedelta(0)) -> Transition:
    new = NewTransition(
        key=key, key_source="caller", repo=lease.repo, issue_number=lease.issue_number, lease_id=lease.lease_id,
        owner=lease.owner, role=lease.role, attempt=1, base_branch="main", base_sha="0" * 40,
        branch=f"issue-{lease.issue_number}-{key}", checkout_path="/c", worktree_path=f"/c/branches/{key}", inputs={})
    async with db.transaction() as conn:
        return await JournalStore(db).accept(conn, new, proof={}, runner="test", now=NOW + at)


async def _advance(db: Database, transition: Transition, *phases: str) -> Transition:
    store = JournalStore(db)
    async with db.transaction() as conn:
        for phase in phases:
            transition = await store.advance(conn, transition, phase, proof={}, runner="test", now=NOW)  # type: ignore[arg-type]
    return transition


async def _complete(db: Database, transition: Transition) -> Transition:
    return await _advance(db, transition, *FORWARD_PHASES[1:])


async def _compensate(db: Database, transition: Transition) -> Transition:
    return await _advance(db, transition, "compensation_required", "compensation_completed")


async def test_recent_transitions_filter_by_repository_and_issue_newest_first(db: Database) -> None:
    one, two = await _lease(db, 1), await _lease(db, 2)
    first = await _compensate(db, await _transition(db, one, "k1"))
    second = await _transition(db, one, "k2")
    third = await _transition(db, two, "k3")
    await _transition(db, await _lease(db, 1, repo="other/repo"), "k4")
    store = JournalStore(db)
    assert [t.key for t in await store.recent("acme/widgets")] == [third.key, second.key, first.key]
    assert [t.key for t in await store.recent("acme/widgets", limit=1)] == [third.key]
    assert [t.key for t in await store.recent("acme/widgets", issue=1)] == [second.key, first.key]
    assert (await store.recent("acme/widgets", issue=1))[1].outcome == "compensated"


async def test_first_for_lease_is_its_oldest_transition_whatever_its_outcome(db: Database) -> None:
    lease = await _lease(db, 1)
    store = JournalStore(db)
    assert await store.first_for_lease(lease.lease_id) is None
    compensated = await _compensate(db, await _transition(db, lease, "k1"))
    await _complete(db, await _transition(db, lease, "k2"))
    found = await store.first_for_lease(lease.lease_id)
    assert found is not None and (found.key, found.outcome) == (compensated.key, "compensated")


async def test_every_transition_and_outcome_counts_with_the_oldest_open_one(db: Database) -> None:
    one, two, three = await _lease(db, 1), await _lease(db, 2), await _lease(db, 3, repo="other/repo")
    await _complete(db, await _transition(db, one, "done"))
    await _transition(db, two, "open-late", at=timedelta(minutes=5))
    await _transition(db, three, "open-early", at=timedelta(minutes=1))
    store = JournalStore(db)
    assert [t.key for t in await store.every_transition()] == ["done", "open-late", "open-early"]
    counts, oldest = await store.outcome_counts()
    assert counts == {"completed": 1, "open": 2}
    assert oldest == to_db_time(NOW + timedelta(minutes=1))


async def test_outcome_counts_of_an_empty_journal(db: Database) -> None:
    assert await JournalStore(db).outcome_counts() == ({}, None)


async def _register(db: Database, transition: Transition) -> Registration:
    async with db.transaction() as conn:
        return await JournalStore(db).register(conn, transition, created_branch=True, created_worktree=False,
                                               now=NOW)


async def test_registrations_of_an_issue_and_every_registration_with_its_transition_key(db: Database) -> None:
    one, two = await _lease(db, 1), await _lease(db, 2)
    first = await _register(db, await _compensate(db, await _transition(db, one, "k1")))
    async with db.transaction() as conn:
        await JournalStore(db).end_registration(conn, first.id, reason="compensated", now=NOW)
    second = await _register(db, await _transition(db, one, "k2"))
    third = await _register(db, await _transition(db, two, "k3"))
    store = JournalStore(db)
    found = await store.registrations("acme/widgets", 1)
    assert [r.id for r in found] == [first.id, second.id]
    assert (found[0].end_reason, found[1].ended_at, found[1].created_branch) == ("compensated", None, True)
    assert await store.registrations("other/repo", 1) == []
    every = await store.every_registration()
    assert [(key, r.id) for key, r in every] == [("k1", first.id), ("k2", second.id), ("k3", third.id)]
    assert every[2][1] == third


async def test_phases_of_several_transitions_come_in_one_read_each_oldest_first(db: Database) -> None:
    one, two = await _lease(db, 1), await _lease(db, 2)
    first = await _advance(db, await _transition(db, one, "k1"), "branch_confirmed")
    second = await _compensate(db, await _transition(db, two, "k2"))
    store = JournalStore(db)
    found = await store.phases_of([second.id, first.id, 999])
    assert [p.phase for p in found[first.id]] == ["accepted", "branch_confirmed"]
    assert [p.phase for p in found[second.id]] == ["accepted", "compensation_required", "compensation_completed"]
    assert found[999] == []
    assert found[first.id] == await store.phases(first.id)
    assert await store.phases_of([]) == {}
