"""The git edge: the bot's control checkout, issue branches and worktrees, one bounded git call each.

The package's face for the callers that name its parts as ``gitops.<name>`` (the verbs); the modules hold them."""

from bot.gitops.control import ControlCheckout
from bot.gitops.environment import config_args, git_env, hardened_env
from bot.gitops.errors import GitFailure, GitlinksStaged, WorktreeKept, WorktreeRefused
from bot.gitops.gitfiles import symbolic_head
from bot.gitops.records import WorktreeEntry, WorktreeView
from bot.gitops.remote import auth_env, clone_url_problem, git_refusal
from bot.gitops.runner import GitRunner
from bot.gitops.teardown import (
    commit_subjects,
    fetch_base_and_pull_head,
    fetch_pull_head,
    is_ancestor,
    remove_clean_worktree,
)
from bot.gitops.transport import TransportResult, ls_remote, transport_check
from bot.gitops.worktree_lock import WorktreeRegistry
from bot.gitops.worktrees import losses, worktree_head

__all__ = [
    "ControlCheckout", "GitFailure", "GitRunner", "GitlinksStaged", "TransportResult", "WorktreeEntry", "WorktreeKept",
    "WorktreeRefused", "WorktreeRegistry", "WorktreeView", "auth_env", "clone_url_problem", "commit_subjects",
    "config_args", "fetch_base_and_pull_head", "fetch_pull_head", "git_env", "git_refusal", "hardened_env",
    "is_ancestor", "losses", "ls_remote", "remove_clean_worktree", "symbolic_head", "transport_check", "worktree_head",
]
