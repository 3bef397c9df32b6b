"""The worktree bootstrap verbs: the journaled transition, the lock, the preflight proof (start-up recovery is
``bot.loops.recovery``, a loop above the allocator it uses)."""

from bot.verbs.bootstrap.checkout import effective_clone_url, ensure_control_checkout, repoint_control_checkout
from bot.verbs.bootstrap.context import BootstrapContext, BootstrapResult, LockResult
from bot.verbs.bootstrap.lock import lock_issue
from bot.verbs.bootstrap.preflight import bootstrap_preflight
from bot.verbs.bootstrap.transition import bootstrap_issue_worktree

__all__ = [
    "BootstrapContext",
    "BootstrapResult",
    "LockResult",
    "bootstrap_issue_worktree",
    "bootstrap_preflight",
    "effective_clone_url",
    "ensure_control_checkout",
    "lock_issue",
    "repoint_control_checkout",
]
