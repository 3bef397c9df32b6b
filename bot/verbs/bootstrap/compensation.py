"""Compensating recovery: undo exactly what the journal proves this transition made, then report it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from bot import gitops
from bot.core.bootstrap import Blocked, UndoPlan
from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope
from bot.core.intents import StateChange
from bot.core.reasons import BlockReason
from bot.gitea import GiteaError
from bot.verbs.bootstrap.context import BootstrapResult
from bot.verbs.bootstrap.faults import FAULT_PHASE_ENV, crash_seam
from bot.verbs.bootstrap.git_steps import GitUndo, undo_git
from bot.verbs.bootstrap.refusals import blocked_envelope, observed_details, refused_result, unavailable
from bot.verbs.bootstrap.run import Run
from state.journal import Registration, Transition
from state.leases import Lease, LeaseRefused
from state.outbox import OutboxIntent, enqueue


async def require_compensation(run: Run, t: Transition, blocked: Blocked, **details: Any) -> Transition:
    """``compensation_required``: why the transition cannot go on, recorded before anything is undone."""
    proof = {"kind": blocked.kind, "reason": blocked.reason, "message": blocked.message,
             "failed_phase": t.phase, **details}
    error = blocked_envelope(run.issue_number, blocked, released=False, key=t.key,
                             **observed_details(details)).to_dict()
    async with run.ctx.db.transaction() as conn:
        t = await run.journal.advance(conn, t, "compensation_required", proof=proof, runner=run.runner,
                                      now=run.ctx.clock(), error=error)
    crash_seam(FAULT_PHASE_ENV, "compensation_required")
    return t


async def compensate(run: Run, t: Transition, undoers: Sequence[GitUndo]) -> BootstrapResult:
    """``compensation_completed``: the steps' ``undoers`` remove in git what the journal proves this transition
    made, then the registration ends, the lease is released (or kept) and the Gitea side is queued, in one
    transaction with the phase. Content that removing would lose is left in place: the transition stays open,
    ``blocked``, for a person to look at."""
    n = run.issue_number
    await run.load_proofs(t)  # what the journal proves this transition made (the path reserved free, ...)
    now = run.ctx.clock()
    registration = await run.journal.registration_for_journal(t.id)
    registration_live = registration is not None and registration.ended_at is None
    lease = await run.leases.get(t.lease_id)
    lease_ours = lease is not None and lease.is_live(now) and lease.owner == t.owner
    try:
        plan, observed, done = await asyncio.to_thread(
            undo_git, run, t, undoers, release=run.cfg.release_lease_on_failure,
            registration_live=registration_live, lease_ours=lease_ours)
    except gitops.WorktreeRefused as exc:
        # A worktree whose .git file or registration is not what foreman wrote (an earlier owner's, rewritten): no
        # git runs in it, and nothing here is undone; no retry changes that, an operator must look (never
        # ``unavailable``, which says a retry resumes).
        restore = f"; an operator restores it with: {exc.restore}" if exc.restore else ""
        blocked = Blocked("invalid_state", "worktree_refused", f"compensation left everything in place: {exc}{restore}")
        return refused_result(n, blocked_envelope(n, blocked, False, t.key), t.key)
    except gitops.GitFailure as exc:
        return refused_result(n, unavailable(n, f"git failed during compensation: {exc}", t.key), t.key)
    releasing = "lease" in plan.undo
    assignees: list[str] = []
    if releasing:
        try:
            assignees = sorted(u.login for u in (await run.gitea.get_issue(n)).assignees)
        except GiteaError as exc:
            return refused_result(n, unavailable(n, f"Gitea did not answer ({exc})", t.key), t.key)
    failure = t.error or {}
    envelope = blocked_envelope(n, _failure(failure, plan), released=releasing or not lease_ours, key=t.key,
                                kept=list(plan.keep), left=list(plan.blocked),
                                **observed_details(failure.get("details") or {}))
    proof = {"undone": done + [u for u in plan.undo if u in ("registration", "lease")],
             "kept": list(plan.keep), "blocked": list(plan.blocked), "observed": observed, "failure": failure}
    t, outbox = await _record(run, t, plan, proof, envelope, registration if registration_live else None,
                              lease if releasing else None, assignees, now)
    if plan.blocked:
        return BootstrapResult(n, "blocked", t.key, t.phase, envelope, proof=proof,
                               journal=await run.journal_view(t), outbox=outbox)
    crash_seam(FAULT_PHASE_ENV, "compensation_completed")
    result = await run.finished(t, replayed=False)
    result.outbox = outbox
    return result


def _failure(failure: dict[str, Any], plan: UndoPlan) -> Blocked:
    """What the compensation reports: the recorded failure, or that it left content in place."""
    kind = str(failure.get("error", "invalid_state"))
    message = str(failure.get("message", "the bootstrap failed"))
    if plan.blocked:
        return Blocked("invalid_state", "compensation_blocked", f"{message}; compensation left"
                       f" {', '.join(plan.blocked)} in place because removing it could lose content")
    if kind == "stale_pin":
        return Blocked("stale_pin", _recorded_reason(failure, "stale_pin"), message)
    return Blocked("invalid_state", _recorded_reason(failure, "failed"), message)


def _recorded_reason(failure: dict[str, Any], default: BlockReason) -> BlockReason:
    """The reason ``require_compensation`` recorded from its ``Blocked`` (the journal holds it as JSON text)."""
    return cast("BlockReason", str(failure.get("details", {}).get("reason", default)))


async def _record(run: Run, t: Transition, plan: UndoPlan, proof: dict[str, Any], envelope: Envelope,
                  registration: Registration | None, releasing: Lease | None, assignees: list[str],
                  now: datetime) -> tuple[Transition, list[str]]:
    """The record side of the compensation, in one transaction: the registration ended, the lease released, the
    Gitea side queued, and the phase (or, blocked, the error) recorded. Returns the outbox keys queued."""
    failure = proof["failure"]
    stale = str(failure.get("error", "invalid_state")) == "stale_pin" and not plan.blocked
    released = releasing is not None
    outbox: list[str] = []
    async with run.ctx.db.transaction() as conn:
        if registration is not None:
            await run.journal.end_registration(conn, registration.id, reason=f"compensated: {t.key}", now=now)
        if releasing is not None:
            try:
                await run.leases.release(conn, releasing.lease_id, actor=run.ctx.bot_login,
                                         reason=f"bootstrap failed: {failure.get('message', 'compensated')}"[:300],
                                         now=now)
            except LeaseRefused:
                released = False
        for intent in failure_intents(run, t, assignees, envelope, released=released, stale=stale):
            await enqueue(conn, intent, now=now)
            outbox.append(intent.key)
        if plan.blocked:
            t = await run.journal.note_error(conn, t, {**envelope.to_dict(), "compensation": proof}, now=now)
        else:
            t = await run.journal.advance(conn, t, "compensation_completed", proof=proof, runner=run.runner,
                                          now=now, error=envelope.to_dict(), result=proof)
    return t, outbox


def failure_intents(run: Run, t: Transition, assignees: list[str], envelope: Envelope, *, released: bool,
                     stale: bool) -> list[OutboxIntent]:
    """The Gitea side of a compensation, in order: with the lease released, the status label and the
    assignee follow it back (ready after a stale pin, else blocked); always, a failure evidence comment."""
    key, n = t.key, t.issue_number
    message = " ".join(envelope.message.split())[:300]
    if released:
        target = "ready" if stale else "blocked"
        who, action = "controller", (f"controller: re-allocate #{n} (gitea_allocate_next_work)" if stale
                                     else f"controller: resolve the blocker on #{n}, then re-allocate it")
    else:
        target = "in-progress" if stale else "blocked"
        who = t.role if t.role in ("author", "reviewer", "merger", "controller") else "author"
        action = f"{t.owner}: {envelope.exact_next_action}"
    state = CanonicalState(
        state=target,
        who_is_next=who,
        next_action=action,
        next_prompt="",
        what_happened=f"the worktree bootstrap for lease {t.lease_id} failed and was compensated",
        why=message,
        related_prs=(),
        blockers="none" if stale else message,
        validation="only artifacts the journal proves it created were removed"
        + ("; the lease release is recorded" if released else "; the lease is kept"),
        last_updated_by=run.ctx.bot_login,
    )
    # With the lease released the label and the assignee follow it back: the assignees always, even when Gitea does
    # not list the owner now (the allocation's assignment may still be queued in the outbox, and this entry, queued
    # after it, is sent after it).
    return list(StateChange(
        repo=t.repo, issue_number=n, state=state,
        summary=f"The worktree bootstrap of #{t.issue_number} for {t.owner} failed: {envelope.message}",
        evidence={"action": "bootstrap_compensated", "refusal": envelope.to_dict(), "idempotency_key": key},
        comment_key=f"{key}:failure", labels_key=f"{key}:labels" if released else None, leaving=("in-progress",),
        assignees_key=f"{key}:assignees" if released else None,
        assignees=[a for a in assignees if a.lower() != t.owner.lower()],
    ).intents())
