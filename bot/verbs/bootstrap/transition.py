"""The worktree bootstrap transition: replay a finished request, or accept one from authoritative inputs and drive its
journaled steps (``steps.STEPS``) to the end."""

from __future__ import annotations

from typing import Literal

from bot import worktree_files
from bot.core.bootstrap import Blocked, derive_key
from bot.verbs.bootstrap.acceptance import Request, accept
from bot.verbs.bootstrap.context import TOOL, BootstrapContext, BootstrapResult, ProofReads
from bot.verbs.bootstrap.refusals import (
    call_again,
    input_problem,
    lease_ended,
    make_envelope,
    refused_result,
    unavailable,
)
from bot.verbs.bootstrap.run import Observed, Run
from bot.verbs.bootstrap.steps import drive
from state.journal import Transition
from state.leases import Lease


async def bootstrap_issue_worktree(
    ctx: BootstrapContext,
    *,
    issue_number: int,
    caller: str,
    idempotency_key: str | None = None,
    expected_base: str | None = None,
    proof_reads: ProofReads | None = None,
) -> BootstrapResult:
    """Create or recover the issue's branch and registered worktree under ``branches/`` for the caller's live
    lease, journaled phase by phase; refuse (typed envelope) or compensate on failure. See docs/bootstrap.md.

    Reached through the door (``VerbRuntime.call``), which admits only the live lease's owner; a lease that ended
    since is refused ``stale_pin`` (``lease_ended``) here and at the claim. ``idempotency_key``: replaying the
    same key returns or resumes the same transition (derived from the lease when omitted). ``expected_base``:
    the default branch's commit the caller expects; a different live base is a ``stale_pin`` refusal.
    ``proof_reads``: the allocation's proof's Gitea reads, used instead of reading again while at most
    ``PROOF_READS_FRESH_S`` old (the allocation's own bootstrap only).
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
        return await execute(Run.start(ctx, issue_number, caller, proof_reads=proof_reads), idempotency_key,
                             expected_base)


async def replay_finished(
    ctx: BootstrapContext, *, issue_number: int, caller: str, idempotency_key: str, expected_base: str | None = None
) -> BootstrapResult | None:
    """The recorded answer to the finished request ``idempotency_key`` (see ``replay``), else None."""
    return await replay(Run.start(ctx, issue_number, caller), idempotency_key, expected_base)


async def execute(run: Run, key: str | None, expected_base: str | None) -> BootstrapResult:
    """One call, holding the per-issue file lock: replay, resume, or accept and drive (one open transition per
    issue; one completed transition per lease)."""
    n, repo = run.issue_number, run.ctx.repo
    now = run.ctx.clock()
    if key is not None and (replayed := await replay(run, key, expected_base)) is not None:
        return replayed
    # The door decided the role and the ownership; a lease that ended since is the claim's race, answered alike.
    lease = await run.leases.live_for_issue(repo, n)
    if lease is None or not lease.is_live(now) or lease.owner != run.caller:
        return refused_result(n, lease_ended(), key)
    if lease.action != "implement":  # only an implementer's lease gets a branch and a worktree
        return refused_result(n, make_envelope(
            "invalid_state", f"your lease on #{n} is for {lease.action}, and only an implementation gets a"
            " worktree", "A review reads the pull request as it is on Gitea; nothing was created.",
            f"call gitea_submit_review for #{n} with your verdict on the pull request's head",
            reason="no_worktree_for_action"), key)
    source: Literal["caller", "derived"] = "caller"
    attempt = await run.journal.compensated_count(lease.lease_id)
    if key is None:
        key, source = derive_key(repo, n, lease.lease_id, attempt), "derived"
    existing = await run.journal.get(key)
    if existing is not None:
        refusal = _identity_mismatch(run, existing, lease, expected_base)
        if refusal is not None:
            return refusal
        if existing.outcome != "open":
            return await run.finished(existing, replayed=True)
        return await drive(run, existing)
    open_other = await run.journal.open_for_issue(repo, n)
    if open_other is not None:
        if open_other.lease_id == lease.lease_id:
            return refused_result(n, make_envelope(
                "conflict", f"an unfinished bootstrap of #{n} for this lease exists under another idempotency key",
                "Resume that transition instead of starting a second one.",
                call_again(n, open_other.key), existing_key=open_other.key), key)
        # An unfinished transition of an ended lease: undo what it made before starting anew.
        stale = await compensate_ended(run, open_other)
        if stale.status != "compensated":
            return stale
        run.seen = Observed()  # what was observed for the old transition says nothing about the new one
        run.proofs = {}
    completed = await run.journal.completed_for_lease(lease.lease_id)
    if completed is not None:
        return refused_result(n, make_envelope(
            "conflict", f"#{n} is already bootstrapped for this lease (idempotency key {completed.key})",
            "One lease gets one worktree; use the one already registered.",
            f"call gitea_lock_issue for #{n}", existing_key=completed.key), key)
    accepted = await accept(run, Request(key, source, lease, expected_base, attempt))
    if isinstance(accepted, BootstrapResult):
        return accepted
    return await drive(run, accepted)


async def replay(run: Run, key: str, expected_base: str | None) -> BootstrapResult | None:
    """The recorded answer to a request that already finished (its owner's only), else None: a replay changes
    nothing, so it needs no live lease."""
    existing = await run.journal.get(key)
    if existing is None or existing.outcome == "open":
        return None
    return _identity_mismatch(run, existing, None, expected_base) or await run.finished(existing, replayed=True)


async def compensate_ended(run: Run, transition: Transition) -> BootstrapResult:
    """Undo an open transition whose lease is no longer the live lease (the journal finishing its own work, not
    a verb call: nothing new is made for anyone)."""
    return await drive(run, transition, fail_with=Blocked(
        "stale_pin", "lease_changed", f"its lease {transition.lease_id} is no longer the live lease"))


def _identity_mismatch(run: Run, existing: Transition, lease: Lease | None, expected_base: str | None) -> (
    BootstrapResult | None
):
    """Reuse only after exact identity and compatibility are proven (amendment 2)."""
    n, key = run.issue_number, existing.key
    if existing.owner != run.caller:
        return refused_result(n, make_envelope(
            "not_authorized", "this idempotency key belongs to a transition of another identity",
            "Use your own request's key, or none.", f"call {TOOL} for #{n} without idempotency_key"), key)
    if existing.issue_number != n:
        return refused_result(n, make_envelope(
            "conflict", f"this idempotency key was used for #{existing.issue_number}",
            "A key names exactly one request.", f"call {TOOL} for #{n} without idempotency_key"), key)
    if lease is not None and existing.lease_id != lease.lease_id:
        return refused_result(n, make_envelope(
            "stale_pin", f"this idempotency key belongs to lease {existing.lease_id}, not the live lease"
            f" {lease.lease_id}", "The allocation changed since that request; start a new one.",
            f"call {TOOL} for #{n} without idempotency_key"), key)
    if expected_base is not None and expected_base != existing.base_sha:
        return refused_result(n, make_envelope(
            "stale_pin", f"this transition is pinned to base {existing.base_sha}, not {expected_base}",
            "A replay must carry the same pin as the original request.",
            call_again(n, key)), key)
    return None
