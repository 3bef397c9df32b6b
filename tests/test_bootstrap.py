"""The worktree bootstrap transition in-process against the emulator (seed 004: AC1-AC10, amendment 1-8)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from bot.core.bootstrap import PHASES, reflog_message, worktree_lock_reason
from bot.core.canonical import parse_comment
from bot.gitea import Branch, Issue, Repository
from bot.verbs.bootstrap import BootstrapContext, BootstrapResult, bootstrap_preflight, lock_issue
from state.db import utcnow
from state.leases import Lease, LeaseStore
from state.outbox import OutboxStore
from tests.gitea_fixtures import BOT, OWNER, REPO
from tests.test_bootstrap_support import (
    FILES,
    BootstrapWorld,
    checkout_snapshot,
    git,
    open_bootstrap_world,
    tree_snapshot,
    worktree_entries,
)


async def test_success_creates_the_branch_and_a_registered_worktree_with_read_back_proof() -> None:
    """AC1, AC3, AC8, amendment 1: branch at the live base, worktree under branches/, lease bound, every phase
    journaled with its proof, the evidence comment queued with the same proof; the control checkout unchanged."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        lease = await w.lease(number)
        before = checkout_snapshot(w.checkout)
        base = w.main_sha()
        result = await w.bootstrap(number)
        assert result.status == "completed" and result.exit_code == 0, result.to_dict()
        proof = result.proof
        path, branch = w.path(number), w.branch(number)
        assert proof["branch"] == branch and proof["worktree_path"] == str(path)
        assert proof["head_sha"] == proof["base_sha"] == proof["branch_sha"] == base
        assert proof["base_equivalent"] and proof["created"] == {"branch": True, "worktree": True}
        assert proof["lease"]["lease_id"] == lease.lease_id and proof["lease"]["status"] == "live"
        assert proof["lock"]["state"] == "ready" and proof["registration"]["lease_id"] == lease.lease_id
        assert proof["control_checkout"]["unchanged"] is True
        # git agrees: the ref, the registration (with foreman's lock as creation proof), the files
        assert git(w.checkout, "rev-parse", f"refs/heads/{branch}") == base
        entry = next(e for e in worktree_entries(w.checkout) if e["worktree"] == str(path))
        key = result.idempotency_key or ""
        assert entry["branch"] == f"refs/heads/{branch}" and entry["locked"] == worktree_lock_reason(key)
        assert git(w.checkout, "reflog", "show", "--format=%gs", f"refs/heads/{branch}", "--") == reflog_message(
            result.idempotency_key or "")
        files = {k: v for k, v in tree_snapshot(path).items() if k != ".git"}
        assert {k for k, v in files.items() if v.startswith("file")} == {"README.md", *FILES}
        # journal: every forward phase once, in order, each with its proof
        phases = w.rows("SELECT p.phase, p.proof_json FROM bootstrap_phases p JOIN bootstrap_journal j"
                        " ON j.id = p.journal_id WHERE j.issue_number = ? ORDER BY p.id", number)
        assert [p for p, _ in phases] == list(PHASES[:7])
        proofs = {p: json.loads(doc) for p, doc in phases}
        assert proofs["branch_confirmed"]["sha"] == base and proofs["branch_confirmed"]["created"]
        assert proofs["path_reserved"]["path"] == str(path)
        assert any(line == f"worktree {path}" for line in proofs["worktree_confirmed"]["entry"]["porcelain"])
        assert proofs["lock_established"]["lease"]["lease_id"] == lease.lease_id
        # evidence through the outbox, once, carrying the same proof and a Canonical Issue State
        entry_row = await OutboxStore(w.db).by_key(f"{result.idempotency_key}:evidence")
        assert entry_row is not None and entry_row.kind == "comment" and entry_row.issue_number == number
        body = entry_row.payload["body"]
        [state] = [b.state for b in parse_comment(body).blocks if b.state is not None]
        assert state.state == "in-progress" and "gitea_lock_issue" in state.next_action
        assert f'"head_sha": "{base}"' in body and str(path) in body
        assert checkout_snapshot(w.checkout) == before


