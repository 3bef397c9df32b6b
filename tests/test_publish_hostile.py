"""The issue 29 item 1 attack through a real `foreman serve` and the ``/publish`` comment command: the worktree's
``.git`` file pointed at a repository whose config sets ``core.fsmonitor``. On 2dbfe3f the program ran as the user
of `foreman serve` (in git status, add, diff and commit) and the publication was left at ``committed`` with a commit
the control checkout did not have; now it never runs and the publish is refused typed, naming the next action."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.config_writer import write_config
from bot.core.evidence import find_marker, parse_evidence
from tests.gitea_fixtures import BOT, OWNER, REPO, seed_foreman
from tests.serve_support import Served, served_emulator
from tests.support import SECRET
from tests.test_bootstrap_support import git
from tests.world import EXTRA_TOKENS

pytestmark = [pytest.mark.process]

ROSTER = {"controller-bot": ["controller"], "author-1": ["author"]}


class Commanded(Served):
    """A `foreman serve` of acme/widgets, its hook, and the comment commands its users post."""

    async def comment(self, login: str, number: int, body: str) -> int:
        comment = self.live.emulator.create_comment(OWNER, REPO, number, author=login, body=body, notify=True)
        await self.live.emulator.drain_webhooks()
        return comment.id

    def reply(self, number: int, comment_id: int) -> dict[str, Any] | None:
        """The evidence of the bot's reply to one comment command (None: not there yet)."""
        return next((parse_evidence(c.body) for c in self.live.emulator.issue(OWNER, REPO, number).comments
                     if c.poster.login == BOT and find_marker(c.body) == f"command:{comment_id}:reply"), None)


@pytest.fixture
async def served() -> AsyncIterator[Commanded]:
    """A running `foreman serve` of acme/widgets with its roster, and the repository's hook to it."""
    async with served_emulator("foreman-hostile-", clone_protocol="http") as (live, proc):
        seed_foreman(live.emulator, {login: EXTRA_TOKENS[login] for login in ROSTER})
        write_config(proc.config, proc.serve_document(live.base_url, {
            "outbox": {"poll_interval_s": 0.05, "backoff_base_s": 0.05, "backoff_max_s": 0.5},
            "reconcile": {"interval_s": 0}, "roster": ROSTER}))
        live.emulator.add_hook(OWNER, REPO, url=proc.hook_url, secret=SECRET, events=["issues", "issue_comment"])
        await proc.serve()
        yield Commanded(live, proc)


async def test_core_fsmonitor_named_through_the_worktree_git_file_never_runs_in_serve_and_publish_is_refused(
    served: Commanded,
) -> None:
    s = served
    issue = s.live.emulator.create_issue(OWNER, REPO, title="Add a feature", author="alice",
                                         labels=["status:ready"], notify=True)
    await s.live.emulator.drain_webhooks()
    await s.comment("controller-bot", issue.number, "/allocate --owner author-1")
    await s.wait(lambda: bool(s.db("SELECT 1 FROM worktree_registrations WHERE ended_at IS NULL")), "the bootstrap")
    lock = await s.comment("author-1", issue.number, "/lock")
    await s.wait(lambda: s.reply(issue.number, lock) is not None, "the reply to /lock")
    [(worktree_path, branch)] = s.db("SELECT worktree_path, branch FROM worktree_registrations")
    worktree = Path(worktree_path)

    # The agent, owning its worktree: a repository of its own whose config names a program, and the worktree's
    # .git file pointed at it.
    marker = s.root / "fsmonitor-ran"
    program = s.root / "agent-fsmonitor"
    program.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 1\n", encoding="utf-8")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    attacker = s.root / "agent-repo"
    attacker.mkdir()
    git(attacker, "init", "-q", "-b", branch)
    git(attacker, "config", "core.fsmonitor", str(program))
    written_by_git = (worktree / ".git").read_text(encoding="utf-8")
    (worktree / ".git").write_text(f"gitdir: {attacker / '.git'}\n", encoding="utf-8")
    (worktree / "feature.txt").write_text("a feature\n", encoding="utf-8")

    publish = await s.comment("author-1", issue.number, "/publish Add the feature")
    await s.wait(lambda: s.reply(issue.number, publish) is not None or marker.exists(), "the reply to /publish")

    assert not marker.exists(), "the agent's core.fsmonitor ran in foreman serve"
    evidence = s.reply(issue.number, publish)
    assert evidence is not None and "refusal" in evidence, evidence
    refusal = evidence["refusal"]
    assert refusal["error"] == "invalid_state" and ".git" in refusal["message"], refusal
    assert refusal["exact_next_action"].startswith(f"call gitea_post_issue_state with issue_number={issue.number}")
    assert refusal["details"]["restore"] and refusal["details"]["worktree"] == worktree_path, refusal
    # Refused before any git ran: no publication started, nothing committed or pushed.
    assert s.db("SELECT phase FROM publications") == []
    bare = s.live.emulator.repo(OWNER, REPO).path
    assert git(bare, "rev-parse", "--verify", "-q", f"refs/heads/{branch}", check=False) == ""
    assert git(attacker, "rev-list", "--all") == ""

    # The operator's restore command (named in the refusal) puts back what git wrote; the publish then goes through.
    proc = await asyncio.create_subprocess_exec("sh", "-c", refusal["details"]["restore"])
    assert await proc.wait() == 0
    assert (worktree / ".git").read_text(encoding="utf-8") == written_by_git
    await s.comment("author-1", issue.number, "/publish Add the feature")
    await s.wait(lambda: s.db("SELECT phase FROM publications") == [("verified",)], "the publish after the restore")
    assert not marker.exists()
