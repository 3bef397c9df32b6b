"""Feature handlers: one module per feature, each owning a gidgethub Router; composed here."""

from __future__ import annotations

from gidgethub import routing

from handlers import auto_allocate, issue_state, verb_commands

# Feature routers are listed here as features land; the worker isolates each handler's failure.
FEATURE_ROUTERS: tuple[routing.Router, ...] = (auto_allocate.router, issue_state.router, verb_commands.router)


def build_router(*extra: routing.Router) -> routing.Router:
    """The app's router: every feature router, plus any given (tests add their own)."""
    return routing.Router(*FEATURE_ROUTERS, *extra)
