"""`foreman leases`, `journal` and `issue`: the dashboard's view model (bot/dashboard/model.py) as text or JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from bot.cli.common import EXIT_OK, emit, not_found, with_db
from bot.cli.parsing import LIMIT_HELP, Commands, add_json, count, issue_number
from bot.config import Settings
from state.db import Database


def cmd_leases(settings: Settings, args: argparse.Namespace) -> int:
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
        emit(doc, as_json=args.json, text="\n".join(lines) if lines else "(no leases)")
        return EXIT_OK

    return asyncio.run(with_db(settings, work))


def cmd_journal(settings: Settings, args: argparse.Namespace) -> int:
    """Bootstrap transitions with every journal phase; KEY shows one transition with its proofs."""
    from bot.dashboard import model

    async def work(db: Database) -> int:
        docs = await model.journal(db, settings, key=args.key, issue=args.issue, limit=args.limit)
        if args.key is not None and not docs:
            return not_found(f"no bootstrap transition with idempotency key {args.key!r}", "foreman journal")
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
        emit(doc, as_json=args.json, text="\n".join(lines) if lines else "(no bootstrap transitions)")
        return EXIT_OK

    return asyncio.run(with_db(settings, work))


def cmd_issue(settings: Settings, args: argparse.Namespace) -> int:
    """One issue's timeline: deliveries, decisions, leases, bootstrap phases, the bot's writes, its worktree."""
    from bot.dashboard import model

    async def work(db: Database) -> int:
        doc = await model.issue_view(db, settings, args.number)
        if not doc["known"]:
            return not_found(f"foreman has recorded nothing about #{args.number} in {doc['repository']}",
                              "foreman deliveries")
        snap = doc["snapshot"] or {}
        lines = [
            f"#{args.number} in {doc['repository']}: state {snap.get('state') or '-'},"
            f" labels {', '.join(snap.get('labels') or []) or '-'}, next {snap.get('who_is_next') or '-'}",
            *(f"{item['at']} {item['kind']:<11} {item['summary']}" for item in doc["timeline"]),
        ]
        emit(doc, as_json=args.json, text="\n".join(lines))
        return EXIT_OK

    return asyncio.run(with_db(settings, work))


def register(commands: Commands) -> None:
    """``foreman leases``, ``journal`` and ``issue``."""
    leases = commands.add("leases", "live and recent leases (owner, role, action, expiry, heartbeat)")
    leases.add_argument("--live", action="store_true", help="only leases still marked live")
    leases.add_argument("--issue", type=issue_number, metavar="N", help="only the leases of issue N")
    leases.add_argument("--limit", type=count, default=50, metavar="N", help=LIMIT_HELP)
    add_json(leases)
    journal = commands.add("journal", "bootstrap transitions and their journal phases")
    journal.add_argument("key", nargs="?", metavar="KEY", help="one transition's idempotency key (with its proofs)")
    journal.add_argument("--issue", type=issue_number, metavar="N", help="only the transitions of issue N")
    journal.add_argument("--limit", type=count, default=50, metavar="N", help=LIMIT_HELP)
    add_json(journal)
    issue = commands.add(
        "issue", "one issue's timeline: deliveries, decisions, leases, bootstrap, the bot's writes, worktree"
    )
    issue.add_argument("number", type=issue_number, metavar="N", help="the issue number")
    add_json(issue)
