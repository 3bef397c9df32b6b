"""The bootstrap's table of steps (bot/verbs/bootstrap/steps.py) and the preflight's typed proof, without git."""

from __future__ import annotations

import json

import pytest

from bot.core.bootstrap import FORWARD_PHASES, next_phase
from bot.verbs.bootstrap.git_steps import undo_branch, undo_worktree
from bot.verbs.bootstrap.preflight import PreflightProof
from bot.verbs.bootstrap.steps import STEPS, UNDO, step_after


def test_one_step_per_forward_phase_in_journal_order() -> None:
    """``accepted`` is recorded by the acceptance; every later forward phase is one step, in the journal's order."""
    assert [step.phase for step in STEPS] == list(FORWARD_PHASES[1:])
    for previous, step in zip(FORWARD_PHASES, STEPS, strict=False):
        assert next_phase(previous) == step.phase
        assert step_after(previous) is step


def test_compensation_undoes_the_last_step_first() -> None:
    """The worktree (made by a later step) goes before the branch it holds; the other steps make nothing in git."""
    assert UNDO == (undo_worktree, undo_branch)
    made = {step.phase: step.compensate for step in STEPS if step.compensate is not None}
    assert made == {"branch_confirmed": undo_branch, "worktree_confirmed": undo_worktree}


@pytest.mark.parametrize("phase", ["completed", "compensation_required", "compensation_completed"])
def test_no_forward_step_after_an_end_or_compensation(phase: str) -> None:
    with pytest.raises(AssertionError):
        step_after(phase)  # type: ignore[arg-type]


def test_a_proof_that_stopped_early_shows_only_what_it_made() -> None:
    """The document an edge shows: the checks in the order made, the derived values only once derived, ``ok``
    last; ``failed`` is the set of the checks that did not pass."""
    proof = PreflightProof(7, "alice")
    proof.check("owner_on_roster", True, roles=["author"])
    proof.check("no_foreign_lease", True, lease_owner=None, reclaimable=False)
    proof.check("repo_reachable", False, detail="no Gitea connection configured")
    assert proof.failed == {"repo_reachable"} and not proof.ok
    assert json.dumps(proof.to_dict()) == json.dumps({
        "issue_number": 7, "owner": "alice",
        "checks": {"owner_on_roster": {"ok": True, "roles": ["author"]},
                   "no_foreign_lease": {"ok": True, "lease_owner": None, "reclaimable": False},
                   "repo_reachable": {"ok": False, "detail": "no Gitea connection configured"}},
        "ok": False,
    })
    assert not PreflightProof(7, "alice").ok  # no check made proves nothing
