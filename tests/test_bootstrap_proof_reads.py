"""Issue 35, item 2: the allocation's proof proves what the bootstrap needs now.

(a) The live base already in the control checkout replaces the proof's ``git ls-remote`` (while the scheduled
transport check, /readyz's, last succeeded at that URL); a moved base, or a transport not known to work, asks git as
before, and the bootstrap fetches. (b) The allocation's own bootstrap uses the proof's Gitea reads (repository, base,
issue) while they are at most ``PROOF_READS_FRESH_S`` old, and reads them again past it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot import gitops
from bot.dashboard.board import health
from bot.gitea import Branch, GiteaClient, Issue, Repository
from bot.verbs.allocate import Allocator
from bot.verbs.bootstrap import BootstrapContext, bootstrap_preflight
from bot.verbs.bootstrap.checkout import check_transport
from bot.verbs.bootstrap.context import PROOF_READS_FRESH_S
from bot.verbs.bootstrap.service import bootstrap_for_owner
from state.db import utcnow
from state.leases import LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started, eventually
from tests.test_bootstrap_support import BootstrapWorld, open_bootstrap_world
from tests.world import open_world

#: The emulator's git smart HTTP route (its faults fail git's requests, not the API's).
GIT_ROUTE = "/{owner}/{repo}/{rest}"


@pytest.fixture
def git_commands(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, ...]]]:
    """Every git command foreman starts (its argv after ``git`` and the ``-c`` settings)."""
    started: list[tuple[str, ...]] = []
    real = subprocess.run

    def run(argv: Sequence[str], *args: Any, **kwargs: Any) -> Any:
        if argv and argv[0] == "git":
            rest = list(argv[1:])
            while rest and rest[0] == "-c":
                rest = rest[2:]
            started.append(tuple(rest))
        return real(argv, *args, **kwargs)

    monkeypatch.setattr("bot.gitops.runner.subprocess.run", run)
    yield started


def _named(commands: list[tuple[str, ...]], name: str) -> list[tuple[str, ...]]:
    return [c for c in commands if c and c[0] == name]


async def _transport_checked(w: BootstrapWorld) -> None:
    result = await check_transport(w.ctx)
    assert result is not None and result.ok, result


async def test_the_base_already_fetched_needs_no_ls_remote(git_commands: list[tuple[str, ...]]) -> None:
    """The live base is the control checkout's tracking ref and the transport check succeeded: the proof starts no
    ``ls-remote`` and proves ``base_known`` from the checkout."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await _transport_checked(w)
        git_commands.clear()
        proof = (await bootstrap_preflight(w.ctx, number, "alice")).to_dict()
        assert proof["ok"], proof
        assert _named(git_commands, "ls-remote") == [], git_commands
        assert proof["checks"]["base_known"]["git_source"] == "control_checkout"
        assert proof["checks"]["base_known"]["git_sha"] == w.main_sha()
        assert proof["checks"]["repo_reachable"]["checked_by"] == "control_checkout"


async def test_a_moved_base_asks_git_and_the_bootstrap_fetches(git_commands: list[tuple[str, ...]]) -> None:
    """The base moved on Gitea since the checkout's fetch: the proof runs ``ls-remote`` (git and the API agree on
    the new base) and the bootstrap fetches it, pinning the new base."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await _transport_checked(w)
        moved = w.move_main()
        git_commands.clear()
        proof = await bootstrap_preflight(w.ctx, number, "alice")
        assert proof.ok, proof.to_dict()
        assert len(_named(git_commands, "ls-remote")) == 1, git_commands
        assert proof.checks["base_known"].facts["git_source"] == "ls-remote"
        assert proof.base_sha == moved
        await w.lease(number)
        git_commands.clear()
        result = await bootstrap_for_owner(w.ctx, issue_number=number, owner="alice", proof_reads=proof.reads)
        assert result.status == "completed", result.to_dict()
        assert _named(git_commands, "fetch"), git_commands
        assert w.rows("SELECT base_sha FROM bootstrap_journal") == [(moved,)]
        assert gitops.ControlCheckout(w.checkout, env={}, timeout_s=30).read_ref("refs/remotes/origin/main") == moved


async def test_a_failing_transport_is_asked_again_and_refused(git_commands: list[tuple[str, ...]]) -> None:
    """The last transport check failed (git answers 401): although the base did not move, the proof asks git
    itself and refuses as before (``repo_reachable``: ``not_authorized`` / ``clone_auth_failed``)."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await _transport_checked(w)
        w.live.emulator.faults.fail("*", GIT_ROUTE, status=401, times=100, message="Unauthorized")
        failed = await check_transport(w.ctx)
        assert failed is not None and not failed.ok and failed.reason == "clone_auth_failed", failed
        git_commands.clear()
        proof = (await bootstrap_preflight(w.ctx, number, "alice")).to_dict()
        reach = proof["checks"]["repo_reachable"]
        assert not proof["ok"] and not reach["ok"], proof
        assert reach["error"] == "not_authorized" and reach["reason"] == "clone_auth_failed", reach
        assert len(_named(git_commands, "ls-remote")) == 1, git_commands


