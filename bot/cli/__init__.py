"""The `foreman` command line (README.md, "Command line"): its parser and entry point; a module per command group."""

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
from bot.cli import (
    allocate,
    bootstrap,
    check_config,
    inbox,
    invariants,
    listings,
    mcp,
    queue,
    runs,
    standalone,
    state,
)
from bot.cli import serve as serve_commands
from bot.cli.allocate import cmd_allocate
from bot.cli.bootstrap import cmd_bootstrap, cmd_checkout
from bot.cli.common import EXIT_REFUSED, EXIT_USAGE, config_error_envelope, repository_view
from bot.cli.inbox import cmd_deliveries, cmd_outbox, cmd_replay
from bot.cli.invariants import cmd_invariants
from bot.cli.listings import cmd_issue, cmd_journal, cmd_leases
from bot.cli.mcp import cmd_mcp
from bot.cli.parsing import Commands, Parser, UsageError
from bot.cli.queue import cmd_queue
from bot.cli.runs import cmd_grants, cmd_run
from bot.cli.serve import serve
from bot.cli.standalone import cmd_token_digest
from bot.cli.state import cmd_state_parse
from bot.config import ConfigError, Settings, load_settings
from bot.mcp_bridge import URL_ENV
from state.db import DatabaseFileUnusable, DatabaseNotWritable, SchemaTooNew


def docs_dir() -> Path:
    """Where the documents ship: ``<prefix>/share/gitea-foreman/docs`` of an installed wheel, else the source tree's
    ``docs/`` (an editable install, or ``python -m bot`` in a checkout)."""
    source = Path(__file__).resolve().parents[2] / "docs"
    if source.is_dir():
        return source
    return Path(sys.prefix) / "share" / "gitea-foreman" / "docs"


def build_parser() -> argparse.ArgumentParser:
    from bot.metrics import version

    parser = Parser(
        prog="foreman",
        description="Runs AI coding agents and people on a Gitea repository under auditable rules.",
        epilog="Exit codes: 0 done; 1 refused or blocked (the structured result is still printed), or standard "
        "output closed; 2 usage or configuration error (a taken port too). `foreman COMMAND --help` for each. "
        f"The docs/... this help names (operating.md, mcp.md, grants.md, bootstrap.md, ...) are in {docs_dir()}.",
    )
    parser.add_argument("--version", action="version", version=f"foreman {version()}",
                        help="print the version and exit")
    parser.add_argument("--config", type=Path, metavar="PATH",
                        help="TOML config (default: $FOREMAN_CONFIG, else config/foreman.toml)")
    parser.add_argument("--repository", metavar="OWNER/NAME",
                        help="the served repository a command acts on (default: the only one; required when "
                        "[[repositories]] lists more than one)")
    commands = Commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    for register in _REGISTERS:
        register(commands)
    return parser


#: Each command group's module adds its own subcommands; `foreman --help` lists them in this order.
_REGISTERS: tuple[Callable[[Commands], None], ...] = (
    serve_commands.register,
    check_config.register,
    inbox.register,
    listings.register,
    invariants.register,
    queue.register,
    allocate.register,
    bootstrap.register,
    mcp.register,
    standalone.register,
    runs.register,
    state.register,
)


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

        return demo_main(keep=args.keep, timeout_s=args.timeout, verbose=args.verbose)
    if args.command == "mcp" and (args.url or os.environ.get(URL_ENV)):  # the bridge: no config, no database
        from bot.mcp_bridge import serve as serve_bridge

        return serve_bridge(args.url, os.environ)
    if args.command == "emulator":  # self-contained too: it writes the config for a foreman that uses it
        from bot.emulator_cli import main as emulator_main

        return emulator_main(host=args.host, port=args.port, root=args.root, hook_url=args.hook_url,
                             as_json=args.json)
    if args.command == "token-digest":  # reads no configuration: the operator runs it where the token is
        return cmd_token_digest(args.login)
    if args.command == "check-config":  # loads the config itself: it says where it looked, and why it refuses
        return check_config.main(args)
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
        "queue": cmd_queue,
    }
    return commands[args.command](settings, args)
