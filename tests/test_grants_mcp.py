"""Run-bound MCP sessions: every tool call through the run's broker, then the door with the compiled arguments."""

# The first test drives a real `foreman mcp` over stdio (a subprocess, the SDK's stdio client) bound to a run that
# `foreman run start` sealed on a real lease and bootstrap journal registration. The others run the same server
# in process to turn the clock or cancel a call.

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, ClientSession

from bot.catalog import open_door
from bot.cli import main
from bot.config import Settings, load_settings
from bot.config_writer import write_config
from bot.core.evidence import find_marker, marker
from bot.mcp_server import bind_run, broker_around, build_server
from bot.verbs.runs.broker import Broker, run_evidence_key
from bot.verbs.runs.start import host_identity, start_run
from bot.verbs.runtime import Caller, VerbResult, VerbRuntime, no_bootstrap
from state.db import Database, utcnow
from state.grants import GrantStore
from state.outbox import OutboxIntent, OutboxStore
from tests.conftest import REPO_ROOT
from tests.support import HANG_S, eventually, free_port, offline_config
from tests.test_grants import Dial, _lease_and_worktree
from tests.test_mcp_stdio import TRANSPORTS, sessions_over

pytestmark = [pytest.mark.process]

AUTHOR_TOKEN = "tok-author-grants"  # an ordinary [mcp.tokens] token, for the unbound session
READ = ("gitea_get_issue_state", {"issue_number": 8})
BEAT = ("gitea_heartbeat_lease", {"issue_number": 8})
RELEASE = ("gitea_release_lease", {"issue_number": 8, "reason": "done"})


def grants_config(tmp_path: Path) -> Path:
    """A stand-alone config: SQLite under tmp_path (the lease and registration keyed org/repo), no Gitea token,
    an author on the roster and the run grant template of its leases (read, heartbeat, then the teardown)."""
    issue = {"issue_number": "{issue}"}
    return write_config(tmp_path / "foreman.toml", offline_config(tmp_path / "var" / "foreman.db", {
        "database": {"synchronous": "NORMAL"},
        "gitea": {"bot_login": "foreman-bot"},
        "repository": {"owner": "Org", "name": "repo"},
        "roster": {"author-1": ["author"]},
        "mcp": {"tokens": {AUTHOR_TOKEN: "author-1"}},
        "server": {"port": free_port(), "shutdown_grace_s": 1.0},
        "grants": {"author.implement": {"expires_after_s": 900, "calls": [
            {"tool": "gitea_get_issue_state", "effect": "read", "args": issue},
            {"tool": "gitea_heartbeat_lease", "effect": "mutate", "args": issue},
            {"tool": "gitea_release_lease", "effect": "teardown", "args": {**issue, "reason": "done"}},
        ]}},
    }))


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def lease_events(database: Path, kind: str) -> int:
    with sqlite3.connect(database) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM lease_events WHERE kind = ?", (kind,)).fetchone()
    return int(count)


def outbox_body(database: Path, key: str) -> str | None:
    with sqlite3.connect(database) as conn:
        row = conn.execute("SELECT payload_json FROM outbox WHERE idempotency_key = ?", (key,)).fetchone()
    return None if row is None else str(json.loads(row[0])["body"])


def evidence_json(body: str) -> dict[str, Any]:
    """The machine-readable section of an evidence comment."""
    found = re.search(r"```json\n(.*?)\n```", body, re.DOTALL)
    assert found is not None, body
    doc: dict[str, Any] = json.loads(found.group(1))
    return doc


