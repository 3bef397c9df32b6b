"""The `foreman` command line (DESIGN.md section 3): its parser and entry point; each command group is a module here."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bot import logs
from bot.cli.allocate import cmd_allocate
from bot.cli.bootstrap import cmd_bootstrap, cmd_checkout
from bot.cli.check_config import cmd_check_config
from bot.cli.common import EXIT_REFUSED, EXIT_USAGE, repository_view
from bot.cli.inbox import cmd_deliveries, cmd_outbox, cmd_replay
from bot.cli.invariants import cmd_invariants
from bot.cli.listings import cmd_issue, cmd_journal, cmd_leases
from bot.cli.mcp import cmd_mcp
from bot.cli.parsing import (
    _JSON_HELP,
    _LIMIT_HELP,
    UsageError,
    _count,
    _delivery_ref,
    _issue_number,
    _Parser,
    _port,
    _row_id,
    _seconds,
)
from bot.cli.runs import cmd_grants, cmd_run
from bot.cli.serve import serve
from bot.cli.state import cmd_state_parse
from bot.config import ConfigError, Settings, load_settings
from bot.mcp_bridge import URL_ENV
from state.db import DatabaseFileUnusable, DatabaseNotWritable, SchemaTooNew
from state.deliveries import STATUSES
from state.outbox import OUTBOX_STATUSES


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
    parser.add_argument("--repository", metavar="OWNER/NAME",
                        help="the served repository a command acts on (default: the only one; required when "
                        "[[repositories]] lists more than one)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        cmd.add_argument("--config", dest="sub_config", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        cmd.add_argument("--repository", dest="sub_repository", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
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
                            help="the last catch-up pass instead: what it read, found and missed")
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
    allocate.add_argument("--action", default="implement", help="implement (an author) or review (a reviewer)")
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
    mcp = add("mcp", "MCP over stdio for the identity of $FOREMAN_MCP_TOKEN (see docs/mcp.md): with --url, a bridge "
              "to the service's /mcp (what agents run); without, in-process (an operator's tool)")
    mcp.add_argument("--url", metavar="URL",
                     help="foreman serve's MCP endpoint, e.g. http://foreman:8080/mcp (default: $FOREMAN_MCP_URL): "
                     "forward stdio there with $FOREMAN_MCP_TOKEN as the bearer token; reads no config or database")
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
    digest = add("token-digest", "print the [mcp.token_digests] entry of a token read from standard input (the "
                 "config then holds only its SHA-256)")
    digest.add_argument("--login", metavar="LOGIN", help="print it as a TOML line for this login")
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
    sub_repository = getattr(args, "sub_repository", None)
    if sub_repository is not None:
        if args.repository is not None and args.repository != sub_repository:
            raise UsageError(
                f"foreman: --repository given twice ({args.repository}, {sub_repository}); give it once",
                "foreman --repository OWNER/NAME <command> ...",
            )
        args.repository = sub_repository
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """`foreman`: a reader that closes standard output early (`| head`) ends it with one line and exit 1."""
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
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
        return cmd_state_parse(None, args)
    if args.command == "demo":  # self-contained: writes its own config in a temporary directory
        from bot.demo import main as demo_main

        return demo_main(keep=args.keep, timeout_s=args.timeout)
    if args.command == "mcp" and (args.url or os.environ.get(URL_ENV)):  # the bridge: no config, no database
        from bot.mcp_bridge import serve as serve_bridge

        return serve_bridge(args.url, os.environ)
    if args.command == "emulator":  # self-contained too: it writes the config for a foreman that uses it
        from bot.emulator_cli import main as emulator_main

        return emulator_main(host=args.host, port=args.port, root=args.root, hook_url=args.hook_url,
                             as_json=args.json)
    if args.command == "token-digest":  # reads no configuration: the operator runs it where the token is
        return _token_digest(args.login)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(json.dumps(config_error_envelope(exc), sort_keys=True), file=sys.stderr)
        return EXIT_USAGE
    logs.configure(json_lines=settings.server.log_json, level=settings.server.log_level)
    try:
        return _run_command(settings, args)
    except DatabaseFileUnusable as exc:  # database.path cannot be used: a configuration error, as the others
        print(json.dumps(database_path_error(exc), sort_keys=True), file=sys.stderr)
        return EXIT_USAGE
    except ConfigError as exc:  # found only when the command runs (serve's generated webhook secret)
        print(json.dumps(config_error_envelope(exc), sort_keys=True), file=sys.stderr)
        return EXIT_USAGE
    except (SchemaTooNew, DatabaseNotWritable) as exc:
        print(json.dumps(database_refusal(exc), sort_keys=True), file=sys.stderr)
        return EXIT_REFUSED


def _token_digest(login: str | None) -> int:
    """``foreman token-digest``: the digest of the one token on standard input (a trailing newline dropped)."""
    import hashlib

    token = sys.stdin.buffer.read(1 << 16).removesuffix(b"\n").removesuffix(b"\r")
    if not token or any(byte <= 0x20 for byte in token):
        refusal = {"error": "invalid_input",
                   "message": "standard input must hold one token (no spaces or line breaks inside it)",
                   "exact_next_action": 'printf %s "$TOKEN" | foreman token-digest'}
        print(json.dumps(refusal), file=sys.stderr)
        return EXIT_USAGE
    digest = f"sha256:{hashlib.sha256(token).hexdigest()}"
    print(f'"{login}" = "{digest}"' if login else digest)
    return 0


def database_path_error(exc: DatabaseFileUnusable) -> dict[str, Any]:
    """The configuration error of a ``database.path`` SQLite cannot open and write (the shape of
    ``config_error_envelope``, with the reason)."""
    message = str(exc)
    return {
        "error": "invalid_config",
        "key": "database.path",
        "reason": exc.reason,
        "message": message,
        "errors": [{"key": "database.path", "message": message}],
        "remediate": "foreman writes its SQLite database (and its -wal/-shm files beside it) from the start: "
        "the file and its folder must be writable by the user foreman runs as.",
        "exact_next_action": exc.exact_next_action,
    }


def database_refusal(exc: SchemaTooNew | DatabaseNotWritable) -> dict[str, Any]:
    """The envelope of a database foreman cannot open: a newer schema, or a server it cannot reach or write."""
    if isinstance(exc, SchemaTooNew):
        return {
            "error": "schema_too_new",
            "message": str(exc),
            "found_version": exc.found,
            "known_version": exc.known,
            "remediate": "Run the foreman release that migrated this database (or a newer one); this one must not"
                         " write a schema it does not know.",
            "exact_next_action": exc.exact_next_action,
        }
    return {
        "error": "database_unavailable",
        "reason": exc.reason,
        "message": str(exc),
        "remediate": "Make the configured database reachable and writable (database.path or database.url).",
        "exact_next_action": "fix database.url or database.path, then run foreman check-config",
    }


def _run_command(settings: Settings, args: argparse.Namespace) -> int:
    if args.command == "serve":
        return asyncio.run(serve(settings))
    if args.command == "run" and args.run_command != "start":
        # A run's own commands act for its grant's repository (bot/cli/runs.py checks --repository against it).
        return cmd_run(settings, args)
    if args.command == "grants":  # every run, each marked when its repository is not served (bot/cli/runs.py)
        return cmd_grants(settings, args)
    view = repository_view(settings, args.repository, command=args.command)
    if isinstance(view, dict):
        print(json.dumps(view, indent=2, sort_keys=True))
        return EXIT_USAGE
    settings = view
    commands: dict[str, Callable[[Settings, argparse.Namespace], int]] = {
        "check-config": cmd_check_config,
        "deliveries": cmd_deliveries,
        "replay": cmd_replay,
        "outbox": cmd_outbox,
        "allocate": cmd_allocate,
        "invariants": cmd_invariants,
        "run": cmd_run,
        "grants": cmd_grants,
        "bootstrap": cmd_bootstrap,
        "checkout": cmd_checkout,
        "mcp": cmd_mcp,
        "leases": cmd_leases,
        "journal": cmd_journal,
        "issue": cmd_issue,
    }
    return commands[args.command](settings, args)
