"""The MCP tools of an identity that works in two repositories: the repository argument, its default and refusals."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bot.config import Settings
from bot.mcp_server import RepositoryDoor, build_server, open_runtimes, repositories_of, resolve_identity
from bot.verbs.runtime import VerbRuntime, caller_for, no_bootstrap
from state.db import Database
from state.outbox import OutboxStore
from tests.conftest import REPO_ROOT
from tests.support import SECRET
from tests.test_mcp_server import ALLOCATE, STATE, TOKENS, call
from tests.test_mcp_stdio import foreman_mcp, foreman_mcp_command

pytestmark = [pytest.mark.process]

WIDGETS, GADGETS = "acme/widgets", "acme/gadgets"
CONFIG = f"""
[webhook]
secrets = ["{SECRET}"]
[database]
synchronous = "NORMAL"
[roster]
"controller-bot" = ["controller"]
"author-1" = ["author"]
"author-2" = ["author"]
[mcp.tokens]
{chr(10).join(f'"{token}" = "{login}"' for token, login in TOKENS.items())}
[[repositories]]
owner = "acme"
name = "widgets"
[[repositories]]
owner = "acme"
name = "gadgets"
roster = {{ "controller-bot" = ["controller"], "author-1" = ["author"] }}
"""


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    from bot.config import load_settings

    path = tmp_path / "foreman.toml"
    path.write_text(CONFIG, encoding="utf-8")
    return load_settings(path, environ={})


@asynccontextmanager
async def session(settings: Settings, token: str) -> AsyncIterator[tuple[Client, dict[str, VerbRuntime]]]:
    """An MCP client of the identity of ``token``, served as `foreman mcp` serves it (its repositories' doors)."""
    caller = resolve_identity(settings, token)
    async with open_runtimes(settings, repositories_of(settings, caller.login),
                             bootstrap_factory=no_bootstrap) as runtimes:
        doors = {key: RepositoryDoor(rt, caller_for(rt.settings, caller.login, "mcp")) for key, rt in runtimes.items()}
        first = next(iter(runtimes.values()))
        async with Client(build_server(first, doors[first.settings.repo_key].caller, doors=doors)) as client:
            yield client, runtimes


def _schema(tools: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(tool.input_schema for tool in tools.tools if tool.name == name)
    return found


async def test_an_identity_in_two_repositories_names_the_repository_of_each_call(settings: Settings) -> None:
    async with session(settings, "tok-controller") as (client, runtimes):
        assert list(runtimes) == [WIDGETS, GADGETS]
        schema = _schema(await client.list_tools(), "gitea_allocate_next_work")
        assert "repository" in schema["properties"] and "repository" not in schema["required"]
        error, doc = await call(client, "gitea_allocate_next_work", **ALLOCATE, dry_run=False)
        assert error and doc["error"] == "invalid_input" and doc["details"]["repositories"] == [WIDGETS, GADGETS]
        assert doc["exact_next_action"].endswith(f"repository set to one of: {WIDGETS}, {GADGETS}")
        error, doc = await call(client, "gitea_allocate_next_work", **ALLOCATE, dry_run=False, repository="acme/x")
        assert error and doc["error"] == "invalid_input" and "acme/x" in doc["message"]
        # Issue #618 in each repository: two leases, each filed under its own repository (the author's one lease
        # in gadgets does not make it busy in widgets).
        for repository in ("Acme/Gadgets", WIDGETS):
            error, doc = await call(client, "gitea_allocate_next_work", **ALLOCATE, exclude_issue_numbers=[617],
                                    dry_run=False, repository=repository)
            assert not error and doc["lease"]["issue_number"] == 618, doc
        db: Database = runtimes[WIDGETS].db
        async with db.reader.execute("SELECT repo, issue_number, owner FROM leases ORDER BY repo") as cur:
            assert [tuple(row) for row in await cur.fetchall()] == [(GADGETS, 618, "author-1"),
                                                                    (WIDGETS, 618, "author-1")]
    async with session(settings, "tok-author-1") as (client, runtimes):
        error, doc = await call(client, "gitea_post_issue_state", issue_number=618, state=STATE, repository=GADGETS)
        assert not error and doc["queued"], doc
        [key] = doc["outbox"]
        entries = [e for e in await OutboxStore(runtimes[GADGETS].db).list(limit=100) if e.key == key]
        assert [e.repo for e in entries] == [GADGETS]


async def test_an_identity_in_one_repository_keeps_the_schema_and_needs_no_repository(settings: Settings) -> None:
    """author-2 is on widgets' roster only: its tools take no repository argument and act on widgets."""
    async with session(settings, "tok-author-2") as (client, runtimes):
        assert list(runtimes) == [WIDGETS]
        assert "repository" not in _schema(await client.list_tools(), "gitea_get_issue_state")["properties"]
        error, doc = await call(client, "gitea_get_issue_state", issue_number=618)
        assert not error and doc["lease"] is None
        error, doc = await call(client, "gitea_get_issue_state", issue_number=618, repository=GADGETS)
        assert error and doc["error"] == "invalid_input" and "repository" in doc["message"]


async def test_foreman_mcp_serves_the_repositories_of_its_identity(tmp_path: Path) -> None:
    """The real `foreman mcp` process: the controller (on both rosters) names the repository of each call; with
    `--repository` the same identity is served that one repository, its tools as always."""
    config = tmp_path / "foreman.toml"
    config.write_text(CONFIG.replace('synchronous = "NORMAL"', f'synchronous = "NORMAL"\npath = "{tmp_path}/f.db"'),
                      encoding="utf-8")
    async with foreman_mcp(config, "tok-controller") as client:
        assert "repository" in _schema(await client.list_tools(), "gitea_allocate_next_work")["properties"]
        result = await client.call_tool("gitea_allocate_next_work", {**ALLOCATE, "exclude_issue_numbers": [617],
                                                                     "dry_run": False, "repository": GADGETS})
        assert not result.is_error, result.structured_content
        refused = await client.call_tool("gitea_get_runtime_context", {})
        assert refused.is_error and refused.structured_content is not None
        assert refused.structured_content["details"]["repositories"] == [WIDGETS, GADGETS]
    with sqlite3.connect(tmp_path / "f.db") as conn:
        assert conn.execute("SELECT repo, issue_number FROM leases").fetchall() == [(GADGETS, 618)]
    command, *args = foreman_mcp_command(config)
    params = StdioServerParameters(command=command, args=[*args[:-1], "--repository", WIDGETS, "mcp"],
                                   env={"FOREMAN_MCP_TOKEN": "tok-controller"}, cwd=REPO_ROOT)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        assert "repository" not in _schema(await session.list_tools(), "gitea_allocate_next_work")["properties"]