async def test_a_stale_transport_check_is_not_trusted(git_commands: list[tuple[str, ...]]) -> None:
    """A success older than ``TRANSPORT_TRUSTED_FOR_S`` (the schedule stopped) is not trusted: ls-remote runs."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await _transport_checked(w)
        check = gitops.transport_check(w.checkout)
        assert check.latest is not None
        check.record(replace(check.latest, checked_at=time.time() - 3600))
        git_commands.clear()
        assert (await bootstrap_preflight(w.ctx, number, "alice")).ok
        assert len(_named(git_commands, "ls-remote")) == 1, git_commands


# --- (b) the proof's reads, reused by the allocation's bootstrap within the bound -------------------------------------


class CountingGitea:
    """The bot's client, each call counted by name (``get_branch`` by branch)."""

    def __init__(self, inner: GiteaClient) -> None:
        self.inner = inner
        self.calls: list[str] = []

    async def get_repo(self) -> Repository:
        self.calls.append("get_repo")
        return await self.inner.get_repo()

    async def get_branch(self, name: str) -> Branch:
        self.calls.append(f"get_branch:{name}")
        return await self.inner.get_branch(name)

    async def get_issue(self, number: int) -> Issue:
        self.calls.append("get_issue")
        return await self.inner.get_issue(number)

    async def set_assignees(self, number: int, logins: Sequence[str]) -> Issue:
        self.calls.append("set_assignees")
        return await self.inner.set_assignees(number, logins)


def _acceptance_calls(counting: CountingGitea, branch: str) -> list[str]:
    """The calls up to the acceptance's read of the issue's branch (the binding's come after it)."""
    return counting.calls[: counting.calls.index(f"get_branch:{branch}") + 1]


def _counting(w: BootstrapWorld) -> tuple[BootstrapContext, CountingGitea]:
    counting = CountingGitea(w.gitea)
    return replace(w.ctx, gitea=counting), counting


async def test_the_bootstrap_reuses_the_proofs_reads_within_the_bound() -> None:
    async with open_bootstrap_world() as w:
        number = w.issue()
        ctx, counting = _counting(w)
        proof = await bootstrap_preflight(ctx, number, "alice")
        assert proof.ok and proof.reads is not None, proof.to_dict()
        await w.lease(number)
        counting.calls.clear()
        result = await bootstrap_for_owner(ctx, issue_number=number, owner="alice", proof_reads=proof.reads)
        assert result.status == "completed", result.to_dict()
        # The acceptance asks Gitea only for the issue's branch; the binding reads the assignees itself after.
        assert _acceptance_calls(counting, w.branch(number)) == [f"get_branch:{w.branch(number)}"], counting.calls
        assert "get_repo" not in counting.calls and "get_branch:main" not in counting.calls, counting.calls
        assert w.rows("SELECT base_sha FROM bootstrap_journal") == [(proof.base_sha,)]


