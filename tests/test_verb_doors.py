"""A test per door: comment commands, MCP, the CLI, auto-allocation and start-up recovery are refused by one entry."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from mcp import Client

from bot import cli
from bot.catalog import open_door
from bot.config_writer import write_config
from bot.core.evidence import find_marker, parse_evidence
from bot.core.verbs import VERBS, role_gate
from bot.loops.auto_allocate import auto_allocate
from bot.loops.recovery import recover_open_transitions
from bot.mcp_server import build_server
from bot.verbs.bootstrap import BootstrapContext
from bot.verbs.runtime import caller_for, no_bootstrap
from state.db import utcnow
from state.leases import LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started, offline_config
from tests.world import FULL_NAME, World, open_world

ROSTER = {"controller-bot": ["controller"], "author-1": ["author"], "author-2": ["author"]}
ENVELOPE_KEYS = ("error", "message", "missing", "remediate", "exact_next_action", "details")
CANDIDATES = [{"issue_number": 1}]


def envelope_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The refusal envelope inside a surface's answer (a surface may add its own keys around it)."""
    return {key: doc[key] for key in ENVELOPE_KEYS if key in doc}


def patch_table(monkeypatch: pytest.MonkeyPatch, name: str, **changes: Any) -> None:
    """Change one verb of the table wherever the door reads it (the table itself, not any surface)."""
    verb = VERBS[name]
    if "roles" in changes:
        changes["preconditions"] = (role_gate(changes["roles"]), *verb.preconditions[1:])
    table = MappingProxyType({**VERBS, name: dataclasses.replace(verb, **changes)})
    monkeypatch.setattr("bot.core.verbs.VERBS", table)
    monkeypatch.setattr("bot.verbs.runtime.VERBS", table)


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER) as opened:
        opened.live.emulator.create_issue(OWNER, REPO, title="work", author="alice")
        yield opened


async def by_comment(world: World, login: str, body: str) -> dict[str, Any]:
    """The refusal a comment command gets back (its reply's evidence), through a signed webhook delivery."""
    await world.comment(login, 1, body)
    issue = world.live.emulator.issue(OWNER, REPO, 1)
    [reply] = [c.body for c in issue.comments if (find_marker(c.body) or "").startswith("command:")][-1:]
    evidence = parse_evidence(reply)
    assert evidence is not None and "refusal" in evidence, reply
    return dict(evidence["refusal"])


async def by_mcp(world: World, login: str, tool: str, **arguments: Any) -> dict[str, Any]:
    """The document an MCP tool call answers, through the MCP server in process."""
    settings = world.service.settings
    runtime = open_door(db=world.service.db, settings=settings, bot_login="foreman-bot",
                          bootstrap_factory=no_bootstrap)
    async with Client(build_server(runtime, caller_for(settings, login, "mcp"))) as client:
        result = await client.call_tool(tool, arguments)
    assert result.is_error and result.structured_content is not None
    return dict(result.structured_content)


async def by_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    """`foreman ARGV --json` through main() (in this process, so the patched table applies): exit code, document."""
    config = write_config(tmp_path / "cli.toml", offline_config(tmp_path / "cli.db", {
        "repository": {"owner": OWNER, "name": REPO, "checkout_root": tmp_path / "cli-checkouts"}, "roster": ROSTER}))
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, [argv[0], "--config", str(config), "--json", *argv[1:]])
    return code, json.loads(capsys.readouterr().out)


async def by_auto(world: World) -> dict[str, Any]:
    """The refusal auto-allocation records for its first apply."""
    service = world.service
    report = await auto_allocate(open_door(service.db, service.settings, service.gitea, bot_login="foreman-bot"),
                                 trigger="test")
    assert report.leased == [] and report.applies, report.to_dict()
    return dict(report.applies[0]["refusal"])


