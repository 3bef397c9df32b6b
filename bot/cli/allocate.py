"""`foreman allocate`: the allocate verb through the door, as the operator."""

from __future__ import annotations

import argparse
import asyncio
import gc
import getpass
from typing import TYPE_CHECKING, Any

from bot.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit, rendered, with_db
from bot.cli.indented_json import dumps_indented
from bot.cli.parsing import Commands, add_json, issue_number
from bot.config import Settings
from state.db import Database

if TYPE_CHECKING:
    from bot.core.allocator import Candidate
    from bot.verbs.runtime import Caller


def parse_candidates_option(value: str | None) -> tuple[Candidate, ...] | None:
    """--candidates-json: JSON text, or @FILE to read it from (UTF-8, at most the allocator's input limit).

    Returns the candidates as the allocator's own normalizer makes them (handed to the door in-process, so the
    allocator's limits hold, not one MCP call's), with the rows it made them from: the decision reads those back
    instead of validating each candidate again, so the fingerprint is the one a dry run shows. Raises EnvelopeError
    (invalid_input): an unreadable, non-UTF-8 or oversized file, or candidates the normalizer refuses (InputError,
    whatever the depth, size or integers of the input). Never any other exception.
    """
    from bot.core.allocator import MAX_INPUT_CHARS, normalized_candidates
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
    return normalized_candidates(text)  # InputError is an EnvelopeError


def cmd_allocate(settings: Settings, args: argparse.Namespace) -> int:
    """`foreman allocate`, with the cyclic garbage collector paused (and restored as it was).

    The command decodes, validates, decides on and renders every candidate of its file: tens of thousands of
    containers per 10k candidates, none in a reference cycle, each freed by its reference count. With the collector
    running they set off collections that walk every object the process imported as well (the modules, the verb
    table, the schemas): about a third of what 10k candidates added to the command (bench/allocate_cli.py).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _allocate(settings, args)
    finally:
        if was_enabled:
            gc.enable()


def _allocate(settings: Settings, args: argparse.Namespace) -> int:
    import aiohttp

    from bot.catalog import open_door
    from bot.core.allocator import InputError
    from bot.core.errors import EnvelopeError
    from bot.gitea import client_for
    from bot.verbs.runtime import CallOptions

    try:
        candidates = parse_candidates_option(args.candidates_json)
    except InputError as exc:  # the candidates themselves: refused, like the allocator's invalid decision
        emit({**exc.envelope.to_dict(), "decision": "invalid", "applied": False}, as_json=True)
        return EXIT_REFUSED
    except EnvelopeError as exc:  # the option itself (the file): usage
        emit(exc.envelope.to_dict(), as_json=True)
        return EXIT_USAGE
    owner = args.owner or _default_owner(settings, args.action)
    by_policy = owner is None and args.action == "implement" and len(settings.authors()) > 1
    if owner is None and not by_policy:
        emit(
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
        from bot.loops.auto_allocate import recent_decisions
        from bot.verbs.allocate import author_pick
        from state.db import utcnow

        pick = await author_pick(db, settings, utcnow())
        auto = {"enabled": settings.auto_allocation(), **pick.to_dict(),
                "recent": await recent_decisions(db, settings.repo_key)}
        chosen = owner if owner is not None else (pick.order[0] if pick.order else None)
        if chosen is None:
            # Several authors and none idle: what auto-allocation would do now is wait.
            waiting = {"decision": "wait", "wait_reason": "authors_busy", "issue_number": None,
                       "dry_run": not args.apply, "applied": False, "auto": auto}
            emit(waiting, as_json=args.json, text="wait: every author is busy")
            return EXIT_OK
        arguments: dict[str, object] = {"owner": chosen, "action": args.action, "dry_run": not args.apply}
        if args.expect_fingerprint is not None:
            arguments["expected_fingerprint"] = args.expect_fingerprint
        # The candidates and exclusions in-process: the allocator's limits hold for them, not one MCP call's.
        options = CallOptions(candidates=candidates, exclusions=frozenset(args.exclude or ()))
        async with aiohttp.ClientSession() as session:
            runtime = open_door(db, settings, client_for(session, settings), bot_login=settings.gitea.bot_login)
            result = await runtime.call("allocate_next_work", _operator(), arguments, options=options)
        doc: dict[str, Any] = {**rendered(result), "owner": chosen, "auto": auto}
        summary = (
            f"{doc.get('decision')}: issue {doc.get('issue_number')} for {chosen}"
            f" (fingerprint {doc.get('fingerprint')}, {len(doc.get('skipped', []))} skipped)"
        )
        # emit's text, written by orjson where it is the same (the document lists every candidate ranked)
        print(summary if result.ok and not args.json else dumps_indented(doc))
        return result.exit_code

    return asyncio.run(with_db(settings, work))


def _operator() -> Caller:
    """The CLI acts as the operator at the shell (the login of the process), with the operator's roles."""
    from bot.verbs.runtime import operator_caller

    return operator_caller(f"operator:{getpass.getuser()}", "cli")


def _default_owner(settings: Settings, action: str) -> str | None:
    from bot.verbs.leasing import ACTION_ROLES

    role = ACTION_ROLES.get(action, "author")
    owners = [login for login, roles in settings.roster.items() if role in roles]
    return owners[0] if len(owners) == 1 else None


def register(commands: Commands) -> None:
    """``foreman allocate``."""
    allocate = commands.add("allocate", "pick the next status:ready issue for an owner (dry-run unless --apply)")
    allocate.add_argument("--apply", action="store_true", help="create the lease (default: dry-run)")
    allocate.add_argument("--owner", metavar="LOGIN",
                          help="roster login that receives the lease (default: the only one)")
    allocate.add_argument("--action", default="implement", help="implement (an author) or review (a reviewer)")
    allocate.add_argument(
        "--exclude", type=issue_number, nargs="+", action="extend", default=None, metavar="N",
        help="issues never leased (several after one flag, or the flag repeated: every value counts)",
    )
    allocate.add_argument("--candidates-json", metavar="JSON|@FILE",
                          help="candidate records as JSON, or @FILE (default: from Gitea)")
    allocate.add_argument("--expect-fingerprint", metavar="FP", help="refuse to apply if the dry-run's inputs changed")
    add_json(allocate)
