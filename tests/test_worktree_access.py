"""Handing a worktree to its owner's Unix group (bot/worktree_access.py): what is opened, and what never is."""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

import pytest

from bot.worktree_access import WorktreeAccessError, grant, group_for


def tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = tmp_path / "checkouts"
    worktree = root / "acme" / "widgets" / "branches" / "issue-1-x"
    (worktree / "src").mkdir(parents=True)
    (worktree / "src" / "a.py").write_text("x = 1\n")
    (worktree / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(worktree / "run.sh", 0o700)
    (worktree / ".git").write_text("gitdir: /somewhere\n")
    outside = tmp_path / "secret"
    outside.write_text("not the agent's")
    os.chmod(outside, 0o600)
    (worktree / "src" / "link").symlink_to(outside)
    for path in (root, *root.rglob("*")):
        if not path.is_symlink():
            os.chmod(path, stat.S_IMODE(path.lstat().st_mode) & ~0o077)  # as under UMask=0077
    return root, worktree, outside


def test_the_worktree_is_opened_to_the_group_and_nothing_else_is(tmp_path: Path) -> None:
    root, worktree, outside = tree(tmp_path)
    group = grp.getgrgid(os.getgid()).gr_name
    assert grant(worktree, root, group) == 6  # two directories, three files, one link
    for directory in (worktree, worktree / "src"):
        mode = directory.stat().st_mode
        assert mode & stat.S_IRWXG == stat.S_IRWXG and mode & stat.S_ISGID, oct(mode)
    assert (worktree / "src" / "a.py").stat().st_mode & 0o070 == 0o060
    assert (worktree / "run.sh").stat().st_mode & 0o070 == 0o070
    assert (worktree / ".git").stat().st_mode & 0o070 == 0o040  # readable, never writable by the group
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600  # the link's target is untouched
    for above in (root, root / "acme", root / "acme" / "widgets", root / "acme" / "widgets" / "branches"):
        mode = stat.S_IMODE(above.stat().st_mode)
        assert mode & 0o077 == 0o001, (above, oct(mode))  # search only: nobody lists or reads what is above


def test_an_unknown_group_or_a_path_outside_the_root_is_refused(tmp_path: Path) -> None:
    root, worktree, _ = tree(tmp_path)
    with pytest.raises(WorktreeAccessError, match="does not exist"):
        grant(worktree, root, "no-such-group-foreman")
    with pytest.raises(WorktreeAccessError, match="not below"):
        grant(tmp_path, root, grp.getgrgid(os.getgid()).gr_name)
    assert stat.S_IMODE(worktree.stat().st_mode) & 0o070 == 0  # nothing was opened


def test_the_group_of_a_login_is_found_whatever_its_case() -> None:
    assert group_for({"Author-1": "agents-a1"}, "author-1") == "agents-a1"
    assert group_for({"author-1": "agents-a1"}, "author-2") is None
