"""The worktree registrations of a repository (``.git/worktrees/<name>``) and the proof a worktree is foreman's:
read from their files as git reads them, and the hardened runner for one worktree."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from bot.gitops.errors import GitFailure, WorktreeRefused
from bot.gitops.gitfiles import (
    GIT_SPACE,
    OID_RE,
    PLAIN_NAME_RE,
    PRUNABLE_MISSING,
    Unsure,
    read_small,
    recorded_path,
    refname_problem,
    symbolic_head,
)
from bot.gitops.records import AdminDir, WorktreeEntry, WorktreeView, parse_worktree_porcelain
from bot.gitops.refs import RefStore
from bot.gitops.runner import GitRunner
from bot.worktree_files import read_text


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
    dotgit = f"{recorded_path(worktree)}/.git"
    for name, wanted in (("gitdir", dotgit), ("commondir", "../..")):
        text = None if (admin / name).is_symlink() else read_small(admin / name)
        if text not in (wanted, f"{wanted}\n"):
            problems.append(f"{admin / name} does not read {wanted!r}")
    expected = f"gitdir: {os.path.realpath(admin)}"
    git_file = worktree / ".git"
    text = None if git_file.is_symlink() else read_small(git_file)
    if text not in (expected, f"{expected}\n"):
        what = ("a symbolic link" if git_file.is_symlink() else "a directory" if git_file.is_dir()
                else "missing" if text is None else "another text")
        problems.append(f"{git_file} is {what}, not a file reading {expected!r}")
    return problems


class WorktreeRegistrations(RefStore):
    """Which worktrees the repository registers, where, and whether one is still what foreman's ``git worktree add``
    wrote (``verify_worktree``) before any git command runs in it (``worktree_git``)."""

    def worktree_git(self, worktree: Path, env: Mapping[str, str] | None = None, *,
                     registry: bool = True) -> GitRunner:
        """git run on one of this repository's worktrees, its repository taken from the control checkout's own
        records, never from the worktree: ``GIT_DIR`` is the metadata directory git registered the worktree under
        (``registered_admin_dir``), ``GIT_WORK_TREE`` the worktree. Before every command (and now, before the runner
        exists) ``verify_worktree`` refuses, with ``WorktreeRefused``, a worktree whose ``.git`` file or registration
        is not what ``git worktree add`` wrote. Under the repository's registry unless told otherwise."""
        admin = self.registered_admin_dir(worktree)
        self.verify_worktree(worktree, admin)
        assert admin is not None  # verify_worktree refuses a worktree without a registration
        return GitRunner(worktree, env=env if env is not None else self.git.env, timeout_s=self.timeout_s,
                         registry=self.registry if registry else None, git_dir=admin, work_tree=worktree,
                         check=lambda: self.verify_worktree(worktree, admin))

    def registered_admin_dir(self, worktree: Path) -> Path | None:
        """The metadata directory (``.git/worktrees/<name>``) git registered ``worktree`` under, found from the control
        checkout's side alone (the worktree's ``.git`` file is never read for it): among the names ``git worktree
        add`` gives a worktree there (its last component, or that followed by a counter), then among all, the one
        whose ``gitdir`` names the worktree's ``.git``; failing that, the one of its last component (whose changed
        ``gitdir`` ``verify_worktree`` reports). None when there is none."""
        root = self.git_dir / "worktrees"
        try:
            names = sorted(os.listdir(root))
        except (FileNotFoundError, NotADirectoryError):
            return None
        wanted, base = f"{recorded_path(worktree)}/.git", worktree.name
        likely = [name for name in names if name == base or (name.startswith(base) and name[len(base):].isdigit())]
        for name in [*likely, *(name for name in names if name not in likely)]:
            child = root / name
            if not child.is_symlink() and child.is_dir() and (read_small(child / "gitdir") or "") in (
                    wanted, f"{wanted}\n"):
                return child
        return root / base if base in names else None

    def check_worktree(self, worktree: Path) -> None:
        """``verify_worktree`` against the registration ``registered_admin_dir`` finds."""
        self.verify_worktree(worktree, self.registered_admin_dir(worktree))

    def verify_worktree(self, worktree: Path, admin: Path | None) -> None:
        """``WorktreeRefused`` unless ``worktree_problems`` finds nothing (file reads only, no git process)."""
        problems = worktree_problems(self.git_dir, worktree, admin)
        if problems:
            raise WorktreeRefused(worktree, admin, problems)

    def worktrees(self) -> list[WorktreeEntry]:
        status, out, err = self.git.attempt("worktree", "list", "--porcelain", "-z")
        if status != 0:
            raise GitFailure(("worktree", "list"), status, err)
        return parse_worktree_porcelain(out)

    def worktree_at(self, path: Path) -> WorktreeEntry | None:
        """The ``git worktree list --porcelain`` record of the worktree registered at ``path`` (None: none is).

        Read from that registration's own files, as git reads them (worktree.c: ``worktrees/<id>/gitdir``, its
        ``HEAD`` resolved through the common refs, ``locked``, and whether the ``.git`` the gitdir names still
        exists), so the cost does not grow with the number of worktrees. The registration is found as
        ``registration_names`` says; anything the direct read does not copy git on (a symbolic or missing HEAD, an
        unborn branch, a relative gitdir, the main worktree) is answered by ``git worktree list`` itself.
        """
        names = self.registration_names(path)
        if names is None:
            return self.listed_worktree_at(path)
        try:
            for name in names:
                entry = self._entry_of(name, str(path))
                if entry is not None:
                    return entry
        except Unsure:
            return self.listed_worktree_at(path)
        return None

    def listed_worktree_at(self, path: Path) -> WorktreeEntry | None:
        """The same record, picked out of ``git worktree list --porcelain`` (reads every worktree)."""
        wanted = str(path)
        return next((entry for entry in self.worktrees() if entry.path == wanted), None)

    def registration_names(self, path: Path) -> list[str] | None:
        """The ``.git/worktrees/<name>`` directories that can register ``path``, without reading the others: the one
        its ``.git`` file names (when that is one of this repository's), then the names ``git worktree add`` gives a
        worktree at ``path`` (its last component, or that followed by a counter: one listing of the names, no file
        read per worktree). None when that cannot be said this way (``path`` is the checkout itself, or its last
        component is one git would sanitise): the caller reads every registration.

        A registration that names ``path`` under another name (``git worktree move`` from elsewhere, or ``repair``)
        and whose directory has since gone is not among these; ``git worktree add`` at ``path`` refuses it
        ("missing but already registered"), and the worktree step then looks at every registration.
        """
        root = self.git_dir / "worktrees"
        base = path.name
        if (not path.is_absolute() or os.path.realpath(path) == os.path.realpath(self.path)
                or not PLAIN_NAME_RE.fullmatch(base) or ".." in base or base.endswith((".lock", "."))):
            return None
        names: list[str] = []
        git_file = read_small(path / ".git") if not (path / ".git").is_symlink() else None
        if git_file is not None and git_file.startswith("gitdir: "):
            linked = Path(git_file.removeprefix("gitdir: ").rstrip(GIT_SPACE))
            if linked.parent == root or os.path.realpath(linked.parent) == os.path.realpath(root):
                names.append(linked.name)
        try:
            listing = os.listdir(root)
        except (FileNotFoundError, NotADirectoryError):
            return names
        names.extend(sorted(name for name in listing if name.startswith(base) and name not in names
                            and (name == base or name[len(base):].isdigit())))
        return names

    def _entry_of(self, name: str, wanted: str) -> WorktreeEntry | None:
        """The porcelain record of ``worktrees/<name>`` when it registers ``wanted`` (None otherwise), built as
        ``git worktree list --porcelain -z`` prints it (builtin/worktree.c show_worktree_porcelain)."""
        admin = self.git_dir / "worktrees" / name
        if admin.is_symlink() or not admin.is_dir():
            raise Unsure(name)
        gitdir = read_small(admin / "gitdir")
        if not gitdir:  # git skips a registration whose gitdir is missing or empty
            return None
        listed = gitdir.rstrip(GIT_SPACE).removesuffix("/.git")
        if not listed.startswith("/"):
            raise Unsure(name)  # a relative gitdir: git resolves it against the metadata directory
        if listed != wanted:
            return None
        head, branch = self._head_of(admin)
        raw = [f"worktree {listed}", f"HEAD {head}", f"branch {branch}" if branch else "detached"]
        locked: str | None = None
        if os.path.lexists(admin / "locked"):
            text = read_small(admin / "locked")
            if text is None:
                raise Unsure(name)
            locked = text.strip(GIT_SPACE)
            raw.append(f"locked {locked}" if locked else "locked")
        prunable: str | None = None
        target = gitdir.rstrip("\r\n")
        if locked is None and target and not os.path.lexists(target):
            # git also keeps a registration whose index is newer than --expire, which list sets to "never"
            prunable = PRUNABLE_MISSING
            raw.append(f"prunable {prunable}")
        return WorktreeEntry(path=listed, head=head, branch=branch.removeprefix("refs/heads/") if branch else None,
                             detached=branch is None, bare=False, locked=locked, prunable=prunable, raw=tuple(raw))

    def _head_of(self, admin: Path) -> tuple[str, str | None]:
        """(HEAD's commit, the branch ref it names or None when detached) of a linked worktree, read from its
        ``HEAD`` file and the common ref store (loose ref, else ``packed-refs``)."""
        text = read_small(admin / "HEAD")
        if text is None:
            raise Unsure(str(admin))
        text = text.rstrip(GIT_SPACE)
        if OID_RE.fullmatch(text):
            return text, None
        if not text.startswith("ref:"):
            raise Unsure(str(admin))
        ref = text.removeprefix("ref:").lstrip(GIT_SPACE)
        if not ref.startswith("refs/heads/") or refname_problem(ref.removeprefix("refs/heads/")):
            raise Unsure(str(admin))
        if (self.git_dir / ref).is_symlink():
            raise Unsure(ref)
        loose = read_small(self.git_dir / ref)
        if loose is None and (self.git_dir / ref).exists():
            raise Unsure(ref)  # a directory where the ref would be
        sha = loose.rstrip(GIT_SPACE) if loose is not None else self._packed(ref)
        if sha is None or not OID_RE.fullmatch(sha):
            raise Unsure(ref)  # an unborn branch, or a symbolic ref: git resolves those
        return sha, ref

    def admin_dirs(self) -> list[AdminDir]:
        root = self.git_dir / "worktrees"
        if not root.is_dir():
            return []
        return [self._admin_dir(child) for child in sorted(root.iterdir()) if child.is_dir() and not child.is_symlink()]

    @staticmethod
    def _admin_dir(child: Path) -> AdminDir:
        """One ``.git/worktrees/<name>`` directory as read from its files."""
        return AdminDir(child.name, child, read_text(child / "gitdir"), read_text(child / "locked"))

    def remove_admin_dir(self, admin: AdminDir) -> None:
        """Remove one ``.git/worktrees/<name>`` directory (the caller proved it is this transition's)."""
        if admin.path.parent != self.git_dir / "worktrees":
            raise ValueError(f"{admin.path} is not a worktree metadata directory of {self.path}")
        with self.registry.held(("rm", "-r", str(admin.path)), alone=True):  # a registration goes: as git's own
            shutil.rmtree(admin.path)

    def worktree_view(self, path: Path) -> WorktreeView:
        """Asked from inside the worktree: its top level, common and own git dirs, HEAD and HEAD's ref."""
        runner = self.worktree_git(path)
        out = runner.run(
            "rev-parse", "--path-format=absolute", "--show-toplevel", "--git-common-dir", "--git-dir",
            "--verify", "HEAD",
        ).splitlines()
        return WorktreeView(out[0], out[1], out[2], out[3], symbolic_head(Path(out[2]) / "HEAD") or "")

    def admin_dir_for(self, path: Path) -> AdminDir | None:
        """The metadata directory whose recorded worktree is ``path`` (file reads only, no git process): among the
        ones ``registration_names`` gives, else (when it cannot say) among all of them."""
        names = self.registration_names(path)
        if names is None:
            return self.scanned_admin_dir_for(path)
        wanted, root = str(path), self.git_dir / "worktrees"
        for name in names:
            child = root / name
            if child.is_symlink() or not child.is_dir():
                continue
            admin = self._admin_dir(child)
            if admin.worktree_path == wanted:
                return admin
        return None

    def scanned_admin_dir_for(self, path: Path) -> AdminDir | None:
        """The same, looking at every metadata directory."""
        wanted = str(path)
        return next((a for a in self.admin_dirs() if a.worktree_path == wanted), None)
