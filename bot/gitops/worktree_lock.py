"""The lock every git command holds over one repository's worktree registrations (an ``flock``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from bot.gitops.errors import GitFailure

#: The git subcommands that add or delete a worktree registration (``.git/worktrees/<name>``).
_CHANGES_REGISTRATIONS = frozenset({("worktree", "add"), ("worktree", "move"), ("worktree", "remove"),
                                    ("worktree", "prune"), ("worktree", "repair")})


class WorktreeRegistry:
    """One repository's worktree registrations, held for the length of one git command.

    git writes a new registration's files one by one and takes no lock while it does (worktree.c), and every command
    that lists the worktrees (``worktree add`` itself, ``worktree list``, ``branch -f``, ``fetch``, ``rev-list
    --all``) dies when it meets one half-written: "fatal: failed to read .git/worktrees/<name>/commondir". So two
    bootstraps of one repository at once could fail each other. Every git command foreman runs in the repository
    holds this lock shared (but a new worktree's checkout, ``ControlCheckout.check_out``: it lists none); the ones
    that add or delete a registration hold it alone. It is an ``flock`` on a file in the git directory, so it holds
    across foreman's processes and threads alike (an agent's own git commands in its worktree are not under it: git
    alone decides those).
    """

    def __init__(self, git_dir: Path, *, wait_s: float) -> None:
        self.path = git_dir / "foreman-worktrees.lock"
        self.wait_s = wait_s

    @contextlib.contextmanager
    def held(self, args: tuple[str, ...], *, alone: bool | None = None) -> Iterator[None]:
        """Held alone for a command that changes the registrations (or with ``alone``), shared for any other; nothing
        is held while the repository does not exist yet (a clone: no worktree to meet)."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except (FileNotFoundError, NotADirectoryError):
            yield
            return
        except OSError as exc:
            raise GitFailure(args, None, f"cannot open {self.path}: {exc.strerror}") from exc
        try:
            if alone is None:
                alone = tuple(args[:2]) in _CHANGES_REGISTRATIONS
            self._acquire(fd, fcntl.LOCK_EX if alone else fcntl.LOCK_SH, args)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _acquire(self, fd: int, mode: int, args: tuple[str, ...]) -> None:
        deadline = time.monotonic() + self.wait_s
        pause = 0.001
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise GitFailure(args, None, (
                        f"another git command kept this repository's worktree registrations ({self.path}) for "
                        f"{self.wait_s:g} s; retry once it has ended")) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