async def test_replaying_the_same_request_returns_the_same_transition_and_creates_nothing_new() -> None:
    """Amendment 2: a replay (derived key, or the caller's key) returns the completed transition; no second
    branch, worktree, registration, lock or evidence comment."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        first = await w.bootstrap(number, idempotency_key="req-1")
        again = await w.bootstrap(number, idempotency_key="req-1")
        assert again.status == "completed" and again.replayed and again.idempotency_key == "req-1"
        assert again.proof["head_sha"] == first.proof["head_sha"]
        other = await w.bootstrap(number)  # a second key for the same lease is not a second transition
        assert other.status == "refused" and other.refusal is not None and other.refusal.error == "conflict"
        assert "gitea_lock_issue" in other.refusal.exact_next_action
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(1,)]
        assert w.rows("SELECT COUNT(*) FROM worktree_registrations") == [(1,)]
        assert w.rows("SELECT COUNT(*) FROM outbox WHERE idempotency_key LIKE '%:evidence'") == [(1,)]
        assert len([e for e in worktree_entries(w.checkout) if "/branches/" in e["worktree"]]) == 1


async def test_a_replay_must_prove_identity_and_carry_the_same_pin() -> None:
    """Amendment 2/3: a key is reused only by its owner, for its issue and lease, with the same pin."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        done = await w.bootstrap(number, idempotency_key="req-7")
        assert done.status == "completed"
        by_bob = await w.bootstrap(number, caller="bob", idempotency_key="req-7")
        assert by_bob.refusal is not None and by_bob.refusal.error == "not_authorized"
        repinned = await w.bootstrap(number, idempotency_key="req-7", expected_base="0" * 40)
        assert repinned.refusal is not None and repinned.refusal.error == "stale_pin"
        again = await w.bootstrap(number, idempotency_key="req-7", expected_base=done.proof["base_sha"])
        assert again.status == "completed" and again.replayed  # a finished transition is only read back ...
        other = w.issue("Another one")
        await w.lease(other)
        cross = await w.bootstrap(other, idempotency_key="req-7")
        assert cross.refusal is not None and cross.refusal.error == "conflict"  # ... and never reused elsewhere
        bad = await w.bootstrap(other, idempotency_key="../../etc")
        assert bad.refusal is not None and bad.refusal.error == "invalid_input"


async def test_permission_denial_for_a_non_owner_an_unknown_login_and_an_unleased_issue() -> None:
    """AC2, AC9: only the live lease's owner may bootstrap; nothing is created for anyone else."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        unleased = w.issue("Nobody holds this")
        for caller, issue in (("bob", number), ("mallory", number), ("alice", unleased)):
            result = await w.bootstrap(issue, caller=caller)
            assert result.status == "refused" and result.exit_code == 1
            assert result.refusal is not None and result.refusal.error == "not_authorized", result.to_dict()
            action = result.refusal.exact_next_action
            assert not any(word in action for word in ("git ", "worktree add", "scripts/", "bash"))
            assert caller == "mallory" or "gitea_" in action  # off the roster: ask an operator (no tool to call)
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(0,)]
        assert not (w.checkout / "branches").exists()
        assert git(w.checkout, "for-each-ref", "--format=%(refname)", "refs/heads/") == "refs/heads/main"


class _LeaseEnds:
    """The bot's Gitea client, except that its ``at_read``-th read of the issue ends the lease first (released, or
    the clock past its expiry): read 1 is the acceptance's, after the gateway let the call through and before the
    transition is claimed; read 2 is the assignment's, after the worktree exists and before the lease is bound."""

    def __init__(self, w: BootstrapWorld, lease: Lease, how: str, at_read: int) -> None:
        assert w.ctx.gitea is not None
        self.real, self.w, self.lease, self.how, self.at_read = w.ctx.gitea, w, lease, how, at_read
        self.now, self.reads = utcnow(), 0

    def clock(self) -> datetime:
        return self.now

    async def get_repo(self) -> Repository:
        return await self.real.get_repo()

    async def get_branch(self, name: str) -> Branch:
        return await self.real.get_branch(name)

    async def get_issue(self, number: int) -> Issue:
        self.reads += 1
        if self.reads == self.at_read and self.how == "released":
            await self.w.release(self.lease)
        elif self.reads == self.at_read:
            self.now = self.lease.expires_at + timedelta(seconds=1)
        return await self.real.get_issue(number)

    async def set_assignees(self, number: int, logins: Sequence[str]) -> Issue:
        return await self.real.set_assignees(number, logins)


