"""Standing exclusions per action (issue 31, item 5): what a controller states in a review allocation stands for its
review allocations only, never for implement auto-allocation; a statement for one action replaces only that
action's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import state.db_base as state_db
from bot.catalog import open_door
from bot.loops.auto_allocate import recent_decisions
from bot.verbs.runtime import caller_for
from state.db import Database, utcnow
from state.exclusions import ExclusionStore
from state.leases import LeaseStore
from state.migrations import MIGRATIONS
from tests.conftest import DbOpener
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started
from tests.world import FULL_NAME, World, open_world

#: One author implements (auto-allocation's only choice), author-3 reviews; the controller states the exclusions.
ROSTER = {"controller-bot": ["controller"], "author-1": ["author"], "author-3": ["reviewer"]}
CONTROLLER = "controller-bot"


def sections(database_url: str | None) -> dict[str, Any]:
    """The world's database on this backend (conftest's ``database_url``: SQLite, then PostgreSQL)."""
    return {} if database_url is None else {"database": {"url": database_url}}


async def state_in_an_apply(world: World, action: str, owner: str, exclude: list[int], **values: object) -> None:
    """The controller allocates for ``action`` through the MCP door, for real, stating ``exclude``."""
    service = world.service
    door = open_door(db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")
    result = await door.call("allocate_next_work", caller_for(service.settings, CONTROLLER, "mcp"),
                             {"action": action, "owner": owner, "exclude_issue_numbers": exclude, "dry_run": False,
                              **values})
    assert result.ok, result.doc  # nothing to lease for it yet: the statement is what counts here


async def make_ready(world: World, number: int) -> dict[str, Any]:
    """A person labels #``number`` `status:ready` (auto-allocation runs); the automatic decision it made."""
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    [decision, *_] = await recent_decisions(world.service.db, FULL_NAME.lower())
    return decision


async def live(world: World) -> dict[int, str]:
    return {lease.issue_number: lease.owner for lease in await LeaseStore(world.service.db).open_leases(FULL_NAME)}


async def test_a_review_allocations_exclusions_never_hold_an_issue_back_from_implement_auto_allocation(
    tmp_path: Path, database_url: str | None, start: Started
) -> None:
    """The controller excludes #1 in a review allocation: that stands for its review allocations, and #1, once
    ready, is still auto-allocated for implementation (it used to stand for every action, so a run leased nothing)."""
    async with open_world(tmp_path, start, roster=ROSTER, **sections(database_url)) as world:
        world.live.emulator.create_issue(OWNER, REPO, title="Canary", author="alice")
        await state_in_an_apply(world, "review", "author-3", [1])
        store = ExclusionStore(world.service.db)
        assert await store.standing(world.service.settings.repo_key, action="review") == {CONTROLLER: [1]}
        decision = await make_ready(world, 1)
        assert decision["standing_exclusions"] == {}, decision
        assert await live(world) == {1: "author-1"}


async def test_an_implement_statement_stands_for_auto_allocation_until_the_controller_states_another_for_implement(
    tmp_path: Path, database_url: str | None, start: Started
) -> None:
    """The controller excludes #1 in an implement allocation, then lifts its review exclusions (`[]`): #1 stays
    excluded from auto-allocation (a review statement replaced it before); its next implement statement lifts it."""
    async with open_world(tmp_path, start, roster=ROSTER, **sections(database_url)) as world:
        world.live.emulator.create_issue(OWNER, REPO, title="Canary", author="alice")
        await state_in_an_apply(world, "implement", "author-1", [1])
        await state_in_an_apply(world, "review", "author-3", [])
        decision = await make_ready(world, 1)
        assert decision["standing_exclusions"] == {CONTROLLER: [1]}, decision
        assert [(s["issue_number"], s["reason"]) for s in decision["skipped"]] == [(1, "excluded_by_controller")]
        assert await live(world) == {}
        await state_in_an_apply(world, "review", "author-3", [1])  # the review exclusion, again: still nothing lifted
        # The implement statement that lifts it (its own candidates none: the lease is auto-allocation's to make).
        await state_in_an_apply(world, "implement", "author-1", [], candidates_json=[])
        number = await world.open_issue("alice", "Next")
        decision = await make_ready(world, number)
        assert decision["standing_exclusions"] == {}, decision
        assert await live(world) == {1: "author-1"}  # #1 ranks first (older) and is no longer excluded


async def test_a_statement_for_one_action_replaces_only_that_actions(db: Database) -> None:
    """Each controller's latest statement per action stands, on both databases; any action is a string (a merge
    action may come), and the default is implement's."""
    store = ExclusionStore(db)
    at = utcnow()

    async def standing(action: str) -> dict[str, list[int]]:
        return await store.standing("acme/widgets", action=action)

    await store.state("acme/widgets", "c-1", [2, 1], action="implement", at=at, via="mcp")
    await store.state("acme/widgets", "c-1", [3], action="review", at=at, via="mcp")
    await store.state("acme/widgets", "c-2", [4], action="implement", at=at, via="d-1")
    await store.state("other/repo", "c-1", [9], action="review", at=at, via="mcp")
    assert await store.standing("acme/widgets") == await standing("implement") == {"c-1": [1, 2], "c-2": [4]}
    assert await standing("review") == {"c-1": [3]}

    await store.state("acme/widgets", "c-1", [5], action="review", at=at, via="mcp")
    assert await standing("implement") == {"c-1": [1, 2], "c-2": [4]}
    assert await standing("review") == {"c-1": [5]}

    await store.state("acme/widgets", "c-1", [], action="implement", at=at, via="mcp")  # lifts implement's only
    assert await standing("implement") == {"c-2": [4]}
    assert await standing("review") == {"c-1": [5]}

    await store.state("acme/widgets", "c-2", [6], action="merge", at=at, via="mcp")
    assert await standing("merge") == {"c-2": [6]}
    assert await standing("implement") == {"c-2": [4]}
    assert await store.standing("other/repo", action="review") == {"c-1": [9]}
    assert await store.standing("other/repo") == {}


async def test_statements_made_before_the_migration_stand_for_implement(
    open_db: DbOpener, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 16 on a database holding statements (made with no action): they keep standing for implement, as
    they did, and stand for nothing else; a review statement after it leaves them standing."""
    monkeypatch.setattr(state_db, "MIGRATIONS", tuple(m for m in MIGRATIONS if m[0] <= 15))
    db = await open_db(tmp_path / "foreman.db")
    async with db.transaction() as conn:
        for controller, numbers in (("c-1", "[1]"), ("c-1", "[1, 2]"), ("c-2", "[3]")):
            await conn.execute(
                "INSERT INTO controller_exclusions (repo, controller, issue_numbers, stated_at, via)"
                " VALUES ('acme/widgets', ?, ?, 't', 'mcp')",
                (controller, numbers),
            )
    await db.close()
    monkeypatch.setattr(state_db, "MIGRATIONS", MIGRATIONS)
    db = await open_db(tmp_path / "foreman.db")
    store = ExclusionStore(db)
    assert await store.standing("acme/widgets", action="implement") == {"c-1": [1, 2], "c-2": [3]}
    assert await store.standing("acme/widgets", action="review") == {}
    await store.state("acme/widgets", "c-1", [], action="review", at=utcnow(), via="mcp")
    assert await store.standing("acme/widgets", action="implement") == {"c-1": [1, 2], "c-2": [3]}
