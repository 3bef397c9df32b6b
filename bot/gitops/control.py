"""The bot's control checkout: its clone, refs and worktrees, one bounded git call each."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from bot.gitops.errors import GitFailure
from bot.gitops.runner import GitRunner
from bot.gitops.worktrees import WorktreeOperations
from bot.worktree_files import read_text

#: ``remote.origin.url`` by control checkout and the identity of its ``.git/config`` (inode, modification time,
#: size) when git read it: git rewrites the file whole for every change (a new file renamed into place), so a changed
#: origin (``foreman checkout repoint``, an operator's ``git remote set-url``) is read again. Not seen: a change in a
#: file the config includes (foreman's control checkout includes none).
_ORIGINS: dict[tuple[str, int, int, int], str | None] = {}
_ORIGINS_KEPT = 256
_UNREAD = "\0unread"  # not a URL git can hold (a NUL byte)
#: A config file changed less than this long ago is read from git every time.
_RACY_S = 2.0
#: Whether a commit's tree has something at a path, by (checkout, commit, path): a commit never changes.
_TRACKED: dict[tuple[str, str, str], bool] = {}


class ControlCheckout(WorktreeOperations):
    """The bot's own clone of the repository. Its working tree stays on the default branch and is never
    written to; worktrees live in ``<checkout>/branches/`` (excluded through ``.git/info/exclude``)."""

    @property
    def branches_root(self) -> Path:
        return self.path / "branches"

    # --- clone, origin and fetch -------------------------------------------------------------------------------------

    def clone(self, clone_url: str, default_branch: str, *, auth: Mapping[str, str]) -> None:
        """Clone into a fresh sibling directory and rename it into place, so a concurrent or interrupted
        clone never leaves a half-made checkout at ``path`` (the loser of a race discards its copy)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.parent / f".clone-{self.path.name}-{uuid.uuid4().hex[:8]}"
        runner = GitRunner(self.path.parent, env=self.git.env, timeout_s=self.timeout_s)
        try:
            runner.run(
                "clone", "--quiet", "--no-tags", "--origin", "origin", "--branch", default_branch, "--",
                clone_url, str(temp), extra_env=auth,
            )
            with contextlib.suppress(OSError):
                os.rename(temp, self.path)
        finally:
            if temp.exists():
                shutil.rmtree(temp, ignore_errors=True)
        if not self.exists():
            raise GitFailure(("clone",), None, f"no checkout at {self.path} after cloning")

    def ensure_excluded(self) -> None:
        """``branches/`` is listed in ``.git/info/exclude`` (so worktrees never show in the checkout's status)."""
        exclude = self.git_dir / "info" / "exclude"
        current = read_text(exclude) or ""
        if "/branches/" in current.splitlines():
            return
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a", encoding="utf-8") as handle:
            handle.write(("" if not current or current.endswith("\n") else "\n") + "/branches/\n")

    def origin_url(self) -> str | None:
        """``remote.origin.url`` as git reads it. A process reads it from git once per state of ``.git/config``
        (``_ORIGINS``): each allocation asks twice (its proof, its bootstrap), one git process each."""
        try:
            stat = (self.git_dir / "config").stat()
        except OSError:
            key = None
        else:
            # The identity is taken before git reads the file, so a change during the read gives another one. A file
            # written within the last seconds is read again every time (git's own "racy" rule: on a file system
            # with coarse times, a second change in the same tick could leave size and time as they were).
            key = (str(self.path), stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if time.time() - stat.st_mtime < _RACY_S:
                key = None
            elif (known := _ORIGINS.get(key, _UNREAD)) is not _UNREAD:  # one lookup: another thread may clear it
                return known
        status, out, _ = self.git.attempt("config", "--get", "remote.origin.url")
        found = out.strip() if status == 0 else None
        if key is not None and status in (0, 1):  # 1: the key is not set; anything else is not an answer
            if len(_ORIGINS) >= _ORIGINS_KEPT:
                _ORIGINS.clear()
            _ORIGINS[key] = found
        return found

    def set_origin(self, url: str) -> None:
        """``git remote set-url origin <url>``: changes ``.git/config`` only (no ref, index or working tree)."""
        self.git.run("remote", "set-url", "origin", url)

    def fetch(self, branch: str, *, auth: Mapping[str, str]) -> None:
        """Bring ``refs/remotes/origin/<branch>`` up to date (the working tree is not touched)."""
        self.git.run(
            "fetch", "--quiet", "--no-tags", "origin", f"+refs/heads/{branch}:refs/remotes/origin/{branch}",
            extra_env=auth,
        )

    def status(self) -> list[str]:
        """``git status --porcelain`` of the checkout itself, without refreshing its index (read-only)."""
        out = self.git.run("--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all")
        return [item for item in out.split("\0") if item]

    def tracks(self, path: str) -> bool:
        """True when HEAD's tree has anything at ``path`` (a tracked ``branches/`` would collide with worktrees)."""
        return bool(self.git.run("ls-tree", "--name-only", "HEAD", "--", path).strip())

    def tracks_at(self, sha: str, path: str) -> bool:
        """True when commit ``sha``'s tree has anything at ``path``; asked of git once per commit and path in a
        process (a commit's tree never changes)."""
        key = (str(self.path), sha, path)
        known = _TRACKED.get(key)
        if known is None:
            known = bool(self.git.run("ls-tree", "--name-only", sha, "--", path).strip())
            if len(_TRACKED) >= _ORIGINS_KEPT:
                _TRACKED.clear()
            _TRACKED[key] = known
        return known

    def remote_branch(self, branch: str, *, auth: Mapping[str, str]) -> str | None:
        """The sha ``refs/heads/<branch>`` has on origin now (None: no such branch there)."""
        out = self.git.run("ls-remote", "origin", f"refs/heads/{branch}", extra_env=auth)
        return out.split("\t", 1)[0].strip() or None

    def push_branch(self, branch: str, sha: str, *, auth: Mapping[str, str]) -> str | None:
        """Push ``sha`` to origin's ``refs/heads/<branch>``, never forced; None when pushed, else git's refusal
        (a non-fast-forward). Any other failure raises GitFailure."""
        status, _, err = self.git.attempt("push", "--quiet", "origin", f"{sha}:refs/heads/{branch}", extra_env=auth)
        if status == 0:
            return None
        if any(word in err for word in ("rejected", "non-fast-forward", "fetch first")):
            return err.strip()[-400:]
        raise GitFailure(("push", "origin", branch), status, err)
