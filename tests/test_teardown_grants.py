"""The reserved teardown runs by itself, once: on a grant's expiry or a run's abort, through the one door."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from bot.core.grants.admission import RunState, teardown_due
from bot.loops.run_teardowns import TeardownLoop, run_due_teardowns
from bot.verbs.runs.broker import Broker
from bot.verbs.runs.start import host_identity, start_run
from state.grants import GrantStore
from state.journal import JournalStore
from state.leases import LeaseStore
from tests.support import Started, eventually
from tests.test_grants_mcp import Bound, bound_run
from tests.test_teardown import LOOP, ROSTER, bootstrapped
from tests.world import Sections, World, open_world


async def _lease_status(bound: Bound) -> list[tuple[str, str | None]]:
    history = await LeaseStore(bound.db).history(bound.settings.repo_key, 8)
    return [(lease.status, lease.end_reason) for lease in history]


async def _teardown_decisions(bound: Bound) -> list[str]:
    return [f"{d.kind}:{d.position}" for d in await GrantStore(bound.db).decisions(bound.run_id)
            if d.tool == "gitea_release_lease"]


async def test_an_aborted_run_is_torn_down_once_by_itself(tmp_path: Path) -> None:
    async with bound_run(tmp_path) as bound:
        assert await run_due_teardowns(bound.db, bound.settings, bound.runtime) == []  # nothing is due yet
        assert (await bound.broker.abort("operator stop")).ok
        [report] = await run_due_teardowns(bound.db, bound.settings, bound.runtime)
        assert report["ok"], report
        state = await bound.state()
        assert (state["outcome"], state["teardown"], state["closed"]) == ("aborted", "done", True)
        assert [status for status, _ in await _lease_status(bound)] == ["released"]
        assert await run_due_teardowns(bound.db, bound.settings, bound.runtime) == []
        assert await _teardown_decisions(bound) == ["admitted:2", "accepted:2"]


async def test_an_expired_grant_is_torn_down_once_by_itself(tmp_path: Path) -> None:
    async with bound_run(tmp_path) as bound:
        before = bound.expires_at - timedelta(seconds=1)
        assert await run_due_teardowns(bound.db, bound.settings, bound.runtime, now=before) == []
        assert [status for status, _ in await _lease_status(bound)] == ["live"]
        after = bound.expires_at + timedelta(seconds=1)
        [report] = await run_due_teardowns(bound.db, bound.settings, bound.runtime, now=after)
        assert report["ok"], report
        state = await bound.state()
        assert (state["outcome"], state["teardown"]) == ("expired", "done")
        assert [status for status, _ in await _lease_status(bound)] == ["released"]
        assert await run_due_teardowns(bound.db, bound.settings, bound.runtime, now=after) == []
        assert await _teardown_decisions(bound) == ["admitted:2", "accepted:2"]


async def test_a_teardown_in_flight_is_never_run_again_by_itself(tmp_path: Path) -> None:
    """An admitted teardown whose result never came (a crash) blocks every later automatic run."""
    async with bound_run(tmp_path) as bound:
        assert (await bound.broker.abort("stop")).ok
        admission = await bound.broker.teardown()
        assert admission.allowed
        assert await run_due_teardowns(bound.db, bound.settings, bound.runtime) == []
        assert [status for status, _ in await _lease_status(bound)] == ["live"]


async def test_another_hosts_run_is_left_to_that_host(tmp_path: Path) -> None:
    async with bound_run(tmp_path) as bound:
        assert (await bound.broker.abort("stop")).ok
        refused: set[str] = set()
        for _ in range(2):
            assert await run_due_teardowns(bound.db, bound.settings, bound.runtime, host=lambda: "elsewhere/0000",
                                           refused=refused) == []
        assert refused == {bound.run_id}
        assert [status for status, _ in await _lease_status(bound)] == ["live"]
        assert await _teardown_decisions(bound) == []


def test_teardown_due_is_pending_nothing_in_flight_and_ended_or_expired() -> None:
    from tests.test_grants import NOW, PLAN_ONLY_TEMPLATE, _compile

    grant = _compile(PLAN_ONLY_TEMPLATE)
    fresh = RunState(run_id=grant.run_id)
    assert not teardown_due(grant, fresh, NOW)
    assert teardown_due(grant, fresh, grant.expires_at)
    assert teardown_due(grant, RunState(run_id=grant.run_id, outcome="aborted"), NOW)
    assert teardown_due(grant, RunState(run_id=grant.run_id, outcome="failed"), NOW)
    assert not teardown_due(grant, RunState(run_id=grant.run_id, outcome="aborted", teardown="done"), NOW)


async def test_the_loop_checks_at_start_up_and_then_on_its_interval(tmp_path: Path) -> None:
    async with bound_run(tmp_path) as bound:
        assert (await bound.broker.abort("stop")).ok
        woke: list[int] = []
        loop = TeardownLoop(bound.db, bound.settings, bound.runtime, interval_s=0.01, on_ran=lambda: woke.append(1))
        loop.start()
        try:
            await eventually(lambda: loop.passes >= 3, "three passes of the loop", poll_s=0.01)
        finally:
            await loop.stop()
        assert loop.passes >= 3 and woke == [1]
        assert [status for status, _ in await _lease_status(bound)] == ["released"]


async def test_the_service_tears_down_an_aborted_run_at_start_up(tmp_path: Path, start: Started) -> None:
    """A run aborted while no service ran: `foreman serve` tears it down by itself once it starts."""
    async with bound_run(tmp_path) as bound:
        assert (await bound.broker.abort("stopped while the service was down")).ok
        service, _client = await start(bound.settings)
        loop = service.run_teardowns
        assert loop is not None
        await eventually(lambda: loop.passes >= 1, "the loop's first pass", poll_s=0.01)
        assert [status for status, _ in await _lease_status(bound)] == ["released"]
        assert (await bound.state())["teardown"] == "done"


RUN_TEMPLATE = {"expires_after_s": 900, "calls": [
    {"tool": "gitea_get_issue_state", "effect": "read", "args": {"issue_number": "{issue}"}},
    {"tool": "gitea_release_lease", "effect": "teardown", "args": {"issue_number": "{issue}", "reason": "done"}},
]}


async def _aborted_run_world(tmp_path: Path, start: Started, *, remove: bool) -> AsyncIterator[tuple[World, Path]]:
    sections: Sections = {**LOOP, "grants": {"author.implement": RUN_TEMPLATE},
                          "lifecycle": {"remove_worktree_on_run_teardown": remove}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as world:
        number, transition = await bootstrapped(world)
        service = world.service
        started = await start_run(service.db, service.settings, issue_number=number, sealed_by="test")
        path = service.settings.database.path
        broker = Broker(GrantStore(service.db), started.run_id, host=lambda: host_identity(path))
        assert (await broker.abort("stop")).ok
        loop = service.run_teardowns
        assert loop is not None
        [report] = await loop.run_once()
        assert report["ok"], report
        await world.settle()
        yield world, Path(transition.worktree_path)


async def test_a_run_teardown_removes_the_clean_worktree_where_the_policy_says_so(tmp_path: Path,
                                                                                   start: Started) -> None:
    async for world, worktree in _aborted_run_world(tmp_path, start, remove=True):
        assert not worktree.exists()
        [registration] = await JournalStore(world.service.db).registrations(world.service.settings.repo_key, 1)
        assert registration.end_reason is not None and registration.end_reason.startswith("run teardown: run ")


async def test_a_run_teardown_keeps_the_worktree_by_default(tmp_path: Path, start: Started) -> None:
    async for world, worktree in _aborted_run_world(tmp_path, start, remove=False):
        assert worktree.is_dir()
        leases = await LeaseStore(world.service.db).history(world.service.settings.repo_key, 1)
        assert [lease.status for lease in leases] == ["released"]
