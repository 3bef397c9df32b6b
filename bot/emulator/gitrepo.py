"""Real bare git repositories behind the emulator's repositories (GitPython, plumbing only, no work tree)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import git
from gitdb import IStream  # type: ignore[import-untyped]

_IDENTITY = {
    "GIT_AUTHOR_NAME": "Gitea Emulator",
    "GIT_AUTHOR_EMAIL": "emulator@noreply.localhost",
    "GIT_COMMITTER_NAME": "Gitea Emulator",
    "GIT_COMMITTER_EMAIL": "emulator@noreply.localhost",
}


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """What the branch API reports about a branch's head commit."""

    sha: str
    message: str
    author_name: str
    author_email: str
    committer_name: str
    committer_email: str
    authored_at: datetime
    committed_at: datetime


def init_bare(path: Path, *, default_branch: str, files: Mapping[str, str | bytes]) -> str:
    """Create a bare repository at ``path`` whose ``default_branch`` holds one commit of ``files``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    repo = git.Repo.init(path, bare=True, initial_branch=default_branch)
    repo.close()
    return commit_files(path, default_branch, files, message="Initial commit")


def commit_files(
    path: Path,
    branch: str,
    files: Mapping[str, str | bytes],
    *,
    message: str,
    parent: str | None = None,
) -> str:
    """Commit ``files`` (added or replaced) on top of ``parent`` and point ``refs/heads/<branch>`` at it."""
    with git.Repo(path) as repo, tempfile.TemporaryDirectory(prefix="emu-index-") as tmp:
        env = {**os.environ, **_IDENTITY, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if parent is not None:
            repo.git.read_tree(parent, env=env)
        cacheinfo: list[str] = []
        for name, content in sorted(files.items()):
            data = content.encode("utf-8") if isinstance(content, str) else content
            blob = repo.odb.store(IStream("blob", len(data), _Reader(data)))
            cacheinfo += ["--cacheinfo", f"100644,{blob.hexsha.decode('ascii')},{name}"]
        if cacheinfo:
            repo.git.update_index("--add", *cacheinfo, env=env)
        tree = repo.git.write_tree(env=env)
        parents = ["-p", parent] if parent is not None else []
        sha: str = repo.git.commit_tree(tree, *parents, "-m", message, env=env)
        repo.git.update_ref(f"refs/heads/{branch}", sha)
        return sha


#: A commit's metadata never changes (its sha names its content): read once per repository and sha, a bounded memo
#: (emptied when full). Reading it takes GitPython a `git cat-file` process; resolving the branch takes none.
_COMMITS: dict[tuple[str, str], CommitInfo] = {}
_COMMITS_MAX = 4096


def branch_head(path: Path, branch: str) -> CommitInfo | None:
    """The head commit of ``branch`` (slashes allowed), or None when there is no such branch."""
    with git.Repo(path) as repo:
        try:
            # The loose ref or packed-refs, read in-process; an invalid or missing name is a ValueError.
            sha = git.SymbolicReference.dereference_recursive(repo, f"refs/heads/{branch}")
        except (ValueError, OSError):
            return None
        key = (str(path), sha)
        known = _COMMITS.get(key)
        if known is not None:
            return known
        try:
            commit = repo.commit(sha)
            message = commit.message
            info = CommitInfo(
                sha=commit.hexsha,
                message=message if isinstance(message, str) else message.decode("utf-8", "replace"),
                author_name=str(commit.author.name),
                author_email=str(commit.author.email),
                committer_name=str(commit.committer.name),
                committer_email=str(commit.committer.email),
                authored_at=commit.authored_datetime,
                committed_at=commit.committed_datetime,
            )
        except (git.BadName, ValueError):
            return None
    if len(_COMMITS) >= _COMMITS_MAX:
        _COMMITS.clear()
    _COMMITS[key] = info
    return info


class _Reader:
    """The minimal ``read()`` stream gitdb wants for a blob."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else min(len(self._data), self._pos + size)
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk
