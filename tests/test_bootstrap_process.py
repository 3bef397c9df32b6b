"""The bootstrap as `foreman bootstrap` processes: racing duplicates, and a replay after every crash seam."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from bot.core.bootstrap import FORWARD_PHASES
from bot.verbs.bootstrap.faults import FAULT_EXIT_CODE, FAULT_PHASE_ENV, FAULT_STEP_ENV
from state.leases import LeaseStore
from tests.test_bootstrap_support import (
    BootstrapWorld,
    checkout_snapshot,
    git,
    open_bootstrap_world,
    tree_snapshot,
    worktree_entries,
)

pytestmark = [pytest.mark.process]


def assert_one_clean_transition(w: BootstrapWorld, number: int) -> None:
    """Exactly one completed transition, registration, branch, worktree and evidence entry for the issue."""
    assert w.rows("SELECT outcome FROM bootstrap_journal WHERE issue_number = ? AND outcome != 'compensated'",
                  number) == [("completed",)]
    assert w.rows("SELECT COUNT(*) FROM worktree_registrations WHERE issue_number = ? AND ended_at IS NULL",
                  number) == [(1,)]
    assert w.rows("SELECT COUNT(*) FROM outbox WHERE issue_number = ? AND idempotency_key LIKE '%:evidence'",
                  number) == [(1,)]
    branches = git(w.checkout, "for-each-ref", "--format=%(refname:short)", f"refs/heads/issue-{number}-*")
    assert branches.splitlines() == [w.branch(number)]
    assert [e["worktree"] for e in worktree_entries(w.checkout) if e.get("branch") == f"refs/heads/{w.branch(number)}"
            ] == [str(w.path(number))]


async def test_racing_processes_for_one_issue_produce_exactly_one_transition() -> None:
    """Amendment 8 / issue Done-when: duplicate requests from three separate processes at once: one transition,
    one branch, one worktree, one registration, one evidence comment; every process reports the same result."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number)
        before = checkout_snapshot(w.checkout)
        results = await asyncio.gather(*(w.cli("--issue", str(number), "--owner", "alice") for _ in range(3)))
        assert [code for code, _, _ in results] == [0, 0, 0], [err[-500:] for _, _, err in results]
        docs = [doc for _, doc, _ in results if doc is not None]
        assert len({d["idempotency_key"] for d in docs}) == 1 and {d["status"] for d in docs} == {"completed"}
        assert sorted(d["replayed"] for d in docs) == [False, True, True]
        assert len({d["proof"]["head_sha"] for d in docs}) == 1
        assert_one_clean_transition(w, number)
        assert checkout_snapshot(w.checkout) == before


async def test_a_hard_exit_after_every_phase_and_git_step_is_completed_by_a_replay() -> None:
    """FOREMAN_FAULT_AFTER_PHASE for each forward phase (and FOREMAN_FAULT_AFTER_STEP between a git
    mutation and its journal entry): the process dies with the phase committed; a replay completes the same
    transition, proving ownership of what the dead process made (reflog, worktree lock) and adding nothing."""
    async with open_bootstrap_world() as w:
        seams = [(FAULT_PHASE_ENV, phase) for phase in FORWARD_PHASES] + [
            (FAULT_STEP_ENV, "ref_created"), (FAULT_STEP_ENV, "worktree_registered"),
            (FAULT_STEP_ENV, "worktree_added")]
        issues = {}
        for env, value in seams:
            number = w.issue()
            await w.lease(number)
            issues[number] = (env, value)
        before = checkout_snapshot(w.checkout)
        runs = await asyncio.gather(*(w.cli("--issue", str(n), "--owner", "alice", env={env: value})
                                      for n, (env, value) in issues.items()))
        expected = {"ref_created": "accepted", "worktree_registered": "path_reserved",
                    "worktree_added": "path_reserved"}
        for (number, (_, value)), (code, _, err) in zip(issues.items(), runs, strict=True):
            assert code == FAULT_EXIT_CODE, (value, err[-800:])
            [(phase,)] = w.rows("SELECT phase FROM bootstrap_journal WHERE issue_number = ?", number)
            assert phase == expected.get(value, value), (value, phase)
        for number, (_, value) in issues.items():
            result = await w.bootstrap(number)
            assert result.status == "completed", (value, result.to_dict())
            assert result.proof["created"] == {"branch": True, "worktree": True}, value
            assert result.replayed == (value == "completed")
            assert_one_clean_transition(w, number)
        assert checkout_snapshot(w.checkout) == before