async def allocate_at_every_door(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The controller's `/allocate` comment, its MCP call, the operator's `foreman allocate` (exit 1) and
    auto-allocation: the one envelope all four refused with (the comment's)."""
    comment = await by_comment(world, "controller-bot", "/allocate --owner author-1")
    mcp = await by_mcp(world, "controller-bot", "gitea_allocate_next_work", owner="author-1",
                       candidates_json=CANDIDATES)
    code, shell = await by_cli(tmp_path, capsys, "allocate", "--owner", "author-1", "--candidates-json",
                               json.dumps(CANDIDATES))
    auto = await by_auto(world)
    assert code == 1
    assert envelope_of(mcp) == envelope_of(shell) == envelope_of(auto) == comment
    return comment


async def test_a_role_taken_from_the_allocate_verb_refuses_every_door_alike(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table's role gate is the one check: with allocate_next_work for mergers only, the controller's comment,
    its MCP call, the operator's `foreman allocate` and auto-allocation all get the same not_authorized envelope."""
    patch_table(monkeypatch, "allocate_next_work", roles=frozenset({"merger"}))
    comment = await allocate_at_every_door(world, tmp_path, capsys)
    assert comment["error"] == "not_authorized" and "merger role" in comment["message"], comment
    assert await LeaseStore(world.service.db).open_leases(FULL_NAME) == []


async def test_an_allocate_verb_no_longer_offered_is_refused_by_every_door_alike(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verb the table marks not executable is refused invalid_input on every surface, by the same envelope."""
    patch_table(monkeypatch, "allocate_next_work", executable=False)
    comment = await allocate_at_every_door(world, tmp_path, capsys)
    assert comment["error"] == "invalid_input" and "not a verb foreman carries out" in comment["message"], comment


async def by_recovery(world: World, owner: str) -> dict[str, Any]:
    """The refusal start-up recovery records for a live lease whose process died before its bootstrap began."""
    service = world.service
    async with service.db.transaction() as conn:
        await LeaseStore(service.db).acquire(
            conn, repo=FULL_NAME.lower(), issue_number=1, owner=owner, role="author", action="implement",
            ttl=timedelta(hours=1), now=utcnow(), actor="controller-bot", fingerprint=None, request={},
        )
    [result] = await recover_open_transitions(BootstrapContext.from_service(service))
    assert result.status == "refused" and result.refusal is not None, result.to_dict()
    return result.refusal.to_dict()


async def test_a_role_taken_from_the_bootstrap_verb_refuses_every_door_alike(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With bootstrap_issue_worktree for mergers only, an author's `/bootstrap`, its MCP call, the operator's
    `foreman bootstrap --owner` and start-up recovery of the author's unstarted lease get the same not_authorized
    envelope; recovery logs it and releases the lease as unworkable, as the allocation would, and start-up goes on."""
    patch_table(monkeypatch, "bootstrap_issue_worktree", roles=frozenset({"merger"}))
    comment = await by_comment(world, "author-1", "/bootstrap")
    assert comment["error"] == "not_authorized" and "merger role" in comment["message"], comment
    mcp = await by_mcp(world, "author-1", "gitea_bootstrap_issue_worktree", issue_number=1)
    code, shell = await by_cli(tmp_path, capsys, "bootstrap", "--issue", "1", "--owner", "author-1")
    recovery_log = logging.getLogger("foreman.bootstrap")  # the service's logging does not propagate to the root
    recovery_log.addHandler(caplog.handler)
    try:
        recovery = await by_recovery(world, "author-1")
    finally:
        recovery_log.removeHandler(caplog.handler)
    assert code == 1
    assert envelope_of(mcp) == envelope_of(shell) == envelope_of(recovery) == comment
    assert any("unstarted lease" in r.getMessage() and "not_authorized" in r.getMessage() for r in caplog.records)
    [lease] = await LeaseStore(world.service.db).history(FULL_NAME.lower(), 1)
    assert lease.status == "released" and lease.end_reason == "unworkable: not_authorized", lease


async def test_a_caller_without_the_role_gets_the_same_refusal_by_comment_and_by_mcp(world: World) -> None:
    """Unpatched: an author is not a controller, whichever surface it allocates through."""
    comment = await by_comment(world, "author-1", "/allocate --owner author-1")
    assert comment["error"] == "not_authorized" and "controller role" in comment["message"], comment
    mcp = await by_mcp(world, "author-1", "gitea_allocate_next_work", owner="author-1", candidates_json=CANDIDATES)
    assert envelope_of(mcp) == comment
