"""The bootstrap's git proofs read the issue's own branch and worktree, not every one (issue 19, item 3 "flat"),
and refuse what they refused before: another branch of the issue, a stale registration at the path."""

from __future__ import annotations

import shutil
import sys
from typing import Any

from tests.test_bootstrap_support import git, open_bootstrap_world

#: git command lines started while ``_RECORDING`` is on.
_COMMANDS: list[list[str]] = []
_RECORDING: list[bool] = [False]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _RECORDING[0] and event == "subprocess.Popen":
        argv = [str(a) for a in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
        if argv and argv[0].endswith("git"):
            _COMMANDS.append(argv[1:])


sys.addaudithook(_audit)


async def test_a_bootstrap_lists_neither_every_worktree_nor_every_branch() -> None:
    """The transition's proofs (control checkout refs, the issue's other branches, the path's registration, the
    worktree's read-back) read the ones they are about: no ``git worktree list`` and no ``git for-each-ref``
    (before: one listing of every worktree and one or two of every branch per transition), with other worktrees
    and branches present; and the proof still carries git's porcelain record of the new worktree."""
    async with open_bootstrap_world() as w:
        for i in range(3):
            git(w.checkout, "worktree", "add", "-q", "-b", f"filler-{i}", str(w.checkout / "branches" / f"f-{i}"))
        number = w.issue()
        await w.lease(number)
        _COMMANDS.clear()
        _RECORDING[0] = True
        try:
            result = await w.bootstrap(number)
        finally:
            _RECORDING[0] = False
        assert result.status == "completed", result.to_dict()
        commands = [" ".join(c) for c in _COMMANDS]
        assert commands and not [c for c in commands if "worktree list" in c or "for-each-ref" in c], commands
        listed = next(e for e in git(w.checkout, "worktree", "list", "--porcelain").split("\n\n")
                      if e.startswith(f"worktree {w.path(number)}\n"))
        assert result.proof["worktree"]["porcelain"] == listed.splitlines()


async def test_another_branch_of_the_issue_is_refused_loose_or_packed() -> None:
    """Amendment 6 (``ambiguous_branches``): an ``issue-<N>-*`` branch under another name, found among the issue's
    own branches whether its ref is a loose file or in packed-refs; a branch of issue N0 is not issue N's."""
    async with open_bootstrap_world() as w:
        loose, packed, neighbour = w.issue(), w.issue(), w.issue()
        git(w.checkout, "branch", f"issue-{loose}-an-older-title", "origin/main")
        git(w.checkout, "branch", f"issue-{packed}-an-older-title", "origin/main")
        git(w.checkout, "branch", f"issue-{neighbour}0-not-this-one", "origin/main")
        git(w.checkout, "pack-refs", "--all")
        git(w.checkout, "branch", f"issue-{loose}-another-title", "origin/main")
        for number in (loose, packed):
            await w.lease(number)
            result = await w.bootstrap(number)
            assert result.status == "refused" and result.refusal is not None, result.to_dict()
            assert result.refusal.reason == "ambiguous_branches"
            assert f"issue-{number}-an-older-title" in result.refusal.message
        await w.lease(neighbour)
        assert (await w.bootstrap(neighbour)).status == "completed"


async def test_a_registration_moved_to_the_path_whose_directory_is_gone_is_refused_as_before() -> None:
    """Amendment 6 (``incompatible_registration``): git's metadata names the canonical path under another name (a
    worktree of another branch moved there, then its directory deleted). The direct read does not look under that
    name; git's add refuses the path, and the transition ends as it did when every registration was read: refused
    for that registration, compensation blocked (the registration kept byte for byte, the branch left)."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        path = w.path(number)
        elsewhere = w.checkout / "branches" / "somewhere-else"
        git(w.checkout, "worktree", "add", "-q", "-b", "hand-made", str(elsewhere))
        git(w.checkout, "worktree", "move", str(elsewhere), str(path))
        shutil.rmtree(path)
        admin = w.checkout / ".git" / "worktrees" / "somewhere-else"
        before = {p.name: p.read_bytes() for p in admin.iterdir() if p.is_file()}
        result = await w.bootstrap(number)
        assert result.status == "blocked" and result.refusal is not None, result.to_dict()
        assert result.refusal.reason == "compensation_blocked"
        assert result.proof["failure"]["details"]["reason"] == "incompatible_registration"
        assert result.proof["observed"]["worktree"]["registered_branch"] == "hand-made"
        assert result.proof["kept"] == ["worktree"] and result.proof["blocked"] == ["branch"]
        assert {p.name: p.read_bytes() for p in admin.iterdir() if p.is_file()} == before