async def call(session: ClientSession | Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    result = await session.call_tool(tool, arguments)
    assert result.structured_content is not None
    return bool(result.is_error), result.structured_content


def denied(answer: tuple[bool, dict[str, Any]], category: str, reason: str) -> None:
    is_error, doc = answer
    assert is_error, doc
    assert (doc["error"], doc["details"]["reason"]) == (category, reason), doc
    assert list(doc) == ["error", "message", "remediate", "exact_next_action", "details"]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_real_session_bound_to_a_run_admits_only_the_grant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, transport: str
) -> None:
    """A real session bound to a run, over `foreman mcp` (stdio) and over `foreman serve`'s `/mcp` (HTTP, the run
    token as the bearer): the same broker, the same decisions. The grant's calls are admitted in
    order; changed, out-of-order, skipped and repeated calls are denied with the bounded category before the
    tool runs (no heartbeat, no release happened); the teardown runs once; the run's evidence is queued."""
    monkeypatch.delenv("FOREMAN_CONFIG", raising=False)
    config = grants_config(tmp_path)
    settings = load_settings(config, environ={})
    database = settings.database.path
    await _lease_and_worktree(database)
    start = ["run", "start", "--issue", "8", "--config", str(config), "--json"]
    code, started = await asyncio.to_thread(cli, start, capsys)
    assert code == 0, started
    run_id, token = started["run_id"], started["token"]
    assert [c["tool"] for c in started["grant"]["calls"]] == [READ[0], BEAT[0], RELEASE[0]]

    async with sessions_over(transport, config) as open_session, open_session(token) as session:
        initialized_tools = {t.name for t in (await session.list_tools()).tools}
        assert initialized_tools == {READ[0], BEAT[0], RELEASE[0]}  # only the grant's tools are offered

        denied(await call(session, *BEAT), "grant_denied", "skipped")  # a later entry, ahead of the plan
        denied(await call(session, RELEASE[0], {"issue_number": 8, "reason": "bored"}), "grant_denied", "out_of_order")
        denied(await call(session, READ[0], {"issue_number": 9}), "grant_denied", "changed_arguments")
        assert lease_events(database, "heartbeat") == 0 and lease_events(database, "released") == 0

        is_error, doc = await call(session, *READ)
        assert not is_error and doc["issue_number"] == 8 and doc["lease_live"] is True
        denied(await call(session, *READ), "grant_denied", "repeated")
        denied(await call(session, BEAT[0], {"issue_number": 8, "ttl": 99}), "grant_denied", "invalid_arguments")
        denied(await call(session, BEAT[0], {"issue_number": 9}), "grant_denied", "changed_arguments")
        assert lease_events(database, "heartbeat") == 0  # nothing denied reached the gateway

        is_error, doc = await call(session, *BEAT)
        assert not is_error and doc["lease"]["issue_number"] == 8
        assert lease_events(database, "heartbeat") == 1
        is_error, doc = await call(session, *RELEASE)  # the reserved teardown, with the compiled arguments
        assert not is_error and doc["lease"]["status"] == "released"
        denied(await call(session, *RELEASE), "grant_denied", "run_closed")
        denied(await call(session, *READ), "grant_denied", "run_closed")
    assert lease_events(database, "heartbeat") == 1 and lease_events(database, "released") == 1

    code, shown = await asyncio.to_thread(cli, ["grants", run_id, "--config", str(config), "--json"], capsys)
    assert code == 0
    [entry] = shown["runs"]
    assert (entry["run"]["outcome"], entry["run"]["teardown"], entry["run"]["closed"]) == ("completed", "done", True)
    assert [(d["kind"], d["reason"], d["category"]) for d in entry["decisions"]] == [
        ("denied", "skipped", "grant_denied"),
        ("denied", "out_of_order", "grant_denied"),
        ("denied", "changed_arguments", "grant_denied"),
        ("admitted", "admitted", None),
        ("accepted", "accepted", None),
        ("denied", "repeated", "grant_denied"),
        ("denied", "invalid_arguments", "grant_denied"),
        ("denied", "changed_arguments", "grant_denied"),
        ("admitted", "admitted", None),
        ("accepted", "accepted", None),
        ("admitted", "admitted", None),
        ("accepted", "accepted", None),
        ("denied", "run_closed", "grant_denied"),
        ("denied", "run_closed", "grant_denied"),
    ]
    assert [d["position"] for d in entry["decisions"] if d["kind"] == "admitted"] == [0, 1, 2]

    # The run's end: one evidence comment in the outbox, queued with the closing decision.
    body = outbox_body(database, run_evidence_key(run_id))
    assert body is not None and find_marker(body) == run_evidence_key(run_id)
    assert f"Run {run_id}" in body and "ended completed" in body and "ran once" in body
    evidence = evidence_json(body)
    assert evidence["action"] == "run_end" and evidence["unresolved_worktree_uuid"] is None
    assert evidence["run"] == {
        "run_id": run_id,
        "policy": "author.implement",
        "grant_digest": started["grant"]["grant_digest"],
        "policy_digest": started["grant"]["policy"]["digest"],
        "contract_digest": started["grant"]["contract_digest"],
        "worktree_uuid": started["grant"]["worktree"]["uuid"],
        "steps_done": 2,
        "steps": 2,
        "outcome": "completed",
        "teardown": "done",
    }
    assert evidence["decisions"] == {"accepted": 3, "admitted": 3, "denied": 6}  # as of the close
    assert token not in body


def test_an_unknown_run_token_refuses_to_start(tmp_path: Path) -> None:
    """A run token no run has is a configuration error (exit 2), before anything is served."""
    config = grants_config(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "bot", "--config", str(config), "mcp"],
        env={"FOREMAN_MCP_TOKEN": "frun_no-such-run", "PATH": "/usr/bin:/bin"},
        cwd=REPO_ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HANG_S, check=False,
    )
    assert done.returncode == 2, done.stderr
    assert '"error": "invalid_config"' in done.stderr and "not the token of any run" in done.stderr


