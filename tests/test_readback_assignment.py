"""Read-after-write of the assignment: the bootstrap's proof of Gitea's assignees is what Gitea ends with."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bot import invariants
from bot.config_sections import OutboxConfig
from bot.metrics import Metrics
from bot.outbox import OutboxSender
from bot.verbs.allocate import AllocationCall, Allocator
from state.leases import Lease, LeaseStore
from state.outbox import OutboxStore
from tests.gitea_fixtures import BOT, OWNER, REPO, seed_foreman
from tests.test_bootstrap_support import BootstrapWorld, open_bootstrap_world


async def drain_outbox(w: BootstrapWorld) -> None:
    """Send every queued outbox entry to the emulator, in the outbox's own order, as the service would."""
    config = OutboxConfig(backoff_base_s=0.005, backoff_max_s=0.01, max_attempts=3, claim_ttl_s=0.2)
    sender = OutboxSender(OutboxStore(w.db), w.live.client(BOT, max_attempts=1), config, Metrics())
    for _ in range(40):
        if not await sender.run_once():
            await asyncio.sleep(0.02)
            if not await sender.run_once():
                return
    raise AssertionError("the outbox did not settle")


async def gitea_assignees(w: BootstrapWorld, number: int) -> list[str]:
    """The issue's assignees as Gitea (the emulator's API) reports them."""
    return sorted(u.login for u in (await w.live.client(OWNER).get_issue(number)).assignees)


async def gitea_labels(w: BootstrapWorld, number: int) -> set[str]:
    return set((await w.live.client(OWNER).get_issue(number)).label_names)


def status_labelled(w: BootstrapWorld) -> None:
    """The repository gets foreman's status labels (the seeded ones are spelled otherwise)."""
    seed_foreman(w.live.emulator, {})


async def allocate(w: BootstrapWorld, number: int, **call: Any) -> dict[str, Any]:
    """The controller's apply for ``number`` (candidates_json), with the allocator's own outbox entries."""
    outcome = await Allocator(w.db, w.settings, w.gitea, bot_login=BOT).run(
        AllocationCall(actor="ctl", owner="alice", candidates_json=[{"issue_number": number}], dry_run=False, **call)
    )
    assert outcome.lease is not None, outcome.to_dict()
    return outcome.to_dict()


@contextmanager
def occupied_after_the_proof(path: Path) -> Iterator[None]:
    """Someone's directory appears at the canonical path after the apply's proof and before its bootstrap (the
    proof runs before every lease by default, so a directory there beforehand leases nothing): the bootstrap
    then fails after the lease and is compensated."""
    import bot.verbs.allocate
    from bot.verbs.bootstrap.service import bootstrap_for_owner as original  # patched where the allocation calls it

    async def racing(*args: Any, **kwargs: Any) -> Any:
        path.mkdir(parents=True)
        (path / "mine.txt").write_text("not foreman's\n", encoding="utf-8")
        return await original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bot.verbs.allocate, "bootstrap_for_owner", racing)
        yield


# --- the assignment read back -----------------------------------------------------------------------------------------


async def test_the_assignment_is_read_back_from_gitea_and_a_write_gitea_ignored_is_refused() -> None:
    """Seed 004 AC1/AC8: Gitea accepts an edit of an issue from its poster but silently ignores
    the assignees when the poster has no write access; the bootstrap reads the issue back after assigning and, as
    Gitea does not list the owner, does not complete (typed refusal naming what Gitea holds) instead of assuming
    its write took effect."""
    async with open_bootstrap_world() as w:
        number = w.live.emulator.create_issue(OWNER, REPO, title="Polish the widgets", author=BOT).number
        await w.lease(number)
        w.live.emulator.set_permission(OWNER, REPO, BOT, "read")
        result = await w.bootstrap(number)
        assert await gitea_assignees(w, number) == []
        assert result.status != "completed", result.to_dict()
        assert result.refusal is not None and result.refusal.error == "invalid_state"
        assert result.refusal.reason == "assignment_unverified"
        assert "gitea_" in result.refusal.exact_next_action
        [(error,)] = w.rows("SELECT error_json FROM bootstrap_journal WHERE issue_number = ?", number)
        assert json.loads(error)["details"]["gitea_assignees"] == await gitea_assignees(w, number)


# --- a compensated allocation -----------------------------------------------------------------------------------------


