"""Git plumbing for emulated pull requests: refs, merge bases, conflict checks and merges in a bare repository."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ZERO_SHA: Final = "0" * 40


class MergeConflict(Exception):
    """The merge (or one rebased commit) does not apply cleanly."""


class RebaseConflict(MergeConflict):
    """One commit of a rebase does not apply (services/pull ``ErrRebaseConflicts``); ``commit`` is its sha."""

    def __init__(self, commit: str) -> None:
        super().__init__(f"commit {commit} does not apply")
        self.commit = commit


class DivergingFastForward(MergeConflict):
    """``fast-forward-only`` on a base that is not an ancestor of the head (``ErrMergeDivergingFastForwardOnly``)."""


class PushOutOfDate(Exception):
    """The branch moved between reading it and the compare-and-swap push (``git.ErrPushOutOfDate``)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who authors and commits a merge (the doer: services/pull/merge_prepare.go ``createTemporaryRepoForMerge``)."""

    name: str
    email: str


def _git(
    path: Path, *args: str, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(path), *args],
        capture_output=True,
        text=True,
        check=check,
        env={**os.environ, **(env or {})},
    )


#: The refs read from the repository's files (a branch and a pull request's head always name a commit here).
_FILE_REFS: Final = ("refs/heads/", "refs/pull/")
_OID: Final = re.compile(r"[0-9a-f]{40}")


def rev(path: Path, ref: str) -> str | None:
    """The commit sha ``ref`` names, or None. A branch or a pull request's head is read from the files git stored
    (the loose ref, else ``packed-refs``), with no process per read: Gitea resolves them in its long-running
    ``git cat-file --batch`` (modules/git ``GetRefCommitID``), not a ``git rev-parse`` each. Anything else (a sha,
    ``X^``, a symbolic or malformed ref file) is resolved by git."""
    if ref.startswith(_FILE_REFS) and ".." not in ref and "//" not in ref:
        found = _ref_file(path, ref)
        if not isinstance(found, _Unsure):
            return found
    done = _git(path, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return done.stdout.strip() or None


class _Unsure:
    """The ref files cannot tell (a symbolic ref, an unexpected file): git resolves it."""


_UNSURE: Final = _Unsure()


def _ref_file(path: Path, ref: str) -> str | _Unsure | None:
    try:
        text = (path / ref).read_text(encoding="ascii").strip()
    except FileNotFoundError:
        text = None
    except (OSError, UnicodeDecodeError):
        return _UNSURE
    if text is not None:
        return text if _OID.fullmatch(text) else _UNSURE
    try:
        packed = (path / "packed-refs").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        return _UNSURE
    for line in packed.splitlines():
        sha, _, name = line.partition(" ")
        if name == ref and _OID.fullmatch(sha):
            return sha
    return None


def branch_sha(path: Path, branch: str) -> str | None:
    """The head sha of ``refs/heads/<branch>``, or None."""
    return rev(path, f"refs/heads/{branch}")


def all_branches(path: Path) -> dict[str, str]:
    """Every branch and its sha."""
    out = _git(path, "for-each-ref", "--format=%(refname) %(objectname)", "refs/heads/").stdout
    refs = (line.split(" ", 1) for line in out.splitlines() if line)
    return {name.removeprefix("refs/heads/"): sha for name, sha in refs}


def merge_base(path: Path, a: str, b: str) -> str:
    """The best common ancestor of two commits ("" when none)."""
    return _git(path, "merge-base", a, b, check=False).stdout.strip()


def is_ancestor(path: Path, a: str, b: str) -> bool:
    return _git(path, "merge-base", "--is-ancestor", a, b, check=False).returncode == 0


def merged_tree(path: Path, base: str, head: str) -> str:
    """The tree of merging ``head`` into ``base`` (``git merge-tree --write-tree``); MergeConflict on conflicts."""
    done = _git(path, "merge-tree", "--write-tree", "--no-messages", base, head, check=False)
    if done.returncode == 1:
        raise MergeConflict(done.stdout.strip())
    done.check_returncode()
    return done.stdout.splitlines()[0].strip()


def can_merge(path: Path, base: str, head: str) -> bool:
    """Whether ``head`` merges into ``base`` without conflicts (services/pull/patch.go ``checkConflicts``)."""
    try:
        merged_tree(path, base, head)
    except MergeConflict:
        return False
    return True


def commits_between(path: Path, base: str, head: str) -> list[str]:
    """The commits reachable from ``head`` and not from ``base``, oldest first."""
    out = _git(path, "rev-list", "--reverse", "--topo-order", f"{base}..{head}").stdout
    return [line for line in out.splitlines() if line]


def _commit_env(author: Identity | None, committer: Identity) -> dict[str, str]:
    env = {"GIT_COMMITTER_NAME": committer.name, "GIT_COMMITTER_EMAIL": committer.email}
    who = author or committer
    return env | {"GIT_AUTHOR_NAME": who.name, "GIT_AUTHOR_EMAIL": who.email}


def commit_tree(path: Path, tree: str, parents: list[str], message: str, env: dict[str, str]) -> str:
    args = ["commit-tree", tree]
    for parent in parents:
        args += ["-p", parent]
    return _git(path, *args, "-m", message, env=env).stdout.strip()


def _original_env(path: Path, sha: str, committer: Identity) -> dict[str, str]:
    """A rebased commit keeps its author and date; the doer commits it."""
    fmt = _git(path, "show", "-s", "--format=%an%x00%ae%x00%aI%x00%B", sha).stdout
    name, email, date, message = fmt.split("\x00", 3)
    env = _commit_env(Identity(name, email), committer)
    return env | {"GIT_AUTHOR_DATE": date, "EMU_MESSAGE": message.rstrip("\n")}


def _pick_tree(path: Path, parent: str, onto: str, sha: str) -> str:
    """The tree of applying commit ``sha`` (whose parent is ``parent``) onto ``onto``: a three-way
    ``read-tree -m`` in a scratch index (git 2.39 has no ``merge-tree --merge-base``); a path changed on both
    sides is a conflict here (Gitea's rebase would try a content merge first)."""
    with tempfile.TemporaryDirectory(prefix="emu-pick-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(path, "read-tree", "-i", "-m", "--aggressive", parent, onto, sha, env=env)
        done = _git(path, "write-tree", env=env, check=False)
        if done.returncode != 0:
            raise RebaseConflict(sha)
        return done.stdout.strip()


def rebase_onto(path: Path, onto: str, base: str, head: str, committer: Identity) -> str:
    """Replay ``base..head`` onto ``onto`` one commit at a time (services/pull/merge_rebase.go); the new tip."""
    tip = onto
    for sha in commits_between(path, base, head):
        parent = rev(path, f"{sha}^") or ""
        tree = _pick_tree(path, parent, tip, sha)
        env = _original_env(path, sha, committer)
        message = env.pop("EMU_MESSAGE")
        tip = commit_tree(path, tree, [tip], message, env)
    return tip


def merge(
    path: Path,
    style: str,
    base_branch: str,
    head: str,
    message: str,
    doer: Identity,
    poster: Identity,
    *,
    before_push: Callable[[], None] | None = None,
) -> str:
    """Merge ``head`` into ``base_branch`` in ``style`` and move the branch; returns the new base tip.

    services/pull/merge.go ``doMergeAndPush`` and merge_{merge,rebase,squash,ff_only}.go: ``merge`` makes a merge
    commit (``--no-ff``), ``rebase`` replays the commits (fast-forward when already on top), ``rebase-merge``
    replays then makes a merge commit, ``squash`` one commit authored by the PR's poster, ``fast-forward-only``
    moves the branch only when it is an ancestor of the head. The push to the base branch is a compare-and-swap
    on the old tip (Gitea pushes without force; a moved base is PushOutOfDate). ``before_push`` runs right before
    that push (a test's concurrent push to the base).
    """
    base = branch_sha(path, base_branch)
    if base is None:
        raise MergeConflict(f"base branch {base_branch} does not exist")
    env = _commit_env(None, doer)
    if style == "merge":
        new = commit_tree(path, merged_tree(path, base, head), [base, head], message, env)
    elif style == "squash":
        squash_env = _commit_env(poster, doer)
        if poster != doer:
            # merge_squash.go: AddCoCommitterTrailers (default on) when the committer is not the author.
            who = f"{poster.name} <{poster.email}>"
            message = f"{message.rstrip()}\n\nCo-authored-by: {who}\nCo-committed-by: {who}"
        new = commit_tree(path, merged_tree(path, base, head), [base], message, squash_env)
    elif style in ("rebase", "rebase-merge"):
        start = merge_base(path, base, head)
        tip = head if is_ancestor(path, base, head) else rebase_onto(path, base, start, head, doer)
        if style == "rebase":
            new = tip
        else:
            new = commit_tree(path, merged_tree(path, base, tip), [base, tip], message, env)
    elif style == "fast-forward-only":
        if not is_ancestor(path, base, head):
            raise DivergingFastForward("fatal: Not possible to fast-forward, aborting.")
        new = head
    else:
        raise ValueError(f"unknown merge style {style!r}")
    if before_push is not None:
        before_push()
    move_branch(path, base_branch, new, base)
    return new


def move_branch(path: Path, branch: str, new: str, old: str) -> None:
    """Compare-and-swap ``refs/heads/<branch>`` from ``old`` to ``new``; PushOutOfDate when it moved meanwhile."""
    if _git(path, "update-ref", f"refs/heads/{branch}", new, old, check=False).returncode != 0:
        raise PushOutOfDate(branch)


def content_changed(path: Path, old: str, new: str, base: str) -> bool:
    """services/pull/pull.go ``checkIfPRContentChanged``: ``git diff --name-only -z new old merge-base`` (a
    combined diff: a file counts only when ``new`` differs from both ``old`` and the merge base) is not empty."""
    done = _git(path, "diff", "--name-only", "-z", new, old, base, check=False)
    if done.returncode != 0:
        return False
    return bool(done.stdout.strip("\0"))


def commits_behind(path: Path, base: str, head: str) -> int:
    """``GetDivergingCommits(...).Behind``: commits on ``base`` that ``head`` lacks."""
    out = _git(path, "rev-list", "--count", f"{head}..{base}", check=False).stdout.strip()
    return int(out) if out.isdigit() else 0


def set_ref(path: Path, ref: str, sha: str) -> None:
    """Point ``ref`` at ``sha``."""
    _git(path, "update-ref", ref, sha)


def rev_list(path: Path, tip: str, *, exclude: list[str], limit: int) -> list[str]:
    """Up to ``limit`` commits reachable from ``tip`` and from none of ``exclude``, newest first."""
    return _git(path, "rev-list", f"--max-count={limit}", tip, *[f"^{sha}" for sha in exclude]).stdout.split()


def delete_branch(path: Path, branch: str, old: str) -> None:
    """Remove ``refs/heads/<branch>`` if it still points at ``old``."""
    _git(path, "update-ref", "-d", f"refs/heads/{branch}", old)


def commit_facts(path: Path, shas: list[str]) -> list[dict[str, str | list[str]]]:
    """Per commit: message, author/committer name and e-mail, commit date, files added/removed/modified."""
    facts: list[dict[str, str | list[str]]] = []
    for sha in shas:
        out = _git(path, "show", "-s", "--format=%an%x00%ae%x00%cn%x00%ce%x00%cI%x00%B", sha).stdout
        an, ae, cn, ce, date, message = out.split("\x00", 5)
        status = _git(path, "diff-tree", "--no-commit-id", "-r", "--name-status", "--root", sha).stdout
        changed: dict[str, list[str]] = {"A": [], "D": [], "M": []}
        for line in status.splitlines():
            kind, _, name = line.partition("\t")
            changed.setdefault(kind[:1], []).append(name)
        facts.append(
            {
                "id": sha,
                "message": message.rstrip("\n") + "\n",
                "author_name": an,
                "author_email": ae,
                "committer_name": cn,
                "committer_email": ce,
                "timestamp": date,
                "added": changed["A"],
                "removed": changed["D"],
                "modified": changed["M"],
            }
        )
    return facts


def shortstat(path: Path, start: str, end: str) -> tuple[int, int, int]:
    """``git diff --shortstat start end``: files changed, insertions, deletions. Between two commit ids the answer
    never changes: it is kept (a pull request's JSON reads it on every GET)."""
    if _OID.fullmatch(start) and _OID.fullmatch(end):
        return _shortstat_of_commits(path, start, end)
    return _shortstat(path, start, end)


@functools.lru_cache(maxsize=4096)
def _shortstat_of_commits(path: Path, start: str, end: str) -> tuple[int, int, int]:
    return _shortstat(path, start, end)


def _shortstat(path: Path, start: str, end: str) -> tuple[int, int, int]:
    out = _git(path, "diff", "--shortstat", start, end, check=False).stdout
    numbers = [0, 0, 0]
    for part in out.split(","):
        words = part.split()
        if len(words) >= 2 and words[0].isdigit():
            slot = 0 if words[1].startswith("file") else 1 if words[1].startswith("insertion") else 2
            numbers[slot] = int(words[0])
    return numbers[0], numbers[1], numbers[2]


def changed_files(path: Path, start: str, end: str) -> list[tuple[str, str, int, int, str]]:
    """``git diff -M start end`` file by file, as services/gitdiff reads it: (name, status, additions, deletions,
    previous name of a rename). Status as ``ToChangedFile``: added, deleted, renamed, copied, else changed
    (unchanged: no line added or removed, a mode change). A binary file counts no lines."""
    names = _git(path, "diff", "-M", "--name-status", "-z", start, end, check=False).stdout.split("\0")
    counts = _git(path, "diff", "-M", "--numstat", "-z", start, end, check=False).stdout.split("\0")
    lines: list[tuple[int, int]] = []
    i = 0
    while i < len(counts) and counts[i]:
        added, deleted, rest = counts[i].split("\t", 2)
        lines.append((int(added) if added.isdigit() else 0, int(deleted) if deleted.isdigit() else 0))
        i += 1 if rest else 3  # a rename's numstat is "a\td\t" then the old and new names
    out: list[tuple[str, str, int, int, str]] = []
    i = 0
    while i < len(names) and names[i]:
        code = names[i][:1]
        if code in "RC":
            previous, name, i = names[i + 1], names[i + 2], i + 3
        else:
            previous, name, i = "", names[i + 1], i + 2
        plus, minus = lines[len(out)] if len(out) < len(lines) else (0, 0)
        status = {"A": "added", "D": "deleted", "R": "renamed", "C": "copied"}.get(code, "changed")
        if status == "changed" and plus == 0 and minus == 0:
            status = "unchanged"
        out.append((name, status, plus, minus, previous if code == "R" else ""))
    return out


def diff(path: Path, start: str, end: str) -> bytes:
    """``git diff -p start end`` (modules/git ``GetDiff``), as bytes."""
    done = subprocess.run(["git", "-C", str(path), "diff", "-p", start, end], capture_output=True, check=False)
    return done.stdout
