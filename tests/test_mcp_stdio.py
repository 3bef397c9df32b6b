"""The public MCP regression (seed 000 AC8) on both transports: `foreman mcp` as a subprocess with the SDK's stdio
client, and a real `foreman serve`'s `/mcp` with the SDK's Streamable HTTP client, over the same configuration."""

# A candidate list with #617 ranked first and ``exclude_issue_numbers=[617]``: #617 is never selected or
# leased, in dry-run or apply; it is in ``skipped`` as ``excluded_by_controller``; ``candidates_json`` as a
# JSON string and as a list give the same fingerprint; an identity that may not allocate gets the envelope.

from __future__ import annotations

import json
import select
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from bot.config_writer import write_config
from tests.conftest import REPO_ROOT
from tests.mcp_http_support import mcp_over_http
from tests.serve_support import serve_process
from tests.support import HANG_S, free_port, offline_config

pytestmark = [pytest.mark.process]

CANARY = [
    {"issue_number": 617, "title": "protected", "labels": ["priority:p0"], "created_at": "2026-07-01T10:00:00-05:00"},
    {"issue_number": 618, "title": "next", "labels": ["priority:p1"], "created_at": "2026-07-02T10:00:00-05:00"},
    {"issue_number": 619, "title": "later", "labels": [], "created_at": "2026-06-01T10:00:00-05:00"},
]
CONTROLLER_TOKEN = "tok-controller-ac8"
AUTHOR_TOKEN = "tok-author-ac8"
REVIEWER_TOKEN = "tok-reviewer-ac8"
MERGER_TOKEN = "tok-merger-ac8"
STRANGER_TOKEN = "tok-stranger-ac8"  # a token whose login is on no roster


def mcp_config(tmp_path: Path) -> Path:
    """A config for a stand-alone `foreman mcp`: SQLite under tmp_path, no Gitea token, two MCP identities."""
    return write_config(tmp_path / "foreman.toml", offline_config(tmp_path / "foreman.db", {
        "database": {"synchronous": "NORMAL"},
        "gitea": {"bot_login": "foreman-bot"},
        "repository": {"owner": "acme", "name": "widgets"},
        "roster": {"controller-bot": ["controller"], "author-1": ["author"], "rev-1": ["reviewer"],
                   "merge-1": ["merger"]},
        "mcp": {"tokens": {CONTROLLER_TOKEN: "controller-bot", AUTHOR_TOKEN: "author-1", REVIEWER_TOKEN: "rev-1",
                           MERGER_TOKEN: "merge-1", STRANGER_TOKEN: "stranger"}},
        "server": {"port": free_port(), "shutdown_grace_s": 1.0},
    }))


#: The two ways an agent reaches the verb table: one implementation behind both.
TRANSPORTS = ("stdio", "http")
OpenSession = Callable[[str], AbstractAsyncContextManager[ClientSession]]


@asynccontextmanager
async def sessions_over(transport: str, config: Path) -> AsyncIterator[OpenSession]:
    """What opens a session for a token over ``transport``: `foreman mcp` per session over stdio, or one
    `foreman serve` (for the whole block) whose `/mcp` each session calls."""
    if transport == "stdio":
        yield lambda token: foreman_mcp(config, token)
        return
    async with serve_process(config.parent, config=config, serve=True, graceful=True) as proc:
        yield lambda token: mcp_over_http(f"{proc.url}/mcp", token)


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


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_ac8_an_excluded_top_ranked_issue_is_never_selected_or_leased_through_mcp(
    tmp_path: Path, transport: str
) -> None:
    """Seed 000 AC8 (with AC1, AC2, AC3, AC4, AC6) through the public MCP allocation tool, over each transport."""
    config = mcp_config(tmp_path)
    async with sessions_over(transport, config) as open_session, open_session(CONTROLLER_TOKEN) as session:
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

    async with sessions_over(transport, config) as open_session, open_session(AUTHOR_TOKEN) as session:
        refused = await allocate(session, candidates_json=CANARY, exclude_issue_numbers=[617], dry_run=False)
    assert refused.pop("is_error") is True
    assert list(refused) == ["error", "message", "remediate", "exact_next_action"]
    assert refused["error"] == "not_authorized" and refused["message"] == refused["remediate"]
    assert leases(tmp_path / "foreman.db") == [(618, "author-1", "live")]


