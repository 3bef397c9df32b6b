"""The `foreman` command line (DESIGN.md section 3). Exit codes: 0 done; 1 refused, blocked or the output pipe closed
(a structured result is still printed where it can be); 2 usage or configuration error (a taken port included)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import logging
import math
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from gidgethub import routing

from bot import logs
from bot.config import ConfigError, Settings, ensure_webhook_secret, load_settings
from bot.core.vocabulary import MAX_ISSUE_NUMBER, is_issue_number
from state.db import Database
from state.deliveries import STATUSES, DeliveryStore
from state.outbox import OUTBOX_STATUSES

if TYPE_CHECKING:
    from bot.verbs.runtime import Caller, VerbResult

log = logging.getLogger("foreman.cli")

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def _emit(doc: Any, *, as_json: bool, text: str | None = None) -> None:
    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print(text if text is not None else json.dumps(doc, indent=2, sort_keys=True, default=str))


def _refused(exc: LookupError | ValueError, *, listing: str) -> int:
    """A replay/retry of something missing (not_found) or not in a retryable state (invalid_state)."""
    _emit(
        {
            "error": "invalid_state" if isinstance(exc, ValueError) else "not_found",
            "message": str(exc),
            "remediate": f"list the candidates with `{listing}` and pick one",
            "exact_next_action": f"run {listing}",
        },
        as_json=True,
    )
    return EXIT_REFUSED


# --- serve ---------------------------------------------------------------------------------------------
async def serve(settings: Settings, router: routing.Router | None = None) -> int:
    """Run the service until SIGTERM/SIGINT, then shut down gracefully."""
    from bot.app import RUNNER_OPTIONS, open_service
    from handlers import build_router

    settings, secret_path = ensure_webhook_secret(settings)
    if secret_path is not None:
        log.warning(
            "no webhook secret configured: using the generated one stored in %s (mode 0600); "
            "paste its contents into the Gitea webhook's Secret field",
            secret_path.resolve(),
        )
    service = await open_service(settings, router or build_router())
    app = service.make_app()
    runner = web.AppRunner(app, handle_signals=False, access_log=None, **RUNNER_OPTIONS)
    await runner.setup()
    site = web.TCPSite(runner, settings.server.host, settings.server.port)
    try:
        await site.start()
    except OSError as exc:  # a taken port, an address that is not this host's, a privileged port
        from bot.emulator_cli import listen_refusal

        await runner.cleanup()
        print(json.dumps(listen_refusal("serve", settings.server.host, settings.server.port, exc), sort_keys=True),
              file=sys.stderr)
        return EXIT_USAGE
    port = runner.addresses[0][1] if runner.addresses else settings.server.port
    log.info(
        "listening on http://%s:%s%s (database %s)",
        settings.server.host,
        port,
        settings.webhook.path,
        settings.database.path,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: finishing in-flight deliveries (grace %.1fs)", settings.server.shutdown_grace_s)
    await runner.cleanup()
    log.info("stopped")
    return EXIT_OK


# --- inbox inspection ----------------------------------------------------------------------------------
async def _with_db(settings: Settings, work: Callable[[Database], Awaitable[int]]) -> int:
    db = await Database.open(settings.database.path, busy_timeout_ms=settings.database.busy_timeout_ms)
    try:
        return await work(db)
    finally:
        await db.close()


async def _with_store(settings: Settings, work: Callable[[DeliveryStore], Awaitable[int]]) -> int:
    return await _with_db(settings, lambda db: work(DeliveryStore(db)))


def _cmd_deliveries(settings: Settings, args: argparse.Namespace) -> int:
    if getattr(args, "reconcile", False):
        return asyncio.run(_with_db(settings, lambda db: _reconcile_summary(settings, db, as_json=args.json)))

    async def work(store: DeliveryStore) -> int:
        rows = await store.list(status=args.status, limit=args.limit)
        docs = [row.summary() for row in rows]
        lines = [
            f"{d['id']:>6} {d['status']:<12} {d['event']}/{d['action'] or '-'} {d['delivery']}"
            f" attempts={d['attempts']}" + (" (catch-up)" if d["source"] == "reconcile" else "")
            + (f" error={d['last_error']}" if d["last_error"] else "")
            for d in docs
        ]
        _emit(docs, as_json=args.json, text="\n".join(lines) if lines else "(no deliveries)")
        return EXIT_OK

    return asyncio.run(_with_store(settings, work))


async def _reconcile_summary(settings: Settings, db: Database, *, as_json: bool) -> int:
    """`foreman deliveries --reconcile`: the last catch-up pass, the last that succeeded, and the down window."""
    from state.reconcile import ReconcileStore

    store = ReconcileStore(db)
    repo = f"{settings.repository.owner}/{settings.repository.name}"
    last, ok = await store.last_pass(repo), await store.last_pass(repo, succeeded=True)
    doc = {
        "repository": repo,
        "interval_s": settings.reconcile.interval_s,
        "last_pass": last.to_dict() if last else None,
        "last_success": ok.to_dict() if ok else None,
        "watermark": await store.watermark(repo),
    }
    if last is None:
        text = f"no catch-up pass recorded for {repo} (the service runs one at start when gitea.token is set)"
    else:
        found = ", ".join(f"{k} {v}" for k, v in sorted(last.found.items())) or "nothing"
        text = (
            f"last catch-up pass {last.id} ({last.trigger}, {last.outcome}) finished {last.finished_at}: read "
            f"{last.read_issues} issues and {last.read_comments} comments since {last.since} in {last.calls} API "
            f"calls; found {found} that no webhook had brought"
            + (f"; error: {last.error}" if last.error else "")
            + (f"\ndown window before it: from {last.down_from}, {last.down_seconds:.0f} s" if last.down_from
               and last.down_seconds is not None else "")
            + f"\nwatermark: {doc['watermark']}"
        )
    _emit(doc, as_json=as_json, text=text)
    return EXIT_OK


def _cmd_replay(settings: Settings, args: argparse.Namespace) -> int:
    async def work(store: DeliveryStore) -> int:
        try:
            row = await store.replay(args.id, requested_by=getpass.getuser(), force=args.force)
        except (LookupError, ValueError) as exc:
            return _refused(exc, listing="foreman deliveries --status failed")
        _emit(row.summary(), as_json=args.json, text=f"delivery {row.pk} ({row.delivery_id}) queued again")
        return EXIT_OK

    return asyncio.run(_with_store(settings, work))


def _cmd_outbox(settings: Settings, args: argparse.Namespace) -> int:
    from state.outbox import OutboxStore

    async def work(db: Database) -> int:
        store = OutboxStore(db)
        if args.outbox_command == "retry":
            try:
                entry = await store.retry(args.id)
            except (LookupError, ValueError) as exc:
                return _refused(exc, listing="foreman outbox --status parked")
            _emit(entry.summary(), as_json=args.json, text=f"outbox entry {entry.id} ({entry.key}) queued again")
            return EXIT_OK
        entries = [e.summary() for e in await store.list(status=args.status, limit=args.limit)]
        lines = [
            f"{e['id']:>6} {e['status']:<19} #{e['issue']} {e['kind']:<12} {e['key']} attempts={e['attempts']}"
            + (f" error={e['last_error']}" if e["last_error"] else "")
            for e in entries
        ]
        _emit(entries, as_json=args.json, text="\n".join(lines) if lines else "(no outbox entries)")
        return EXIT_OK

    return asyncio.run(_with_db(settings, work))


# --- allocate ------------------------------------------------------------------------------------------
def parse_candidates_option(value: str | None) -> str | None:
    """--candidates-json: JSON text, or @FILE to read it from (UTF-8, at most the allocator's input limit).

    Returns the text, checked by the allocator's own normalizer (the allocator normalizes it again, by the same
    rules, so the fingerprint is the one a dry run shows). Raises EnvelopeError (invalid_input): an unreadable,
    non-UTF-8 or oversized file, or candidates the normalizer refuses (InputError, whatever the depth, size or
    integers of the input). Never any other exception.
    """
    from bot.core.allocator import MAX_INPUT_CHARS, normalize_candidates
    from bot.core.errors import Envelope, EnvelopeError

    if value is None:
        return None
    text = value
    if value.startswith("@"):
        name = value[1:]

        def unreadable(why: str) -> EnvelopeError:
            return EnvelopeError(
                Envelope(
                    error="invalid_input",
                    message=f"--candidates-json: cannot read {name}: {why}",
                    remediate="Give @FILE naming a readable UTF-8 JSON file, or the JSON text itself.",
                    exact_next_action="run foreman allocate again with --candidates-json @FILE of a readable file",
                )
            )

        try:
            with open(name, encoding="utf-8") as handle:
                text = handle.read(MAX_INPUT_CHARS + 1)
        except UnicodeDecodeError as exc:
            raise unreadable(f"not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise unreadable(exc.strerror or type(exc).__name__) from None
        if len(text) > MAX_INPUT_CHARS:
            raise unreadable(f"longer than {MAX_INPUT_CHARS} characters")
    normalize_candidates(text)  # InputError is an EnvelopeError
    return text


def _cmd_allocate(settings: Settings, args: argparse.Namespace) -> int:
    import aiohttp

    from bot.core.allocator import InputError
    from bot.core.errors import EnvelopeError
    from bot.gitea import client_for
    from bot.verbs.runtime import VerbRuntime

    try:
        candidates = parse_candidates_option(args.candidates_json)
    except InputError as exc:  # the candidates themselves: refused, like the allocator's invalid decision
        _emit({**exc.envelope.to_dict(), "decision": "invalid", "applied": False}, as_json=True)
        return EXIT_REFUSED
    except EnvelopeError as exc:  # the option itself (the file): usage
        _emit(exc.envelope.to_dict(), as_json=True)
        return EXIT_USAGE
    owner = args.owner or _default_owner(settings, args.action)
    by_policy = owner is None and args.action == "implement" and len(settings.authors()) > 1
    if owner is None and not by_policy:
        _emit(
            {
                "error": "invalid_input",
                "message": f"give --owner: no single roster identity has the role for {args.action}",
                "remediate": "Name the roster login that receives the lease with --owner LOGIN.",
                "exact_next_action": "run foreman allocate again with --owner LOGIN",
            },
            as_json=True,
        )
        return EXIT_USAGE

    async def work(db: Database) -> int:
        from bot.verbs.auto_allocate import author_pick, recent_decisions
        from state.db import utcnow

        pick = await author_pick(db, settings, utcnow())
        auto = {"enabled": settings.auto_allocation(), **pick.to_dict(),
                "recent": await recent_decisions(db, f"{settings.repository.owner}/{settings.repository.name}".lower())}
        chosen = owner if owner is not None else (pick.order[0] if pick.order else None)
        if chosen is None:
            # Several authors and none idle: what auto-allocation would do now is wait.
            waiting = {"decision": "wait", "wait_reason": "authors_busy", "issue_number": None,
                       "dry_run": not args.apply, "applied": False, "auto": auto}
            _emit(waiting, as_json=args.json, text="wait: every author is busy")
            return EXIT_OK
        arguments: dict[str, object] = {"owner": chosen, "action": args.action, "dry_run": not args.apply}
        given = {"candidates_json": candidates, "exclude_issue_numbers": args.exclude,
                 "expected_fingerprint": args.expect_fingerprint}
        arguments.update({name: value for name, value in given.items() if value is not None})
        async with aiohttp.ClientSession() as session:
            runtime = VerbRuntime(db=db, settings=settings, gitea=client_for(session, settings),
                                  bot_login=settings.gitea.bot_login)
            result = await runtime.call("allocate_next_work", _operator(), arguments)
        doc: dict[str, Any] = {**_rendered(result), "owner": chosen, "auto": auto}
        summary = (
            f"{doc.get('decision')}: issue {doc.get('issue_number')} for {chosen}"
            f" (fingerprint {doc.get('fingerprint')}, {len(doc.get('skipped', []))} skipped)"
        )
        _emit(doc, as_json=args.json, text=summary if result.ok else None)
        return result.exit_code

    return asyncio.run(_with_db(settings, work))


def _operator() -> Caller:
    """The CLI acts as the operator at the shell (the login of the process), with the operator's roles."""
    from bot.verbs.runtime import operator_caller

    return operator_caller(f"operator:{getpass.getuser()}", "cli")


