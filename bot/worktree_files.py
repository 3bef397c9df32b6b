"""What the worktree guards read and lock on disk: blob ids, content proofs, root escapes, removal, file locks."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path


def read_text(path: Path) -> str | None:
    """A small text file's content, stripped; None when it does not exist."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def blob_id(data: bytes) -> str:
    """git's object id of a blob holding ``data`` (SHA-1 repositories)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def content_problems(
    root: Path, files: Mapping[str, tuple[str, str]], *, git_file_ok: Callable[[str], bool] | None
) -> list[str]:
    """Why removing ``root`` could lose content: any file that is not a byte-identical blob of ``files`` at the
    same path and mode, or anything else at all. ``git_file_ok`` judges the content of a ``root/.git`` file.
    Empty: everything there is reproducible from the tree (a half-made checkout of it)."""
    problems: list[str] = []
    prefixes = {str(Path(name).parent) for name in files} | {"."}
    for name in list(prefixes):
        parent = Path(name)
        while str(parent) != ".":
            parent = parent.parent
            prefixes.add(str(parent))
    for current, dirs, names in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(current, root)
        for name in list(dirs):
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if os.path.islink(os.path.join(current, name)):
                names.append(name)  # a symlink to a directory: judge it as a file
                dirs.remove(name)
            elif rel not in prefixes:
                problems.append(f"{rel}/: a directory the tree does not have")
                dirs.remove(name)
        for name in names:
            full = os.path.join(current, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel == ".git":
                text = read_text(Path(full)) if os.path.isfile(full) and not os.path.islink(full) else None
                if git_file_ok is None or text is None or not git_file_ok(text):
                    problems.append(".git: not the worktree's own git file")
                continue
            expected = files.get(rel)
            if expected is None:
                problems.append(f"{rel}: not in the tree")
                continue
            mode, blob = expected
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                data, actual_mode = os.fsencode(os.readlink(full)), "120000"
            elif stat.S_ISREG(info.st_mode):
                data = Path(full).read_bytes()
                actual_mode = "100755" if info.st_mode & stat.S_IXUSR else "100644"
            else:
                problems.append(f"{rel}: not a regular file or symbolic link")
                continue
            if actual_mode != mode or blob_id(data) != blob:
                problems.append(f"{rel}: differs from the tree")
    return problems


def escapes_root(root: Path, path: Path) -> bool:
    """True when ``root`` or anything between it and ``path`` is a symbolic link, or ``path`` resolves
    outside ``root``. (Checked before anything is created there, and again before a worktree is trusted.)"""
    if root.is_symlink():
        return True
    real_root = Path(os.path.realpath(root))
    if real_root != Path(os.path.realpath(root.parent)) / root.name:
        return True
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(info.st_mode):
            return True
    resolved = Path(os.path.realpath(path))
    return resolved != real_root and real_root not in resolved.parents


def nested_repositories(root: Path, changes: Iterable[str]) -> list[str]:
    """The directories (relative to ``root``) among or above ``changes`` that hold their own ``.git`` (a directory,
    a ``gitdir:`` file or a link): git would commit each as a gitlink (mode 160000) naming a commit nobody can fetch.
    A change git lists with a trailing slash is a directory it did not look into for that reason. File reads only
    (``lstat``, never following a link); the root's own ``.git`` is not looked at."""
    found: set[str] = set()
    seen: set[Path] = set()
    for change in changes:
        rel = Path(change)
        if change.endswith("/"):
            found.add(rel.as_posix())
        current = root
        for part in rel.parts[:-1] if not change.endswith("/") else rel.parts:
            current = current / part
            if current in seen:
                continue
            seen.add(current)
            try:
                os.lstat(current / ".git")
            except (FileNotFoundError, NotADirectoryError):
                continue
            found.add(current.relative_to(root).as_posix())
    return sorted(found)


@contextlib.asynccontextmanager
async def file_lock(path: Path, *, wait_s: float, poll_s: float = 0.02) -> AsyncIterator[bool]:
    """An exclusive ``flock`` on ``path``: yields True once held, False if not held within ``wait_s``.

    The kernel drops the lock when the holder exits, however it exits, so a crashed process never leaves a
    transition claimed. Two holders in one process exclude each other too (one open file each).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
            if time.monotonic() >= deadline:
                yield False
                return
            await asyncio.sleep(poll_s)
        yield True
    finally:
        os.close(fd)