async def _bootstrap_as_the_lease_ends(w: BootstrapWorld, how: str, at_read: int) -> tuple[int, BootstrapResult]:
    """A new issue's bootstrap whose lease ends (``how``) at the ``at_read``-th read of the issue: its number, and
    the bootstrap's result."""
    number = w.issue()
    lease = await w.lease(number)
    gitea = _LeaseEnds(w, lease, how, at_read)
    w.ctx = BootstrapContext(db=w.db, settings=w.settings, gitea=gitea, bot_login=BOT, clock=gitea.clock)
    return number, await w.bootstrap(number)


@pytest.mark.parametrize("how", ["released", "expired"])
async def test_a_lease_that_ends_while_the_request_is_checked_is_refused_when_the_transition_is_claimed(
    how: str,
) -> None:
    """AC2, AC9: the ownership the gateway saw is checked again inside the transaction that claims the
    transition; a lease that ended in between is refused (``lease_ended``) and nothing is created or journaled."""
    async with open_bootstrap_world() as w:
        _, result = await _bootstrap_as_the_lease_ends(w, how, at_read=1)
        assert result.status == "refused" and result.refusal is not None, result.to_dict()
        assert result.refusal.error == "stale_pin" and result.refusal.reason == "lease_ended"
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(0,)]
        assert not (w.checkout / "branches").exists()
        assert git(w.checkout, "for-each-ref", "--format=%(refname)", "refs/heads/") == "refs/heads/main"


@pytest.mark.parametrize("how", ["released", "expired"])
async def test_a_lease_that_ends_before_it_is_bound_compensates_the_transition(how: str) -> None:
    """AC4, AC5: binding checks again, inside its transaction, that the lease is live and the owner's; a lease
    that ended after the worktree was made is never bound (``lease_changed``): what this transition made is undone."""
    async with open_bootstrap_world() as w:
        number, result = await _bootstrap_as_the_lease_ends(w, how, at_read=2)
        assert result.status == "compensated" and result.refusal is not None, result.to_dict()
        assert result.refusal.error == "stale_pin" and result.refusal.reason == "lease_changed"
        assert w.rows("SELECT COUNT(*) FROM worktree_registrations WHERE ended_at IS NULL") == [(0,)]
        assert "lock_established" not in [p for (p,) in w.rows("SELECT phase FROM bootstrap_phases")]
        assert not w.path(number).exists()
        assert git(w.checkout, "for-each-ref", "--format=%(refname)", "refs/heads/") == "refs/heads/main"


