"""The default loop: a `status:ready` label goes to the next idle author, proved, leased and bootstrapped."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from bot.catalog import open_door
from bot.core.canonical import parse_comment
from bot.core.evidence import find_marker
from bot.mcp_server import build_server
from bot.verbs.allocate import AllocationCall, Allocator
from bot.verbs.runtime import caller_for
from state.db import utcnow
from state.journal import JournalStore
from state.leases import Lease, LeaseStore
from state.outbox import OUTBOX_TOPIC
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started, wait_status
from tests.world import FULL_NAME, World, open_world

AUTHORS = ("author-1", "author-2", "author-3")
ROSTER = {"controller-bot": ["controller"], **{login: ["author"] for login in AUTHORS}}


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    # Only the roster is configured: auto-allocation and the bootstrap on allocation are the defaults.
    async with open_world(tmp_path, start, roster=ROSTER) as opened:
        yield opened


def bodies(world: World, number: int) -> list[str]:
    return [c.body for c in world.live.emulator.issue(OWNER, REPO, number).comments if c.kind == "comment"]


def worktrees(world: World, number: int) -> list[Path]:
    checkout = Path(world.service.settings.repository.checkout_root)
    return sorted(checkout.glob(f"{OWNER}/{REPO}/branches/issue-{number}-*"))


async def live(world: World) -> dict[int, str]:
    return {lease.issue_number: lease.owner for lease in await LeaseStore(world.service.db).open_leases(FULL_NAME)}


async def five_ready(world: World) -> None:
    """Four ready issues that Gitea already holds, then a fifth labelled ready by a person (the trigger)."""
    emu = world.live.emulator
    for n in range(1, 5):
        emu.create_issue(OWNER, REPO, title=f"Task {n}", author="alice", labels=["status:ready"])
    number = await world.open_issue("alice", "Task 5")
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})


async def assert_bootstrapped(world: World, number: int, owner: str) -> None:
    """One live lease of ``owner``, a completed transition of that lease, its worktree on disk, Gitea mirroring it."""
    history = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert [(lease.owner, lease.status) for lease in history] == [(owner, "live")], history
    transitions = await JournalStore(world.service.db).history(FULL_NAME.lower(), number)
    assert [(t.phase, t.lease_id) for t in transitions] == [("completed", history[0].lease_id)]
    [worktree] = worktrees(world, number)
    assert (worktree / ".git").is_file() and (worktree / "README.md").is_file()
    assert world.labels(number) == ["status:in-progress"]
    assert [u.login for u in world.live.emulator.issue(OWNER, REPO, number).assignees] == [owner]


def waiting_state(world: World, number: int) -> Any:
    found = [b for b in bodies(world, number) if (find_marker(b) or "").startswith("auto-wait:")]
    assert len(found) == 1, bodies(world, number)
    state = parse_comment(found[0]).current
    assert state is not None
    return state


async def release(world: World, login: str, number: int) -> None:
    service = world.service
    runtime = open_door(db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")
    async with Client(build_server(runtime, caller_for(service.settings, login, "mcp"))) as client:
        result = await client.call_tool("gitea_release_lease", {"issue_number": number, "reason": "done"})
        assert not result.is_error, result.structured_content
    await world.settle()


async def test_three_authors_and_five_ready_issues_give_three_leases_with_worktrees_and_two_waiting(
    world: World,
) -> None:
    await five_ready(world)
    assert await live(world) == {1: "author-1", 2: "author-2", 3: "author-3"}
    for number, owner in ((1, "author-1"), (2, "author-2"), (3, "author-3")):
        await assert_bootstrapped(world, number, owner)
    for number in (4, 5):
        assert world.labels(number) == ["status:ready"] and worktrees(world, number) == []
        state = waiting_state(world, number)
        assert (state.state, state.who_is_next) == ("ready", "controller")
        assert "every author" in state.next_action and "busy" in state.next_action, state.next_action
    for entry in await world.service.outbox.list(limit=1000):
        assert entry.status == "done", entry.summary()
    from bot import invariants
    from bot.verbs.bootstrap import BootstrapContext

    checkout = BootstrapContext.from_service(world.service).checkout_path
    facts = await invariants.gather(database=world.service.settings.database.path, client=world.gitea,
                                    bot_login="foreman-bot", checkout=checkout, require_bootstrap=True)
    assert invariants.check(facts) == []


async def test_a_release_hands_the_next_ready_issue_to_the_freed_author_once(world: World) -> None:
    await five_ready(world)
    await release(world, "author-2", 2)
    assert await live(world) == {1: "author-1", 3: "author-3", 4: "author-2"}
    await assert_bootstrapped(world, 4, "author-2")
    # A replayed ready label (every handler again) and a second release trigger change nothing.
    emu = world.live.emulator
    [label] = [d for d in emu.deliveries if d.event_type == "issue_label" and d.payload["sender"]["login"] == "alice"]
    await world.service.store.replay(label.delivery_id, requested_by="test", force=True)
    world.service.worker.wakeup.set()
    await wait_status(world.service, label.delivery_id, "done")
    await world.settle()
    assert await live(world) == {1: "author-1", 3: "author-3", 4: "author-2"}
    assert len(await LeaseStore(world.service.db).history(FULL_NAME, 4)) == 1
    assert await LeaseStore(world.service.db).history(FULL_NAME, 5) == []
    assert len([b for b in bodies(world, 5) if (find_marker(b) or "").startswith("auto-wait:")]) == 1


async def test_a_teardown_that_ends_a_lease_hands_the_next_ready_issue_to_the_freed_author(world: World) -> None:
    """A person closes an issue its author still works on: the teardown ends the lease and auto-allocation runs
    (trigger issue_closed, as a release or a merge does), so the waiting ready issue goes to that author, once."""
    from state.auto_allocations import AutoAllocationStore

    await five_ready(world)
    await world.call("alice", "PATCH", "/issues/2", {"state": "closed"})
    assert await live(world) == {1: "author-1", 3: "author-3", 4: "author-2"}
    await assert_bootstrapped(world, 4, "author-2")
    [ended] = await LeaseStore(world.service.db).history(FULL_NAME, 2)
    assert (ended.status, ended.end_reason) == ("released", "issue_closed")
    triggers = [d.trigger for d in await AutoAllocationStore(world.service.db).recent(FULL_NAME.lower(), limit=50)]
    assert triggers.count("issue_closed") == 1, triggers


async def test_a_replayed_or_caught_up_ready_label_never_leases_twice(world: World) -> None:
    await five_ready(world)
    emu = world.live.emulator
    [label] = [d for d in emu.deliveries if d.event_type == "issue_label" and d.payload["sender"]["login"] == "alice"]
    emu.replay_delivery(label.delivery_id)  # Gitea's Replay: same body, new id
    await world.settle()
    await world.service.store.replay(label.delivery_id, requested_by="test", force=True)
    world.service.worker.wakeup.set()
    await wait_status(world.service, label.delivery_id, "done")
    await world.settle()
    # A catch-up run (what start-up and the periodic sweep call) on the same state.
    from bot.loops.auto_allocate import auto_allocate

    report = await auto_allocate(open_door(world.service.db, world.service.settings, world.service.gitea,
                                           bot_login="foreman-bot"), trigger="catch_up")
    await world.settle()
    assert report.leased == [] and sorted(report.waiting) == [4, 5]
    store = LeaseStore(world.service.db)
    for number in range(1, 6):
        assert len(await store.history(FULL_NAME, number)) == (1 if number <= 3 else 0)
    for number in (4, 5):
        waiting_state(world, number)  # still exactly one waiting comment each


async def test_an_expired_lease_frees_its_author_for_the_next_ready_issue(world: World) -> None:
    await five_ready(world)
    from bot.loops.auto_allocate import auto_allocate

    later = utcnow() + timedelta(seconds=world.service.settings.allocator.lease_ttl_s + 1)
    report = await auto_allocate(open_door(world.service.db, world.service.settings, world.service.gitea,
                                           bot_login="foreman-bot"), trigger="catch_up", now=later)
    await world.settle()
    # Every lease expired: the three authors are idle again; #4 and #5 go to the two longest idle of them.
    assert sorted(report.leased) == [4, 5], report.to_dict()
    assert {n: o for n, o in (await live(world)).items() if n in (4, 5)} == {4: "author-1", 5: "author-2"}


async def test_an_excluded_issue_is_never_auto_allocated(tmp_path: Path, start: Started) -> None:
    allocator = {"protected_issues": [1], "protected_labels": ["hold"]}
    async with open_world(tmp_path, start, roster=ROSTER, allocator=allocator) as world:
        emu = world.live.emulator
        emu.create_label(OWNER, REPO, "hold", color="#000000")
        emu.create_issue(OWNER, REPO, title="Protected", author="alice", labels=["status:ready"])
        emu.create_issue(OWNER, REPO, title="Held", author="alice", labels=["status:ready", "hold"])
        number = await world.open_issue("alice", "Ordinary")
        await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        assert await live(world) == {3: "author-1"}
        assert bodies(world, 1) == [] and bodies(world, 2) == []
        from bot.loops.auto_allocate import recent_decisions

        [decision, *_] = await recent_decisions(world.service.db, FULL_NAME.lower())
        reasons = {s["issue_number"]: s["reason"] for s in decision["skipped"]}
        assert reasons == {1: "protected_issue", 2: "protected_label"}, decision


async def test_a_failed_proof_leases_nothing(world: World) -> None:
    """A foreign directory at #1's canonical worktree path: the apply's preflight fails, nothing is leased, and
    the refusal is typed with an exact next action; auto-allocation takes the next issues and marks #1 blocked."""
    emu = world.live.emulator
    emu.create_issue(OWNER, REPO, title="Occupied", author="alice", labels=["status:ready"])
    from bot.verbs.bootstrap import BootstrapContext, ensure_control_checkout

    await ensure_control_checkout(BootstrapContext.from_service(world.service))
    checkout = Path(world.service.settings.repository.checkout_root) / OWNER / REPO / "branches" / "issue-1-occupied"
    checkout.mkdir(parents=True)
    (checkout / "notes.txt").write_text("someone's work\n")
    allocator = Allocator(world.service.db, world.service.settings, world.service.gitea, bot_login="foreman-bot")
    outcome = await allocator.run(AllocationCall(actor="controller-bot", owner="author-1", dry_run=False))
    assert outcome.lease is None and not outcome.applied
    assert outcome.refusal is not None and outcome.refusal.error == "invalid_state"
    assert outcome.refusal.reason == "bootstrap_preflight_failed"
    assert "path_free" in outcome.refusal.details["failed_checks"]
    assert "exclude_issue_numbers=[1]" in outcome.refusal.exact_next_action
    assert await LeaseStore(world.service.db).history(FULL_NAME, 1) == []
    # Through the loop: #1 is never leased, the others are.
    for n in (2, 3):
        emu.create_issue(OWNER, REPO, title=f"Task {n}", author="alice", labels=["status:ready"])
    await world.call("alice", "POST", "/issues/3/labels", {"labels": ["status:ready"]})
    assert await live(world) == {2: "author-1", 3: "author-2"}
    assert await LeaseStore(world.service.db).history(FULL_NAME, 1) == []
    assert (checkout / "notes.txt").read_text() == "someone's work\n"
    assert world.labels(1) == ["status:blocked"]
    [blocked] = [b for b in bodies(world, 1) if (find_marker(b) or "").startswith("auto-proof:")]
    state = parse_comment(blocked).current
    assert state is not None and (state.state, state.who_is_next) == ("blocked", "human")


