"""The bot's control checkout: its clone, refs and worktrees, one bounded git call each."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

from bot import worktree_access
from bot.gitops.errors import GitFailure, GitlinksStaged, WorktreeKept, WorktreeRefused
from bot.gitops.gitfiles import (
    _GIT_SPACE,
    _OID_RE,
    _PLAIN_NAME_RE,
    PRUNABLE_MISSING,
    _read_small,
    _real,
    _refname_problem,
    _Unsure,
    symbolic_head,
)
from bot.gitops.records import AdminDir, WorktreeEntry, WorktreeView, parse_worktree_porcelain
from bot.gitops.registrations import worktree_problems
from bot.gitops.runner import GitRunner
from bot.gitops.worktree_lock import WorktreeRegistry
from bot.gitops.worktrees import losses, staged_gitlinks, worktree_head
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


class ControlCheckout:
    """The bot's own clone of the repository. Its working tree stays on the default branch and is never
    written to; worktrees live in ``<checkout>/branches/`` (excluded through ``.git/info/exclude``)."""

    def __init__(self, path: Path, *, env: Mapping[str, str], timeout_s: float) -> None:
        self.path = path
        self.registry = WorktreeRegistry(path / ".git", wait_s=timeout_s)
        self.git = GitRunner(path, env=env, timeout_s=timeout_s, registry=self.registry, git_dir=path / ".git",
                             work_tree=path)
        self.timeout_s = timeout_s

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
        wanted, base = f"{_real(worktree)}/.git", worktree.name
        likely = [name for name in names if name == base or (name.startswith(base) and name[len(base):].isdigit())]
        for name in [*likely, *(name for name in names if name not in likely)]:
            child = root / name
            if not child.is_symlink() and child.is_dir() and (_read_small(child / "gitdir") or "") in (
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

    @property
    def git_dir(self) -> Path:
        return self.path / ".git"

    @property
    def branches_root(self) -> Path:
        return self.path / "branches"

    def exists(self) -> bool:
        return (self.git_dir / "HEAD").is_file()

    # --- clone, fetch and refs ----------------------------------------------------------------------------------------

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


    def head(self) -> tuple[str | None, str | None]:
        """(symbolic ref of HEAD or None when detached, HEAD's commit)."""
        return symbolic_head(self.git_dir / "HEAD"), self.rev("HEAD")

    def refs(self, *patterns: str) -> dict[str, str]:
        """refname -> object id for every ref matching ``patterns`` (``git for-each-ref``)."""
        out = self.git.run("for-each-ref", "--format=%(objectname) %(refname)", *patterns)
        found: dict[str, str] = {}
        for line in out.splitlines():
            sha, _, name = line.partition(" ")
            if name:
                found[name] = sha
        return found

    def status(self) -> list[str]:
        """``git status --porcelain`` of the checkout itself, without refreshing its index (read-only)."""
        out = self.git.run("--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all")
        return [item for item in out.split("\0") if item]

    def tracks(self, path: str) -> bool:
        """True when HEAD's tree has anything at ``path`` (a tracked ``branches/`` would collide with worktrees)."""
        return bool(self.git.run("ls-tree", "--name-only", "HEAD", "--", path).strip())

    def rev(self, ref: str) -> str | None:
        status, out, _ = self.git.attempt("rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        return out.strip() if status == 0 else None

    def branch_sha(self, branch: str) -> str | None:
        return self.rev(f"refs/heads/{branch}")

    def local_branches(self) -> list[str]:
        out = self.git.run("for-each-ref", "--format=%(refname:strip=2)", "refs/heads/")
        return [line for line in out.splitlines() if line]

    def exact_refs(self, *refnames: str) -> dict[str, str]:
        """refname -> object id for each of these full refnames that exists (the ones that do not are left out).

        Read like ``read_ref`` (the loose ref file, else ``packed-refs``, else ``git rev-parse``): the cost does not
        grow with the number of refs. ``git for-each-ref <exact refname>`` would read every loose ref of the
        directory (git's files backend loads a directory's refs whole; 7 ms for 1,000 branches against 1.3 ms).
        """
        found: dict[str, str] = {}
        for name in refnames:
            sha = self.read_ref(name)
            if sha is not None:
                found[name] = sha
        return found

    def branch_refs(self, prefix: str) -> dict[str, str]:
        """``refs/heads/<name>`` -> object id for every branch whose name starts with ``prefix``: what
        ``git for-each-ref refs/heads/`` lists of them, without reading the other branches.

        The loose refs are found by name in ``refs/heads/`` (one directory listing, no file read per branch) and in
        ``packed-refs``; a loose ref overrides a packed one. As for-each-ref does, a name git would refuse and a ref
        that is not an object id (a broken file) are left out, one naming a missing object is listed (git 2.39 lists
        it); a symbolic ref is resolved by git. Another ref store than files (reftable) is listed by for-each-ref.
        """
        heads = self.git_dir / "refs" / "heads"
        if (self.git_dir / "reftable").exists() or not heads.is_dir() or "/" in prefix or not prefix:
            return {name: sha for name, sha in self.refs("refs/heads/").items()
                    if name.removeprefix("refs/heads/").startswith(prefix)}
        loose: set[str] = set()
        with os.scandir(heads) as listing:
            matching = [entry for entry in listing if entry.name.startswith(prefix)]
        for entry in matching:
            if entry.is_dir(follow_symlinks=False):
                for folder, _dirs, files in os.walk(entry.path):
                    for file in files:
                        rel = os.path.relpath(os.path.join(folder, file), heads)
                        loose.add(f"refs/heads/{rel}")
            else:
                loose.add(f"refs/heads/{entry.name}")
        wanted = f"refs/heads/{prefix}"
        packed = {name: oid for name, oid in self._packed_refs() if name.startswith(wanted)}
        found: dict[str, str] = {}
        for name in sorted({*loose, *packed}):
            if _refname_problem(name.removeprefix("refs/heads/")):
                continue
            sha = packed.get(name)
            if name in loose:
                text = None if os.path.islink(self.git_dir / name) else _read_small(self.git_dir / name)
                if text is not None and _OID_RE.fullmatch(text.rstrip(_GIT_SPACE)):
                    sha = text.rstrip(_GIT_SPACE)
                else:  # a symbolic ref, or not a ref at all: git says what it resolves to, if anything
                    status, out, _ = self.git.attempt("rev-parse", "--verify", "-q", name)
                    sha = out.strip() if status == 0 and _OID_RE.fullmatch(out.strip()) else None
            if sha is not None:
                found[name] = sha
        return found

    def create_branch(self, branch: str, sha: str, message: str) -> bool:
        """Create ``refs/heads/<branch>`` at ``sha`` only if it does not exist, with a reflog entry carrying
        ``message`` (the creation proof). False when the branch already existed (nothing changed)."""
        status, _, err = self.git.attempt(
            "update-ref", "--create-reflog", "-m", message, f"refs/heads/{branch}", sha, ""
        )
        if status == 0:
            return True
        if "already exists" in err or "reference already exists" in err:
            return False
        raise GitFailure(("update-ref", f"refs/heads/{branch}"), status, err)

    def read_ref(self, ref: str) -> str | None:
        """A ref's object id as git stored it: the loose ref file, else ``packed-refs``, else ``git rev-parse``
        (another ref backend). Reading the files git wrote is the read-after-write without a process."""
        text = _read_small(self.git_dir / ref) if ref.startswith("refs/") and ".." not in ref else None
        text = text.strip() if text is not None else None
        if text is not None and _OID_RE.fullmatch(text):
            return text
        if text is None and (packed := self._packed(ref)) is not None:
            return packed
        return self.rev(ref)

    def reflog(self, branch: str) -> list[tuple[str, str]]:
        """(new sha, message) of the branch's reflog entries, oldest first ([] without a reflog).

        Read from ``.git/logs/refs/heads/<branch>`` (git's own record, one line per update) when it is there,
        else through ``git reflog show``.
        """
        log_file = self.git_dir / "logs" / "refs" / "heads" / branch
        if ".." not in branch and log_file.is_file():
            entries: list[tuple[str, str]] = []
            for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines():
                head, _, message = line.partition("\t")
                parts = head.split(" ")
                if len(parts) >= 2 and _OID_RE.fullmatch(parts[1]):
                    entries.append((parts[1], message))
            return entries
        status, out, _ = self.git.attempt(
            "reflog", "show", "--no-abbrev", "--format=%H%x09%gs", f"refs/heads/{branch}", "--"
        )
        if status != 0:
            return []
        rows = [line.split("\t", 1) for line in out.splitlines() if "\t" in line]
        return [(sha, message) for sha, message in reversed(rows)]

    def delete_branch(self, branch: str, expected_sha: str) -> bool:
        """Delete the branch only if it still points at ``expected_sha`` (False otherwise: left as it is)."""
        status, _, _ = self.git.attempt("update-ref", "-d", f"refs/heads/{branch}", expected_sha)
        return status == 0

    def tree_files(self, sha: str) -> dict[str, tuple[str, str]]:
        """path -> (mode, blob id) of every file in the commit's tree."""
        out = self.git.run("ls-tree", "-r", "-z", "--full-tree", sha)
        files: dict[str, tuple[str, str]] = {}
        for item in out.split("\0"):
            if not item:
                continue
            meta, _, name = item.partition("\t")
            mode, _kind, blob = meta.split(" ")
            files[name] = (mode, blob)
        return files

    # --- worktrees ----------------------------------------------------------------------------------------------------

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
        except _Unsure:
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
                or not _PLAIN_NAME_RE.fullmatch(base) or ".." in base or base.endswith((".lock", "."))):
            return None
        names: list[str] = []
        git_file = _read_small(path / ".git") if not (path / ".git").is_symlink() else None
        if git_file is not None and git_file.startswith("gitdir: "):
            linked = Path(git_file.removeprefix("gitdir: ").rstrip(_GIT_SPACE))
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
            raise _Unsure(name)
        gitdir = _read_small(admin / "gitdir")
        if not gitdir:  # git skips a registration whose gitdir is missing or empty
            return None
        listed = gitdir.rstrip(_GIT_SPACE).removesuffix("/.git")
        if not listed.startswith("/"):
            raise _Unsure(name)  # a relative gitdir: git resolves it against the metadata directory
        if listed != wanted:
            return None
        head, branch = self._head_of(admin)
        raw = [f"worktree {listed}", f"HEAD {head}", f"branch {branch}" if branch else "detached"]
        locked: str | None = None
        if os.path.lexists(admin / "locked"):
            text = _read_small(admin / "locked")
            if text is None:
                raise _Unsure(name)
            locked = text.strip(_GIT_SPACE)
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
        text = _read_small(admin / "HEAD")
        if text is None:
            raise _Unsure(str(admin))
        text = text.rstrip(_GIT_SPACE)
        if _OID_RE.fullmatch(text):
            return text, None
        if not text.startswith("ref:"):
            raise _Unsure(str(admin))
        ref = text.removeprefix("ref:").lstrip(_GIT_SPACE)
        if not ref.startswith("refs/heads/") or _refname_problem(ref.removeprefix("refs/heads/")):
            raise _Unsure(str(admin))
        if (self.git_dir / ref).is_symlink():
            raise _Unsure(ref)
        loose = _read_small(self.git_dir / ref)
        if loose is None and (self.git_dir / ref).exists():
            raise _Unsure(ref)  # a directory where the ref would be
        sha = loose.rstrip(_GIT_SPACE) if loose is not None else self._packed(ref)
        if sha is None or not _OID_RE.fullmatch(sha):
            raise _Unsure(ref)  # an unborn branch, or a symbolic ref: git resolves those
        return sha, ref

    def _packed(self, ref: str) -> str | None:
        """``ref``'s object id in ``packed-refs`` (None: not packed)."""
        return next((oid for name, oid in self._packed_refs() if name == ref), None)

    def _packed_refs(self) -> Iterator[tuple[str, str]]:
        """(refname, object id) of every ref line of ``packed-refs`` (its header and peeled ``^`` lines skipped)."""
        for line in (read_text(self.git_dir / "packed-refs") or "").splitlines():
            oid, _, name = line.partition(" ")
            if _OID_RE.fullmatch(oid):
                yield name, oid

    def register_worktree(self, path: Path, branch: str, lock_reason: str) -> None:
        """``git worktree add --no-checkout --lock --reason R <path> <branch>``: git writes the lock (our proof) first,
        then the registration and the worktree's HEAD on the branch; no file is checked out (``check_out``). Held alone
        (the registry): the short part of an add, so other adds wait only for it, never for a checkout."""
        self.git.run("worktree", "add", "--quiet", "--no-checkout", "--lock", "--reason", lock_reason, str(path),
                     branch)

    def check_out(self, path: Path) -> None:
        """The checkout ``git worktree add`` runs itself when not told ``--no-checkout`` (builtin/worktree.c:
        ``reset --hard --no-recurse-submodules`` inside the new worktree). ``reset`` lists no worktree, so it runs
        outside the registry: bootstraps of one repository check out side by side."""
        self.worktree_git(path, registry=False).run("reset", "--hard", "--no-recurse-submodules", "--quiet")

    def unlock_worktree(self, path: Path) -> None:
        self.git.attempt("worktree", "unlock", str(path))

    def remove_worktree(self, path: Path, *, force: bool, made_from: str | None = None) -> None:
        """Remove a worktree and its registration. A worktree still on disk is verified first (``WorktreeRefused``:
        nothing removed); without ``force`` it must also be clean, as ``worktree_status`` (hardened, ignored files
        included) says, else GitFailure and nothing is removed. Then the files of its commit are removed by
        descriptor, anything else kept (``WorktreeKept``), and ``git worktree remove --force`` drops the
        registration of the directory now gone.

        git's own check (``worktree remove`` without ``--force``) is not used: it runs ``git status`` with the
        worktree's ``.git`` file as its repository (builtin/worktree.c, check_clean_worktree), and that file is the
        one thing in a worktree that must never choose what git reads. A locked worktree is still refused by git."""
        if os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path):
            os.rmdir(path)  # a removal killed after its last entry: nothing left to judge or keep
        if os.path.lexists(path):
            self.check_worktree(path)
            if not force and (left := losses(self.worktree_status(path))):
                raise GitFailure(("worktree", "remove", str(path)), None,
                                 f"the worktree is not clean: {', '.join(item[3:] for item in left[:10])}")
            # git's own removal walks the tree by path (dir.c, remove_dir_recurse): a directory swapped for a link
            # after it was looked at would be followed. The service removes what its commit proves it made, by
            # descriptor, and keeps anything else (an agent's file that appeared since the check): WorktreeKept.
            # ``made_from``: the commit the worktree was checked out from, when its HEAD may not be readable (a
            # compensation that deleted the branch first); the files of either are the service's.
            commits = {c for c in (worktree_head(self, path), made_from) if c}
            tracked = {name for commit in commits if self.rev(commit) for name in self.tree_files(commit)}
            kept = worktree_access.remove_tracked_tree(path, tracked)
            if kept:
                raise WorktreeKept(path, kept)
        self.git.run("worktree", "remove", "--force", str(path))  # the directory is gone: its registration goes

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

    def worktree_status(self, path: Path) -> list[str]:
        """Every tracked change, untracked and ignored file in a worktree (empty: nothing would be lost). A
        submodule's own work tree is not looked into (git would run ``git status`` in it, with its configuration):
        git refuses to remove a worktree holding one anyway."""
        out = self.worktree_git(path).run(
            "--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored",
            "--ignore-submodules=dirty")
        return [item for item in out.split("\0") if item]

    def worktree_changes(self, path: Path) -> list[str]:
        """The paths (relative to the worktree) of every tracked change and untracked file, no rename pairing."""
        out = self.worktree_git(path).run(
            "--no-optional-locks", "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames",
            "--ignore-submodules=dirty")
        return [item[3:] for item in out.split("\0") if len(item) > 3]

    def commit_worktree(self, path: Path, message: str, *, author: tuple[str, str]) -> str | None:
        """Stage everything inside the worktree (``git add -A -- .`` run there) and commit it as ``author``
        (name, e-mail; the committer is the bot). None when nothing is staged (no commit made). No hook runs
        (``--no-verify``, and ``core.hooksPath`` is ``/dev/null``). A gitlink staged (a repository nested in the
        worktree) is unstaged again and ``GitlinksStaged`` raised: nothing is committed."""
        runner = self.worktree_git(path, {**self.git.env, "GIT_AUTHOR_NAME": author[0],
                                          "GIT_AUTHOR_EMAIL": author[1]})
        runner.run("add", "-A", "--", ".")
        gitlinks = staged_gitlinks(runner.run("diff", "--cached", "--raw", "-z", "--no-abbrev", "--no-renames",
                                              "--no-ext-diff", "--no-textconv"))
        if gitlinks:
            runner.run("reset", "-q")  # the index back to HEAD; the worktree's files stay as they are
            raise GitlinksStaged(gitlinks)
        status, _, err = runner.attempt("diff", "--cached", "--quiet", "--no-ext-diff", "--no-textconv")
        if status == 0:
            return None
        if status != 1:
            raise GitFailure(("diff", "--cached"), status, err)
        status, _, err = runner.attempt("commit", "--no-verify", "-q", "-m", message)
        if status != 0:
            raise GitFailure(("commit",), status, err)
        return runner.run("rev-parse", "--verify", "HEAD").strip()

    def commit_message(self, sha: str) -> str:
        status, out, _ = self.git.attempt("log", "-1", "--format=%B", sha)
        return out if status == 0 else ""

    def is_ancestor(self, older: str, newer: str) -> bool:
        """``older`` is ``newer`` or one of its ancestors (False when either is unknown here)."""
        status, _, _ = self.git.attempt("merge-base", "--is-ancestor", older, newer)
        return status == 0

    def commits_between(self, base: str, head: str) -> int | None:
        """How many commits ``head`` has that ``base`` has not (None when either is unknown here)."""
        status, out, _ = self.git.attempt("rev-list", "--count", f"{base}..{head}")
        return int(out.strip()) if status == 0 and out.strip().isdigit() else None

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
