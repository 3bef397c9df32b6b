"""`foreman bootstrap` (the bootstrap verb through the door) and `foreman checkout repoint`."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from bot.cli.common import EXIT_OK, EXIT_REFUSED, emit, rendered, with_db
from bot.cli.parsing import Commands, add_json, issue_number
from bot.config import Settings
from state.db import Database


def cmd_bootstrap(settings: Settings, args: argparse.Namespace) -> int:
    """The worktree bootstrap transition for --owner (who must hold the issue's live lease); docs/bootstrap.md."""
    import aiohttp

    from bot.catalog import open_door
    from bot.gitea import client_for
    from bot.verbs.bootstrap import BootstrapContext, bootstrap_preflight
    from bot.verbs.runtime import caller_for

    async def work(db: Database) -> int:
        async with aiohttp.ClientSession() as session:
            gitea = client_for(session, settings)
            ctx = BootstrapContext(db=db, settings=settings, gitea=gitea, bot_login=settings.gitea.bot_login)
            if args.preflight:
                preflight = await bootstrap_preflight(ctx, args.issue, args.owner)
                emit(preflight.to_dict(), as_json=args.json)
                return EXIT_OK if preflight.ok else EXIT_REFUSED
            arguments: dict[str, object] = {"issue_number": args.issue}
            given = {"idempotency_key": args.idempotency_key, "expected_base": args.expected_base}
            arguments.update({name: value for name, value in given.items() if value is not None})
            runtime = open_door(db, settings, gitea, bot_login=settings.gitea.bot_login)
            # The operator bootstraps for the owner: the door checks the owner's roster role and its live lease.
            result = await runtime.call("bootstrap_issue_worktree", caller_for(settings, args.owner, "cli"), arguments)
        doc = rendered(result)
        proof = doc.get("proof") or {}
        text = (
            f"{doc.get('status')}: #{args.issue} branch {proof.get('branch')} at {proof.get('head_sha')},"
            f" worktree {proof.get('worktree_path')} (key {doc.get('idempotency_key')})"
            if result.ok
            else None
        )
        emit(doc, as_json=args.json, text=text)
        return result.exit_code

    return asyncio.run(with_db(settings, work))


def cmd_checkout(settings: Settings, args: argparse.Namespace) -> int:
    """`checkout repoint`: origin of the control checkout to the clone URL foreman uses now (docs/bootstrap.md)."""
    import aiohttp

    from bot.gitea import client_for
    from bot.verbs.bootstrap import BootstrapContext, repoint_control_checkout

    async def work(db: Database) -> int:
        async with aiohttp.ClientSession() as session:
            ctx = BootstrapContext(db=db, settings=settings, gitea=client_for(session, settings),
                                   bot_login=settings.gitea.bot_login)
            doc = await repoint_control_checkout(ctx)
        text = (f"{'repointed' if doc.get('changed') else 'unchanged'}: {doc['path']} origin {doc.get('to')}"
                if doc["ok"] else None)
        emit(doc, as_json=args.json, text=text)
        return EXIT_OK if doc["ok"] else EXIT_REFUSED

    return asyncio.run(with_db(settings, work))


def register(commands: Commands) -> None:
    """``foreman bootstrap`` and ``checkout`` (``checkout repoint``)."""
    bootstrap = commands.add("bootstrap", "create or recover the issue's branch and worktree for its lease owner")
    bootstrap.add_argument("--issue", type=issue_number, required=True, metavar="N", help="the leased issue")
    bootstrap.add_argument("--owner", required=True, metavar="LOGIN", help="the live lease's owner (the caller)")
    bootstrap.add_argument("--idempotency-key", metavar="K", help="replay or resume this request (default: derived)")
    bootstrap.add_argument("--expected-base", metavar="SHA", help="refuse (stale_pin) unless the base is this commit")
    bootstrap.add_argument("--preflight", action="store_true", help="only prove the bootstrap could run (no change)")
    add_json(bootstrap)
    checkout = commands.add("checkout", "the control checkout (docs/bootstrap.md)")
    checkout_sub = checkout.add_subparsers(dest="checkout_command", required=True, metavar="SUBCOMMAND")
    repoint = checkout_sub.add_parser(
        "repoint", help="point origin at the clone URL foreman uses now, once it serves the same repository "
        "(no worktree is touched)")
    add_json(repoint)
    repoint.add_argument("--config", dest="sub_config", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