async def test_foreman_allocate_json_shows_the_automatic_decisions(
    world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import json

    from bot.cli import main

    await five_ready(world)
    env = world.cli_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert await asyncio.to_thread(main, ["allocate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    auto = doc["auto"]
    assert auto["enabled"] is True and auto["policy"]["max_leases_per_author"] == 1
    assert [a["login"] for a in auto["authors"] if a["skipped"] == "busy"] == list(AUTHORS)
    recent = auto["recent"]
    assert recent and recent[0]["waiting"] == [4, 5], recent[0]
    assert any(d["leased"] for d in recent)


async def lease_without_its_bootstrap(world: World, owner: str) -> Lease:
    """A ready issue leased to ``owner`` as the apply commits it, without the bootstrap a process killed right after
    the lease commit never ran."""
    service = world.service
    world.live.emulator.create_issue(OWNER, REPO, title="Crashed", author="alice", labels=["status:ready"])
    unstarted = service.settings.model_copy(
        update={"bootstrap": service.settings.bootstrap.model_copy(update={"on_allocate": "preflight"})})
    outcome = await Allocator(service.db, unstarted, service.gitea, bot_login="foreman-bot").run(
        AllocationCall(actor="controller-bot", owner=owner, dry_run=False))
    assert outcome.applied and outcome.lease is not None
    await world.settle()
    return outcome.lease


async def test_start_up_recovery_bootstraps_a_lease_whose_process_died_before_its_bootstrap(world: World) -> None:
    """A process killed between the lease commit and the bootstrap's first phase leaves a live lease with no
    transition at all: `recover_open_transitions` (what `foreman serve` runs at start) bootstraps it, and
    `foreman invariants`' `leases.bootstrapped` holds again."""
    from bot import invariants
    from bot.loops.recovery import recover_open_transitions
    from bot.verbs.bootstrap import BootstrapContext

    service = world.service
    await lease_without_its_bootstrap(world, "author-2")

    async def violations() -> set[str]:
        facts = await invariants.gather(database=service.settings.database.path, client=world.gitea,
                                        bot_login="foreman-bot", checkout=None, require_bootstrap=True)
        return {v.invariant for v in invariants.check(facts)}

    assert "leases.bootstrapped" in await violations()
    [result] = await recover_open_transitions(BootstrapContext.from_service(service))
    assert result.status == "completed", result.to_dict()
    service.outbox_wakeup()
    await world.settle()
    await assert_bootstrapped(world, 1, "author-2")
    assert "leases.bootstrapped" not in await violations()


async def test_an_allocation_without_an_owner_goes_to_the_next_idle_author(tmp_path: Path, start: Started) -> None:
    """The MCP tool (and `/allocate`) without `owner` and with several authors: the auto-allocation policy names the
    owner; with every author busy the answer is a typed `conflict` (`authors_busy`), nothing leased."""
    async with open_world(tmp_path, start, roster=ROSTER, allocator={"auto": False}) as world:
        emu = world.live.emulator
        for n in (1, 2):
            emu.create_issue(OWNER, REPO, title=f"Task {n}", author="alice", labels=["status:ready"])
        service = world.service
        await Allocator(service.db, service.settings, service.gitea, bot_login="foreman-bot").run(
            AllocationCall(actor="controller-bot", owner="author-1", dry_run=False))
        runtime = open_door(db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")
        controller = caller_for(service.settings, "controller-bot", "mcp")
        result = await runtime.call("allocate_next_work", controller, {"dry_run": False})
        assert result.ok, result.doc
        assert (result.doc["lease"]["owner"], result.doc["lease"]["issue_number"]) == ("author-2", 2)
        await world.settle()
        emu.create_issue(OWNER, REPO, title="Task 3", author="alice", labels=["status:ready"])
        await Allocator(service.db, service.settings, service.gitea, bot_login="foreman-bot").run(
            AllocationCall(actor="controller-bot", owner="author-3", dry_run=False))
        busy = await runtime.call("allocate_next_work", controller, {"dry_run": False})
        assert busy.refusal is not None and busy.refusal.error == "conflict", busy.doc
        assert busy.refusal.reason == "authors_busy"
        assert len(await LeaseStore(service.db).open_leases(FULL_NAME)) == 3


async def test_a_controllers_stated_exclusions_stand_for_auto_allocation_until_it_lifts_them(
    tmp_path: Path, start: Started
) -> None:
    """The controller's own standing exclusions: the exclusions a controller last stated (MCP or `/allocate`) apply
    to every automatic decision before ranking, exactly as in its call, until it states others (`[]` lifts them)."""
    async with open_world(tmp_path, start, roster=ROSTER) as world:
        emu = world.live.emulator
        emu.create_issue(OWNER, REPO, title="Canary", author="alice", labels=["priority:p0"])
        service = world.service
        runtime = open_door(db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")
        controller = caller_for(service.settings, "controller-bot", "mcp")
        stated = await runtime.call("allocate_next_work", controller, {"owner": "author-1",
                                                                       "exclude_issue_numbers": [1],
                                                                       "dry_run": False})
        assert stated.ok, stated.doc  # nothing ready to lease yet, the exclusion stands
        await world.call("alice", "POST", "/issues/1/labels", {"labels": ["status:ready"]})
        assert await LeaseStore(service.db).history(FULL_NAME, 1) == []
        from bot.loops.auto_allocate import recent_decisions

        [decision, *_] = await recent_decisions(service.db, FULL_NAME.lower())
        assert decision["standing_exclusions"] == {"controller-bot": [1]}
        assert [(s["issue_number"], s["reason"]) for s in decision["skipped"]] == [(1, "excluded_by_controller")]
        lifted = await runtime.call("allocate_next_work", controller, {"owner": "author-1",
                                                                       "exclude_issue_numbers": [],
                                                                       "dry_run": False})
        assert lifted.ok, lifted.doc
        number = await world.open_issue("alice", "Next")
        await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        assert await live(world) == {1: "author-1", 2: "author-2"}


async def test_a_bootstrap_gitea_could_not_serve_is_resumed_by_the_retried_delivery(world: World) -> None:
    """A 5xx spell on the branch reads (past the client's own retries) while the proofs and bootstraps run: the
    delivery is retried (a failed read leases nothing, a lease whose bootstrap could not finish is resumed for its
    owner), and every author ends with one lease and one worktree (nothing leased twice)."""
    emu = world.live.emulator
    for n in range(1, 3):
        emu.create_issue(OWNER, REPO, title=f"Task {n}", author="alice", labels=["status:ready"])
    number = await world.open_issue("alice", "Task 3")
    # Past the client's retries (4 attempts per read) even though the three candidates' branch reads run side by
    # side: 10 failures among three reads leave at least one with four.
    rule = emu.faults.fail("GET", "/repos/{owner}/{repo}/branches/{branch}", status=502, times=10)
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]}, settle=False)
    await world.settle()
    assert rule.remaining == 0
    [label] = [d for d in emu.deliveries if d.event_type == "issue_label" and d.payload["sender"]["login"] == "alice"]
    stored = await world.service.store.get(label.delivery_id)
    assert stored is not None and stored.attempts > 1
    assert await live(world) == {1: "author-1", 2: "author-2", 3: "author-3"}
    for n, owner in ((1, "author-1"), (2, "author-2"), (3, "author-3")):
        await assert_bootstrapped(world, n, owner)


async def test_the_next_trigger_finishes_a_lease_left_without_its_bootstrap(world: World) -> None:
    """A live lease whose bootstrap never ran (a process killed right after the lease commit): the next automatic run
    resumes it for its owner first (bootstrap completed, lease `resumed`), then allocates the rest."""
    service = world.service
    lease = await lease_without_its_bootstrap(world, "author-3")
    number = await world.open_issue("alice", "Next")
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    assert await live(world) == {1: "author-3", 2: "author-1"}
    await assert_bootstrapped(world, 1, "author-3")
    await assert_bootstrapped(world, 2, "author-1")
    kinds = [e["kind"] for e in await LeaseStore(service.db).events(lease.lease_id)]
    assert kinds == ["acquired", "resumed"], kinds


async def test_auto_allocation_survives_more_standing_exclusions_than_one_call_may_state(
    tmp_path: Path, start: Started
) -> None:
    """Standing exclusions of every controller (1200 here) are more than one call's `exclude_issue_numbers` may
    state (1000): auto-allocation hands them to the allocator in-process, so the apply still leases."""
    from bot.loops.auto_allocate import recent_decisions
    from state.exclusions import ExclusionStore

    roster = {"controller-bot": ["controller"], "author-2": ["author"]}
    async with open_world(tmp_path, start, roster=roster) as world:
        service = world.service
        store = ExclusionStore(service.db)
        repo = service.settings.repo_key
        await store.state(repo, "controller-bot", range(1000, 1600), action="implement", at=utcnow(), via="mcp")
        await store.state(repo, "controller-x", range(2000, 2600), action="implement", at=utcnow(), via="mcp")
        number = await world.open_issue("alice", "Task")
        await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
        [decision, *_] = await recent_decisions(service.db, FULL_NAME.lower())
        assert [a.get("error") for a in decision["applies"]] == [None], decision["applies"]
        assert [lease.owner for lease in await LeaseStore(service.db).history(FULL_NAME, number)] == ["author-2"]


async def test_a_leases_effects_and_its_bootstrap_evidence_wake_the_sender_when_committed(
    tmp_path: Path, start: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender is woken once the lease's label, assignee and evidence are committed, before the bootstrap starts
    (they go out while it runs), and again once the bootstrap's evidence is committed, before the bootstrap returns:
    never left for the sender's next poll."""
    from bot.loops.auto_allocate import auto_allocate
    from bot.verbs import allocate

    async with open_world(tmp_path, start, roster=ROSTER, allocator={"auto": False}) as world:
        world.live.emulator.create_issue(OWNER, REPO, title="Task 1", author="alice", labels=["status:ready"])
        service = world.service
        seen: list[str] = []

        async def bootstrap(*args: Any, **kwargs: Any) -> Any:
            seen.append("bootstrap")
            try:
                return await original(*args, **kwargs)
            finally:
                seen.append("bootstrap returned")

        from bot.verbs.bootstrap.service import bootstrap_for_owner as original
        monkeypatch.setattr(allocate, "bootstrap_for_owner", bootstrap)
        settings = service.settings.model_copy(update={"allocator": service.settings.allocator.model_copy(
            update={"auto": True})})
        service.db.on_commit(OUTBOX_TOPIC, lambda: seen.append("wake"))  # what the sender hears
        door = open_door(service.db, settings, service.gitea, bot_login="foreman-bot")
        report = await auto_allocate(door, trigger="test")
        assert report.leased == [1]
        assert seen[:4] == ["wake", "bootstrap", "wake", "bootstrap returned"], seen
        keys = [e.key.split(":")[-1] for e in sorted(await service.outbox.list(limit=100), key=lambda e: e.id)]
        assert keys == ["labels", "assignee", "evidence", "evidence"]