async def compensated_allocation(w: BootstrapWorld) -> tuple[int, dict[str, Any], Lease]:
    """A ready issue allocated, its bootstrap failing after the proof and compensated: the issue, the allocation's
    document, and its lease as stored."""
    status_labelled(w)
    number = w.issue()
    with occupied_after_the_proof(w.path(number)):
        doc = await allocate(w, number)
    assert doc["bootstrap"]["status"] == "compensated", doc["bootstrap"]
    lease = await LeaseStore(w.db).get(doc["lease"]["lease_id"])
    assert lease is not None
    return number, doc, lease


async def test_a_compensated_bootstrap_leaves_the_owner_unassigned_even_with_the_assignment_still_queued() -> None:
    """Seed 004 AC4/AC5: the allocation's assignee change is still in the outbox when the
    bootstrap fails and is compensated; once the outbox has sent everything, Gitea has the issue blocked, the
    lease released, and the owner not assigned."""
    async with open_bootstrap_world(on_allocate="run") as w:
        number, doc, lease = await compensated_allocation(w)
        assert lease.status == "released"
        pending = await OutboxStore(w.db).by_key(f"{doc['lease']['lease_id']}:assignee")
        assert pending is not None and pending.status == "pending"  # the assignment was still queued
        await drain_outbox(w)
        assert "status:blocked" in await gitea_labels(w, number)
        assert "alice" not in await gitea_assignees(w, number)


async def test_a_completed_proof_reports_the_assignment_gitea_ends_with() -> None:
    """Seed 004 AC8: the allocation queued the assignee change; the bootstrap's completed
    proof says what Gitea says once the bootstrap has made the assignment, and Gitea ends (after the outbox sent
    everything) with the same assignees the proof reported."""
    async with open_bootstrap_world(on_allocate="run") as w:
        status_labelled(w)
        number = w.issue()
        doc = await allocate(w, number)
        proof = doc["bootstrap"]["proof"]
        assert doc["bootstrap"]["status"] == "completed", doc["bootstrap"]
        assert proof["assignment"]["gitea_assignees"] == await gitea_assignees(w, number)
        await drain_outbox(w)
        final = await gitea_assignees(w, number)
        assert proof["assignment"]["assigned"] is ("alice" in final) is True
        assert proof["assignment"]["gitea_assignees"] == final


async def test_the_allocation_reports_its_lease_as_stored_after_the_bootstrap_compensated() -> None:
    """Seed 000 AC9 / seed 004 AC5 (read-after-write): with `on_allocate = "run"`, the apply's
    result shows the lease as the store holds it after the bootstrap, released by the compensation, not the
    live copy the apply's transaction created."""
    async with open_bootstrap_world(on_allocate="run") as w:
        _, doc, stored = await compensated_allocation(w)
        assert doc["lease"] == stored.to_dict() and stored.status == "released"


# --- foreman invariants -----------------------------------------------------------------------------------------------


async def test_invariants_hold_after_a_compensated_allocation_and_report_an_owner_left_assigned() -> None:
    """Over the real stores (SQLite, Gitea, the checkout), a compensated allocation leaves
    `leases.unassigned_after_failure` holding; Gitea showing the released owner assigned (what the outbox used to
    end with) is reported by that invariant."""
    async with open_bootstrap_world(on_allocate="run") as w:
        number, doc, _ = await compensated_allocation(w)
        await drain_outbox(w)

        async def found() -> set[str]:
            facts = await invariants.gather(database=w.settings.database.path, client=w.live.client(BOT),
                                            bot_login=BOT, checkout=w.checkout)
            return {v.invariant for v in invariants.check(facts)}

        assert "leases.unassigned_after_failure" not in await found()
        await w.live.client(BOT).edit_issue(number, assignees=["alice"])
        assert "leases.unassigned_after_failure" in await found(), doc["lease"]


async def test_invariants_see_the_exclusions_and_the_read_back_assignment_of_a_real_allocation() -> None:
    """A real allocation with exclusions and its completed bootstrap: the lease
    row's exclusions equal its evidence comment's, the proof's assignment was read back, every invariant holds."""
    async with open_bootstrap_world(on_allocate="run") as w:
        status_labelled(w)
        number = w.issue()
        doc = await allocate(w, number, exclude_issue_numbers=[4242, 4241])
        assert doc["bootstrap"]["status"] == "completed", doc["bootstrap"]
        await drain_outbox(w)
        facts = await invariants.gather(database=w.settings.database.path, client=w.live.client(BOT),
                                        bot_login=BOT, checkout=w.checkout, require_bootstrap=True)
        [lease] = facts.db.leases
        assert lease.exclude == lease.decided_exclude == (4241, 4242)
        [transition] = facts.db.transitions
        assert transition.assignment_read_back is True
        assert invariants.check(facts) == []
