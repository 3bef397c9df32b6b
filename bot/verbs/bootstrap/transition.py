"""The worktree bootstrap transition: accept from authoritative inputs, then drive the journaled phases."""

from __future__ import annotations

import asyncio
from pathlib import Path, PurePosixPath
from typing import Literal

from bot import gitops, worktree_files
from bot.core.bootstrap import (
    Blocked,
    PathRejected,
    branch_for,
    derive_key,
    issue_branch_prefix,
    worktree_path_for,
)
from bot.core.errors import Envelope
from bot.gitea import Branch, GiteaError, GiteaNotFound, GiteaUnavailable, Issue, Repository
from bot.verbs.bootstrap.binding import Binding
from bot.verbs.bootstrap.checkout import effective_clone_url
from bot.verbs.bootstrap.compensation import Compensation
from bot.verbs.bootstrap.context import TOOL, BootstrapContext, BootstrapResult, live_lease_in
from bot.verbs.bootstrap.faults import FAULT_PHASE_ENV, crash_seam
from bot.verbs.bootstrap.refusals import (
    OperatorMustFix,
    StepFailed,
    TransientFailure,
    api_refusal,
    blocked_envelope,
    call_again,
    input_problem,
    make_envelope,
    refused_result,
    unavailable,
)
from state.journal import JournalConflict, JournalRaced, NewTransition, Transition
from state.leases import Lease
from state.outbox import acting_for


async def bootstrap_issue_worktree(
    ctx: BootstrapContext,
    *,
    issue_number: int,
    caller: str,
    idempotency_key: str | None = None,
    expected_base: str | None = None,
) -> BootstrapResult:
    """Create or recover the issue's branch and registered worktree under ``branches/`` for the caller's live
    lease, journaled phase by phase; refuse (typed envelope) or compensate on failure. See docs/bootstrap.md.

    Reached through the door (``VerbRuntime.call``), which admits only the live lease's owner; a lease that ended
    since is refused ``stale_pin`` (``lease_ended``) here and at the claim. ``idempotency_key``: replaying the
    same key returns or resumes the same transition (derived from the lease when omitted). ``expected_base``:
    the default branch's commit the caller expects; a different live base is a ``stale_pin`` refusal.
    """
    problem = input_problem(issue_number, caller, idempotency_key, expected_base)
    if problem is not None:
        return refused_result(
            issue_number if isinstance(issue_number, int) else 0,
            make_envelope("invalid_input", problem, "Correct the argument and call again.",
                          f"call {TOOL} again with corrected arguments (omit idempotency_key to have one derived)"),
        )
    if ctx.gitea is None:
        return refused_result(issue_number, unavailable(issue_number, "foreman has no Gitea connection configured"))
    lock_path = ctx.locks_dir() / f"issue-{issue_number}.lock"
    async with worktree_files.file_lock(lock_path, wait_s=ctx.settings.bootstrap.lock_wait_s) as held:
        if not held:
            return refused_result(issue_number, make_envelope(
                "conflict",
                f"another bootstrap of #{issue_number} is still running",
                "Wait for it to finish; a repeat of the same request then returns its result.",
                call_again(issue_number, idempotency_key),
            ), idempotency_key)
        with acting_for(ctx.repo):  # a bootstrap acts for its repository: its entries are filed under it
            return await BootstrapRun(ctx, issue_number, caller).execute(idempotency_key, expected_base)


def lease_ended() -> Envelope:
    return make_envelope("stale_pin", "the lease ended while the request was being checked", "Nothing was created.",
                         "call gitea_get_runtime_context to see your leases", reason="lease_ended")


async def replay_finished(
    ctx: BootstrapContext, *, issue_number: int, caller: str, idempotency_key: str, expected_base: str | None = None
) -> BootstrapResult | None:
    """The recorded answer to the finished request ``idempotency_key`` (see ``BootstrapRun.replay``), else None."""
    return await BootstrapRun(ctx, issue_number, caller).replay(idempotency_key, expected_base)