def _rendered(result: VerbResult) -> dict[str, Any]:
    """A verb's document as the CLI prints it: without the door's ``verb`` and the MCP tools to call ``next``."""
    return {key: value for key, value in result.doc.items() if key not in ("verb", "next")}


def _default_owner(settings: Settings, action: str) -> str | None:
    from bot.verbs.allocate import ACTION_ROLES

    role = ACTION_ROLES.get(action, "author")
    owners = [login for login, roles in settings.roster.items() if role in roles]
    return owners[0] if len(owners) == 1 else None


# --- mcp -----------------------------------------------------------------------------------------------
def _cmd_mcp(settings: Settings, args: argparse.Namespace) -> int:
    """MCP over stdio for the identity of FOREMAN_MCP_TOKEN, or bound to the run of a run token (docs/grants.md);
    without a known token, refuse to start (exit 2)."""
    from bot.grants_broker import is_run_token
    from bot.mcp_server import IdentityError, resolve_identity, serve_stdio, token_from_environment

    token = token_from_environment()
    try:
        caller = resolve_identity(settings, token)
    except IdentityError as exc:
        if not is_run_token(token):
            refusal = _mcp_token_refusal(str(exc))
            print(json.dumps(refusal), file=sys.stderr)
            answer_refusal_on_the_wire(refusal)
            return EXIT_USAGE
        code = asyncio.run(serve_stdio(settings, run_token=token))
        if code != EXIT_OK:
            message = "FOREMAN_MCP_TOKEN is not the token of any run; `foreman run start` prints a run's token"
            refusal = _mcp_token_refusal(message)
            print(json.dumps(refusal), file=sys.stderr)
            answer_refusal_on_the_wire(refusal)
        return code
    return asyncio.run(serve_stdio(settings, caller))


