"""The worktree registrations of a repository (``.git/worktrees/<name>``) and the proof a worktree is foreman's."""

from __future__ import annotations

import os
from pathlib import Path

from bot.gitops.gitfiles import _read_small, _real


def worktree_problems(git_dir: Path, worktree: Path, admin: Path | None) -> list[str]:
    """What differs from what ``git worktree add`` wrote for ``worktree`` (empty: nothing): a registration
    ``<git_dir>/worktrees/<name>`` whose ``gitdir`` names the worktree's ``.git`` and whose ``commondir`` is ``../..``
    (the common repository git then uses is ``git_dir``), and in the worktree a ``.git`` file reading exactly
    ``gitdir: <registration>``. Read from the files alone, before any git runs: the worktree's ``.git`` is the
    agent's to rewrite (pointed at a repository whose configuration runs programs), the registration is not. The
    problems name only paths foreman chose, never what it found (text the agent wrote)."""
    if admin is None:
        return [f"no registration in {git_dir}/worktrees names {worktree}"]
    problems: list[str] = []
    if worktree.is_symlink() or not worktree.is_dir():
        problems.append(f"{worktree} is not a directory")
    root = git_dir / "worktrees"
    if admin.parent != root or root.is_symlink() or admin.is_symlink() or not admin.is_dir():
        problems.append(f"{admin} is not a worktree registration of {git_dir}")
        return problems
    dotgit = f"{_real(worktree)}/.git"
    for name, wanted in (("gitdir", dotgit), ("commondir", "../..")):
        text = None if (admin / name).is_symlink() else _read_small(admin / name)
        if text not in (wanted, f"{wanted}\n"):
            problems.append(f"{admin / name} does not read {wanted!r}")
    expected = f"gitdir: {os.path.realpath(admin)}"
    git_file = worktree / ".git"
    text = None if git_file.is_symlink() else _read_small(git_file)
    if text not in (expected, f"{expected}\n"):
        what = ("a symbolic link" if git_file.is_symlink() else "a directory" if git_file.is_dir()
                else "missing" if text is None else "another text")
        problems.append(f"{git_file} is {what}, not a file reading {expected!r}")
    return problems