class BootstrapRun(Binding, Compensation):
    """One bootstrap call, holding the per-issue file lock."""

    # --- entry: replay and the one open transition per issue ----------------------------------------------------------

    async def execute(self, key: str | None, expected_base: str | None) -> BootstrapResult:
        now = self.ctx.clock()
        if key is not None and (replayed := await self.replay(key, expected_base)) is not None:
            return replayed
        # The door decided the role and the ownership; a lease that ended since is the claim's race, answered alike.
        lease = await self.leases.live_for_issue(self.ctx.repo, self.n)
        if lease is None or not lease.is_live(now) or lease.owner != self.caller:
            return refused_result(self.n, lease_ended(), key)
        if lease.action != "implement":  # only an implementer's lease gets a branch and a worktree
            return refused_result(self.n, make_envelope(
                "invalid_state", f"your lease on #{self.n} is for {lease.action}, and only an implementation gets a"
                " worktree", "A review reads the pull request as it is on Gitea; nothing was created.",
                f"call gitea_submit_review for #{self.n} with your verdict on the pull request's head",
                reason="no_worktree_for_action"), key)
        source: Literal["caller", "derived"] = "caller"
        attempt = await self.journal.compensated_count(lease.lease_id)
        if key is None:
            key, source = derive_key(self.ctx.repo, self.n, lease.lease_id, attempt), "derived"
        existing = await self.journal.get(key)
        if existing is not None:
            refusal = self._identity_mismatch(existing, lease, expected_base)
            if refusal is not None:
                return refusal
            if existing.outcome != "open":
                return await self._finished(existing, replayed=True)
            return await self._drive(existing, resumed=True)
        open_other = await self.journal.open_for_issue(self.ctx.repo, self.n)
        if open_other is not None:
            if open_other.lease_id == lease.lease_id:
                return refused_result(self.n, make_envelope(
                    "conflict",
                    f"an unfinished bootstrap of #{self.n} for this lease exists under another idempotency key",
                    "Resume that transition instead of starting a second one.",
                    call_again(self.n, open_other.key), existing_key=open_other.key), key)
            # An unfinished transition of an ended lease: undo what it made before starting anew.
            stale = await self.compensate_ended(open_other)
            if stale.status != "compensated":
                return stale
            self.seen.clear()  # what was observed for the old transition says nothing about the new one
            self.proofs = {}
        completed = await self.journal.completed_for_lease(lease.lease_id)
        if completed is not None:
            return refused_result(self.n, make_envelope(
                "conflict",
                f"#{self.n} is already bootstrapped for this lease (idempotency key {completed.key})",
                "One lease gets one worktree; use the one already registered.",
                f"call gitea_lock_issue for #{self.n}", existing_key=completed.key), key)
        accepted = await self._accept(key, source, lease, expected_base, attempt)
        if isinstance(accepted, BootstrapResult):
            return accepted
        return await self._drive(accepted, resumed=False)

    async def replay(self, key: str, expected_base: str | None) -> BootstrapResult | None:
        """The recorded answer to a request that already finished (its owner's only), else None: a replay changes
        nothing, so it needs no live lease."""
        existing = await self.journal.get(key)
        if existing is None or existing.outcome == "open":
            return None
        return self._identity_mismatch(existing, None, expected_base) or await self._finished(existing, replayed=True)

    async def compensate_ended(self, transition: Transition) -> BootstrapResult:
        """Undo an open transition whose lease is no longer the live lease (the journal finishing its own work, not
        a verb call: nothing new is made for anyone)."""
        return await self._drive(transition, resumed=True, fail_with=Blocked(
            "stale_pin", "lease_changed", f"its lease {transition.lease_id} is no longer the live lease"))

    def _identity_mismatch(self, existing: Transition, lease: Lease | None, expected_base: str | None) -> (
        BootstrapResult | None
    ):
        """Reuse only after exact identity and compatibility are proven (amendment 2)."""
        key = existing.key
        if existing.owner != self.caller:
            return refused_result(self.n, make_envelope(
                "not_authorized", "this idempotency key belongs to a transition of another identity",
                "Use your own request's key, or none.", f"call {TOOL} for #{self.n} without idempotency_key"), key)
        if existing.issue_number != self.n:
            return refused_result(self.n, make_envelope(
                "conflict", f"this idempotency key was used for #{existing.issue_number}",
                "A key names exactly one request.", f"call {TOOL} for #{self.n} without idempotency_key"), key)
        if lease is not None and existing.lease_id != lease.lease_id:
            return refused_result(self.n, make_envelope(
                "stale_pin", f"this idempotency key belongs to lease {existing.lease_id}, not the live lease"
                f" {lease.lease_id}", "The allocation changed since that request; start a new one.",
                f"call {TOOL} for #{self.n} without idempotency_key"), key)
        if expected_base is not None and expected_base != existing.base_sha:
            return refused_result(self.n, make_envelope(
                "stale_pin", f"this transition is pinned to base {existing.base_sha}, not {expected_base}",
                "A replay must carry the same pin as the original request.",
                call_again(self.n, key)), key)
        return None

    # --- acceptance: the inputs read from Gitea, git and the lease ----------------------------------------------------

    async def _accept(
        self, key: str, source: Literal["caller", "derived"], lease: Lease, expected_base: str | None, attempt: int
    ) -> Transition | BootstrapResult:
        gitea = self.gitea
        not_found = make_envelope("not_found", f"issue #{self.n} or the repository is not visible to foreman",
                                  "Check the issue number.",
                                  "call gitea_get_runtime_context to see the issues leased to you")
        prior = await self.journal.latest_completed(self.ctx.repo, self.n)
        same_owner = prior is not None and prior.owner == self.caller

        async def issue_and_branch() -> tuple[Issue, str, str | None]:
            issue = await gitea.get_issue(self.n)
            self.seen["issue"] = issue
            name = prior.branch if prior is not None and same_owner else branch_for(
                self.n, issue.title, slug_length=self.cfg.slug_length)
            try:
                remote: str | None = (await gitea.get_branch(name)).commit_id
            except GiteaNotFound:
                remote = None
            return issue, name, remote

        async def base_and_checkout() -> tuple[Repository, str, tuple[str | None, str | None]]:
            # The checkout's own branch is the default branch as last seen: read it alongside the repository,
            # and read again only if Gitea's default branch turns out to be another one.
            head = gitops.symbolic_head(self.checkout.git_dir / "HEAD") if self.checkout.exists() else None
            guess = head.removeprefix("refs/heads/") if head else None
            early = gitea.get_branch(guess) if guess else None
            found = await asyncio.gather(gitea.get_repo(), *([early] if early else []), return_exceptions=True)
            if not isinstance(found[0], Repository):
                raise found[0] if isinstance(found[0], BaseException) else TypeError("no repository")
            repo = found[0]
            self.clone_url = effective_clone_url(self.ctx, repo.clone_url)
            url_problem = gitops.clone_url_problem(self.clone_url)
            if url_problem is not None or not repo.default_branch:
                raise StepFailed(Blocked("invalid_state", "clone_url_unusable", "the repository's clone_url cannot be"
                                         f" used: {url_problem or 'no default branch'}"))
            guessed = found[1] if len(found) > 1 else None
            if guess == repo.default_branch and isinstance(guessed, Branch):
                live = guessed.commit_id
            else:
                live = (await gitea.get_branch(repo.default_branch)).commit_id
            return repo, live, await self._prepare(self.clone_url, repo.default_branch, live_base=live)

        # The issue reads and the repository, base and fetch are independent: run them side by side.
        outcomes = await asyncio.gather(base_and_checkout(), issue_and_branch(), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        for failure in failures:
            if not isinstance(failure, Exception):
                raise failure
        operator = next((f for f in failures if isinstance(f, OperatorMustFix)), None)
        if operator is not None:
            return refused_result(self.n, operator.envelope, key)
        token = next((r for f in failures if isinstance(f, GiteaError) and (r := api_refusal(f, call_again(self.n)))),
                     None)
        if token is not None:
            return refused_result(self.n, token, key)
        if any(isinstance(f, GiteaNotFound) for f in failures):
            return refused_result(self.n, not_found, key)
        blocked = next((f for f in failures if isinstance(f, StepFailed)), None)
        if blocked is not None:
            return refused_result(self.n, blocked_envelope(self.n, blocked.blocked, released=False, key=None), key)
        if failures:
            return refused_result(self.n, unavailable(self.n, f"Gitea or git did not answer ({failures[0]})", key), key)
        prepared, found = outcomes
        assert not isinstance(prepared, BaseException) and not isinstance(found, BaseException)
        (repo, base, head), (issue, branch, remote_sha) = prepared, found
        if issue.is_pull or issue.state != "open":
            return refused_result(self.n, make_envelope(
                "invalid_state", f"#{self.n} is {'a pull request' if issue.is_pull else 'closed'}",
                "Only open issues get a worktree.", "call gitea_get_runtime_context to find your work"), key)
        if expected_base is not None and expected_base != base:
            return refused_result(self.n, make_envelope(
                "stale_pin",
                f"the live base of {repo.default_branch} is {base}, not the expected {expected_base}",
                "The default branch moved since the pin was taken; nothing was created.",
                f"call {TOOL} for #{self.n} again with expected_base={base} (or without expected_base)",
                live_base=base), key)
        try:
            path = Path(str(worktree_path_for(PurePosixPath(self.checkout.path), branch)))
        except PathRejected as exc:
            return refused_result(self.n, make_envelope(
                "invalid_state", f"the canonical worktree path is refused: {exc}",
                "foreman never creates a worktree outside branches/.", "call gitea_get_runtime_context"), key)

        def local_checks() -> tuple[bool, list[str], bool]:
            tracking = f"refs/remotes/origin/{repo.default_branch}"
            refs: dict[str, str] = self.seen.get("refs") or self.checkout.exact_refs(tracking)
            have_base = refs.get(tracking) == base or self.checkout.rev(base) is not None
            if not have_base:  # the base moved between the fetch and the API read: fetch once more
                self.checkout.fetch(repo.default_branch, auth=self._auth(self.clone_url))
                have_base = self.checkout.rev(base) is not None
            # This issue's branches only (found by name: the other branches are not read).
            issue_refs = self.checkout.branch_refs(issue_branch_prefix(self.n))
            self.seen["issue_refs"] = issue_refs
            others = [name.removeprefix("refs/heads/") for name in issue_refs]
            others = [b for b in others if b != branch]
            return worktree_files.escapes_root(self.checkout.branches_root, path), others, have_base

        try:
            escapes, others, have_base = await asyncio.to_thread(local_checks)
        except gitops.GitFailure as exc:
            return refused_result(self.n, unavailable(self.n, f"git failed: {exc}", key), key)
        refusal: Envelope | None = None
        if not have_base:
            refusal = unavailable(self.n, f"the base commit {base} could not be fetched", key)
        elif escapes:
            refusal = blocked_envelope(self.n, Blocked("invalid_state", "path_escapes_root", f"{path} is or goes"
                                                       " through a symbolic link out of branches/"), False, None)
        elif others and not same_owner:
            refusal = blocked_envelope(self.n, Blocked("invalid_state", "ambiguous_branches", "other branches of"
                                                       f" #{self.n} exist: {', '.join(others)}"), False, None)
        elif prior is not None and not same_owner:
            refusal = blocked_envelope(self.n, Blocked("invalid_state", "foreign_work", f"#{self.n} was bootstrapped"
                                                       f" for {prior.owner} before; that work is not reclaimed"),
                                       False, None)
        elif remote_sha is not None and remote_sha != base and not same_owner:
            refusal = blocked_envelope(self.n, Blocked("invalid_state", "remote_branch_exists", f"{branch} exists on"
                                                       f" Gitea at {remote_sha}, not at the base"), False, None)
        if refusal is not None:
            return refused_result(self.n, refusal, key)
        inputs = {
            "repo": self.ctx.repo,
            "clone_url": self.clone_url,
            "reported_clone_url": repo.clone_url,
            "default_branch": repo.default_branch,
            "issue": {"number": self.n, "title": issue.title, "state": issue.state},
            "caller": self.caller,
            "lease": lease.to_dict(),
            "expected_base": expected_base,
            "base_sha": base,
            "branch": branch,
            "worktree_path": str(path),
            "remote_branch_sha": remote_sha,
            "prior_key": prior.key if prior is not None and same_owner else None,
            "control_checkout": {"path": str(self.checkout.path), "head_ref": head[0], "head_sha": head[1]},
        }
        new = NewTransition(
            key=key, key_source=source, repo=self.ctx.repo, issue_number=self.n, lease_id=lease.lease_id,
            owner=lease.owner, role=lease.role, attempt=attempt, base_branch=repo.default_branch, base_sha=base,
            branch=branch, checkout_path=str(self.checkout.path), worktree_path=str(path), inputs=inputs,
        )
        now = self.ctx.clock()
        try:
            async with self.ctx.db.transaction() as conn:
                live = await live_lease_in(conn, self.leases, self.ctx.repo, lease.lease_id)
                if live is None or not live.is_live(now) or live.owner != self.caller:
                    return refused_result(self.n, lease_ended(), key)
                transition = await self.journal.accept(conn, new, proof=inputs, runner=self.runner, now=now)
        except JournalConflict as exc:
            return refused_result(self.n, make_envelope(
                "conflict", f"another transition holds #{self.n} or its path ({exc})",
                "Only one bootstrap per issue, path and lease runs at a time.", call_again(self.n)), key)
        self.base_fresh = True
        crash_seam(FAULT_PHASE_ENV, "accepted")
        return transition

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
