"""What the teardown asks of the control checkout: history between commits, a clean removal, a closed PR's head."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from bot.gitops.control import ControlCheckout
from bot.gitops.errors import GitFailure


def is_ancestor(checkout: ControlCheckout, commit: str, of: str) -> bool:
    """``git merge-base --is-ancestor``: ``commit`` is contained in ``of`` (False also when either is unknown)."""
    status, _, _ = checkout.git.attempt("merge-base", "--is-ancestor", commit, of)
    return status == 0


def commit_subjects(checkout: ControlCheckout, base: str, head: str, *, limit: int = 100) -> list[tuple[str, str]]:
    """(sha, subject) of the commits in ``base..head``, oldest first ([] when git does not know them)."""
    status, out, _ = checkout.git.attempt(
        "log", "--reverse", f"--max-count={limit}", "--format=%H%x09%s", f"{base}..{head}", "--"
    )
    if status != 0:
        return []
    return [(sha, subject) for sha, _, subject in (line.partition("\t") for line in out.splitlines()) if sha]


def remove_clean_worktree(checkout: ControlCheckout, path: Path, lock_reason: str) -> None:
    """Unlock and remove a worktree without ``force``: ``remove_worktree`` refuses if anything appeared in it since
    it was judged clean (then it is locked again with the same reason, kept, and GitFailure says why). A worktree
    whose ``.git`` file or registration changed is refused before it is unlocked (``WorktreeRefused``)."""
    if os.path.lexists(path):
        checkout.check_worktree(path)
    checkout.unlock_worktree(path)
    try:
        checkout.remove_worktree(path, force=False)
    except GitFailure:
        checkout.git.attempt("worktree", "lock", "--reason", lock_reason, str(path))
        raise


def fetch_pull_head(checkout: ControlCheckout, number: int, *, auth: Mapping[str, str]) -> str | None:
    """The head a pull request had when it closed: Gitea's ``refs/pull/<n>/head``, which a later push to the
    branch does not move once the PR is closed (None: it could not be fetched)."""
    local = f"refs/foreman/pull/{int(number)}"
    status, _, _ = checkout.git.attempt(
        "fetch", "--quiet", "--no-tags", "origin", f"+refs/pull/{int(number)}/head:{local}", extra_env=auth
    )
    return checkout.rev(local) if status == 0 else None


def fetch_base_and_pull_head(
    checkout: ControlCheckout, default_branch: str, number: int, *, auth: Mapping[str, str]
) -> str | None:
    """``ControlCheckout.fetch`` of the default branch and ``fetch_pull_head`` of PR ``number`` in one exchange
    with Gitea (one git process, one pack): the closed head, or None when the one fetch failed (then neither ref
    may have moved; the caller fetches them one by one, as each may fail on its own)."""
    local = f"refs/foreman/pull/{int(number)}"
    status, _, _ = checkout.git.attempt(
        "fetch", "--quiet", "--no-tags", "origin", f"+refs/heads/{default_branch}:refs/remotes/origin/{default_branch}",
        f"+refs/pull/{int(number)}/head:{local}", extra_env=auth,
    )
    return checkout.read_ref(local) if status == 0 else None
