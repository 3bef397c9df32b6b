"""The bootstrap as a table of steps over its journal, and the driver that reads the journal top to bottom.

Each forward phase after ``accepted`` (which ``acceptance.accept`` records when it creates the transition) is one
``Step``: ``run`` does the work and records the phase with its proof; ``compensate``, where the step makes
something in git, undoes it. The driver resumes wherever the journal stands (one history, replayable): a failed
step records ``compensation_required``, and the compensation runs the steps' ``compensate`` last step first, then
records ``compensation_completed``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bot import gitops
from bot.core.bootstrap import FORWARD_PHASES, Blocked, Phase, next_phase
from bot.gitea import GiteaError, GiteaUnavailable
from bot.verbs.bootstrap.binding import bind, complete
from bot.verbs.bootstrap.checkout import effective_clone_url
from bot.verbs.bootstrap.compensation import compensate, require_compensation
from bot.verbs.bootstrap.context import BootstrapResult
from bot.verbs.bootstrap.git_steps import (
    GitUndo,
    confirm_branch,
    confirm_worktree,
    reserve_path,
    undo_branch,
    undo_worktree,
    verify_registration,
)
from bot.verbs.bootstrap.refusals import (
    OperatorMustFix,
    StepFailed,
    TransientFailure,
    api_refusal,
    call_again,
    make_envelope,
    refused_result,
    unavailable,
)
from bot.verbs.bootstrap.run import Run
from bot.verbs.bootstrap.takeover import record_takeover, take_over
from state.journal import JournalRaced, Transition

#: A step's work: do it and record its phase (with its proof), returning the transition as recorded.
StepRun = Callable[[Run, Transition], Awaitable[Transition]]


@dataclass(frozen=True, slots=True)
class Step:
    """One journal phase: ``run`` records ``phase``; ``compensate`` undoes in git what ``run`` made (None: nothing)."""

    phase: Phase
    run: StepRun
    compensate: GitUndo | None = None


def git_step(phase: Phase, work: Callable[[Run, Transition], dict[str, Any]], *, compensate: GitUndo | None = None,
             reads_proofs: bool = False) -> Step:
    """A step whose work is git's (run in a thread, returning its proof), recorded in a transaction of its own.
    ``reads_proofs``: the work reads what the journal recorded before (``Run.proofs``)."""

    async def run(r: Run, t: Transition) -> Transition:
        if reads_proofs:
            await r.load_proofs(t)
        return await r.commit(t, phase, await r.in_thread(work, t))

    return Step(phase, run, compensate)


async def branch_step(r: Run, t: Transition) -> Transition:
    """``branch_confirmed``; for a takeover (takeover.py), the earlier owner's worktree kept aside and the branch
    pointed at the start commit first, recorded in the same phase with the earlier registration's end."""
    if t.inputs.get("takeover") is None:
        return await r.commit(t, "branch_confirmed", await r.in_thread(confirm_branch, t))

    def taken_over(run: Run, tr: Transition) -> dict[str, Any]:
        done = take_over(run, tr)
        return {**confirm_branch(run, tr), "takeover": done}

    return await record_takeover(r, t, await r.in_thread(taken_over, t))


STEPS: tuple[Step, ...] = (
    Step("branch_confirmed", branch_step, compensate=undo_branch),
    git_step("path_reserved", reserve_path),
    # whether the path was free when reserved decides what a repair may remove
    git_step("worktree_confirmed", confirm_worktree, compensate=undo_worktree, reads_proofs=True),
    git_step("registration_verified", verify_registration, reads_proofs=True),
    Step("lock_established", bind),  # the registration and the lease undo with the compensation's own record
    Step("completed", complete),
)
assert tuple(step.phase for step in STEPS) == FORWARD_PHASES[1:], "one step per forward phase, in order"

#: The git compensations, the last step's first.
UNDO: tuple[GitUndo, ...] = tuple(step.compensate for step in reversed(STEPS) if step.compensate is not None)


def step_after(phase: Phase) -> Step:
    """The step that follows ``phase`` in the journal."""
    following = next_phase(phase)
    step = next((s for s in STEPS if s.phase == following), None)
    if step is None:
        raise AssertionError(f"no forward step from {phase}")
    return step


async def drive(run: Run, transition: Transition, *, fail_with: Blocked | None = None) -> BootstrapResult:
    """Take the transition from where its journal stands to its end (or to a refusal that keeps it open).
    ``fail_with``: compensate it (an unfinished transition whose lease ended)."""
    n, t = run.issue_number, transition
    if fail_with is not None and t.phase not in ("compensation_required", "compensation_completed"):
        t = await require_compensation(run, t, fail_with)
    while True:
        if t.phase in ("completed", "compensation_completed"):
            return await run.finished(t, replayed=False)
        if t.phase == "compensation_required":
            return await compensate(run, t, UNDO)
        try:
            await _ready(run, t)
            t = await step_after(t.phase).run(run, t)
        except TransientFailure as exc:
            return refused_result(n, unavailable(n, str(exc), t.key), t.key)
        except OperatorMustFix as exc:
            return refused_result(n, exc.envelope, t.key)
        except StepFailed as exc:
            t = await require_compensation(run, t, exc.blocked, **exc.details)
        except JournalRaced as exc:
            return refused_result(n, make_envelope(
                "conflict", str(exc), "Another runner advanced this transition.", call_again(n, t.key)), t.key)


async def _ready(run: Run, t: Transition) -> None:
    """Before a step, once per call: the control checkout prepared, and the live base still the pin."""
    if not run.prepared:
        await _prepare(run, t)
    if not run.base_fresh:
        # A resumed transition goes on only while the live base is still its pin: a moved base is a stale
        # pin (compensated), never a reason to rebase, repoint or continue against newer state.
        try:
            live = (await run.gitea.get_branch(t.base_branch)).commit_id
        except GiteaUnavailable as exc:
            raise TransientFailure(f"Gitea did not answer ({exc})") from exc
        except GiteaError as exc:
            raise StepFailed(Blocked("invalid_state", "base_unreadable", str(exc))) from exc
        if live != t.base_sha:
            raise StepFailed(Blocked("stale_pin", "base_moved", f"{t.base_branch} moved from the pinned"
                                     f" {t.base_sha} to {live}"), live_base=live)
        run.base_fresh = True


async def _prepare(run: Run, t: Transition) -> None:
    # The URL as it is now (a repoint since the transition was accepted moved origin to it).
    try:
        url = effective_clone_url(run.ctx, (await run.gitea.get_repo()).clone_url)
    except GiteaUnavailable as exc:
        raise TransientFailure(f"Gitea did not answer ({exc})") from exc
    except GiteaError as exc:
        refusal = api_refusal(exc, call_again(run.issue_number, t.key))
        if refusal is None:
            raise TransientFailure(f"Gitea did not show the repository ({exc})") from exc
        raise OperatorMustFix(refusal) from exc
    try:
        await run.prepare(url, t.base_branch)
    except gitops.GitFailure as exc:
        raise TransientFailure(str(exc)) from exc
