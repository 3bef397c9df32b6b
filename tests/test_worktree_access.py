"""Handing a worktree to its owner's Unix group (bot/worktree_access.py): what is opened, and what never is."""

from __future__ import annotations

import grp
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bot.worktree_access import WorktreeAccessError, grant, group_for, remove_tracked_tree
from tests.test_gitops_hostile import scene  # noqa: F401 (the fixture)


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


# --- removal: only what the service's commit proves it made (issue 29, item 7) ----------------------------------------


def test_a_removal_takes_the_commits_files_and_keeps_everything_else(tmp_path: Path) -> None:
    """Tracked files and the directories left empty go; an untracked file, a link where a tracked directory was
    (pointing outside) and the directories holding them stay, and so does the ``.git`` file (it goes last, only with
    everything else: what is kept stays a worktree git knows); the link's target is untouched."""
    worktree = tmp_path / "w"
    (worktree / "src" / "pkg").mkdir(parents=True)
    (worktree / "src" / "pkg" / "a.py").write_text("a")
    (worktree / "README.md").write_text("r")
    (worktree / "docs").mkdir()
    (worktree / ".git").write_text("gitdir: x\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("not the service's")
    (worktree / "docs" / "guide.md").symlink_to(outside / "precious")  # a link at a tracked file's path: unlinked
    (worktree / "src" / "notes.txt").write_text("the agent's, never committed")
    (worktree / "lib").symlink_to(outside)  # where the commit has a directory lib/, a link the agent planted
    tracked = {"src/pkg/a.py", "README.md", "docs/guide.md", "lib/x.py"}
    kept = remove_tracked_tree(worktree, tracked)
    assert sorted(kept) == ["lib", "src/notes.txt"]
    assert sorted(p.name for p in worktree.rglob("*")) == [".git", "lib", "notes.txt", "src"]
    assert (outside / "precious").read_text() == "not the service's"  # no link was followed


def test_a_worktree_made_only_of_its_commit_is_removed_whole(tmp_path: Path) -> None:
    worktree = tmp_path / "w"
    (worktree / "a" / "b").mkdir(parents=True)
    (worktree / "a" / "b" / "c.txt").write_text("c")
    (worktree / ".git").write_text("gitdir: x\n")
    assert remove_tracked_tree(worktree, {"a/b/c.txt"}) == []
    assert not worktree.exists()
    assert remove_tracked_tree(worktree, {"a/b/c.txt"}) == []  # already gone: nothing to do
    (tmp_path / "link").symlink_to(tmp_path)
    assert remove_tracked_tree(tmp_path / "link", set()) == ["."]  # a link is never walked


def test_a_teardown_keeps_what_appeared_after_the_clean_check_and_follows_no_link(
    scene: Any, monkeypatch: pytest.MonkeyPatch  # noqa: F811 (the fixture)
) -> None:
    """The service judged the worktree clean; the agent then adds a file and swaps a directory for a link to the
    service's own files before the removal: the commit's files go, the agent's are kept and reported
    (WorktreeKept), the registration stays, and nothing behind the link is touched."""
    from bot import gitops

    checkout, worktree = scene.checkout, scene.worktree
    (worktree / "docs").mkdir()
    (worktree / "docs" / "a.md").write_text("a\n")
    scene_git(worktree, checkout)
    precious = scene.root / "service-state"
    precious.mkdir()
    (precious / "foreman.db").write_text("the service's")
    judged = checkout.worktree_status

    def status_then_agent(path: Path) -> list[str]:
        left: list[str] = judged(path)
        (worktree / "late.txt").write_text("written after the check")
        (worktree / "docs" / "a.md").unlink()
        (worktree / "docs").rmdir()
        (worktree / "docs").symlink_to(precious)
        return left

    monkeypatch.setattr(checkout, "worktree_status", status_then_agent)
    checkout.unlock_worktree(worktree)
    with pytest.raises(gitops.WorktreeKept) as kept:
        checkout.remove_worktree(worktree, force=False)
    assert sorted(kept.value.kept) == ["docs", "late.txt"]
    assert (precious / "foreman.db").read_text() == "the service's"
    assert (worktree / "late.txt").exists() and not (worktree / "README.md").exists()
    assert checkout.admin_dir_for(worktree) is not None  # the registration stays for the operator


def scene_git(worktree: Path, checkout: Any) -> None:
    """Commit what is in the worktree on its branch, as the publish verb does (through the hardened runner)."""
    checkout.commit_worktree(worktree, "docs", author=("author-1", "author-1@users.noreply"))


def test_a_removal_cut_short_is_finished_by_the_next(scene: Any) -> None:  # noqa: F811 (the fixture)
    """A removal killed half-way leaves files of the commit missing (``" D"``, no loss) and, later, the directory
    gone with git's registration still there: the next removal finishes each, and teardown decides to."""
    from bot.core.teardown import WorktreeFacts, decide_worktree

    checkout, worktree = scene.checkout, scene.worktree
    checkout.unlock_worktree(worktree)
    (worktree / "README.md").unlink()  # the first removal got this far (the .git file goes last)
    checkout.remove_worktree(worktree, force=False)
    assert not worktree.exists() and checkout.listed_worktree_at(worktree) is None

    facts = WorktreeFacts(path=str(worktree), exists=False, created_by_foreman=True, status=(), head=None,
                          merged_head=None, head_in_default=False, registered=True)
    assert decide_worktree(facts, remove_enabled=True).action == "remove"
    assert decide_worktree(facts, remove_enabled=False).action == "absent"
    gone = WorktreeFacts(path=str(worktree), exists=False, created_by_foreman=True, status=(), head=None,
                         merged_head=None, head_in_default=False)
    assert decide_worktree(gone, remove_enabled=True).action == "absent"


def test_a_registration_left_without_its_directory_is_removed(scene: Any) -> None:  # noqa: F811 (the fixture)
    import shutil as _shutil

    checkout, worktree = scene.checkout, scene.worktree
    checkout.unlock_worktree(worktree)
    _shutil.rmtree(worktree)  # the files went, the process died before git dropped the registration
    assert checkout.listed_worktree_at(worktree) is not None
    checkout.remove_worktree(worktree, force=False)
    assert checkout.listed_worktree_at(worktree) is None


def test_a_hard_link_in_a_fresh_worktree_is_never_opened_to_the_group(tmp_path: Path) -> None:
    """A file with another name (perhaps outside the worktree) is refused whole, its mode and group unchanged."""
    root, worktree, outside = tree(tmp_path)
    os.link(outside, worktree / "src" / "also-secret")
    with pytest.raises(WorktreeAccessError, match="hard links"):
        grant(worktree, root, grp.getgrgid(os.getgid()).gr_name)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600


def test_an_entry_that_vanishes_or_changes_while_it_is_removed_is_skipped_or_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent deletes a tracked file, or swaps it for a directory, between the look and the unlink: the removal
    goes on (gone: skipped; a directory now: kept), never an OSError out of it."""
    import bot.worktree_access as access

    worktree = tmp_path / "w"
    worktree.mkdir()
    for name in ("a.txt", "b.txt"):
        (worktree / name).write_text(name)
    (worktree / ".git").write_text("gitdir: x\n")
    real_stat = os.stat

    def racing_stat(name: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        found = real_stat(name, *args, **kwargs)
        if name == "a.txt":
            os.unlink(worktree / "a.txt")
        elif name == "b.txt":
            os.unlink(worktree / "b.txt")
            os.mkdir(worktree / "b.txt")
        return found

    monkeypatch.setattr(os, "stat", racing_stat)  # the module calls os.stat (one os module)
    kept = access.remove_tracked_tree(worktree, {"a.txt", "b.txt"})
    assert kept == ["b.txt"] and (worktree / "b.txt").is_dir() and not (worktree / "a.txt").exists()


def test_a_compensation_whose_branch_is_gone_still_removes_the_checkout_it_made(scene: Any) -> None:  # noqa: F811
    """The branch deleted first (HEAD unreadable): the files of the commit the worktree was made from are still the
    service's to remove; without it nothing could be proven and everything was kept."""
    from bot import gitops

    checkout, worktree = scene.checkout, scene.worktree
    base = checkout.rev("main")
    checkout.unlock_worktree(worktree)
    subprocess.run(["git", "-C", str(checkout.path), "update-ref", "-d", "refs/heads/issue-1-hostile"],
                          check=True)
    with pytest.raises(gitops.WorktreeKept):
        checkout.remove_worktree(worktree, force=True)  # nothing proves README.md is the service's
    checkout.remove_worktree(worktree, force=True, made_from=base)
    assert not worktree.exists() and checkout.listed_worktree_at(worktree) is None