async def test_the_bootstrap_reads_again_past_the_bound() -> None:
    """Reads older than ``PROOF_READS_FRESH_S`` are read again, and what changed since counts: the issue closed
    after the proof is refused as before."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        ctx, counting = _counting(w)
        proof = await bootstrap_preflight(ctx, number, "alice")
        assert proof.ok and proof.reads is not None, proof.to_dict()
        old = replace(proof.reads, asked_at=time.monotonic() - PROOF_READS_FRESH_S - 1.0)
        w.live.emulator.edit_issue(OWNER, REPO, number, actor="alice", state="closed")
        await w.lease(number)
        counting.calls.clear()
        result = await bootstrap_for_owner(ctx, issue_number=number, owner="alice", proof_reads=old)
        assert {"get_repo", "get_issue", "get_branch:main"} <= set(counting.calls), counting.calls
        assert result.status == "refused" and result.refusal is not None, result.to_dict()
        assert result.refusal.error == "invalid_state" and "closed" in result.refusal.message, result.to_dict()


async def test_reads_of_another_issue_are_not_reused() -> None:
    async with open_bootstrap_world() as w:
        first, number = w.issue(), w.issue("Another one")
        ctx, counting = _counting(w)
        proof = await bootstrap_preflight(ctx, first, "alice")
        assert proof.reads is not None
        await w.lease(number)
        counting.calls.clear()
        result = await bootstrap_for_owner(ctx, issue_number=number, owner="alice", proof_reads=proof.reads)
        assert result.status == "completed", result.to_dict()
        branch = w.branch(number, "Another one")
        assert {"get_repo", "get_issue", "get_branch:main"} <= set(_acceptance_calls(counting, branch)), counting.calls


def test_the_bound_is_a_few_seconds() -> None:
    assert 0 < PROOF_READS_FRESH_S <= 10



# --- /readyz: the transport check, scheduled, bounded, shown ----------------------------------------------------------


async def test_readyz_shows_a_failing_git_transport(tmp_path: Path, start: Started) -> None:
    """foreman serve checks each served repository's git transport on a schedule (at start first): /readyz shows the
    latest result with its age, and a failing one (git answers 401 to the bot's token) with its reason, and so does
    the dashboard's health strip (the same document)."""
    async with open_world(tmp_path, start) as w:
        key = w.service.served.first_key
        assert key is not None

        async def checks() -> dict[str, Any]:
            found: dict[str, Any] = (await (await w.client.get("/readyz")).json())["checks"]
            return found

        async def checked() -> bool:
            return (await checks())["git_transport"].get("ok") is not None

        await eventually(checked, "the start-up transport check")
        shown = await checks()
        assert shown["git_transport"]["ok"] is True, shown["git_transport"]
        assert shown["repositories"][key]["git_transport"]["ok"] is True
        w.live.emulator.faults.fail("*", GIT_ROUTE, status=401, times=100, message="Unauthorized")
        await w.service.check_transports()
        doc = await (await w.client.get("/readyz")).json()
        transport = doc["checks"]["git_transport"]
        assert transport["ok"] is False and transport["reason"] == "clone_auth_failed", transport
        assert transport["age_s"] >= 0 and transport["interval_s"] > 0, transport
        assert doc["checks"]["repositories"][key]["git_transport"]["ok"] is False
        strip = health(doc, key, datetime.now(UTC))
        assert any(c["name"] == "git" and c["ok"] is False for c in strip["checks"]), strip
        assert any(reason.startswith("git:") for reason in strip["reasons"]), strip


async def test_one_transport_check_at_a_time() -> None:
    """A check asked for while one runs starts no second git: it answers None (the running one's result will be
    the latest)."""
    async with open_bootstrap_world() as w:
        check = gitops.transport_check(w.checkout)
        with check._running:  # a check in progress
            assert await check_transport(w.ctx) is None
        assert (await check_transport(w.ctx)) is not None


# --- the apply's candidates: no duplicate read for what the owner may not take ---------------------------------------


class CandidateGitea(CountingGitea):
    """The counting client with the candidate reads the allocator makes."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_an_owners_own_released_issues_are_not_read_for_duplicates() -> None:
    """An issue its owner released is barred for that owner (``self_review``, decided before a duplicate finding):
    its branch is not read for that owner's candidates, but it is for anyone else's, and another candidate's
    duplicate finding is still made."""
    async with open_bootstrap_world() as w:
        w.live.emulator.create_label(OWNER, REPO, "status:ready", color="#00aa00")
        given_up, other, duplicate = (w.issue(title) for title in ("Given up", "Other", "Duplicate"))
        for number in (given_up, other, duplicate):
            w.live.emulator.add_labels(OWNER, REPO, number, ["status:ready"], actor="alice")
        w.live.emulator.create_branch(OWNER, REPO, w.branch(duplicate, "Duplicate"), files={"x.txt": "x"})
        lease = await w.lease(given_up)
        async with w.db.transaction() as conn:
            await LeaseStore(w.db).release(conn, lease.lease_id, actor="alice", reason="gave up", now=utcnow())
        counting = CandidateGitea(w.gitea)
        allocator = Allocator(w.db, w.settings, counting, bot_login=w.ctx.bot_login)
        records, _ = await allocator.gather_candidates(owner="alice")
        by_number = {r["issue_number"]: r for r in records}
        assert f"get_branch:{w.branch(given_up, 'Given up')}" not in counting.calls, counting.calls
        assert f"get_branch:{w.branch(other, 'Other')}" in counting.calls, counting.calls
        assert by_number[given_up]["barred_owners"] == ["alice"] and "duplicate" not in by_number[given_up]
        assert "duplicate" in by_number[duplicate] and "duplicate" not in by_number[other]
        counting.calls.clear()
        for_bob, _ = await allocator.gather_candidates(owner="bob")
        assert f"get_branch:{w.branch(given_up, 'Given up')}" in counting.calls, counting.calls
        assert [r["issue_number"] for r in records] == [r["issue_number"] for r in for_bob]  # Gitea's order