# --- in process -------------------------------------------------------------------------------------------------------


@dataclass
class Bound:
    settings: Settings
    db: Database
    runtime: VerbRuntime
    token: str
    run_id: str
    broker: Broker
    clock: Dial
    expires_at: datetime

    async def state(self) -> dict[str, Any]:
        record = await GrantStore(self.db).run(self.run_id)
        assert record is not None
        return record.state.to_dict()


@asynccontextmanager
async def bound_run(tmp_path: Path) -> AsyncIterator[Bound]:
    settings = load_settings(grants_config(tmp_path), environ={})
    await _lease_and_worktree(settings.database.path)
    db = await Database.open(settings.database.path, synchronous="NORMAL")
    try:
        now = utcnow()
        started = await start_run(db, settings, issue_number=8, sealed_by="test", now=now)
        runtime = open_door(db=db, settings=settings, bot_login="foreman-bot", bootstrap_factory=no_bootstrap)
        clock = Dial(now + timedelta(seconds=1))
        broker = Broker(
            GrantStore(db),
            started.run_id,
            host=lambda: host_identity(settings.database.path),
            clock=clock,
            policy_digest=started.grant.policy_digest,
            grant_digest=started.grant.digest,
        )
        yield Bound(settings, db, runtime, started.token, started.run_id, broker, clock, started.grant.expires_at)
    finally:
        await db.close()


def session(bound: Bound) -> Client:
    from bot.verbs.runtime import caller_for

    caller = caller_for(bound.settings, "author-1", "mcp")
    return Client(build_server(bound.runtime, caller, around=broker_around(bound.broker)))


async def test_a_late_result_is_refused_and_does_not_advance_the_plan(tmp_path: Path) -> None:
    """Through MCP: the grant expires while the call runs; its result is not handed back (the refusal
    is, with grant_expired), the plan does not advance, and only the reserved teardown is admitted after it."""
    async with bound_run(tmp_path) as bound:
        runtime_call = bound.runtime.call
        ran: list[str] = []

        async def slow_call(verb_name: str, caller: Caller, arguments: Mapping[str, object], **kwargs: Any
                            ) -> VerbResult:
            ran.append(verb_name)
            bound.clock.value = bound.expires_at + timedelta(seconds=1)  # the grant ran out meanwhile
            return await runtime_call(verb_name, caller, arguments, **kwargs)

        bound.runtime.call = slow_call  # type: ignore[method-assign]
        async with session(bound) as client:
            is_error, doc = await call(client, *READ)
            assert is_error and doc["error"] == "grant_expired" and doc["details"]["reason"] == "late_result"
            assert "lease_live" not in doc  # the late result itself is not handed back
            state = await bound.state()
            assert (state["next_position"], state["inflight"], state["outcome"]) == (0, None, "expired")
            denied(await call(client, *BEAT), "grant_expired", "expired")
            assert ran == ["get_issue_state"]
            bound.runtime.call = runtime_call  # type: ignore[method-assign]
            is_error, doc = await call(client, *RELEASE)
            assert not is_error and doc["lease"]["status"] == "released"
        body = outbox_body(bound.settings.database.path, run_evidence_key(bound.run_id))
        assert body is not None and evidence_json(body)["run"]["outcome"] == "expired"
        assert evidence_json(body)["run"]["steps_done"] == 0


