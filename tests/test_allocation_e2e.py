"""Allocation end to end: `/allocate` → webhook → worker → lease → outbox → Gitea, every effect read back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.core.evidence import find_marker
from state.leases import LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started
from tests.world import FULL_NAME, World, open_world

ROSTER = {"controller-bot": ["controller"], "author-1": ["author"]}


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER) as opened:
        emu = opened.live.emulator
        emu.create_label(OWNER, REPO, "priority:p1", color="#aa0000")
        # #1 ready, no priority; #2 ready p0 but depends on the open #3; #3 open, not ready; #4 a ready PR;
        # #5 ready p1: the one to lease.
        emu.create_issue(OWNER, REPO, title="plain", author="alice", labels=["status:ready"])
        emu.create_issue(
            OWNER, REPO, title="held", author="alice", body="Depends: #3", labels=["status:ready", "priority:p0"]
        )
        emu.create_issue(OWNER, REPO, title="dependency", author="alice")
        emu.create_issue(OWNER, REPO, title="a PR", author="alice", labels=["status:ready"], pull=True)
        emu.create_issue(OWNER, REPO, title="next", author="alice", labels=["status:ready", "priority:p1"])
        yield opened


def bodies(world: World, number: int) -> list[str]:
    issue = world.live.emulator.issue(OWNER, REPO, number)
    return [c.body for c in issue.comments if c.kind == "comment"]


async def test_a_controllers_allocate_comment_leases_the_top_gitea_candidate_and_proves_it(world: World) -> None:
    """Candidates come from Gitea (ready issues, not PRs, dependency holds); the lease,
    the status label, the assignee and the evidence comment all land, and the issue's state follows."""
    await world.comment("controller-bot", 1, "/allocate")
    leases = await LeaseStore(world.service.db).open_leases(FULL_NAME)
    assert [(lease.issue_number, lease.owner) for lease in leases] == [(5, "author-1")]
    emu = world.live.emulator
    assert "status:in-progress" in emu.label_names(OWNER, REPO, 5)
    assert "status:ready" not in emu.label_names(OWNER, REPO, 5)
    assert [u.login for u in emu.issue(OWNER, REPO, 5).assignees] == ["author-1"]
    # The lease's evidence, then (the bootstrap runs with the allocation by default) the bootstrap's.
    evidence, bootstrapped = bodies(world, 5)
    assert find_marker(evidence) == f"{leases[0].lease_id}:evidence"
    assert (find_marker(bootstrapped) or "").startswith("bootstrap-5-")
    # The bot's own state comment became #5's current state (through the outbox's completion hook).
    snapshot = await world.snapshot(5)
    assert snapshot.state is not None and (snapshot.state.state, snapshot.state.who_is_next) == (
        "in-progress",
        "author",
    )
    # The reply on #1 names the decision and the skipped candidates' reasons.
    reply = bodies(world, 1)[-1]
    assert find_marker(reply) is not None and find_marker(reply).startswith("command:")  # type: ignore[union-attr]
    assert "#5" in reply and "dependency_open" in reply
    for entry in await world.service.outbox.list():
        assert entry.status == "done", entry.summary()


async def test_a_dry_run_command_replies_without_leasing(world: World) -> None:
    """`/allocate --dry-run` reports what would be leased and leases nothing."""
    await world.comment("controller-bot", 1, "/allocate --dry-run --exclude 5")
    assert await LeaseStore(world.service.db).open_leases(FULL_NAME) == []
    reply = bodies(world, 1)[-1]
    assert "Dry run" in reply and "would lease #1" in reply and "excluded_by_controller" in reply


async def test_someone_who_is_not_a_controller_gets_a_not_authorized_reply(world: World) -> None:
    """Only controllers allocate; others get a not_authorized reply through the outbox."""
    await world.comment("alice", 1, "/allocate")
    assert await LeaseStore(world.service.db).open_leases(FULL_NAME) == []
    reply = bodies(world, 1)[-1]
    assert "not_authorized" in reply and "**Next action:**" in reply


