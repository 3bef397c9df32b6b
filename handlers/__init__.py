"""Feature handlers: one module per feature, each owning an OrderedRouter; composed here in a declared order."""

from __future__ import annotations

from gidgethub import routing

from bot.config import Settings
from bot.core.dispatch import OrderedRouter
from bot.outbox import OutboxHooks
from handlers import auto_allocate, issue_state, pull_requests, verb_commands
from state.db import Database

#: The order a delivery's handlers run in: first the features that record what Gitea said (the issue state),
#: then those that act on it (auto-allocation, comment commands), so an action never races ahead of the
#: observation it stands on. The worker isolates each handler: a failing one never stops those after it.
FEATURE_ROUTERS: tuple[OrderedRouter, ...] = (
    issue_state.router, pull_requests.router, auto_allocate.router, verb_commands.router
)


def build_router(*extra: routing.Router) -> OrderedRouter:
    """The app's router: every feature router in the declared order, then any given (tests add their own)."""
    return OrderedRouter(*FEATURE_ROUTERS, *extra)


def outbox_hooks(db: Database, settings: Settings) -> OutboxHooks:
    """What learns the outbox sender's results: the issue state (the bot's own writes come back as ignored_self
    webhooks, so the verified label sets and state comments reach the issue state here)."""
    return issue_state.outbox_hooks(db, settings)
