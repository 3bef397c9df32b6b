"""`foreman run` and `foreman grants`: agent runs bound to sealed grants (docs/grants.md)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
from typing import Any

from bot.cli.common import EXIT_OK, EXIT_REFUSED, emit, with_db
from bot.config import Settings
from state.db import Database


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """`run start` compiles and seals a grant; `run abort` / `run reconcile` are the operator's side of a run."""
    from bot.core.errors import EnvelopeError
    from bot.verbs.runs.broker import Broker
    from bot.verbs.runs.start import host_identity, start_run
    from state.grants import GrantStore

    async def work(db: Database) -> int:
        if args.run_command == "start":
            try:
                started = await start_run(
                    db, settings, issue_number=args.issue, action=args.action, sealed_by=f"operator:{getpass.getuser()}"
                )
            except EnvelopeError as exc:
                emit(exc.envelope.to_dict(), as_json=True)
                return EXIT_REFUSED
            grant = started.grant
            text = (
                f"run {started.run_id} sealed for #{grant.issue_number} ({grant.policy_key}, {len(grant.calls)} calls,"
                f" grant {grant.digest}, expires {grant.expires_at.isoformat()})\n"
                f"run token (shown once; give it to the agent's `foreman mcp` as FOREMAN_MCP_TOKEN): {started.token}"
            )
            emit(started.to_dict(), as_json=args.json, text=text)
            return EXIT_OK
        store = GrantStore(db)
        if await store.run(args.run_id) is None:
            emit(
                {
                    "error": "not_found",
                    "message": f"no run {args.run_id}",
                    "remediate": "list runs with `foreman grants` and pick one",
                    "exact_next_action": "run foreman grants",
                },
                as_json=True,
            )
            return EXIT_REFUSED
        broker = Broker(store, args.run_id, host=lambda: host_identity(settings.database.path))
        if args.run_command == "teardown":
            doc = await _teardown(broker)
            emit(doc, as_json=args.json)
            return EXIT_OK if doc["ok"] else EXIT_REFUSED
        if args.run_command == "abort":
            result = await broker.abort(args.reason)
        else:
            result = await broker.reconcile(args.call_id, note=args.note)
        emit(result.to_dict(), as_json=args.json)
        return EXIT_OK if result.ok else EXIT_REFUSED

    async def _teardown(broker: Broker) -> dict[str, Any]:
        # The reserved teardown, run by the operator through the same gateway as the agent's calls, as the
        # run's owner (a run the agent abandoned is still torn down exactly once, with the compiled arguments).
        from bot.core.verbs import TOOLS
        from bot.mcp_server import open_runtime
        from bot.verbs.runs.inspect import run_teardown
        from bot.verbs.runtime import caller_for

        grant = await broker.grant()
        async with open_runtime(settings) as runtime:
            caller = caller_for(settings, grant.owner, "mcp")

            async def run_tool(tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
                result = await runtime.call(TOOLS[tool].name, caller, arguments)
                return result.ok, result.doc

            return await run_teardown(broker, run_tool)

    return asyncio.run(with_db(settings, work))


def cmd_grants(settings: Settings, args: argparse.Namespace) -> int:
    """Sealed grants with their digests, run state and every admission decision (docs/grants.md)."""
    from bot.verbs.runs.inspect import inspect

    async def work(db: Database) -> int:
        try:
            doc = await inspect(db, args.run_id)
        except LookupError as exc:
            emit(
                {
                    "error": "not_found",
                    "message": str(exc),
                    "remediate": "list runs with `foreman grants` and pick one",
                    "exact_next_action": "run foreman grants",
                },
                as_json=True,
            )
            return EXIT_REFUSED
        lines: list[str] = []
        for entry in doc["runs"]:
            run, grant = entry["run"], entry["grant"]
            lines.append(
                f"{run['run_id']} #{run['issue_number']} {run['policy']} {run['owner']} grant {run['grant_digest']}"
                f" next={run['next_position']} outcome={run['outcome'] or '-'} teardown={run['teardown']}"
                + ("" if entry["grant_integrity"] == "intact" else f" GRANT {entry['grant_integrity']}")
            )
            if grant is not None:
                lines.append(f"  policy {grant['policy']['digest']} contract {grant['contract_digest']}")
                for call in grant["calls"]:
                    args_text = json.dumps(call["arguments"], sort_keys=True)
                    lines.append(f"  [{call['position']}] {call['effect']:<9} {call['tool']} {args_text}")
            for d in entry["decisions"]:
                where = f"#{d['position']}" if d["position"] is not None else "-"
                lines.append(
                    f"    {d['at']} {d['kind']:<12} {d['tool'] or '-'} {where} {d['reason']}"
                    + (f" [{d['category']}]" if d["category"] else "")
                    + (" inert" if d["inert"] else "")
                )
        emit(doc, as_json=args.json, text="\n".join(lines) if lines else "(no runs)")
        return EXIT_OK

    return asyncio.run(with_db(settings, work))