async def test_auto_allocation_leases_when_an_issue_turns_ready(tmp_path: Path, start: Started) -> None:
    """With `auto_allocate_owner` set, a maintainer's `status:ready` label starts the loop:
    the top ready issue is leased once, even when the label event is delivered again."""
    async with open_world(tmp_path, start, roster=ROSTER, allocator={"auto_allocate_owner": "author-1"}) as world:
        emu = world.live.emulator
        emu.create_issue(OWNER, REPO, title="fresh", author="alice")
        await world.call("alice", "POST", "/issues/1/labels", {"labels": ["status:ready"]})
        leases = await LeaseStore(world.service.db).open_leases(FULL_NAME)
        assert [(lease.issue_number, lease.owner) for lease in leases] == [(1, "author-1")]
        assert "status:in-progress" in emu.label_names(OWNER, REPO, 1)
        # Gitea's Replay button resends the same body under a new id: recognised, nothing more happens.
        [label_delivery] = [
            d for d in emu.deliveries if d.event_type == "issue_label" and d.payload["sender"]["login"] == "alice"
        ]
        emu.replay_delivery(label_delivery.delivery_id)
        await world.settle()
        assert len(await LeaseStore(world.service.db).history(FULL_NAME, 1)) == 1
        found = [find_marker(body) for body in bodies(world, 1)]
        assert len(found) == 2 and len(set(found)) == 2, found  # the lease's and the bootstrap's evidence, once


async def test_auto_allocation_is_on_by_default_and_off_with_auto_false(tmp_path: Path, start: Started) -> None:
    """With an author on the roster a ready label allocates; `[allocator] auto = false` only makes a
    candidate."""
    for auto, expected in ((None, [(1, "author-1")]), (False, [])):
        allocator = {} if auto is None else {"auto": auto}
        async with open_world(tmp_path / str(auto), start, roster=ROSTER, allocator=allocator) as world:
            world.live.emulator.create_issue(OWNER, REPO, title="fresh", author="alice")
            await world.call("alice", "POST", "/issues/1/labels", {"labels": ["status:ready"]})
            leases = await LeaseStore(world.service.db).open_leases(FULL_NAME)
            assert [(lease.issue_number, lease.owner) for lease in leases] == expected


async def test_a_dry_run_carries_the_bootstrap_preflight_proof(world: World) -> None:
    """AC10 of seed 004 (`on_allocate = "run"`, the default, or "preflight"): the dry-run proves the owner could
    bootstrap the selected issue now (repository reachable, path free, base known) and changes nothing."""
    from bot.verbs.allocate import AllocationCall, Allocator

    allocator = Allocator(world.service.db, world.service.settings, world.service.gitea, bot_login="foreman-bot")
    outcome = await allocator.run(AllocationCall(actor="controller-bot", owner="author-1"))
    assert outcome.bootstrap is not None and outcome.bootstrap["ok"] is True, outcome.bootstrap
    assert set(outcome.bootstrap["checks"]) >= {"repo_reachable", "base_known", "path_free"}
    assert await LeaseStore(world.service.db).open_leases(FULL_NAME) == []


async def test_allocation_apply_runs_the_bootstrap_when_configured(tmp_path: Path, start: Started) -> None:
    """AC10 of seed 004 (`on_allocate = "run"`): the lease is followed by the server-side branch and
    registered worktree under branches/, and both evidence comments are posted and verified."""
    async with open_world(tmp_path, start, roster=ROSTER, bootstrap={"on_allocate": "run"}) as world:
        emu = world.live.emulator
        emu.create_issue(OWNER, REPO, title="Make the widget blue", author="alice", labels=["status:ready"])
        await world.comment("controller-bot", 1, "/allocate")
        [lease] = await LeaseStore(world.service.db).open_leases(FULL_NAME)
        assert (lease.issue_number, lease.owner) == (1, "author-1")
        checkout = Path(world.service.settings.repository.checkout_root)
        worktrees = list(checkout.glob(f"{OWNER}/{REPO}/branches/issue-1-*"))
        assert len(worktrees) == 1 and (worktrees[0] / "README.md").is_file(), list(checkout.rglob("*"))[:20]
        assert (worktrees[0] / ".git").is_file()  # a registered worktree, not a copy
        markers = [find_marker(body) or "" for body in bodies(world, 1)]
        assert any(m.endswith(":evidence") for m in markers), markers
        assert any("bootstrap" in m for m in markers), markers
        for entry in await world.service.outbox.list():
            assert entry.status == "done", entry.summary()