async def test_a_stale_expected_base_is_refused_before_anything_is_created() -> None:
    """Amendment 3: a pin that no longer matches the live base is a typed stale_pin; the lease stays."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        lease = await w.lease(number)
        old = w.main_sha()
        live = w.move_main()
        stale = await w.bootstrap(number, expected_base=old)
        assert stale.refusal is not None and stale.refusal.error == "stale_pin"
        assert f"expected_base={live}" in stale.refusal.exact_next_action
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(0,)]
        assert not (w.checkout / "branches").exists()
        assert (await LeaseStore(w.db).get(lease.lease_id)).status == "live"  # type: ignore[union-attr]
        fresh = await w.bootstrap(number, expected_base=live)
        assert fresh.status == "completed" and fresh.proof["base_sha"] == live == fresh.proof["head_sha"]


async def test_paths_leaving_branches_through_symlinks_are_refused_and_left_alone() -> None:
    """Amendment 6: branches/ as a symlink out, or the worktree path as one, is refused; nothing is
    created and the link targets stay byte for byte."""
    async with open_bootstrap_world() as w:
        outside = w.root / "outside"
        (outside / "keep").mkdir(parents=True)
        (outside / "keep" / "data.txt").write_text("precious\n", encoding="utf-8")
        before = tree_snapshot(outside)
        checkout_before = checkout_snapshot(w.checkout)
        number = w.issue()
        await w.lease(number)
        (w.checkout / "branches").symlink_to(outside, target_is_directory=True)
        result = await w.bootstrap(number)
        assert result.refusal is not None and result.refusal.error == "invalid_state"
        assert result.refusal.reason == "path_escapes_root"
        (w.checkout / "branches").unlink()
        (w.checkout / "branches").mkdir()
        w.path(number).symlink_to(outside / "keep", target_is_directory=True)
        result = await w.bootstrap(number)
        assert result.refusal is not None and result.refusal.reason == "path_escapes_root"
        assert tree_snapshot(outside) == before
        assert git(w.checkout, "branch", "--list", "issue-*") == ""
        assert checkout_snapshot(w.checkout) == checkout_before


async def test_a_foreign_directory_at_the_path_rolls_back_only_the_branch_this_transition_created() -> None:
    """AC4, AC5, amendment 4 (partial branch creation rolled back): the branch this journal created is
    deleted, the foreign directory stays byte for byte, the lease is released and the Gitea side reverted."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        lease = await w.lease(number)
        checkout_before = checkout_snapshot(w.checkout)
        path = w.path(number)
        (path / "notes").mkdir(parents=True)
        (path / "notes" / "draft.md").write_text("mine, not foreman's\n", encoding="utf-8")
        (path / "README.md").write_text("# widgets\n", encoding="utf-8")  # even content like the tree's
        os.chmod(path / "notes" / "draft.md", 0o600)
        foreign = tree_snapshot(path)
        result = await w.bootstrap(number)
        assert result.status == "compensated" and result.exit_code == 1, result.to_dict()
        assert result.refusal is not None and result.refusal.error == "invalid_state"
        assert "gitea_" in result.refusal.exact_next_action
        assert tree_snapshot(path) == foreign
        assert git(w.checkout, "branch", "--list", w.branch(number)) == ""
        assert any("branch" in item for item in result.proof["undone"]) and "worktree" in result.proof["kept"]
        released = await LeaseStore(w.db).get(lease.lease_id)
        assert released is not None and released.status == "released"
        assert "bootstrap failed" in (released.end_reason or "")
        keys = {row[0]: json.loads(row[1]) for row in w.rows("SELECT idempotency_key, payload_json FROM outbox")}
        labels = next(v for k, v in keys.items() if k.endswith(":labels"))
        assert labels == {"add": ["status:blocked"], "remove": ["status:in-progress"]}
        assert any(k.endswith(":failure") for k in keys)
        phases = [p for (p,) in w.rows("SELECT phase FROM bootstrap_phases ORDER BY id")]
        assert phases == ["accepted", "branch_confirmed", "compensation_required", "compensation_completed"]
        assert checkout_snapshot(w.checkout) == checkout_before
        replay = await w.bootstrap(number, idempotency_key=result.idempotency_key)
        assert replay.status == "compensated" and replay.replayed