async def test_a_call_cancelled_in_flight_aborts_the_run_and_keeps_blocking_the_teardown(tmp_path: Path) -> None:
    """Cancellation between admission and result aborts the run (shielded); the in-flight call is kept and the
    teardown is refused (inflight_unresolved) until an operator reconciles it; then it runs once."""
    async with bound_run(tmp_path) as bound:
        runtime_call = bound.runtime.call
        started = asyncio.Event()

        async def hanging_call(verb_name: str, caller: Caller, arguments: Mapping[str, object], **kwargs: Any
                               ) -> VerbResult:
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        bound.runtime.call = hanging_call  # type: ignore[method-assign]
        around = broker_around(bound.broker)

        async def run(arguments: dict[str, Any]) -> VerbResult:
            return await bound.runtime.call("get_issue_state", None, arguments)  # type: ignore[arg-type]

        task = asyncio.ensure_future(around(READ[0], dict(READ[1]), run))
        await asyncio.wait_for(started.wait(), HANG_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        state = await bound.state()
        assert state["outcome"] == "aborted" and state["inflight"] is not None and state["next_position"] == 0
        inflight = state["inflight"]["call_id"]

        bound.runtime.call = runtime_call  # type: ignore[method-assign]
        async with session(bound) as client:
            denied(await call(client, *RELEASE), "inflight_unresolved", "inflight")
            assert (await bound.broker.reconcile(inflight, note="checked: the read had no effect")).ok
            is_error, doc = await call(client, *RELEASE)
            assert not is_error and doc["lease"]["status"] == "released"
            denied(await call(client, *RELEASE), "grant_denied", "run_closed")
        body = outbox_body(bound.settings.database.path, run_evidence_key(bound.run_id))
        assert body is not None and evidence_json(body)["run"]["outcome"] == "aborted"


async def test_a_client_abandoning_a_call_aborts_the_run(tmp_path: Path) -> None:
    """The same through the SDK: a client that gives up on a call cancels it on the server; the run is aborted."""
    async with bound_run(tmp_path) as bound:

        async def hanging_call(verb_name: str, caller: Caller, arguments: Mapping[str, object], **kwargs: Any
                               ) -> VerbResult:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        bound.runtime.call = hanging_call  # type: ignore[method-assign]
        async with session(bound) as client:
            with anyio.move_on_after(0.5):
                await client.call_tool(*READ)

            async def ended() -> bool:
                return (await bound.state())["outcome"] is not None

            await eventually(ended, "the run's outcome", poll_s=0.05)
            state = await bound.state()
        assert state["outcome"] == "aborted" and state["inflight"] is not None


async def test_ordinary_tokens_are_not_bound_and_run_tokens_bind_the_runs_owner(tmp_path: Path) -> None:
    """Sessions without a run are as before (no broker); a run token serves the run's owner and its grant."""
    async with bound_run(tmp_path) as bound:
        assert await bind_run(bound.runtime, AUTHOR_TOKEN) is None
        assert await bind_run(bound.runtime, "frun_no-such-run") is None
        assert await bind_run(bound.runtime, None) is None
        binding = await bind_run(bound.runtime, bound.token)
        assert binding is not None and binding.caller.login == "author-1" and binding.grant.run_id == bound.run_id
        assert {t.name for t in binding.tools()} == {READ[0], BEAT[0], RELEASE[0]}
        async with Client(binding.build_server(bound.runtime)) as client:
            denied(await call(client, *BEAT), "grant_denied", "skipped")
            is_error, doc = await call(client, *READ)
            assert not is_error and doc["issue_number"] == 8
        # An ordinary session over the same database is not bound: the gateway alone decides.
        from bot.mcp_server import resolve_identity

        async with Client(build_server(bound.runtime, resolve_identity(bound.settings, AUTHOR_TOKEN))) as client:
            is_error, doc = await call(client, *READ)
            assert not is_error and doc["issue_number"] == 8
            is_error, doc = await call(client, "gitea_get_runtime_context", {})
            assert not is_error
        assert [d.kind for d in await GrantStore(bound.db).decisions(bound.run_id)] == [
            "denied",
            "admitted",
            "accepted",
        ]


async def test_the_run_closes_even_when_its_evidence_cannot_be_queued_in_the_closing_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The evidence entry is written under a savepoint of the closing transaction; if that fails the run still
    closes (the teardown is never left in flight by it) and the entry is written once more on its own."""
    import bot.verbs.runs.broker as broker_module
    from bot.verbs.runs.inspect import run_teardown
    from state.outbox import enqueue as real_enqueue

    attempts: list[str] = []

    async def flaky_enqueue(conn: Any, intent: Any, **kwargs: Any) -> bool:
        attempts.append(intent.key)
        if len(attempts) == 1:
            half = OutboxIntent("half-written", intent.issue_number, "comment", {"body": marker("half-written")})
            assert await real_enqueue(conn, half)  # written, then rolled back to the savepoint
            raise sqlite3.OperationalError("disk I/O error")
        return await real_enqueue(conn, intent, **kwargs)

    monkeypatch.setattr(broker_module, "enqueue", flaky_enqueue)
    async with bound_run(tmp_path) as bound:
        assert (await bound.broker.abort("operator stop")).ok

        async def release(tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
            from bot.verbs.runtime import caller_for

            result = await bound.runtime.call("release_lease", caller_for(bound.settings, "author-1", "mcp"), arguments)
            return result.ok, result.doc

        torn = await run_teardown(bound.broker, release)
        assert torn["ok"], torn
        state = await bound.state()
        assert (state["outcome"], state["teardown"], state["closed"]) == ("aborted", "done", True)
        assert attempts == [run_evidence_key(bound.run_id)] * 2
        entry = await OutboxStore(bound.db).by_key(run_evidence_key(bound.run_id))
        assert entry is not None and "ended aborted" in entry.payload["body"]
        assert await OutboxStore(bound.db).by_key("half-written") is None
