"""The crash seams tests use to kill the process at a chosen phase or git step (off unless set)."""

from __future__ import annotations

import logging
import os

log = logging.getLogger("foreman.bootstrap")

FAULT_PHASE_ENV = "FOREMAN_FAULT_AFTER_PHASE"
FAULT_STEP_ENV = "FOREMAN_FAULT_AFTER_STEP"
FAULT_EXIT_CODE = 86
#: The git steps of the bootstrap (``worktree_kept``: a takeover moved the earlier owner's worktree aside), and
#: ``pull_created`` (Gitea created the PR, foreman has not recorded it).
FAULT_STEPS = ("ref_created", "worktree_registered", "worktree_added", "worktree_removed", "branch_deleted",
               "worktree_kept", "pull_created")


def crash_seam(env: str, value: str) -> None:
    """The documented crash seam: exit at once, without cleanup, as a killed process would."""
    if os.environ.get(env) == value:
        log.warning("fault seam %s=%s: exiting hard", env, value)
        os._exit(FAULT_EXIT_CODE)