#: One refused call per verb family (who, tool, arguments): the role gate, ownership, a missing lease or
#: worktree, an identity off the roster. Each must be refused with the same document over both transports.
FAMILY_REFUSALS: list[tuple[str, str, dict[str, Any]]] = [
    (AUTHOR_TOKEN, "gitea_allocate_next_work", {"candidates_json": CANARY, "dry_run": False}),
    (AUTHOR_TOKEN, "gitea_heartbeat_lease", {"issue_number": 619}),
    (AUTHOR_TOKEN, "gitea_release_lease", {"issue_number": 619, "reason": "not leased"}),
    (REVIEWER_TOKEN, "gitea_post_issue_state", {"issue_number": 618, "state": {"state": "done"}}),
    (AUTHOR_TOKEN, "gitea_bootstrap_issue_worktree", {"issue_number": 619}),
    (AUTHOR_TOKEN, "gitea_lock_issue", {"issue_number": 619}),
    (AUTHOR_TOKEN, "gitea_publish_worktree", {"issue_number": 619, "message": "work"}),
    (AUTHOR_TOKEN, "gitea_open_pull_request", {"issue_number": 619}),
    (AUTHOR_TOKEN, "gitea_claim_review", {"issue_number": 618}),
    (REVIEWER_TOKEN, "gitea_submit_review", {"issue_number": 618, "verdict": "approve"}),
    (REVIEWER_TOKEN, "gitea_merge_pull_request", {"issue_number": 618}),
    (STRANGER_TOKEN, "gitea_get_issue_state", {"issue_number": 618}),
    (STRANGER_TOKEN, "gitea_assess_work_issue_duplicate", {"issue_number": 618}),
]


async def test_a_policy_refusal_is_the_same_document_on_both_transports(tmp_path: Path) -> None:
    """Per verb family, the refusal over stdio and over HTTP is one document (the same door decides both), and
    neither transport lets the call through: the one lease, #618 to author-1, is unchanged."""
    config = mcp_config(tmp_path)
    answers: dict[str, list[dict[str, Any]]] = {}
    for transport in TRANSPORTS:
        async with sessions_over(transport, config) as open_session:
            if transport == "stdio":
                async with open_session(CONTROLLER_TOKEN) as session:
                    await allocate(session, candidates_json=CANARY, exclude_issue_numbers=[617], dry_run=False)
            answers[transport] = [{} for _ in FAMILY_REFUSALS]
            for token in dict.fromkeys(token for token, _, _ in FAMILY_REFUSALS):  # one session per identity
                async with open_session(token) as session:
                    for index, (whose, tool, arguments) in enumerate(FAMILY_REFUSALS):
                        if whose == token:
                            result = await session.call_tool(tool, arguments)
                            assert result.is_error and result.structured_content, (transport, tool, result)
                            answers[transport][index] = result.structured_content
    for (_, tool, _), over_stdio, over_http in zip(FAMILY_REFUSALS, answers["stdio"], answers["http"],
                                                   strict=True):
        assert over_stdio == over_http, (tool, over_stdio, over_http)
        assert over_stdio["error"] != "invalid_input" or tool == "gitea_post_issue_state", (tool, over_stdio)
    assert leases(tmp_path / "foreman.db") == [(618, "author-1", "live")]


# --- the published schema and hostile input over real stdio -----------------------------------------------------------

#: A representative subset of the in-process table (tests/test_verbs_table.py): the item 8 probes, an unlisted
#: tool, and hostile values a JSON client can send.
STDIO_PROBES: list[tuple[str, dict[str, Any]]] = [
    ("gitea_release_lease", {"issue_number": 1.0}),
    ("gitea_allocate_next_work", {"owner": "@author-1", "candidates_json": CANARY}),
    ("gitea_release_lease", {"issue_number": 1, "reason": "two\nlines"}),
    ("gitea_allocate_next_work", {"exclude_issue_numbers": "[1,2]", "candidates_json": CANARY}),
    ("gitea_allocate_next_work", {"exclude_issue_numbers": [True], "candidates_json": CANARY}),
    ("gitea_post_issue_state", {"issue_number": 1, "state": {}}),
    ("gitea_get_issue_state", {"issue_number": 2**63}),
    ("gitea_get_issue_state", {"issue_number": 2**63 - 1}),
    ("gitea_get_issue_state", {"issue_number": 10**400}),
    ("gitea_get_issue_state", {"issue_number": 10**5000}),
    ("gitea_get_issue_state", {"issue_number": float("nan")}),
    ("gitea_get_issue_state", {"issue_number": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}),
    ("gitea_release_lease", {"issue_number": 1, "reason": "x" * 100_000}),
    ("gitea_allocate_next_work", {"candidates_json": '[{"issue_number": NaN}]'}),
    ("gitea_allocate_next_work", {"candidates_json": json.dumps(CANARY), "dry_run": True}),
    ("gitea_heartbeat_lease", {"issue_number": 618, "caller": "controller-bot"}),
]