async def test_preexisting_dirty_tracked_and_untracked_work_is_preserved_byte_for_byte() -> None:
    """Amendment 6 and 8: a worktree someone made by hand at the canonical path, with a modified tracked file,
    an untracked and an ignored file, is refused as unprovable; it, its metadata and its branch stay as they are."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        lease = await w.lease(number)
        branch, path = w.branch(number), w.path(number)
        git(w.checkout, "branch", branch, "origin/main")
        git(w.checkout, "worktree", "add", str(path), branch)
        (path / "src" / "app.py").write_text("print('changed by hand')\n", encoding="utf-8")
        (path / "untracked.txt").write_text("new\n", encoding="utf-8")
        (path / "debug.log").write_text("ignored\n", encoding="utf-8")
        admin = w.checkout / ".git" / "worktrees" / branch
        before = (tree_snapshot(path), tree_snapshot(admin), git(w.checkout, "rev-parse", branch))
        checkout_before = checkout_snapshot(w.checkout)
        result = await w.bootstrap(number)
        assert result.status == "compensated", result.to_dict()
        assert result.refusal is not None and result.refusal.reason == "preexisting_worktree"
        assert (tree_snapshot(path), tree_snapshot(admin), git(w.checkout, "rev-parse", branch)) == before
        assert set(result.proof["kept"]) >= {"branch", "worktree"} and not result.proof["blocked"]
        assert (await LeaseStore(w.db).get(lease.lease_id)).status == "released"  # type: ignore[union-attr]
        assert checkout_snapshot(w.checkout) == checkout_before


async def test_a_clean_preexisting_worktree_at_the_pinned_base_is_adopted_never_recreated() -> None:
    """Amendment 1: 'valid existing worktree confirmed': a clean worktree on the issue branch at the pin is
    adopted as it is (created=false), and compensation would never remove it."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        branch, path = w.branch(number), w.path(number)
        git(w.checkout, "branch", branch, "origin/main")
        git(w.checkout, "worktree", "add", str(path), branch)
        before = tree_snapshot(path)
        result = await w.bootstrap(number)
        assert result.status == "completed", result.to_dict()
        assert result.proof["created"] == {"branch": False, "worktree": False}
        assert tree_snapshot(path) == before
        locked = await lock_issue(w.ctx, issue_number=number, caller="alice")
        assert locked.status == "locked"


async def test_a_foreign_branch_is_never_repointed_and_a_remote_one_is_refused_up_front() -> None:
    """Amendment 3/4: an issue branch at another commit (local or on Gitea) is not ours: refused, unchanged."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        old = w.main_sha()
        git(w.checkout, "branch", w.branch(number), old)
        w.move_main()
        result = await w.bootstrap(number)
        assert result.status == "compensated"
        assert result.refusal is not None and result.refusal.reason == "branch_exists_elsewhere"
        assert git(w.checkout, "rev-parse", w.branch(number)) == old and "branch" in result.proof["kept"]
        remote = w.issue("Pushed elsewhere")
        await w.lease(remote)
        w.live.emulator.create_branch(OWNER, REPO, w.branch(remote, "Pushed elsewhere"), files={"x.txt": "x"})
        refused = await w.bootstrap(remote)
        assert refused.status == "refused" and refused.refusal is not None
        assert refused.refusal.reason == "remote_branch_exists"
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal WHERE issue_number = ?", remote) == [(0,)]


async def test_the_lock_verb_recognises_only_a_worktree_this_journal_registered() -> None:
    """AC3: before the bootstrap the lock is a tracing_gap naming the worktree; after it, the owner
    locks (recorded with lease and worktree, idempotently); anyone else is refused; a tampered worktree fails
    the guards."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        lease = await w.lease(number)
        early = await lock_issue(w.ctx, issue_number=number, caller="alice")
        assert early.refusal is not None and early.refusal.error == "tracing_gap"
        assert list(early.refusal.missing) == ["worktree"] and TOOL_NAME in early.refusal.exact_next_action
        assert (await w.bootstrap(number)).status == "completed"
        by_bob = await lock_issue(w.ctx, issue_number=number, caller="bob")
        assert by_bob.refusal is not None and by_bob.refusal.error == "not_authorized"
        locked = await lock_issue(w.ctx, issue_number=number, caller="alice")
        assert locked.status == "locked" and locked.lock is not None and not locked.already_locked
        assert locked.lock["lease_id"] == lease.lease_id and locked.lock["worktree_path"] == str(w.path(number))
        again = await lock_issue(w.ctx, issue_number=number, caller="alice")
        assert again.already_locked and again.lock is not None and again.lock["lock_id"] == locked.lock["lock_id"]
        assert w.rows("SELECT COUNT(*) FROM issue_locks WHERE released_at IS NULL") == [(1,)]
        replay = await w.bootstrap(number)
        assert replay.proof["lock"]["state"] == "locked"
        # a hand-made worktree of another leased issue is not recognised
        other = w.issue("Hand made")
        await w.lease(other)
        git(w.checkout, "worktree", "add", "-b", w.branch(other, "Hand made"), str(w.path(other, "Hand made")),
            "origin/main")
        hand = await lock_issue(w.ctx, issue_number=other, caller="alice")
        assert hand.refusal is not None and hand.refusal.error == "tracing_gap"
        # tampering with the registered worktree fails the anti-stomp guard
        git(w.checkout, "worktree", "unlock", str(w.path(number)))
        async with w.db.transaction() as conn:
            await conn.execute("UPDATE issue_locks SET released_at = 'x', release_reason = 't'")
        tampered = await lock_issue(w.ctx, issue_number=number, caller="alice")
        assert tampered.refusal is not None and tampered.refusal.error == "invalid_state"
        assert "gitea_release_lease" in tampered.refusal.exact_next_action


