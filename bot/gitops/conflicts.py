"""Which files conflict when a pull request's head merges into its base, as the control checkout's git sees it."""

from __future__ import annotations

from bot.gitops.control import ControlCheckout


def conflicting_files(checkout: ControlCheckout, base: str, head: str, *, limit: int = 50) -> list[str] | None:
    """The paths that conflict merging ``head`` into ``base`` (``git merge-tree --write-tree --name-only``, git
    2.38+: nothing is written but objects): [] when it merges cleanly, None when git cannot tell (a commit it does
    not have, an old git). At most ``limit`` paths."""
    status, out, _ = checkout.git.attempt("merge-tree", "--write-tree", "--name-only", "--no-messages", base, head)
    if status not in (0, 1):
        return None
    lines = out.splitlines()
    if status == 0:
        return []
    files = [line for line in lines[1:] if line.strip()]
    return list(dict.fromkeys(files))[:limit]