async def assert_schema_enforced(session: ClientSession, probes: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """For each probe, the tool's listed schema says invalid exactly when ``session``'s server answers
    invalid_input."""
    from tests.test_verbs_table import schema_verdict

    tools = {t.name: t for t in (await session.list_tools()).tools}
    for tool, arguments in probes:
        expected = schema_verdict(tools[tool].input_schema, arguments)
        result = await session.call_tool(tool, arguments)
        doc = result.structured_content
        assert doc is not None, (tool, arguments)
        assert (bool(result.is_error) and doc["error"] == "invalid_input") == (not expected), (tool, doc)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_each_transport_enforces_exactly_its_published_schema(tmp_path: Path, transport: str) -> None:
    """Over `foreman mcp` and over `/mcp`: for each probe, jsonschema(the schema the server lists) says
    invalid exactly when the server answers invalid_input; an unlisted name (``release_lease``) runs nothing."""
    config = mcp_config(tmp_path)
    # The SDK's HTTP client cannot send an integer past Python's digit limit (it fails logging it): that probe goes
    # over HTTP on the raw wire (test_arguments_the_sdk_parser_refuses_are_answered_invalid_input_over_http).
    probes = [(tool, arguments) for tool, arguments in STDIO_PROBES
              if transport == "stdio" or arguments.get("issue_number") != 10**5000]
    async with sessions_over(transport, config) as open_session, open_session(CONTROLLER_TOKEN) as session:
        await allocate(session, candidates_json=CANARY, exclude_issue_numbers=[617], dry_run=False)
        await assert_schema_enforced(session, probes)
        for name in ("release_lease", "gitea_merge", "gitea_release_lease "):
            result = await session.call_tool(name, {"issue_number": 618, "reason": "probe"})
            doc = result.structured_content
            assert result.is_error and doc is not None and doc["error"] == "invalid_input", (name, doc)
            assert "unknown tool" in doc["message"]
    assert leases(tmp_path / "foreman.db") == [(618, "author-1", "live")]


def _bad_token_run(tmp_path: Path, token: bytes) -> subprocess.CompletedProcess[bytes]:
    config = mcp_config(tmp_path)
    env = {b"PATH": b"/usr/bin:/bin", b"FOREMAN_MCP_TOKEN": token}
    return subprocess.run(  # bytes env: the value is not UTF-8 on purpose
        foreman_mcp_command(config), env=env, input=b"", capture_output=True, timeout=HANG_S, check=False, cwd=REPO_ROOT
    )


@pytest.mark.parametrize("token", [b"\xff", b"tok-controller-ac8\xff", b"frun_\xfe\xff", b"\xed\xa0\x80"])
def test_a_token_that_is_not_utf8_refuses_to_start_with_one_line(tmp_path: Path, token: bytes) -> None:
    """FOREMAN_MCP_TOKEN with bytes that are not UTF-8 (surrogateescape in os.environ): no
    traceback, one clear line on stderr naming the variable, exit 2 (configuration), nothing on stdout."""
    done = _bad_token_run(tmp_path, token)
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, stderr
    assert done.stdout == b""
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    error = json.loads(lines[0])
    assert (error["error"], error["key"]) == ("invalid_config", "mcp.tokens")
    assert "FOREMAN_MCP_TOKEN" in error["message"]
    if not token.startswith(b"frun_"):  # a run token's line is bot/cli/mcp.py's "not the token of any run"
        assert "not valid UTF-8" in error["message"]


#: A raw session: initialize, then tools/calls whose JSON the SDK's parser refuses (ids 2-4) and a plain one (5).
_INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


def _raw_call(request_id: int, arguments: str) -> str:
    return (f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/call", "params": '
            f'{{"name": "gitea_get_issue_state", "arguments": {arguments}}}}}')


RAW_LINES = [
    json.dumps(_INIT),
    json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    _raw_call(2, '{"issue_number": 1' + "0" * 5000 + "}"),
    _raw_call(3, '{"issue_number": "\\ud800"}'),
    _raw_call(4, '{"issue_number": -' + "9" * 4301 + ', "x": "\\udfff"}'),
    _raw_call(6, '{"issue_number": ' + "[" * 300 + "1" + "]" * 300 + "}"),
    _raw_call(7, '{"issue_number": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"),
    _raw_call(5, '{"issue_number": 1}'),
]
#: The requests of RAW_LINES (every line but initialize's and the notification).
RAW_REQUESTS = (2, 3, 4, 5, 6, 7)


def assert_unreadable_answered(answers: dict[int, dict[str, Any]]) -> None:
    """Requests 2-4, 6 and 7 answered invalid_input saying nothing ran, each naming why; request 5 answered."""
    for request_id in (2, 3, 4, 6, 7):
        result = answers[request_id]["result"]
        assert result["isError"] is True
        assert result["structuredContent"]["error"] == "invalid_input", result
        assert "nothing ran" in result["structuredContent"]["message"]
    assert "more than 4,300 digits" in answers[2]["result"]["structuredContent"]["message"]
    assert "lone surrogate" in answers[3]["result"]["structuredContent"]["message"]
    for request_id in (6, 7):  # hundreds, then thousands of levels: answered, never a silent drop
        assert "nested more than 64 levels" in answers[request_id]["result"]["structuredContent"]["message"]
    assert "result" in answers[5], answers[5]


async def test_arguments_the_sdk_parser_refuses_are_answered_invalid_input_over_http(tmp_path: Path) -> None:
    """The raw-wire case below, over `/mcp`: each message its own POST in one session, each answered."""
    import aiohttp

    config = mcp_config(tmp_path)
    headers = {"Authorization": f"Bearer {CONTROLLER_TOKEN}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}
    answers: dict[int, dict[str, Any]] = {}
    async with (serve_process(config.parent, config=config, serve=True, graceful=True) as proc,
                aiohttp.ClientSession() as http):
        for line in RAW_LINES:
            async with http.post(f"{proc.url}/mcp", data=line.encode(), headers=headers) as resp:
                assert resp.status in (200, 202), await resp.text()
                if "mcp-session-id" in resp.headers:
                    headers = {**headers, "Mcp-Session-Id": resp.headers["mcp-session-id"],
                               "MCP-Protocol-Version": "2025-06-18"}
                if resp.status == 200:
                    message = await resp.json()
                    answers[message["id"]] = message
    assert_unreadable_answered(answers)


def test_arguments_the_sdk_parser_refuses_are_answered_invalid_input_on_the_wire(tmp_path: Path) -> None:
    """On the raw wire: a tools/call whose JSON the SDK's parser refuses (an integer of 5,000
    digits, a lone surrogate escape) used to get no answer at all (the client waited forever). Each request is
    answered, with invalid_input, and the session goes on."""
    config = mcp_config(tmp_path)
    lines = RAW_LINES
    command, *args = foreman_mcp_command(config)
    process = subprocess.Popen(
        [command, *args], env={"PATH": "/usr/bin:/bin", "FOREMAN_MCP_TOKEN": CONTROLLER_TOKEN}, cwd=REPO_ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,  # select() sees all
    )
    try:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(("\n".join(lines) + "\n").encode())
        process.stdin.flush()
        answers: dict[int, dict[str, Any]] = {}
        while not set(RAW_REQUESTS) <= set(answers):  # the answer to every request, before stdin closes
            ready, _, _ = select.select([process.stdout], [], [], HANG_S)
            assert ready, f"no answer to requests {sorted(set(RAW_REQUESTS) - set(answers))} within {HANG_S:.0f} s"
            line = process.stdout.readline()
            assert line, "the server stopped answering"
            message = json.loads(line)
            assert message.get("id") in (1, *RAW_REQUESTS), message  # initialize's answer, then one per request
            answers[message["id"]] = message
        process.stdin.close()
        assert process.wait(timeout=HANG_S) == 0
    finally:  # never left running, whatever failed
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stderr is not None and b"Traceback" not in process.stderr.read()
    assert_unreadable_answered(answers)
    assert answers[5]["result"]["isError"] is False
