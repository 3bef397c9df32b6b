"""Every failure the git edge raises: a git command that failed, and the typed refusals around worktrees."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from bot import worktree_access
from bot.gitops.gitfiles import recorded_path


class GitFailure(Exception):
    """A git command failed (or timed out). The text names the command and git's message, never a token."""

    def __init__(self, args: tuple[str, ...], status: int | None, stderr: str) -> None:
        self.command = args
        self.status = status
        self.stderr = stderr.strip()
        shown = " ".join(args[:4]) + (" ..." if len(args) > 4 else "")
        super().__init__(f"git {shown} failed ({status}): {self.stderr[-400:]}")


class GitlinksStaged(Exception):
    """``git add`` staged a gitlink (mode 160000: a repository nested in the worktree); it was unstaged again."""

    def __init__(self, paths: list[str]) -> None:
        super().__init__(f"a repository nested in the worktree would be committed as a gitlink: {', '.join(paths)}")
        self.paths = tuple(paths)


class WorktreeRefused(GitFailure):
    """A worktree whose ``.git`` file or registration is not what foreman's ``git worktree add`` wrote: no git
    command runs in it (``worktree_problems`` says what differs). ``restore`` is the operator's command that writes
    back what git wrote (None without a registration: then only a fresh bootstrap makes one)."""

    def __init__(self, worktree: Path, admin: Path | None, problems: list[str]) -> None:
        self.worktree, self.admin, self.problems = worktree, admin, tuple(problems)
        self.command, self.status = ("worktree", "verify", str(worktree)), None
        self.stderr = "; ".join(problems)
        Exception.__init__(self, f"foreman runs no git command in {worktree}: its .git file or registration is not "
                                 f"what foreman wrote ({self.stderr[:600]})")

    @property
    def restore(self) -> str | None:
        if self.admin is None:
            return None
        dotgit, admin = f"{recorded_path(self.worktree)}/.git", os.path.realpath(self.admin)
        return (f"rm -rf -- {shlex.quote(dotgit)} && printf 'gitdir: %s\\n' {shlex.quote(admin)} > "
                f"{shlex.quote(dotgit)} && printf '%s\\n' {shlex.quote(dotgit)} > {shlex.quote(admin + '/gitdir')} && "
                f"printf '../..\\n' > {shlex.quote(admin + '/commondir')}")


class WorktreeKept(GitFailure):
    """A worktree removal kept what the service cannot prove it made (``bot.worktree_access.remove_tracked_tree``):
    the registration stays, the entries named stay on disk, and an operator decides about them."""

    def __init__(self, worktree: Path, kept: list[str]) -> None:
        self.worktree, self.kept = worktree, tuple(kept)
        self.command, self.status = ("worktree", "remove", str(worktree)), None
        limit = worktree_access.KEPT_SHOWN
        shown = ", ".join(kept[:limit]) + (" ..." if len(kept) > limit else "")
        self.stderr = f"kept {len(kept)} entries foreman did not make: {shown}"
        Exception.__init__(self, f"{worktree}: {self.stderr}")
