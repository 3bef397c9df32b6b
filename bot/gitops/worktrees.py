"""Work on worktrees: add one (registration, then checkout), commit what is in it, and remove it keeping what the
service cannot prove it made."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bot import worktree_access
from bot.gitops.errors import GitFailure, GitlinksStaged, WorktreeKept
from bot.gitops.registrations import WorktreeRegistrations


def staged_gitlinks(raw: str) -> list[str]:
    """The paths ``git diff --cached --raw -z`` shows with a new mode of 160000 (a gitlink added or changed)."""
    items = raw.split("\0")
    found: list[str] = []
    for meta, path in zip(items[::2], items[1::2], strict=False):
        fields = meta.split()
        if len(fields) >= 2 and fields[1] == "160000":
            found.append(path)
    return sorted(found)


def worktree_head(checkout: WorktreeRegistrations, path: Path) -> str | None:
    """The commit a worktree's HEAD is at (None: git cannot say; ``WorktreeRefused`` for a worktree git is not run
    on)."""
    status, out, _ = checkout.worktree_git(path).attempt("rev-parse", "--verify", "-q", "HEAD^{commit}")
    return out.strip() if status == 0 and out.strip() else None


def losses(status: Sequence[str]) -> list[str]:
    """What removing a worktree would lose, of its ``worktree_status``: everything but a file of its commit missing
    from the worktree (`` D``, which a removal killed half-way leaves; its content is the commit's)."""
    return [item for item in status if item[:2] != " D"]


class WorktreeOperations(WorktreeRegistrations):
    """Adding, checking out, committing in and removing the repository's worktrees."""

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

    def fast_forward_worktree(self, path: Path, sha: str) -> str | None:
        """Move a worktree's branch and files forward to ``sha``, a descendant of its HEAD (``git merge --ff-only
        --no-stat <sha>`` run there: a two-way checkout that carries uncommitted changes along and refuses, changing
        nothing, when one would be overwritten). No hook, filter or merge driver runs (the neutral configuration).
        None when done, else git's refusal (its last lines)."""
        status, _, err = self.worktree_git(path).attempt("merge", "--ff-only", "--no-stat", "--quiet", sha)
        return None if status == 0 else (err.strip() or f"git merge --ff-only exited {status}")[-400:]

    def detach_head(self, path: Path, message: str) -> str:
        """Detach a worktree's HEAD where it is (``update-ref --no-deref HEAD <its commit>``, only if HEAD still
        resolves there), so it holds no branch; its index and files are not touched. Returns the commit. Run on the
        worktree's own registration, verified first (``worktree_git``: ``WorktreeRefused`` if it is not foreman's)."""
        runner = self.worktree_git(path)
        head = runner.run("rev-parse", "--verify", "-q", "HEAD^{commit}").strip()
        runner.run("update-ref", "--no-deref", "-m", message, "HEAD", head, head)
        return head

    def move_worktree(self, path: Path, destination: Path) -> None:
        """``git worktree move --force --force <path> <destination>`` (the registration held alone): the worktree's
        files, index and registration move as they are, its lock with them (twice ``--force``: a locked worktree
        moves only so). Verified first (``WorktreeRefused``); git refuses a destination that exists (the caller
        checks that too: git would move the worktree into an existing directory)."""
        self.check_worktree(path)
        if os.path.lexists(destination):
            raise GitFailure(("worktree", "move", str(path), str(destination)), None, f"{destination} exists")
        self.git.run("worktree", "move", "--force", "--force", str(path), str(destination))

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
