"""Driving the journaled phases of an accepted transition, forward or to compensation."""

from __future__ import annotations

from bot import gitops
from bot.core.bootstrap import Blocked
from bot.gitea import GiteaError, GiteaUnavailable
from bot.verbs.bootstrap.binding import Binding
from bot.verbs.bootstrap.checkout import effective_clone_url
from bot.verbs.bootstrap.compensation import Compensation
from bot.verbs.bootstrap.context import BootstrapResult
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
from state.journal import JournalRaced, Transition


class Driver(Binding, Compensation):
    """Drives a transition's phases from the journal, forward or to compensation."""

    # --- driving the phases -------------------------------------------------------------------------------------------

    async def _drive(self, transition: Transition, *, resumed: bool, fail_with: Blocked | None = None) -> (
        BootstrapResult
    ):
        t = transition
        if fail_with is not None and t.phase not in ("compensation_required", "compensation_completed"):
            t = await self._require_compensation(t, fail_with)
        while True:
            if t.phase in ("completed", "compensation_completed"):
                return await self._finished(t, replayed=False)
            if t.phase == "compensation_required":
                return await self._compensate(t)
            try:
                t = await self._step(t)
            except TransientFailure as exc:
                return refused_result(self.n, unavailable(self.n, str(exc), t.key), t.key)
            except OperatorMustFix as exc:
                return refused_result(self.n, exc.envelope, t.key)
            except StepFailed as exc:
                t = await self._require_compensation(t, exc.blocked, **exc.details)
            except JournalRaced as exc:
                return refused_result(self.n, make_envelope(
                    "conflict", str(exc), "Another runner advanced this transition.", call_again(self.n, t.key)), t.key)

    async def _step(self, t: Transition) -> Transition:
        if not self.prepared:
            # The URL as it is now (a repoint since the transition was accepted moved origin to it).
            try:
                url = effective_clone_url(self.ctx, (await self.gitea.get_repo()).clone_url)
            except GiteaUnavailable as exc:
                raise TransientFailure(f"Gitea did not answer ({exc})") from exc
            except GiteaError as exc:
                refusal = api_refusal(exc, call_again(self.n, t.key))
                if refusal is None:
                    raise TransientFailure(f"Gitea did not show the repository ({exc})") from exc
                raise OperatorMustFix(refusal) from exc
            try:
                await self._prepare(url, t.base_branch)
            except gitops.GitFailure as exc:
                raise TransientFailure(str(exc)) from exc
        if not self.base_fresh:
            # A resumed transition goes on only while the live base is still its pin: a moved base is a stale
            # pin (compensated), never a reason to rebase, repoint or continue against newer state.
            try:
                live = (await self.gitea.get_branch(t.base_branch)).commit_id
            except GiteaUnavailable as exc:
                raise TransientFailure(f"Gitea did not answer ({exc})") from exc
            except GiteaError as exc:
                raise StepFailed(Blocked("invalid_state", "base_unreadable", str(exc))) from exc
            if live != t.base_sha:
                raise StepFailed(Blocked("stale_pin", "base_moved", f"{t.base_branch} moved from the pinned"
                                         f" {t.base_sha} to {live}"), live_base=live)
            self.base_fresh = True
        if t.phase == "accepted":
            return await self._commit(t, "branch_confirmed", await self._git(self._branch_step, t))
        if t.phase == "branch_confirmed":
            return await self._commit(t, "path_reserved", await self._git(self._path_step, t))
        if t.phase == "path_reserved":
            await self._load_proofs(t)  # whether the path was free when reserved decides what a repair may remove
            return await self._commit(t, "worktree_confirmed", await self._git(self._worktree_step, t))
        if t.phase == "worktree_confirmed":
            await self._load_proofs(t)
            return await self._commit(t, "registration_verified", await self._git(self._registration_step, t))
        if t.phase == "registration_verified":
            return await self._bind(t)
        if t.phase == "lock_established":
            return await self._complete(t)
        raise AssertionError(f"no forward step from {t.phase}")