TOOL_NAME = "gitea_bootstrap_issue_worktree"


async def test_concurrent_calls_in_one_process_produce_one_transition() -> None:
    """Amendment 8 (in-process half; the separate-process race is in test_bootstrap_process)."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        results = await asyncio.gather(*(w.bootstrap(number) for _ in range(3)))
        assert {r.status for r in results} == {"completed"} and len({r.idempotency_key for r in results}) == 1
        assert sorted(r.replayed for r in results) == [False, True, True]
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(1,)]


async def test_several_issues_bootstrap_side_by_side() -> None:
    """Different issues do not wait for each other beyond the shared fetch."""
    async with open_bootstrap_world() as w:
        numbers = [w.issue(f"Task {i}") for i in range(4)]
        for number in numbers:
            await w.lease(number)
        results = await asyncio.gather(*(w.bootstrap(n) for n in numbers))
        assert [r.status for r in results] == ["completed"] * 4
        assert len({r.proof["worktree_path"] for r in results}) == 4


async def test_preflight_proves_the_owner_can_bootstrap_and_names_what_blocks_it() -> None:
    """AC10: the allocator's dry-run proof (repo reachable, path free, base known) changes nothing."""
    async with open_bootstrap_world(clone=False) as w:
        number = w.issue()
        proof = await bootstrap_preflight(w.ctx, number, "alice")
        doc = proof.to_dict()
        assert proof.ok is True and proof.failed == frozenset() and doc["ok"] is True, doc
        assert doc["base_sha"] == w.main_sha() and doc["worktree_path"] == str(w.path(number))
        assert list(doc) == ["issue_number", "owner", "checks", "branch", "base_sha", "worktree_path", "ok"]
        assert list(doc["checks"]) == ["owner_on_roster", "no_foreign_lease", "repo_reachable", "base_known",
                                       "control_checkout", "path_free"]
        assert not w.checkout.exists()  # nothing was cloned or created
        await w.lease(number, owner="bob")
        foreign = (await bootstrap_preflight(w.ctx, number, "alice")).to_dict()
        assert foreign["ok"] is False and foreign["checks"]["no_foreign_lease"]["ok"] is False
        other = w.issue("Occupied")
        w.path(other, "Occupied").mkdir(parents=True)
        occupied = await bootstrap_preflight(w.ctx, other, "alice")
        assert occupied.to_dict()["ok"] is False and occupied.to_dict()["checks"]["path_free"]["ok"] is False
        assert "path_free" in occupied.failed
        offline = BootstrapContext(db=w.db, settings=w.settings, gitea=None, bot_login="foreman-bot")
        assert (await bootstrap_preflight(offline, number, "alice")).to_dict()["ok"] is False


