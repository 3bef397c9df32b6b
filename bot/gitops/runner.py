"""The bounded git runner: one hardened ``git`` process in one directory, killed after its timeout."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from bot.gitops.environment import config_args, hardened_env
from bot.gitops.errors import GitFailure
from bot.gitops.worktree_lock import WorktreeRegistry


class GitRunner:
    """Runs ``git <args>`` in one directory with a fixed environment and timeout (under the repository's
    ``WorktreeRegistry`` when it has one), hardened (``hardened_env``, ``NEUTRAL_CONFIG``).

    With ``git_dir`` (and ``work_tree``) git is told its repository (``GIT_DIR``, ``GIT_WORK_TREE``) instead of
    finding one from ``cwd``; ``check`` runs before every command, under the registry, and refuses by raising.
    """

    def __init__(self, cwd: Path, *, env: Mapping[str, str], timeout_s: float,
                 registry: WorktreeRegistry | None = None, git_dir: Path | None = None,
                 work_tree: Path | None = None, check: Callable[[], None] | None = None) -> None:
        self.cwd = cwd
        self.env = dict(env)
        self.timeout_s = timeout_s
        self.registry = registry
        self.git_dir = git_dir
        self.work_tree = work_tree
        self.check = check

    def attempt(self, *args: str, extra_env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
        """(status, stdout, stderr) of ``git <args>``; never raises for a non-zero status. Every command is killed
        after ``timeout_s`` (a status of -9 and a stderr saying so)."""
        env = hardened_env({**self.env, **(extra_env or {})}, git_dir=self.git_dir, work_tree=self.work_tree)
        with self.registry.held(args) if self.registry is not None else contextlib.nullcontext():
            if self.check is not None:
                self.check()
            try:
                done = subprocess.run(
                    ["git", *config_args(), *args], cwd=self.cwd, env=env, stdin=subprocess.DEVNULL,
                    capture_output=True, timeout=self.timeout_s, check=False)
            except subprocess.TimeoutExpired as exc:
                return -9, _text(exc.stdout), _text(exc.stderr) + f"\ngit was killed after {self.timeout_s:g} s"
            except OSError as exc:  # no git on PATH, or no directory to run it in
                raise GitFailure(args, None, f"cannot run git in {self.cwd}: {exc.strerror}") from exc
        return done.returncode, _text(done.stdout), _text(done.stderr)

    def run(self, *args: str, extra_env: Mapping[str, str] | None = None) -> str:
        """stdout of ``git <args>``; GitFailure on a non-zero status."""
        status, out, err = self.attempt(*args, extra_env=extra_env)
        if status != 0:
            raise GitFailure(args, status, err)
        return out


def _text(data: bytes | str | None) -> str:
    """git's output as text, bytes that are not UTF-8 kept (surrogate escapes), as GitPython decoded it."""
    if data is None:
        return ""
    return data if isinstance(data, str) else data.decode("utf-8", "surrogateescape")