#: JSON-RPC error code of a refused ``foreman mcp`` start (the implementation-defined server error range).
MCP_REFUSED_CODE = -32001


def answer_refusal_on_the_wire(refusal: dict[str, Any], *, timeout_s: float = 10.0, max_bytes: int = 1 << 20) -> None:
    """An MCP client shows a JSON-RPC error to its first request, but only "connection closed" for a server that
    exits: answer that request (normally ``initialize``) with the refusal, then let the process exit. Reads at most
    ``max_bytes`` of standard input for at most ``timeout_s``; nothing is written when no request comes (EOF)."""
    import os
    import select
    import time

    deadline = time.monotonic() + timeout_s
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    pending, read = b"", 0
    while fd >= 0 and read < max_bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        read += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and "id" in message and "method" in message:
                error = {"code": MCP_REFUSED_CODE, "message": f"{refusal['error']}: {refusal['message']}",
                         "data": refusal}
                with contextlib.suppress(OSError):
                    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}) + "\n")
                    sys.stdout.flush()
                return


def _mcp_token_refusal(message: str) -> dict[str, Any]:
    return {
        "error": "invalid_config",
        "key": "mcp.tokens",
        "message": message,
        "remediate": "Start foreman mcp with FOREMAN_MCP_TOKEN set to a token listed in [mcp.tokens], or to the "
        "token `foreman run start` printed for a run.",
        "exact_next_action": "set FOREMAN_MCP_TOKEN to a configured token and start foreman mcp again",
    }


# --- bootstrap -----------------------------------------------------------------------------------------
def _cmd_bootstrap(settings: Settings, args: argparse.Namespace) -> int:
    """The worktree bootstrap transition for --owner (who must hold the issue's live lease); docs/bootstrap.md."""
    import aiohttp

    from bot.bootstrap import BootstrapContext, bootstrap_preflight
    from bot.gitea import client_for
    from bot.verbs.runtime import VerbRuntime, caller_for

    async def work(db: Database) -> int:
        async with aiohttp.ClientSession() as session:
            gitea = client_for(session, settings)
            ctx = BootstrapContext(db=db, settings=settings, gitea=gitea, bot_login=settings.gitea.bot_login)
            if args.preflight:
                proof = await bootstrap_preflight(ctx, args.issue, args.owner)
                _emit(proof, as_json=args.json)
                return EXIT_OK if proof["ok"] else EXIT_REFUSED
            arguments: dict[str, object] = {"issue_number": args.issue}
            given = {"idempotency_key": args.idempotency_key, "expected_base": args.expected_base}
            arguments.update({name: value for name, value in given.items() if value is not None})
            runtime = VerbRuntime(db=db, settings=settings, gitea=gitea, bot_login=settings.gitea.bot_login)
            # The operator bootstraps for the owner: the door checks the owner's roster role and its live lease.
            result = await runtime.call("bootstrap_issue_worktree", caller_for(settings, args.owner, "cli"), arguments)
        doc = _rendered(result)
        proof = doc.get("proof") or {}
        text = (
            f"{doc.get('status')}: #{args.issue} branch {proof.get('branch')} at {proof.get('head_sha')},"
            f" worktree {proof.get('worktree_path')} (key {doc.get('idempotency_key')})"
            if result.ok
            else None
        )
        _emit(doc, as_json=args.json, text=text)
        return result.exit_code

    return asyncio.run(_with_db(settings, work))


