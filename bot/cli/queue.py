"""`foreman queue`: the review and merge queues as ``work_queues`` reads them (bot/verbs/queue_view.py), as text or
JSON: reviews waiting, merges waiting in approval order, the leases in hand, the idle reviewers and mergers."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from bot.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit, with_db
from bot.cli.parsing import Commands, add_json
from bot.config import Settings
from state.db import Database


def no_token() -> dict[str, Any]:
    """The refusal without a Gitea token: the queues are pull requests and reviews only Gitea has."""
    return {
        "error": "unavailable",
        "key": "gitea.token",
        "message": "no gitea.token configured: the review and merge queues are read from Gitea (pull requests and "
                   "their reviews)",
        "remediate": "Configure gitea.token (or gitea.token_file) for the bot's account.",
        "exact_next_action": "set gitea.token_file in the config, then run foreman check-config",
    }


def cmd_queue(settings: Settings, args: argparse.Namespace) -> int:
    """What the review and merge queues hold now, read-only (Gitea's pull requests and reviews, the lease store)."""
    import aiohttp

    from bot.catalog import open_door
    from bot.dashboard import model
    from bot.gitea import GiteaError, client_for

    async def work(db: Database) -> int:
        async with aiohttp.ClientSession() as session:
            gitea = client_for(session, settings)
            if gitea is None:
                emit(no_token(), as_json=True)
                return EXIT_USAGE
            door = open_door(db, settings, gitea, bot_login=settings.gitea.bot_login)
            try:
                doc = await model.queues(door)
            except GiteaError as exc:
                emit({"error": "unavailable", "message": f"Gitea could not be read: {exc}",
                      "remediate": "Check that Gitea is reachable and accepts the token (foreman check-config).",
                      "exact_next_action": "run foreman check-config, then foreman queue again"}, as_json=True)
                return EXIT_REFUSED
        emit(doc, as_json=args.json, text=render(doc))
        return EXIT_OK

    return asyncio.run(with_db(settings, work))


def _shown(value: object) -> str:
    """Text from Gitea on one terminal line: control characters (escape sequences, line breaks) as escapes."""
    text = "-" if value is None else str(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _age(seconds: object) -> str:
    if not isinstance(seconds, int):
        return "since ?"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _waiting(rows: Sequence[Mapping[str, Any]], *, merge: bool) -> list[str]:
    lines = []
    for r in rows:
        head = f"  #{r['issue_number']:<6} PR #{r['pull_number']:<6} waiting {_age(r.get('waiting_s')):<8}"
        if merge:
            head += f" approved by {_shown(r.get('approved_by'))} at {_shown(r.get('approved_at'))}"
        barred = ", ".join(_shown(login) for login in r.get("barred_owners") or []) or "-"
        lines.append(f"{head} {_shown(r.get('title'))} (not for: {barred})")
    return lines or ["  (none)"]


def render(doc: Mapping[str, Any]) -> str:
    """The queues as text: one line per pull request or lease."""
    running = ", ".join(doc.get("running") or []) or "none (a controller hands them out)"
    in_hand = [f"  #{r['issue_number']:<6} {_shown(r['owner']):<16} {r['action']:<8} expires {r['expires_at']}"
               for r in doc.get("in_hand") or []]
    return "\n".join([
        f"{doc['repository']} at {doc['generated_at']}: queues running by themselves: {running}; merges by "
        f"{doc['merge_by']}",
        f"reviews waiting ({len(doc['reviews_waiting'])}):",
        *_waiting(doc["reviews_waiting"], merge=False),
        f"merges waiting, in approval order ({len(doc['merges_waiting'])}):",
        *_waiting(doc["merges_waiting"], merge=True),
        f"in hand ({len(in_hand)}):",
        *(in_hand or ["  (none)"]),
        f"idle reviewers: {', '.join(_shown(x) for x in doc['idle_reviewers']) or '(none)'}",
        f"idle mergers: {', '.join(_shown(x) for x in doc['idle_mergers']) or '(none)'}",
    ])


def register(commands: Commands) -> None:
    """``foreman queue``."""
    queue = commands.add("queue", "the review and merge queues: reviews and merges waiting, leases in hand, idle "
                                  "reviewers and mergers")
    add_json(queue)
