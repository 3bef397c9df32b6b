"""The one surface an agent shares with the service: its worktree, opened to the owner's Unix group.

With agents on Unix users of their own (docs/operating.md "Agents on their own Unix users"), the service creates a
worktree as its own user, then hands it to the owner's group (``[bootstrap] worktree_groups``, login = group): every
directory ``g+rwx`` with the set-group-id bit (what the agent creates there stays in the group, so the service, a
member of it, reads and commits it), every file ``g+rw``, and search-only permission (``o+x``: no listing, no
reading) on the directories above it, from the checkout root down to ``branches/``. Nothing else of the control
checkout is opened: its files and its ``.git`` stay the service's (run it with ``UMask=0077``).

The tree is walked bottom-up and changed through descriptors opened with ``O_NOFOLLOW``, so a directory is opened
to the agent only once everything below it is done, and a symbolic link planted meanwhile is never followed.
"""

from __future__ import annotations

import contextlib
import grp
import os
import stat
from collections.abc import Collection
from pathlib import Path

#: Directories: group read, write and search, and set-group-id (new entries take the directory's group).
DIRECTORY_BITS = stat.S_IRWXG | stat.S_ISGID
#: Files: group read and write (and search where the owner may execute it).
FILE_BITS = stat.S_IRGRP | stat.S_IWGRP


class WorktreeAccessError(Exception):
    """The worktree could not be handed to its owner's group (the group does not exist, a path is a link, or the
    service may not change the group: it must be a member of that group, or root)."""


def group_for(groups: dict[str, str], login: str) -> str | None:
    """The Unix group configured for ``login`` (case-insensitive, as Gitea logins are), or None."""
    lowered = login.lower()
    return next((group for who, group in groups.items() if who.lower() == lowered), None)


def grant(worktree: Path, root: Path, group: str) -> int:
    """Hand ``worktree`` (below ``root``) to ``group``; the number of entries changed. WorktreeAccessError when
    it cannot be done whole."""
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        raise WorktreeAccessError(f"the Unix group {group!r} does not exist on this host") from None
    try:
        relative = worktree.relative_to(root)
    except ValueError:
        raise WorktreeAccessError(f"{worktree} is not below {root}") from None
    try:
        changed = _grant_tree(worktree, gid)
        directory = root
        for part in ("", *relative.parent.parts):  # root, then each directory down to the worktree's parent
            directory = directory / part if part else directory
            _add_mode(directory, stat.S_IXOTH, expect_directory=True)
    except OSError as exc:
        raise WorktreeAccessError(f"cannot hand {worktree} to the group {group}: {exc.strerror or exc}") from exc
    return changed


def _grant_tree(worktree: Path, gid: int) -> int:
    changed = 0
    for current, directories, files in os.walk(worktree, topdown=False, followlinks=False):
        for name in (*files, *directories):
            path = os.path.join(current, name)
            if stat.S_ISLNK(os.lstat(path).st_mode):
                os.chown(path, -1, gid, follow_symlinks=False)  # a link's own group; its target is never touched
            elif name in directories:
                continue  # a directory is done as ``current`` (walked before its parent)
            else:
                _set_group(path, gid)
            changed += 1
        _set_group(current, gid)
        changed += 1
    return changed


def _set_group(path: str, gid: int) -> None:
    """Group ``gid`` and its bits on one file or directory, through a descriptor that never follows a link."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:  # another name may be outside the worktree
            raise WorktreeAccessError(f"{path} has other names (hard links): it is not opened to the group")
        os.fchown(fd, -1, gid)
        mode = stat.S_IMODE(info.st_mode)
        if stat.S_ISDIR(info.st_mode):
            mode |= DIRECTORY_BITS
        elif os.path.basename(path) == ".git" and stat.S_ISREG(info.st_mode):
            mode |= stat.S_IRGRP  # the service's pointer to its metadata: readable; replaced, it is refused
        elif stat.S_ISREG(info.st_mode):
            mode |= FILE_BITS | (stat.S_IXGRP if mode & stat.S_IXUSR else 0)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _add_mode(path: Path, bits: int, *, expect_directory: bool) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if expect_directory else 0))
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & bits != bits:
            os.fchmod(fd, mode | bits)
    finally:
        os.close(fd)


#: Entries a removal names when it keeps some (the count is always given).
KEPT_SHOWN = 20
_DIRECTORY_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def remove_tracked_tree(worktree: Path, tracked: Collection[str]) -> list[str]:
    """Remove a worktree the service made, keeping what it cannot prove it made: a regular file or a symbolic link
    whose path (relative, ``/``-separated) is in ``tracked`` (the commit the worktree is on: checked out or
    published by the service, so reproducible from the branch) is removed, as is the worktree's own ``.git`` file
    and every directory left empty; anything else (an agent's untracked file, a link where a directory was) is kept.
    Each entry is looked at the moment it is removed, through the descriptor of its directory, and no link is ever
    followed. The paths kept, relative to the worktree (``[]``: the worktree is gone)."""
    wanted = frozenset(tracked)
    kept: list[str] = []
    try:
        root = os.open(worktree, _DIRECTORY_OPEN)
    except FileNotFoundError:
        return []
    except OSError:
        return ["."]  # not a directory of its own (a link, a file): nothing is touched
    try:
        empty = _remove_below(root, "", wanted, kept, last=".git")
        # The .git file goes last: a removal killed half-way leaves a worktree git still recognises (its missing
        # files are only deletions of the commit's), which the next removal finishes.
        if empty:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISREG(os.stat(".git", dir_fd=root, follow_symlinks=False).st_mode):
                    os.unlink(".git", dir_fd=root)
                else:
                    kept.append(".git")
                    empty = False
    finally:
        os.close(root)
    if empty:
        try:
            os.rmdir(worktree)
        except OSError:
            kept.append(".")
    return kept


def _remove_below(directory: int, prefix: str, wanted: frozenset[str], kept: list[str], *,
                  last: str | None = None) -> bool:
    """Remove what ``wanted`` names below the open ``directory`` (leaving ``last`` to the caller); True when nothing
    else is left in it."""
    left = False
    with os.scandir(directory) as entries:
        names = [entry.name for entry in entries if entry.name != last]
    for name in names:
        relative = f"{prefix}{name}"
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode):
            try:
                child = os.open(name, _DIRECTORY_OPEN, dir_fd=directory)
            except OSError:  # replaced since it was looked at (a link now): kept, never followed
                kept.append(relative)
                left = True
                continue
            try:
                same = os.fstat(child).st_ino == info.st_ino
                empty = same and _remove_below(child, f"{relative}/", wanted, kept)
            finally:
                os.close(child)
            if not same:
                kept.append(relative)
            if not empty:
                left = True
                continue
            try:
                os.rmdir(name, dir_fd=directory)
            except OSError:  # something appeared in it meanwhile
                kept.append(relative)
                left = True
            continue
        if relative in wanted and (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
            try:
                os.unlink(name, dir_fd=directory)  # unlinking a link never touches its target
            except FileNotFoundError:  # gone meanwhile
                pass
            except OSError:  # replaced meanwhile (a directory now): kept
                kept.append(relative)
                left = True
            continue
        kept.append(relative)
        left = True
    return not left
