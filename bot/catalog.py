"""Every verb family and every loop that registers with the door, loaded: importing this module registers each
family's executors, and the loops' reactions to a freed author, with the door.

The door (``bot.verbs.runtime``) imports no verb and no loop; a composition root (the service, the command line, the
stdio MCP server) imports this module and builds its doors with ``open_door``, which refuses to build one while a
verb the table offers has no executor.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

# Each import registers its family (or its loop) with the door (the names are not used here).
import bot.loops.auto_allocate
import bot.loops.triggers
import bot.verbs.allocate
import bot.verbs.context
import bot.verbs.duplicates
import bot.verbs.issue_state
import bot.verbs.leases
import bot.verbs.merge
import bot.verbs.publish
import bot.verbs.pulls
import bot.verbs.reads
import bot.verbs.review
import bot.verbs.update
import bot.verbs.worktree  # noqa: F401  (the worktree bootstrap and its verbs)
from bot.config import Settings
from bot.verbs.runtime import BootstrapFactory, G, VerbRuntime, registered_bootstrap, registry
from state.db import Database, utcnow


def require_complete() -> None:
    """Raises when an offered verb has no executor: a family not loaded."""
    missing = registry().missing()
    if missing:
        raise RuntimeError(f"no executor is registered for the offered verbs {missing}")


def open_door(
    db: Database,
    settings: Settings,
    gitea: G | None = None,
    *,
    bot_login: str = "",
    bootstrap_factory: BootstrapFactory = registered_bootstrap,
    clock: Callable[[], datetime] = utcnow,
) -> VerbRuntime[G]:
    """The door of one served repository (``settings`` is its view), with every verb family loaded."""
    require_complete()
    return VerbRuntime(db=db, settings=settings, gitea=gitea, bot_login=bot_login,
                       bootstrap_factory=bootstrap_factory, clock=clock)
