"""Teardown meets a worktree whose ``.git`` file the agent rewrote (issue 29, item 1): git is never run on it, the
worktree is kept as it is, and the final evidence says why and how an operator restores it. On 2dbfe3f teardown's
``git status`` in the worktree ran the ``core.fsmonitor`` of the repository the file named."""

from __future__ import annotations

import stat
from pathlib import Path

from bot.core.teardown import WorktreeFacts, decide_worktree
from tests.test_bootstrap_support import git
from tests.test_teardown import bootstrapped, evidence_of, merge, open_pull, teardown_comments, world
from tests.world import World

__all__ = ["world"]  # the fixture, as tests/test_teardown.py makes it


async def test_a_worktree_whose_git_file_names_another_repository_is_kept_and_nothing_runs(
    world: World, tmp_path: Path
) -> None:
    number, transition = await bootstrapped(world)
    worktree = Path(transition.worktree_path)
    marker, program = tmp_path / "fsmonitor-ran", tmp_path / "agent-fsmonitor"
    program.write_text(f"#!/bin/sh\necho ran >> {marker}\nexit 1\n", encoding="utf-8")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    attacker = tmp_path / "agent-repo"
    attacker.mkdir()
    git(attacker, "init", "-q", "-b", transition.branch)
    git(attacker, "config", "core.fsmonitor", str(program))
    (worktree / ".git").write_text(f"gitdir: {attacker / '.git'}\n", encoding="utf-8")
    pr = await open_pull(world, number, transition)
    await merge(world, pr)
    assert not marker.exists(), "the agent's core.fsmonitor ran during teardown"
    assert worktree.is_dir() and (worktree / ".git").read_text(encoding="utf-8").endswith("agent-repo/.git\n")
    [final] = teardown_comments(world, number)
    kept = evidence_of(final)["worktree"]
    assert kept["action"] == "kept" and "foreman runs no git command" in kept["reason"], kept
    assert "an operator restores it with: rm -rf -- " in kept["reason"]


def test_a_refused_worktree_is_kept_whatever_else_is_true() -> None:
    refused = WorktreeFacts(path="/w", exists=True, created_by_foreman=True, status=(), head="a" * 40,
                            merged_head="a" * 40, head_in_default=True, refused="its .git file changed")
    decision = decide_worktree(refused, remove_enabled=True)
    assert decision.action == "keep" and "its .git file changed" in decision.reason
