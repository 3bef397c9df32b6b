"""The public MCP regression (seed 000 AC8, issue 7.5): `foreman mcp` as a subprocess, the SDK's stdio client.

A candidate list with #617 ranked first and ``exclude_issue_numbers=[617]``: #617 is never selected or
leased, in dry-run or apply; it is in ``skipped`` as ``excluded_by_controller``; ``candidates_json`` as a
JSON string and as a list give the same fingerprint; an identity that may not allocate gets the envelope.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import REPO_ROOT

CANARY = [
    {"issue_number": 617, "title": "protected", "labels": ["priority:p0"], "created_at": "2026-07-01T10:00:00-05:00"},
    {"issue_number": 618, "title": "next", "labels": ["priority:p1"], "created_at": "2026-07-02T10:00:00-05:00"},
    {"issue_number": 619, "title": "later", "labels": [], "created_at": "2026-06-01T10:00:00-05:00"},
]
CONTROLLER_TOKEN = "tok-controller-ac8"
AUTHOR_TOKEN = "tok-author-ac8"


def write_config(tmp_path: Path) -> Path:
    """A config for a stand-alone `foreman mcp`: SQLite under tmp_path, no Gitea token, two MCP identities."""
    config = tmp_path / "foreman.toml"
    config.write_text(
        f"""
[webhook]
secrets = ["ac8-secret-0123456789abcdef"]
[database]
path = "{tmp_path / 'foreman.db'}"
synchronous = "NORMAL"
[gitea]
bot_login = "foreman-bot"
[repository]
owner = "acme"
name = "widgets"
[roster]
"controller-bot" = ["controller"]
"author-1" = ["author"]
[mcp.tokens]
"{CONTROLLER_TOKEN}" = "controller-bot"
"{AUTHOR_TOKEN}" = "author-1"
""",
        encoding="utf-8",
    )
    return config


def foreman_mcp_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "bot", "--config", str(config), "mcp"]


@asynccontextmanager
async def foreman_mcp(config: Path, token: str) -> AsyncIterator[ClientSession]:
    """`foreman mcp` started as a subprocess, with an initialized client session over its stdio."""
    command, *args = foreman_mcp_command(config)
    params = StdioServerParameters(command=command, args=args, env={"FOREMAN_MCP_TOKEN": token}, cwd=REPO_ROOT)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def allocate(session: ClientSession, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool("gitea_allocate_next_work", arguments)
    assert result.structured_content is not None
    return {**result.structured_content, "is_error": bool(result.is_error)}


def leases(database: Path) -> list[tuple[int, str, str]]:
    with sqlite3.connect(database) as conn:
        rows = conn.execute("SELECT issue_number, owner, status FROM leases ORDER BY id").fetchall()
    return [(int(n), str(owner), str(status)) for n, owner, status in rows]


async def test_ac8_an_excluded_top_ranked_issue_is_never_selected_or_leased_through_mcp(tmp_path: Path) -> None:
    """Seed 000 AC8 (with AC1, AC2, AC3, AC4, AC6) through the public MCP allocation tool over stdio."""
    config = write_config(tmp_path)
    async with foreman_mcp(config, CONTROLLER_TOKEN) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        schema = tools["gitea_allocate_next_work"].input_schema
        assert schema["properties"]["exclude_issue_numbers"]["items"]["type"] == "integer"

        as_list = await allocate(session, candidates_json=CANARY, exclude_issue_numbers=[617])
        as_text = await allocate(session, candidates_json=json.dumps(CANARY), exclude_issue_numbers=[617])
        for dry in (as_list, as_text):
            assert not dry["is_error"] and dry["decision"] == "select" and dry["issue_number"] == 618
            assert dry["dry_run"] is True and dry["applied"] is False
            assert [r["issue_number"] for r in dry["ranked"]] == [618, 619]
            [skipped] = [s for s in dry["skipped"] if s["issue_number"] == 617]
            assert skipped["reason"] == "excluded_by_controller"
        assert as_list["fingerprint"] == as_text["fingerprint"]
        assert leases(tmp_path / "foreman.db") == []

        applied = await allocate(
            session,
            candidates_json=json.dumps(CANARY),
            exclude_issue_numbers=[617],
            dry_run=False,
            expected_fingerprint=as_list["fingerprint"],
        )
        assert not applied["is_error"] and applied["applied"] is True
        assert (applied["issue_number"], applied["lease"]["issue_number"]) == (618, 618)
        assert 617 in [s["issue_number"] for s in applied["skipped"] if s["reason"] == "excluded_by_controller"]

        # Everything but #617 taken or excluded: the canonical WAIT, still nothing on #617.
        waiting = await allocate(session, candidates_json=CANARY, exclude_issue_numbers=[617, 619], dry_run=False)
        assert waiting["decision"] in ("resume", "wait") and waiting.get("issue_number") != 617
    assert leases(tmp_path / "foreman.db") == [(618, "author-1", "live")]

    async with foreman_mcp(config, AUTHOR_TOKEN) as session:
        refused = await allocate(session, candidates_json=CANARY, exclude_issue_numbers=[617], dry_run=False)
    assert refused.pop("is_error") is True
    assert list(refused) == ["error", "message", "remediate", "exact_next_action"]
    assert refused["error"] == "not_authorized" and refused["message"] == refused["remediate"]
    assert leases(tmp_path / "foreman.db") == [(618, "author-1", "live")]
