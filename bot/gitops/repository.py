"""One local repository foreman runs git in, and the one runner every group of its git calls shares."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bot.gitops.runner import GitRunner
from bot.gitops.worktree_lock import WorktreeRegistry


class GitRepository:
    """A repository with a work tree at ``path``: its registrations lock and its runner, made once and never changed.
    The groups of git calls built on it (``RefStore``, ``WorktreeRegistrations``, ``WorktreeOperations``,
    ``ControlCheckout``) hold no state of their own: every call goes through ``git``."""

    def __init__(self, path: Path, *, env: Mapping[str, str], timeout_s: float) -> None:
        self.path = path
        self.registry = WorktreeRegistry(path / ".git", wait_s=timeout_s)
        self.git = GitRunner(path, env=env, timeout_s=timeout_s, registry=self.registry, git_dir=path / ".git",
                             work_tree=path)
        self.timeout_s = timeout_s

    @property
    def git_dir(self) -> Path:
        return self.path / ".git"

    def exists(self) -> bool:
        return (self.git_dir / "HEAD").is_file()
