"""Duplicate-work assessment against the emulator: each finding on its own, and the allocator's duplicate_work skip."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.catalog import open_door
from bot.core.bootstrap import branch_for
from bot.tasks import bounded_in_order
from bot.verbs.candidates import ready_candidates
from bot.verbs.duplicates import READS_AT_ONCE, closes, mark_duplicates
from bot.verbs.runtime import caller_for
from state.leases import LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started
from tests.test_publish import ROSTER, call_tool, leased_and_locked, worktree_of
from tests.world import FULL_NAME, World, open_world


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER, allocator={"auto": False}) as opened:
        yield opened


async def assess(world: World, login: str, number: int, phase: str = "pre_claim") -> dict[str, Any]:
    refused, doc = await call_tool(world, login, "gitea_assess_work_issue_duplicate", issue_number=number,
                                   phase=phase)
    assert not refused, doc
    return doc


async def dry_run(world: World) -> dict[str, Any]:
    service = world.service
    door = open_door(db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")
    result = await door.call("allocate_next_work", caller_for(service.settings, "controller-bot", "mcp"),
                             {"owner": "author-1", "dry_run": True})
    return result.doc


def skip_of(doc: dict[str, Any], number: int) -> dict[str, Any]:
    [skip] = [s for s in doc["skipped"] if s["issue_number"] == number]
    return dict(skip)


def test_closing_keywords_are_read_as_gitea_reads_them() -> None:
    assert closes("Closes #4, fixes #5 and Resolved: #6; see #7") == {4, 5, 6}
    assert closes("closes#8 prefixes#9") == set()


async def test_a_linked_open_pull_request_is_found_and_the_allocator_skips_the_issue(world: World) -> None:
    emu = world.live.emulator
    issue = emu.create_issue(OWNER, REPO, title="Linked", author="alice", labels=["status:ready"])
    emu.push_commit(OWNER, REPO, "alice-work", {"x.txt": "x\n"}, pusher="alice")
    pr = await world.gitea.create_pull("alice-work", title="Alice's fix", base="main", body=f"Fixes #{issue.number}")
    doc = await assess(world, "author-1", issue.number)
    assert doc["duplicate"] and [f["kind"] for f in doc["findings"]] == ["linked_open_pr"], doc
    assert doc["findings"][0]["evidence"]["pull_request"] == pr.number and doc["findings"][0]["evidence"]["closes"]
    skip = skip_of(await dry_run(world), issue.number)
    assert skip["reason"] == "duplicate_work" and f"#{pr.number}" in skip["detail"], skip
    await world.comment("controller-bot", issue.number, "/allocate --owner author-1")
    assert await LeaseStore(world.service.db).history(FULL_NAME, issue.number) == []


async def test_a_conflicting_branch_is_found_and_the_allocator_skips_the_issue(world: World) -> None:
    emu = world.live.emulator
    issue = emu.create_issue(OWNER, REPO, title="Branch taken", author="alice", labels=["status:ready"])
    branch = branch_for(issue.number, "Branch taken")
    sha = emu.push_commit(OWNER, REPO, branch, {"y.txt": "y\n"}, pusher="alice")
    doc = await assess(world, "author-2", issue.number)
    assert [f["kind"] for f in doc["findings"]] == ["conflicting_branch"], doc
    assert doc["findings"][0]["evidence"] == {"branch": branch, "sha": sha}
    skip = skip_of(await dry_run(world), issue.number)
    assert skip["reason"] == "duplicate_work" and branch in skip["detail"], skip


async def test_an_active_claim_is_found_and_our_own_published_branch_is_no_conflict(world: World) -> None:
    number = await leased_and_locked(world)
    doc = await assess(world, "author-2", number)
    [claim] = doc["findings"]
    assert claim["kind"] == "active_claim" and claim["evidence"]["owner"] == "author-1", doc
    worktree, _ = await worktree_of(world, number)
    (worktree / "z.txt").write_text("z\n", encoding="utf-8")
    refused, published = await call_tool(world, "author-1", "gitea_publish_worktree", issue_number=number,
                                         message="Z")
    assert not refused, published
    # Before its PR the owner's own lease and own pushed branch are no duplicate work.
    assert (await assess(world, "author-1", number, "pre_pr"))["findings"] == []
    kinds = [f["kind"] for f in (await assess(world, "author-2", number))["findings"]]
    assert kinds == ["active_claim"]
    await call_tool(world, "author-1", "gitea_open_pull_request", issue_number=number)
    kinds = [f["kind"] for f in (await assess(world, "author-1", number, "pre_pr"))["findings"]]
    assert kinds == ["linked_open_pr"]


async def test_an_issue_with_no_duplicate_work_has_no_findings(world: World) -> None:
    issue = world.live.emulator.create_issue(OWNER, REPO, title="Fresh", author="alice", labels=["status:ready"])
    doc = await assess(world, "controller-bot", issue.number)
    assert doc == {**doc, "duplicate": False, "findings": [], "unchecked": []}
    assert all(s["issue_number"] != issue.number for s in (await dry_run(world))["skipped"])


class InFlight:
    """The service's Gitea client, counting its branch reads in flight (the reads themselves go to the emulator)."""

    def __init__(self, gitea: Any) -> None:
        self.gitea, self.now, self.most = gitea, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.gitea, name)

    async def get_branch(self, name: str) -> Any:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await self.gitea.get_branch(name)
        finally:
            self.now -= 1


async def test_the_candidates_are_assessed_a_few_at_a_time_and_kept_in_order(world: World) -> None:
    """A backlog's assessments overlap, at most READS_AT_ONCE at a time (one after another, 200 ready issues cost
    1.6 s per candidate read against a Gitea answering in 5 ms); the candidates keep their order and their findings."""
    emu = world.live.emulator
    numbers = [emu.create_issue(OWNER, REPO, title=f"Backlog {i}", author="alice", labels=["status:ready"]).number
               for i in range(24)]
    taken = numbers[5]
    emu.push_commit(OWNER, REPO, branch_for(taken, "Backlog 5"), {"y.txt": "y\n"}, pusher="alice")
    emu.faults.delay("GET", "/repos/{owner}/{repo}/branches/{branch}", 0.02)  # reads in flight long enough to meet
    counting = InFlight(world.gitea)
    gathered = await ready_candidates(world.gitea)
    records, _ = await mark_duplicates(world.service.db, FULL_NAME, counting, gathered)
    assert 1 < counting.most <= READS_AT_ONCE
    assert [r["issue_number"] for r in records] == [r["issue_number"] for r in gathered[0]]
    assert sorted(r["issue_number"] for r in records) == numbers
    assert [r["issue_number"] for r in records if r.get("duplicate")] == [taken]


async def test_bounded_reads_raise_the_first_failure_in_order_once_every_read_ended() -> None:
    """As the loop they replace: the first item's failure (in order, not in time), and nothing left running."""
    ended: list[int] = []

    async def read(item: int) -> int:
        await asyncio.sleep(0.03 if item == 2 else 0.0)
        ended.append(item)
        if item in (2, 3):
            raise ValueError(f"read {item}")
        return item * 10

    assert await bounded_in_order(read, [1, 4, 5], at_once=2) == [10, 40, 50]
    ended.clear()
    with pytest.raises(ValueError, match="read 2"):
        await bounded_in_order(read, [1, 2, 3, 4], at_once=2)
    assert sorted(ended) == [1, 2, 3, 4]
