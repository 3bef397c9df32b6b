"""A repository's refs and history: read from git's files where that is exact, else asked of git; branches
created and deleted with a proof."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

from bot.gitops.errors import GitFailure
from bot.gitops.gitfiles import GIT_SPACE, OID_RE, read_small, refname_problem, symbolic_head
from bot.gitops.repository import GitRepository
from bot.worktree_files import read_text


class RefStore(GitRepository):
    """The refs, reflogs, trees and ancestry of the repository."""

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

    def rev(self, ref: str) -> str | None:
        status, out, _ = self.git.attempt("rev-parse", "--verify", "-q", f"{ref}^{{commit}}")
        return out.strip() if status == 0 else None

    def branch_sha(self, branch: str) -> str | None:
        """The branch's commit, read as git stored it (``read_ref``: no process for a loose or packed ref)."""
        return self.read_ref(f"refs/heads/{branch}")

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
            if refname_problem(name.removeprefix("refs/heads/")):
                continue
            sha = packed.get(name)
            if name in loose:
                text = None if os.path.islink(self.git_dir / name) else read_small(self.git_dir / name)
                if text is not None and OID_RE.fullmatch(text.rstrip(GIT_SPACE)):
                    sha = text.rstrip(GIT_SPACE)
                else:  # a symbolic ref, or not a ref at all: git says what it resolves to, if anything
                    status, out, _ = self.git.attempt("rev-parse", "--verify", "-q", name)
                    sha = out.strip() if status == 0 and OID_RE.fullmatch(out.strip()) else None
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

    def move_branch(self, branch: str, sha: str, expected_sha: str, message: str) -> bool:
        """Point ``refs/heads/<branch>`` at ``sha`` only if it still points at ``expected_sha``, with a reflog entry
        carrying ``message`` (``expected_sha`` empty: only if it does not exist). False when it points elsewhere
        (nothing changed); GitFailure for anything else."""
        status, _, err = self.git.attempt("update-ref", "-m", message, f"refs/heads/{branch}", sha, expected_sha)
        if status == 0:
            return True
        if any(word in err for word in ("but expected", "unable to resolve reference", "already exists")):
            return False
        raise GitFailure(("update-ref", f"refs/heads/{branch}"), status, err)

    def read_ref(self, ref: str) -> str | None:
        """A ref's object id as git stored it: the loose ref file, else ``packed-refs``, else ``git rev-parse``
        (another ref backend). Reading the files git wrote is the read-after-write without a process."""
        text = read_small(self.git_dir / ref) if ref.startswith("refs/") and ".." not in ref else None
        text = text.strip() if text is not None else None
        if text is not None and OID_RE.fullmatch(text):
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
                if len(parts) >= 2 and OID_RE.fullmatch(parts[1]):
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

    def _packed(self, ref: str) -> str | None:
        """``ref``'s object id in ``packed-refs`` (None: not packed)."""
        return next((oid for name, oid in self._packed_refs() if name == ref), None)

    def _packed_refs(self) -> Iterator[tuple[str, str]]:
        """(refname, object id) of every ref line of ``packed-refs`` (its header and peeled ``^`` lines skipped)."""
        for line in (read_text(self.git_dir / "packed-refs") or "").splitlines():
            oid, _, name = line.partition(" ")
            if OID_RE.fullmatch(oid):
                yield name, oid

    def commit_message(self, sha: str) -> str:
        status, out, _ = self.git.attempt("log", "-1", "--format=%B", sha)
        return out if status == 0 else ""

    def is_ancestor(self, older: str, newer: str) -> bool:
        """``older`` is ``newer`` or one of its ancestors (False when either is unknown here)."""
        status, _, _ = self.git.attempt("merge-base", "--is-ancestor", older, newer)
        return status == 0

    def update_from_base(self, local: str, remote: str, base: str) -> Literal["merge", "rebase"] | None:
        """How ``remote`` is exactly ``local`` brought up to date with ``base`` (Gitea's "update branch",
        services/pull/update.go), or None when it is anything else (a foreign push, another rewrite).

        ``merge``: ``remote`` is a merge commit whose first parent is ``local`` and second an ancestor of ``base``,
        with exactly the tree git's own merge of the two gives (``merge-tree --write-tree``: no change of its own).
        ``rebase``: every commit ``local`` has beyond ``remote`` has its patch in ``remote``, and every commit
        ``remote`` has beyond ``base`` and ``local`` has its patch in ``local`` (``git cherry``, by patch id)."""
        status, out, _ = self.git.attempt("rev-list", "--parents", "-n", "1", remote)
        parents = out.split()[1:] if status == 0 else []
        if len(parents) == 2 and parents[0] == local and self.is_ancestor(parents[1], base):
            status, merged, _ = self.git.attempt("merge-tree", "--write-tree", "--no-messages", local, parents[1])
            found, tree, _ = self.git.attempt("rev-parse", "--verify", "-q", f"{remote}^{{tree}}")
            return "merge" if status == found == 0 and merged.split()[:1] == [tree.strip()] else None
        if self.is_ancestor(local, remote) or not self.is_ancestor(base, remote):
            return None
        ours = self.git.attempt("cherry", remote, local)
        theirs = self.git.attempt("cherry", local, remote, base)
        if ours[0] != 0 or theirs[0] != 0:
            return None
        lines = ours[1].splitlines() + theirs[1].splitlines()
        return "rebase" if lines and all(line.startswith("- ") for line in lines) else None

    def commits_between(self, base: str, head: str) -> int | None:
        """How many commits ``head`` has that ``base`` has not (None when either is unknown here)."""
        status, out, _ = self.git.attempt("rev-list", "--count", f"{base}..{head}")
        return int(out.strip()) if status == 0 and out.strip().isdigit() else None