async def test_a_compensated_attempt_is_followed_by_a_fresh_one_under_a_new_derived_key() -> None:
    """Amendment 2: after a compensated attempt the next request (same live lease) starts a new transition."""
    async with open_bootstrap_world(release_lease_on_failure=False) as w:
        number = w.issue()
        lease = await w.lease(number)
        (w.path(number)).mkdir(parents=True)
        (w.path(number) / "x").write_text("x", encoding="utf-8")
        failed = await w.bootstrap(number)
        assert failed.status == "compensated"
        assert (await LeaseStore(w.db).get(lease.lease_id)).status == "live"  # type: ignore[union-attr]
        assert failed.refusal is not None and "gitea_" in failed.refusal.exact_next_action
        assert w.rows("SELECT COUNT(*) FROM outbox WHERE idempotency_key LIKE '%:failure'") == [(1,)]
        assert w.rows("SELECT COUNT(*) FROM outbox WHERE idempotency_key LIKE '%:labels'") == [(0,)]
        (w.path(number) / "x").unlink()
        Path(w.path(number)).rmdir()
        retried = await w.bootstrap(number)
        assert retried.status == "completed" and retried.idempotency_key != failed.idempotency_key


async def test_another_identitys_finished_key_reveals_nothing_to_a_caller_without_the_lease() -> None:
    """A caller without the lease who passes another identity's finished idempotency key gets the refusal any caller
    without the lease gets: the door's replay answers only the key's own identity."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        done = await w.bootstrap(number, idempotency_key="req-7")
        assert done.status == "completed", done.to_dict()
        guessed = await w.bootstrap(number, caller="bob", idempotency_key="req-7")
        unknown = await w.bootstrap(number, caller="bob", idempotency_key="req-never-used")
        assert guessed.refusal is not None and unknown.refusal is not None, (guessed.to_dict(), unknown.to_dict())
        assert guessed.refusal.to_dict() == unknown.refusal.to_dict()
        assert "another identity" not in guessed.refusal.message
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(1,)]


async def test_a_lease_taken_over_after_the_door_decided_is_refused_and_nothing_is_journaled() -> None:
    """The transition checks the lease's owner itself (at entry and at the claim), not only the door before it."""
    from bot.verbs.bootstrap import bootstrap_issue_worktree

    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.release(await w.lease(number, owner="alice"))
        await w.lease(number, owner="bob")
        result = await bootstrap_issue_worktree(w.ctx, issue_number=number, caller="alice")
        assert result.status == "refused" and result.refusal is not None, result.to_dict()
        assert result.refusal.reason == "lease_ended", result.to_dict()
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(0,)]


async def test_start_up_recovery_acts_with_the_owners_roster_roles_only() -> None:
    """Recovery resumes for the lease's owner with that owner's roster roles: an owner off the roster is refused
    at the door, nothing is journaled, and its lease is released as unworkable."""
    from bot.loops.recovery import recover_open_transitions

    async with open_bootstrap_world() as w:
        number = w.issue()
        lease = await w.lease(number, owner="mallory")  # leased before mallory left the roster
        [result] = await recover_open_transitions(w.ctx)
        assert result.status == "refused" and result.refusal is not None, result.to_dict()
        assert result.refusal.error == "not_authorized", result.to_dict()
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(0,)]
        assert w.rows("SELECT status FROM leases WHERE lease_id = ?", lease.lease_id) == [("released",)]


async def test_start_up_recovery_leaves_a_live_review_lease_alone() -> None:
    """A review lease needs no worktree: recovery never bootstraps it, never releases it as unworkable, and queues
    nothing (the crash test of the whole life caught the old recovery ending a reviewer's lease `unworkable:
    invalid_state` on a restart and adding `status:blocked` beside `status:review`, which stranded the issue)."""
    from bot.loops.recovery import recover_open_transitions

    async with open_bootstrap_world() as w:
        number = w.issue()
        async with w.db.transaction() as conn:
            review = await LeaseStore(w.db).acquire(
                conn, repo=w.ctx.repo, issue_number=number, owner="carol", role="reviewer", action="review",
                ttl=timedelta(seconds=3600), now=utcnow(), actor="ctl", fingerprint=None, request={},
            )
        assert await recover_open_transitions(w.ctx) == []
        assert w.rows("SELECT status, end_reason FROM leases WHERE lease_id = ?", review.lease_id) == [("live", None)]
        assert w.rows("SELECT COUNT(*) FROM bootstrap_journal") == [(0,)]
        assert w.rows("SELECT COUNT(*) FROM outbox") == [(0,)]
