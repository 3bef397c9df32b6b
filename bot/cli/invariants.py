"""`foreman invariants`: leases, evidence, outbox, journal, worktrees and the queues checked against each other."""

from __future__ import annotations

import argparse
import asyncio

from bot.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, emit, with_db
from bot.cli.parsing import Commands, add_json
from bot.config import Settings
from state.db import Database


def cmd_invariants(settings: Settings, args: argparse.Namespace) -> int:
    """Check the consistency invariants (docs/operating.md) over the database, Gitea and the checkout, read-only."""
    import aiohttp

    from bot import invariants
    from bot.gitea import GiteaError, client_for
    from bot.verbs.bootstrap import BootstrapContext
    from state.db import utcnow

    async def work(db: Database) -> int:
        async with aiohttp.ClientSession() as session:
            gitea = client_for(session, settings)
            if gitea is None:
                emit(
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
            database = settings.database.postgres_url() or settings.database.path
            now = utcnow()
            try:
                queues = await invariants.gather_queues(gitea, database, settings, now=now)
                facts = await invariants.gather(
                    database=database,
                    client=gitea,
                    bot_login=settings.gitea.bot_login,
                    checkout=checkout,
                    require_bootstrap=settings.bootstrap.on_allocate == "run",
                    repo=settings.repo_key,  # the repository of --repository (its client and checkout above)
                    now=now,
                    lease_grace_s=settings.allocator.lease_grace_s,
                    queues=queues,
                )
            except GiteaError as exc:
                emit(
                    {
                        "error": "unavailable",
                        "message": f"Gitea could not be read: {exc}",
                        "remediate": "Check that Gitea is reachable and accepts the token (foreman check-config).",
                        "exact_next_action": "run foreman check-config, then foreman invariants again",
                    },
                    as_json=True,
                )
                return EXIT_REFUSED
        doc = invariants.report(invariants.check(facts))
        text = "every invariant holds" if doc["ok"] else "\n".join(
            f"{v['invariant']}: {v['subject']}: {v['detail']}" for v in doc["violations"]
        )
        emit(doc, as_json=args.json, text=text)
        return EXIT_OK if doc["ok"] else EXIT_REFUSED

    return asyncio.run(with_db(settings, work))


def register(commands: Commands) -> None:
    """``foreman invariants``."""
    invariants = commands.add("invariants", "check leases, evidence, outbox, journal, worktrees and the review and"
                              " merge queues are consistent")
    add_json(invariants)
