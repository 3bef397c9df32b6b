"""A dry-run allocation decides only: through every surface it leaves exclusions, leases and the outbox unchanged."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.catalog import open_door
from bot.dashboard import model
from bot.verbs.runtime import Caller, caller_for
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started
from tests.world import World, open_world

ROSTER = {"controller-bot": ["controller"], "author-1": ["author"]}
#: The tables a decision could write to; the outbox without the comment command's own reply.
TABLES = {
    "exclusions": "SELECT repo, controller, issue_numbers FROM controller_exclusions ORDER BY id",
    "leases": "SELECT lease_id, status FROM leases ORDER BY lease_id",
    "outbox": "SELECT idempotency_key FROM outbox WHERE idempotency_key NOT LIKE 'command:%' ORDER BY id",
}


def written(world: World) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(world.service.settings.database.path) as conn:
        return {name: conn.execute(sql).fetchall() for name, sql in TABLES.items()}


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER, allocator={"auto": False}) as opened:
        for title in ("first", "second"):  # through the webhooks, so the stored state has them too
            number = await opened.open_issue("alice", title)
            await opened.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        yield opened


async def test_a_dry_run_by_mcp_states_no_standing_exclusions(world: World) -> None:
    before = written(world)
    service = world.service
    runtime = open_door(db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")
    result = await runtime.call("allocate_next_work", caller_for(service.settings, "controller-bot", "mcp"),
                                {"owner": "author-1", "exclude_issue_numbers": [1], "dry_run": True})
    assert result.ok and result.doc["issue_number"] == 2, result.doc
    assert written(world) == before


async def test_a_dry_run_by_comment_states_no_standing_exclusions(world: World) -> None:
    before = written(world)
    await world.comment("controller-bot", 1, "/allocate --dry-run --owner author-1 --exclude 1")
    assert written(world) == before


async def test_the_dashboards_preview_writes_nothing(world: World) -> None:
    before = written(world)
    [preview] = await model.current_decisions(world.service.db, world.service.settings)
    assert preview["owner"] == "author-1" and preview["decision"] == "select", preview
    assert written(world) == before


async def apply_excluding_1(world: World, caller: Caller) -> None:
    """``caller`` allocates to author-1, excluding #1, for real: #2 is leased."""
    service = world.service
    runtime = open_door(db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")
    result = await runtime.call("allocate_next_work", caller,
                                {"owner": "author-1", "exclude_issue_numbers": [1], "dry_run": False})
    assert result.ok and result.doc["lease"]["issue_number"] == 2, result.doc


async def test_an_apply_states_the_controllers_exclusions(world: World) -> None:
    """The apply still states them (what auto-allocation then applies), so the tests above are not vacuous."""
    await apply_excluding_1(world, caller_for(world.service.settings, "controller-bot", "mcp"))
    assert written(world)["exclusions"] == [(f"{OWNER}/{REPO}".lower(), "controller-bot", "[1]")]


async def test_an_operators_apply_states_no_standing_exclusions(world: World) -> None:
    """The operator (its command line) is no controller: its exclusions hold for its own call only."""
    from bot.verbs.runtime import operator_caller

    await apply_excluding_1(world, operator_caller("operator:root", "cli"))
    assert written(world)["exclusions"] == []


async def test_a_roster_caller_on_an_operator_channel_is_not_the_operator(world: World) -> None:
    """Who calls decides, not the channel: a roster controller whose call came by the command line's channel still
    states its exclusions, as through MCP."""
    await apply_excluding_1(world, caller_for(world.service.settings, "controller-bot", "cli"))
    assert written(world)["exclusions"] == [(f"{OWNER}/{REPO}".lower(), "controller-bot", "[1]")]