async def test_a_hard_exit_during_compensation_is_finished_by_a_replay() -> None:
    """AC4/AC5: the transition fails on a moved base (stale pin) after its worktree exists; the
    compensating process dies after compensation_required, after removing the worktree, after deleting the
    branch, or after compensation_completed; a replay finishes: branch, worktree, metadata gone, lease released
    once, the failure reported once, the control checkout unchanged."""
    async with open_bootstrap_world() as w:
        seams = [(FAULT_PHASE_ENV, "compensation_required"), (FAULT_STEP_ENV, "worktree_removed"),
                 (FAULT_STEP_ENV, "branch_deleted"), (FAULT_PHASE_ENV, "compensation_completed")]
        issues: dict[int, tuple[str, str]] = {}
        leases = {}
        for env, value in seams:
            number = w.issue()
            leases[number] = await w.lease(number)
            issues[number] = (env, value)
        before = checkout_snapshot(w.checkout)
        first = await asyncio.gather(*(w.cli("--issue", str(n), "--owner", "alice",
                                             env={FAULT_PHASE_ENV: "registration_verified"}) for n in issues))
        assert {code for code, _, _ in first} == {FAULT_EXIT_CODE}
        w.move_main()
        second = await asyncio.gather(*(w.cli("--issue", str(n), "--owner", "alice", env={env: value})
                                        for n, (env, value) in issues.items()))
        assert {code for code, _, _ in second} == {FAULT_EXIT_CODE}, [e[-600:] for _, _, e in second]
        for number, (_, value) in issues.items():
            result = await w.bootstrap(number, caller="alice", idempotency_key=_key_of(w, number))
            assert result.status == "compensated", (value, result.to_dict())
            assert result.refusal is not None and result.refusal.error == "stale_pin"
            assert git(w.checkout, "branch", "--list", w.branch(number)) == ""
            assert not w.path(number).exists()
            assert not (w.checkout / ".git" / "worktrees" / w.branch(number)).exists()
            lease = await LeaseStore(w.db).get(leases[number].lease_id)
            assert lease is not None and lease.status == "released"
            events = [e["kind"] for e in await LeaseStore(w.db).events(lease.lease_id)]
            assert events.count("released") == 1
            keys = [k for (k,) in w.rows("SELECT idempotency_key FROM outbox WHERE issue_number = ?", number)]
            assert sorted(k.rsplit(":", 1)[1] for k in keys) == ["assignees", "failure", "labels"], keys
        assert checkout_snapshot(w.checkout) == before


def _key_of(w: BootstrapWorld, number: int) -> str:
    [(key,)] = w.rows("SELECT idempotency_key FROM bootstrap_journal WHERE issue_number = ?", number)
    return str(key)


async def test_partial_worktree_metadata_and_partial_directories_are_repaired_or_rolled_back() -> None:
    """AC4, AC9 (partial branch creation, partial worktree metadata, partial directory): the process dies right
    after the git mutation; what it left is proven to be this transition's (reflog message, worktree lock,
    content identical to the branch tree) and then repaired on replay, or rolled back when the pin went stale.
    A directory holding anything that is not provably foreman's is left byte for byte."""
    async with open_bootstrap_world() as w:
        cases = ["meta_only_repair", "partial_dir_repair", "ref_rollback", "meta_only_rollback",
                 "partial_dir_rollback", "foreign_file_kept"]
        issues: dict[str, int] = {}
        for case in cases:
            number = w.issue()
            await w.lease(number)
            issues[case] = number
        before = checkout_snapshot(w.checkout)
        runs = await asyncio.gather(*(
            w.cli("--issue", str(n), "--owner", "alice",
                  env={FAULT_STEP_ENV: "ref_created" if case == "ref_rollback" else "worktree_added"})
            for case, n in issues.items()))
        assert {code for code, _, _ in runs} == {FAULT_EXIT_CODE}, [e[-600:] for _, _, e in runs]

        def admin(number: int) -> Path:
            return w.checkout / ".git" / "worktrees" / w.branch(number)

        for case in ("meta_only_repair", "meta_only_rollback"):
            shutil.rmtree(w.path(issues[case]))  # the directory never made it: metadata only
        for case in ("partial_dir_repair", "partial_dir_rollback", "foreign_file_kept"):
            n = issues[case]
            shutil.rmtree(admin(n))  # metadata gone, a half-checked-out directory left
            (w.path(n) / "docs" / "guide.md").unlink()
        (w.path(issues["foreign_file_kept"]) / "mine.txt").write_text("not foreman's\n", encoding="utf-8")
        kept = tree_snapshot(w.path(issues["foreign_file_kept"]))

        for case in ("meta_only_repair", "partial_dir_repair"):
            result = await w.bootstrap(issues[case])
            assert result.status == "completed", (case, result.to_dict())
            assert result.proof["created"]["worktree"] is True
            assert (w.path(issues[case]) / "docs" / "guide.md").is_file()
            assert_one_clean_transition(w, issues[case])

        w.move_main()
        for case in ("ref_rollback", "meta_only_rollback", "partial_dir_rollback", "foreign_file_kept"):
            n = issues[case]
            result = await w.bootstrap(n, idempotency_key=_key_of(w, n))
            assert result.status == "compensated", (case, result.to_dict())
            assert git(w.checkout, "branch", "--list", w.branch(n)) == "", case
            assert not admin(n).exists(), case
            if case == "foreign_file_kept":
                assert tree_snapshot(w.path(n)) == kept and "worktree" in result.proof["kept"]
            else:
                assert not w.path(n).exists(), case
        assert checkout_snapshot(w.checkout) == before


async def test_an_unfinished_transition_of_an_ended_lease_is_compensated_before_the_next_lease_starts() -> None:
    """AC5, AC7: a process dies after binding the worktree to its lease; the lease then ends and the same
    owner is leased the issue again: the old transition is compensated (its registration ended, what it made
    removed) and the new one completes from scratch; nothing of it is reused without proof."""
    async with open_bootstrap_world() as w:
        number = w.issue()
        old = await w.lease(number)
        await w.cli_dies_after(number, "lock_established")
        await w.release(old)
        new = await w.lease(number)
        result = await w.bootstrap(number)
        assert result.status == "completed", result.to_dict()
        assert result.proof["lease"]["lease_id"] == new.lease_id
        history = w.rows("SELECT lease_id, outcome FROM bootstrap_journal WHERE issue_number = ? ORDER BY id", number)
        assert history == [(old.lease_id, "compensated"), (new.lease_id, "completed")]
        ended = w.rows("SELECT lease_id, end_reason FROM worktree_registrations WHERE ended_at IS NOT NULL")
        assert [lease for lease, _ in ended] == [old.lease_id]
        assert_one_clean_transition(w, number)