def _cmd_checkout(settings: Settings, args: argparse.Namespace) -> int:
    """`checkout repoint`: origin of the control checkout to the clone URL foreman uses now (docs/bootstrap.md)."""
    import aiohttp

    from bot.bootstrap import BootstrapContext, repoint_control_checkout
    from bot.gitea import client_for

    async def work(db: Database) -> int:
        async with aiohttp.ClientSession() as session:
            ctx = BootstrapContext(db=db, settings=settings, gitea=client_for(session, settings),
                                   bot_login=settings.gitea.bot_login)
            doc = await repoint_control_checkout(ctx)
        text = (f"{'repointed' if doc.get('changed') else 'unchanged'}: {doc['path']} origin {doc.get('to')}"
                if doc["ok"] else None)
        _emit(doc, as_json=args.json, text=text)
        return EXIT_OK if doc["ok"] else EXIT_REFUSED

    return asyncio.run(_with_db(settings, work))


# --- run grants ----------------------------------------------------------------------------------------
def _cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    """`run start` compiles and seals a grant; `run abort` / `run reconcile` are the operator's side of a run."""
    from bot.core.errors import EnvelopeError
    from bot.grants_broker import Broker, host_identity, start_run
    from state.grants import GrantStore

    async def work(db: Database) -> int:
        if args.run_command == "start":
            try:
                started = await start_run(
                    db, settings, issue_number=args.issue, action=args.action, sealed_by=f"operator:{getpass.getuser()}"
                )
            except EnvelopeError as exc:
                _emit(exc.envelope.to_dict(), as_json=True)
                return EXIT_REFUSED
            grant = started.grant
            text = (
                f"run {started.run_id} sealed for #{grant.issue_number} ({grant.policy_key}, {len(grant.calls)} calls,"
                f" grant {grant.digest}, expires {grant.expires_at.isoformat()})\n"
                f"run token (shown once; give it to the agent's `foreman mcp` as FOREMAN_MCP_TOKEN): {started.token}"
            )
            _emit(started.to_dict(), as_json=args.json, text=text)
            return EXIT_OK
        store = GrantStore(db)
        if await store.run(args.run_id) is None:
            _emit(
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
            _emit(doc, as_json=args.json)
            return EXIT_OK if doc["ok"] else EXIT_REFUSED
        if args.run_command == "abort":
            result = await broker.abort(args.reason)
        else:
            result = await broker.reconcile(args.call_id, note=args.note)
        _emit(result.to_dict(), as_json=args.json)
        return EXIT_OK if result.ok else EXIT_REFUSED

    async def _teardown(broker: Broker) -> dict[str, Any]:
        # The reserved teardown, run by the operator through the same gateway as the agent's calls, as the
        # run's owner (a run the agent abandoned is still torn down exactly once, with the compiled arguments).
        from bot.core.verbs import TOOLS
        from bot.grants_broker import run_teardown
        from bot.mcp_server import open_runtime
        from bot.verbs.runtime import caller_for

        grant = await broker.grant()
        async with open_runtime(settings) as runtime:
            caller = caller_for(settings, grant.owner, "mcp")

            async def run_tool(tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
                result = await runtime.call(TOOLS[tool].name, caller, arguments)
                return result.ok, result.doc

            return await run_teardown(broker, run_tool)

    return asyncio.run(_with_db(settings, work))


def _cmd_grants(settings: Settings, args: argparse.Namespace) -> int:
    """Sealed grants with their digests, run state and every admission decision (docs/grants.md)."""
    from bot.grants_broker import inspect

    async def work(db: Database) -> int:
        try:
            doc = await inspect(db, args.run_id)
        except LookupError as exc:
            _emit(
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
        _emit(doc, as_json=args.json, text="\n".join(lines) if lines else "(no runs)")
        return EXIT_OK

    return asyncio.run(_with_db(settings, work))


# --- listings (the dashboard's view model, bot/dashboard/model.py) --------------------------------------
def _not_found(message: str, listing: str) -> int:
    _emit(
        {
            "error": "not_found",
            "message": message,
            "remediate": f"list what exists with `{listing}` and pick one",
            "exact_next_action": f"run {listing}",
        },
        as_json=True,
    )
    return EXIT_REFUSED


def _cmd_leases(settings: Settings, args: argparse.Namespace) -> int:
    """Live leases (and, unless --live, the most recent ones), from the lease store."""
    from bot.dashboard import model

    async def work(db: Database) -> int:
        doc = await model.leases(db, settings, limit=args.limit, issue=args.issue)
        rows = doc["live"] + doc["stale_live"] if args.live else doc["recent"]
        if args.live:
            doc = {"live": doc["live"], "stale_live": doc["stale_live"]}
        lines = [
            f"#{r['issue_number']:<6} {r['owner']:<16} {r['role']:<10} {r['action']:<10}"
            f" {'live' if r['live'] else r['status']:<9} expires {r['expires_at']} heartbeat {r['heartbeat_at']}"
            f" {r['lease_id']}" + (f" ended {r['ended_at']} ({r['end_reason']})" if r["ended_at"] else "")
            for r in rows
        ]
        _emit(doc, as_json=args.json, text="\n".join(lines) if lines else "(no leases)")
        return EXIT_OK

    return asyncio.run(_with_db(settings, work))


def _cmd_journal(settings: Settings, args: argparse.Namespace) -> int:
    """Bootstrap transitions with every journal phase; KEY shows one transition with its proofs."""
    from bot.dashboard import model

    async def work(db: Database) -> int:
        docs = await model.journal(db, settings, key=args.key, issue=args.issue, limit=args.limit)
        if args.key is not None and not docs:
            return _not_found(f"no bootstrap transition with idempotency key {args.key!r}", "foreman journal")
        lines: list[str] = []
        for t in docs:
            lines.append(
                f"{t['idempotency_key']} #{t['issue_number']} {t['owner']} {t['phase']} ({t['outcome']})"
                f" branch {t['branch']} worktree {t['worktree_path']}"
                + (f" failed at {t['failed_phase']}" if t["failed_phase"] else "")
            )
            for phase in t["phases"]:
                proof = json.dumps(phase["proof"], sort_keys=True) if args.key is not None else ""
                lines.append(f"  {phase['recorded_at']} {phase['phase']:<24} {phase['runner']} {proof}".rstrip())
        doc: Any = docs[0] if args.key is not None else docs
        _emit(doc, as_json=args.json, text="\n".join(lines) if lines else "(no bootstrap transitions)")
        return EXIT_OK

    return asyncio.run(_with_db(settings, work))


def _cmd_issue(settings: Settings, args: argparse.Namespace) -> int:
    """One issue's timeline: deliveries, decisions, leases, bootstrap phases, the bot's writes, its worktree."""
    from bot.dashboard import model

    async def work(db: Database) -> int:
        doc = await model.issue_view(db, settings, args.number)
        if not doc["known"]:
            return _not_found(f"foreman has recorded nothing about #{args.number} in {doc['repository']}",
                              "foreman deliveries")
        snap = doc["snapshot"] or {}
        lines = [
            f"#{args.number} in {doc['repository']}: state {snap.get('state') or '-'},"
            f" labels {', '.join(snap.get('labels') or []) or '-'}, next {snap.get('who_is_next') or '-'}",
            *(f"{item['at']} {item['kind']:<11} {item['summary']}" for item in doc["timeline"]),
        ]
        _emit(doc, as_json=args.json, text="\n".join(lines))
        return EXIT_OK

    return asyncio.run(_with_db(settings, work))


# --- invariants -----------------------------------------------------------------------------------------
def _cmd_invariants(settings: Settings, args: argparse.Namespace) -> int:
    """Check the consistency invariants (docs/operating.md) over the database, Gitea and the checkout, read-only."""
    import aiohttp

    from bot import invariants
    from bot.bootstrap import BootstrapContext
    from bot.gitea import client_for

    async def work(db: Database) -> int:
        async with aiohttp.ClientSession() as session:
            gitea = client_for(session, settings)
            if gitea is None:
                _emit(
                    {
                        "error": "unavailable",
                        "message": "no gitea.token configured: the invariants need Gitea",
                        "remediate": "Configure gitea.token (or gitea.token_file) for the bot's account.",
                        "exact_next_action": "set gitea.token_file in the config, then run foreman check-config",
                    },
                    as_json=True,
                )
                return EXIT_USAGE
            checkout = BootstrapContext(db=db, settings=settings, gitea=gitea, bot_login="").checkout_path
            facts = await invariants.gather(
                database=settings.database.path,
                client=gitea,
                bot_login=settings.gitea.bot_login,
                checkout=checkout,
                require_bootstrap=settings.bootstrap.on_allocate == "run",
            )
        doc = invariants.report(invariants.check(facts))
        text = "every invariant holds" if doc["ok"] else "\n".join(
            f"{v['invariant']}: {v['subject']}: {v['detail']}" for v in doc["violations"]
        )
        _emit(doc, as_json=args.json, text=text)
        return EXIT_OK if doc["ok"] else EXIT_REFUSED

    return asyncio.run(_with_db(settings, work))


# --- check-config --------------------------------------------------------------------------------------
#: The repository permissions (Gitea's permission API) that let the bot label, assign, comment and push branches.
WRITE_PERMISSIONS = ("write", "admin", "owner")


def _check(name: str, status: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"check": name, "status": status, "ok": status != "failed", "detail": detail, **extra}


def _failed(name: str, error: str, detail: str, remediate: str, **extra: Any) -> dict[str, Any]:
    return _check(name, "failed", detail, error=error, remediate=remediate, **extra)


async def _gitea_checks(settings: Settings) -> list[dict[str, Any]]:
    """Reachable, token accepted, token is gitea.bot_login's, repository exists, the bot may write to it.

    Each check runs only when the one before passed; the rest are reported as skipped (never as passed).
    """
    import aiohttp

    from bot.gitea import GiteaError, GiteaForbidden, GiteaNotFound, GiteaUnavailable, client_for

    names = ("gitea_reachable", "token", "bot_login", "repository", "permission")
    url, repo = settings.gitea.url, f"{settings.repository.owner}/{settings.repository.name}"
    checks: list[dict[str, Any]] = []

    def skip_rest(why: str) -> list[dict[str, Any]]:
        return checks + [_check(name, "skipped", why) for name in names[len(checks) :]]

    async with aiohttp.ClientSession() as session:
        client = client_for(session, settings, timeout_s=min(5.0, settings.gitea.timeout_s), max_attempts=1)
        if client is None:
            return skip_rest("no gitea.token configured: Gitea API calls are off")
        try:
            version = await client.get_version()
            checks.append(_check("gitea_reachable", "ok", f"Gitea {version} answers at {url}", version=version))
        except GiteaForbidden:  # a sign-in-only instance hides /version: the token check decides
            checks.append(_check("gitea_reachable", "ok", f"Gitea answers at {url} (/version needs sign-in)"))
        except Exception as exc:  # connection refused, timeout, 5xx, not a Gitea API at all
            checks.append(_failed(
                "gitea_reachable", "unavailable", f"no Gitea API answers at {url}: {_short(exc)}",
                "Check gitea.url (Gitea's base URL, without /api/v1) and that Gitea is running and reachable.",
            ))
            return skip_rest("needs gitea_reachable")
        try:
            login = (await client.get_own_user()).login
            checks.append(_check("token", "ok", f"the token is accepted: it belongs to {login}", login=login))
        except Exception as exc:
            error = "not_authorized" if isinstance(exc, GiteaForbidden) else "unavailable"
            checks.append(_failed(
                "token", error, f"Gitea refused the token: {_short(exc)}" if error == "not_authorized"
                else f"GET /user failed: {_short(exc)}",
                "Give gitea.token (or gitea.token_file) an access token of the bot's account with repository "
                "and issue scopes.",
            ))
            return skip_rest("needs token")
        if login.casefold() != (settings.gitea.bot_login or "").casefold():  # Gitea logins ignore case
            checks.append(_failed(
                "bot_login", "invalid_input",
                f"the token belongs to {login}, but gitea.bot_login is {settings.gitea.bot_login!r}: the bot would "
                "take its own events for someone else's",
                f"Set gitea.bot_login = {login!r}, or give the bot account's token.",
            ))
            return skip_rest("needs bot_login")
        checks.append(_check("bot_login", "ok", f"gitea.bot_login is the token's account ({login})"))
        try:
            found = await client.get_repo()
            checks.append(_check("repository", "ok", f"{found.full_name or repo} exists", full_name=found.full_name))
        except GiteaNotFound:
            checks.append(_failed(
                "repository", "not_found", f"{repo} does not exist on {url}, or {login} cannot see it",
                "Fix repository.owner / repository.name, or give the bot's account access to the repository.",
            ))
            return skip_rest("needs repository")
        except GiteaError as exc:
            checks.append(_failed("repository", "unavailable", f"GET {repo}: {_short(exc)}",
                                  "Make sure Gitea answers, then run foreman check-config again."))
            return skip_rest("needs repository")
        try:
            permission = await client.get_user_permission(login)
        except GiteaError as exc:
            error = "unavailable" if isinstance(exc, GiteaUnavailable) else "not_authorized"
            checks.append(_failed("permission", error, f"cannot read {login}'s permission on {repo}: {_short(exc)}",
                                  f"Give {login} write permission on {repo} (Collaborators, or a team)."))
            return checks
        if permission not in WRITE_PERMISSIONS:
            checks.append(_failed(
                "permission", "not_authorized",
                f"{login} has {permission!r} permission on {repo}; the bot needs write (labels, assignees, comments, "
                "branches)", f"Give {login} write permission on {repo} (Collaborators, or a team).",
                permission=permission,
            ))
            return checks
        checks.append(_check("permission", "ok", f"{login} has {permission} permission on {repo}",
                             permission=permission))
    return checks


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def _cmd_check_config(settings: Settings, args: argparse.Namespace) -> int:
    """The config loaded (else exit 2 before this); then Gitea: exit 1 when any check failed (docs/operating.md)."""
    checks = [_check("config", "ok", "the configuration is valid"), *asyncio.run(_gitea_checks(settings))]
    by_name = {c["check"]: c for c in checks}
    failed = [c for c in checks if c["status"] == "failed"]
    gitea_ok = by_name["token"]["status"] == "ok"
    gitea: dict[str, Any] = {"ok": gitea_ok and not failed}
    if gitea_ok:
        gitea["login"] = by_name["token"]["login"]
    if failed or not gitea_ok:
        gitea["detail"] = (failed[0] if failed else by_name["token"])["detail"]
    doc: dict[str, Any] = {
        "ok": not failed,
        "config": "ok",
        "webhook": {
            "path": settings.webhook.path,
            "secrets": (
                f"{len(settings.webhook.secrets)} configured"
                if settings.webhook.secrets is not None
                else "none configured: one is generated under var/ on first start"
            ),
        },
        "database": str(settings.database.path),
        "gitea": gitea,
        "checks": checks,
    }
    if failed:
        first = failed[0]
        doc.update({
            "error": first["error"],
            "message": f"{len(failed)} check(s) failed: "
            + "; ".join(f"{c['check']}: {c['detail']}" for c in failed),
            "remediate": first["remediate"],
            "exact_next_action": "fix what the failed check names, then run foreman check-config again",
        })
        _emit(doc, as_json=True)
        return EXIT_REFUSED
    text = "\n".join(f"{c['status']:<8} {c['check']:<16} {c['detail']}" for c in checks)
    _emit(doc, as_json=args.json, text=text)
    return EXIT_OK


# --- state parse ---------------------------------------------------------------------------------------
def _cmd_state_parse(settings: Settings | None, args: argparse.Namespace) -> int:
    from bot.core.canonical import state_parse_report

    if args.file in (None, "-"):
        text = sys.stdin.read()
    else:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            _emit(
                {
                    "error": "invalid_input",
                    "message": f"cannot read {args.file}: {why}",
                    "remediate": "Give a readable UTF-8 file, or - to read standard input.",
                    "exact_next_action": "run foreman state parse FILE with a readable file",
                },
                as_json=True,
            )
            return EXIT_USAGE
    code, doc = state_parse_report(text)
    print(json.dumps(doc, indent=2, sort_keys=True))
    return int(code)


def config_error_envelope(exc: ConfigError) -> dict[str, Any]:
    """Every configuration problem at once; ``key`` and ``message`` stay the first one's (compatibility)."""
    more = f" (and {len(exc.errors) - 1} more: see errors)" if len(exc.errors) > 1 else ""
    return {
        "error": "invalid_config",
        "key": exc.key,
        "message": f"{exc.key}: {exc.message}{more}",
        "errors": [{"key": key, "message": message} for key, message in exc.errors],
        "remediate": "Fix each key listed in errors (config/foreman.example.toml documents every key), or the "
        "FOREMAN_<SECTION>__<KEY> variable that sets it.",
        "exact_next_action": "edit the config, then run foreman check-config --config PATH",
    }


# --- parser --------------------------------------------------------------------------------------------
class UsageError(Exception):
    """A command line that cannot be read: exit 2 with the invalid_input envelope (never argparse's exit)."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage

    def envelope(self) -> dict[str, Any]:
        return {
            "error": "invalid_input",
            "message": self.message,
            "remediate": "Give every option at most once (list options such as --exclude take several values, "
            "repeated or after one flag) with a value of the documented type; see `foreman <command> --help`.",
            "exact_next_action": f"run the command again as: {self.usage}",
        }


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, and refuses a one-value option given twice."""

    def error(self, message: str) -> Any:  # argparse's signature is NoReturn; raising keeps it so
        raise UsageError(f"{self.prog}: {message}", " ".join(self.format_usage().split()).removeprefix("usage: "))

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and str(args[0]).startswith("-") and kwargs.get("action", "store") == "store":
            kwargs["action"] = _Once
        return super().add_argument(*args, **kwargs)


class _Once(argparse.Action):
    """Store one value; a second occurrence is refused (it would silently replace the first)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        marker = f"_given_{self.dest}"
        if getattr(namespace, marker, False):
            raise argparse.ArgumentError(self, "given more than once; give it once")
        setattr(namespace, marker, True)
        setattr(namespace, self.dest, values)


_DIGITS = re.compile(r"[0-9]{1,19}")


def _positive_int64(what: str) -> Callable[[str], int]:
    """An argparse type: a decimal integer in 1..2^63-1 (what SQLite and Gitea store), else a clear refusal."""

    def parse(text: str) -> int:
        value = int(text) if _DIGITS.fullmatch(text) else 0
        if not is_issue_number(value):
            shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
            raise argparse.ArgumentTypeError(f"{shown!r} is not {what} (a whole number from 1 to {MAX_ISSUE_NUMBER})")
        return value

    parse.__name__ = what
    return parse


_issue_number = _positive_int64("an issue number")
_row_id = _positive_int64("a row id")
_count = _positive_int64("a positive count")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds")
    return value


def _delivery_ref(text: str) -> str:
    """A row id (digits, within int64) or a Gitea delivery id."""
    if text.isdigit() or not text.strip():
        _row_id(text)
    return text


_JSON_HELP = "print exactly one JSON document on stdout (logs go to stderr)"
_LIMIT_HELP = "show at most N rows (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    from bot.metrics import version

    parser = _Parser(
        prog="foreman",
        description="Runs AI coding agents and people on a Gitea repository under auditable rules.",
        epilog="Exit codes: 0 done; 1 refused or blocked (the structured result is still printed), or standard "
        "output closed; 2 usage or configuration error (a taken port too). `foreman COMMAND --help` for each.",
    )
    parser.add_argument("--version", action="version", version=f"foreman {version()}",
                        help="print the version and exit")
    parser.add_argument("--config", type=Path, metavar="PATH",
                        help="TOML config (default: $FOREMAN_CONFIG, else config/foreman.toml)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        cmd.add_argument("--config", dest="sub_config", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return cmd

    def add_json(cmd: argparse.ArgumentParser) -> None:
        cmd.add_argument("--json", action="store_true", help=_JSON_HELP)

    add("serve", "run the webhook service (and the dashboard at /dashboard with [dashboard] token)")
    check = add("check-config", "validate the config and, if reachable, the Gitea credentials")
    add_json(check)
    deliveries = add("deliveries", "list stored webhook deliveries")
    deliveries.add_argument("--status", choices=STATUSES, help="only deliveries with this status")
    deliveries.add_argument("--limit", type=_count, default=50, metavar="N", help=_LIMIT_HELP)
    deliveries.add_argument("--reconcile", action="store_true",
                            help="the last catch-up pass instead: what it read, found and missed (issue 16)")
    add_json(deliveries)
    replay = add("replay", "queue a stored delivery again")
    replay.add_argument("id", type=_delivery_ref, help="row id or Gitea delivery id")
    replay.add_argument("--force", action="store_true", help="also replay done or ignored deliveries")
    add_json(replay)
    outbox = add("outbox", "list intended Gitea mutations, or retry a parked one")
    outbox.add_argument("--status", choices=OUTBOX_STATUSES, help="only entries with this status")
    outbox.add_argument("--limit", type=_count, default=50, metavar="N", help=_LIMIT_HELP)
    add_json(outbox)
    outbox_sub = outbox.add_subparsers(dest="outbox_command", metavar="SUBCOMMAND")
    outbox_retry = outbox_sub.add_parser("retry", help="send a parked or verification_failed entry again")
    outbox_retry.add_argument("id", type=_row_id, help="the entry's id (foreman outbox shows it)")
    add_json(outbox_retry)
    leases = add("leases", "live and recent leases (owner, role, action, expiry, heartbeat)")
    leases.add_argument("--live", action="store_true", help="only leases still marked live")
    leases.add_argument("--issue", type=_issue_number, metavar="N", help="only the leases of issue N")
    leases.add_argument("--limit", type=_count, default=50, metavar="N", help=_LIMIT_HELP)
    add_json(leases)
    journal = add("journal", "bootstrap transitions and their journal phases")
    journal.add_argument("key", nargs="?", metavar="KEY", help="one transition's idempotency key (with its proofs)")
    journal.add_argument("--issue", type=_issue_number, metavar="N", help="only the transitions of issue N")
    journal.add_argument("--limit", type=_count, default=50, metavar="N", help=_LIMIT_HELP)
    add_json(journal)
    issue = add("issue", "one issue's timeline: deliveries, decisions, leases, bootstrap, the bot's writes, worktree")
    issue.add_argument("number", type=_issue_number, metavar="N", help="the issue number")
    add_json(issue)
    invariants = add("invariants", "check leases, evidence, outbox, journal and worktrees are consistent")
    add_json(invariants)
    allocate = add("allocate", "pick the next status:ready issue for an owner (dry-run unless --apply)")
    allocate.add_argument("--apply", action="store_true", help="create the lease (default: dry-run)")
    allocate.add_argument("--owner", metavar="LOGIN",
                          help="roster login that receives the lease (default: the only one)")
    allocate.add_argument("--action", default="implement", help="implement (author), review, merge")
    allocate.add_argument(
        "--exclude", type=_issue_number, nargs="+", action="extend", default=None, metavar="N",
        help="issues never leased (several after one flag, or the flag repeated: every value counts)",
    )
    allocate.add_argument("--candidates-json", metavar="JSON|@FILE",
                          help="candidate records as JSON, or @FILE (default: from Gitea)")
    allocate.add_argument("--expect-fingerprint", metavar="FP", help="refuse to apply if the dry-run's inputs changed")
    add_json(allocate)
    bootstrap = add("bootstrap", "create or recover the issue's branch and worktree for its lease owner")
    bootstrap.add_argument("--issue", type=_issue_number, required=True, metavar="N", help="the leased issue")
    bootstrap.add_argument("--owner", required=True, metavar="LOGIN", help="the live lease's owner (the caller)")
    bootstrap.add_argument("--idempotency-key", metavar="K", help="replay or resume this request (default: derived)")
    bootstrap.add_argument("--expected-base", metavar="SHA", help="refuse (stale_pin) unless the base is this commit")
    bootstrap.add_argument("--preflight", action="store_true", help="only prove the bootstrap could run (no change)")
    add_json(bootstrap)
    checkout = add("checkout", "the control checkout (docs/bootstrap.md)")
    checkout_sub = checkout.add_subparsers(dest="checkout_command", required=True, metavar="SUBCOMMAND")
    repoint = checkout_sub.add_parser(
        "repoint", help="point origin at the clone URL foreman uses now, once it serves the same repository "
        "(no worktree is touched)")
    add_json(repoint)
    repoint.add_argument("--config", dest="sub_config", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add("mcp", "MCP server over stdio for the identity of $FOREMAN_MCP_TOKEN (see docs/mcp.md)")
    demo = add("demo", "run the whole loop against the bundled Gitea emulator in a temporary directory")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory (config, database, logs)")
    demo.add_argument("--timeout", type=_seconds, default=30.0, metavar="S", help="seconds each step may take")
    emulator = add("emulator", "serve the bundled Gitea emulator with a demo repository; prints URL, users, tokens")
    emulator.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    emulator.add_argument("--port", type=_port, default=3000, help="port to listen on; 0 picks a free one "
                          "(default: %(default)s)")
    emulator.add_argument("--dir", type=Path, metavar="DIR", dest="root",
                          help="keep its files (git repositories, foreman.toml) here (default: a new temporary folder)")
    emulator.add_argument("--hook-url", metavar="URL", help="add a signed webhook to this foreman's /webhook")
    add_json(emulator)
    run = add("run", "agent runs bound to sealed grants (docs/grants.md)")
    run_sub = run.add_subparsers(dest="run_command", required=True, metavar="SUBCOMMAND")
    run_start = run_sub.add_parser("start", help="compile and seal the grant for the issue's live lease and worktree")
    run_start.add_argument("--issue", type=_issue_number, required=True, metavar="N", help="the leased issue")
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
    grants = add("grants", "sealed run grants, their digests and every admission decision")
    grants.add_argument("run_id", nargs="?", metavar="RUN_ID", help="one run (default: every run)")
    add_json(grants)
    state = add("state", "Canonical Issue State tools")
    state_sub = state.add_subparsers(dest="state_command", required=True, metavar="SUBCOMMAND")
    parse = state_sub.add_parser("parse", help="parse Canonical Issue State block(s) to JSON")
    parse.add_argument("file", nargs="?", help="a file, or - for standard input (default)")
    return parser


def _port(text: str) -> int:
    value = int(text) if _DIGITS.fullmatch(text) else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port (0 to 65535)")
    return value


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    sub_config = getattr(args, "sub_config", None)
    if sub_config is not None:
        if args.config is not None and args.config != sub_config:
            raise UsageError(
                f"foreman: --config given twice with different paths ({args.config}, {sub_config}); give it once",
                "foreman --config PATH <command> ...",
            )
        args.config = sub_config
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """`foreman`: a reader that closes standard output early (`| head`) ends it with one line and exit 1."""
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        # Python would complain again when it flushes stdout at exit: point it at the null device first.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        with contextlib.suppress(OSError, ValueError):
            print("foreman: standard output was closed before the output was written (broken pipe)",
                  file=sys.stderr)
        return EXIT_REFUSED
    return code


def _main(argv: Sequence[str] | None) -> int:
    try:
        args = _parse(argv)
    except UsageError as exc:
        print(f"usage: {exc.usage}\n{exc.message}", file=sys.stderr)
        print(json.dumps(exc.envelope(), indent=2, sort_keys=True))
        return EXIT_USAGE
    if args.command == "state":
        return _cmd_state_parse(None, args)
    if args.command == "demo":  # self-contained: writes its own config in a temporary directory
        from bot.demo import main as demo_main

        return demo_main(keep=args.keep, timeout_s=args.timeout)
    if args.command == "emulator":  # self-contained too: it writes the config for a foreman that uses it
        from bot.emulator_cli import main as emulator_main

        return emulator_main(host=args.host, port=args.port, root=args.root, hook_url=args.hook_url,
                             as_json=args.json)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(json.dumps(config_error_envelope(exc), sort_keys=True), file=sys.stderr)
        return EXIT_USAGE
    logs.configure(json_lines=settings.server.log_json, level=settings.server.log_level)
    if args.command == "serve":
        return asyncio.run(serve(settings))
    commands: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
        "check-config": _cmd_check_config,
        "deliveries": _cmd_deliveries,
        "replay": _cmd_replay,
        "outbox": _cmd_outbox,
        "allocate": _cmd_allocate,
        "invariants": _cmd_invariants,
        "run": _cmd_run,
        "grants": _cmd_grants,
        "bootstrap": _cmd_bootstrap,
        "checkout": _cmd_checkout,
        "mcp": _cmd_mcp,
        "leases": _cmd_leases,
        "journal": _cmd_journal,
        "issue": _cmd_issue,
    }
    return commands[args.command](settings, args)
