"""`foreman run` and `foreman grants`: agent runs bound to sealed grants (docs/grants.md)."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
from pathlib import Path
from typing import Any

from bot.cli.common import EXIT_OK, EXIT_REFUSED, emit, with_db
from bot.cli.parsing import Commands, add_json, issue_number
from bot.config import Settings
from state.db import Database


def run_view(settings: Settings, grant_repo: str, given: str | None, run_id: str, *, command: str = "teardown"
             ) -> Settings | dict[str, Any]:
    """The settings of a run's own repository (its grant's), or the ``invalid_input`` envelope: a run of a
    repository this config does not serve, or an explicit ``--repository`` that is not the run's."""
    if given is not None and settings.find_repository(given) != grant_repo:
        return {"error": "invalid_input",
                "message": f"run {run_id} acts for {grant_repo}, not --repository {given}",
                "remediate": "a run's own commands act for its grant's repository: leave --repository out",
                "exact_next_action": f"foreman run {command} {run_id} (the same command, without --repository)",
                "repository": grant_repo}
    if grant_repo not in settings.repository_keys():
        return {"error": "invalid_input",
                "message": f"run {run_id} acts for {grant_repo}, which this config does not serve"
                f" ({', '.join(settings.repository_keys())})",
                "remediate": f"add {grant_repo} to [[repositories]] (or use the config that serves it)",
                "exact_next_action": f"add [[repositories]] owner/name {grant_repo} to the config, then run"
                " foreman check-config", "repository": grant_repo}
    return settings.for_repository(grant_repo)


def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """`run start` compiles and seals a grant; `run abort` / `run reconcile` are the operator's side of a run.

    ``settings`` is the ``--repository`` view for `run start`, and the whole config for a run's own commands: they
    act for the run's grant's repository (``run_view``)."""
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
        record = await store.run(args.run_id)
        if record is None:
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
        view = run_view(settings, record.repo, getattr(args, "repository", None), args.run_id,
                        command=args.run_command)
        if isinstance(view, dict):
            emit(view, as_json=True)
            return EXIT_REFUSED
        broker = Broker(store, args.run_id, host=lambda: host_identity(view.database.path))
        if args.run_command == "teardown":
            doc = await _teardown(broker, view)
            emit(doc, as_json=args.json)
            return EXIT_OK if doc["ok"] else EXIT_REFUSED
        if args.run_command == "abort":
            result = await broker.abort(args.reason)
        else:
            result = await broker.reconcile(args.call_id, note=args.note)
        emit(result.to_dict(), as_json=args.json)
        return EXIT_OK if result.ok else EXIT_REFUSED

    async def _teardown(broker: Broker, view: Settings) -> dict[str, Any]:
        # The reserved teardown, run by the operator through the same gateway as the agent's calls, as the
        # run's owner (a run the agent abandoned is still torn down exactly once, with the compiled arguments).
        from bot.core.verbs import TOOLS
        from bot.mcp_server import open_runtime
        from bot.verbs.runs.inspect import run_teardown
        from bot.verbs.runtime import caller_for

        grant = await broker.grant()
        async with open_runtime(view) as runtime:
            caller = caller_for(view, grant.owner, "mcp")

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
        served = settings.repository_keys()
        for entry in doc["runs"]:
            run, grant = entry["run"], entry["grant"]
            # A run of a repository no longer configured: no teardown loop of this config runs it.
            entry["repository_served"] = run["repo"] in served
            lines.append(
                f"{run['run_id']} #{run['issue_number']} {run['policy']} {run['owner']} grant {run['grant_digest']}"
                f" next={run['next_position']} outcome={run['outcome'] or '-'} teardown={run['teardown']}"
                + ("" if entry["grant_integrity"] == "intact" else f" GRANT {entry['grant_integrity']}")
                + ("" if entry["repository_served"] else f" REPOSITORY {run['repo']} NOT SERVED (no teardown loop)")
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


def register(commands: Commands) -> None:
    """``foreman run`` (``start``, ``abort``, ``reconcile``, ``teardown``) and ``grants``."""
    run = commands.add("run", "agent runs bound to sealed grants (docs/grants.md)")
    run_sub = run.add_subparsers(dest="run_command", required=True, metavar="SUBCOMMAND")
    run_start = run_sub.add_parser("start", help="compile and seal the grant for the issue's live lease and worktree")
    run_start.add_argument("--issue", type=issue_number, required=True, metavar="N", help="the leased issue")
    run_start.add_argument("--action", metavar="A", help="the template's action (default: the lease's action)")
    run_abort = run_sub.add_parser("abort", help="abort a run (an in-flight call keeps blocking its teardown)")
    run_abort.add_argument("run_id", metavar="RUN_ID", help="the run (foreman grants lists them)")
    run_abort.add_argument("--reason", default="aborted by operator", help="recorded with the abort")
    run_reconcile = run_sub.add_parser("reconcile", help="settle an in-flight call whose result will never come")
    run_reconcile.add_argument("run_id", metavar="RUN_ID", help="the run (foreman grants lists them)")
    run_reconcile.add_argument("call_id", metavar="CALL_ID", help="the in-flight call (foreman grants RUN_ID)")
    run_reconcile.add_argument("--note", required=True, help="what was checked independently")
    run_teardown = run_sub.add_parser("teardown", help="run the reserved teardown (after an abort, failure or expiry)")
    run_teardown.add_argument("run_id", metavar="RUN_ID", help="the run (foreman grants lists them)")
    for run_cmd in (run_start, run_abort, run_reconcile, run_teardown):
        add_json(run_cmd)
        run_cmd.add_argument(
            "--config", dest="sub_config", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    grants = commands.add("grants", "sealed run grants, their digests and every admission decision")
    grants.add_argument("run_id", nargs="?", metavar="RUN_ID", help="one run (default: every run)")
    add_json(grants)
