"""Work in one worktree: its HEAD, what removing it would lose, and the gitlinks a commit must not take."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.gitops.control import ControlCheckout


def staged_gitlinks(raw: str) -> list[str]:
    """The paths ``git diff --cached --raw -z`` shows with a new mode of 160000 (a gitlink added or changed)."""
    items = raw.split("\0")
    found: list[str] = []
    for meta, path in zip(items[::2], items[1::2], strict=False):
        fields = meta.split()
        if len(fields) >= 2 and fields[1] == "160000":
            found.append(path)
    return sorted(found)


def worktree_head(checkout: ControlCheckout, path: Path) -> str | None:
    """The commit a worktree's HEAD is at (None: git cannot say; ``WorktreeRefused`` for a worktree git is not run
    on)."""
    status, out, _ = checkout.worktree_git(path).attempt("rev-parse", "--verify", "-q", "HEAD^{commit}")
    return out.strip() if status == 0 and out.strip() else None


def losses(status: Sequence[str]) -> list[str]:
    """What removing a worktree would lose, of its ``worktree_status``: everything but a file of its commit missing
    from the worktree (`` D``, which a removal killed half-way leaves; its content is the commit's)."""
    return [item for item in status if item[:2] != " D"]
