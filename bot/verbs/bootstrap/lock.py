"""The lock verb: an issue locked to the worktree its caller's completed bootstrap registered."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path, PurePosixPath
from typing import Any

from bot import gitops, worktree_files
from bot.core.bootstrap import PathRejected, worktree_lock_reason, worktree_path_for
from bot.core.gateway import GatewayContext
from bot.core.verbs import evaluate
from bot.verbs.bootstrap.context import BootstrapContext, LockResult, live_lease_in
from bot.verbs.bootstrap.refusals import input_problem, make_envelope
from state.journal import JournalConflict, JournalStore, Transition
from state.leases import LeaseStore


async def lock_issue(ctx: BootstrapContext, *, issue_number: int, caller: str) -> LockResult:
    """Lock the issue to the caller's registered worktree: only a worktree a completed bootstrap of the caller's
    live lease registered, still registered in git under ``branches/`` on the issue branch (branches-only and
    anti-stomp guards). Idempotent for the same lease; the lock is recorded with the lease and the worktree."""
    problem = input_problem(issue_number, caller, None, None)
    if problem is not None:
        return LockResult(issue_number if isinstance(issue_number, int) else 0, "refused", refusal=make_envelope(
            "invalid_input", problem, "Correct the argument and call again.", "call gitea_lock_issue again"))
    journal, leases = JournalStore(ctx.db), LeaseStore(ctx.db)
    now = ctx.clock()
    lease = await leases.live_for_issue(ctx.repo, issue_number)
    lease_live = lease is not None and lease.is_live(now)
    done = await journal.completed_for_lease(lease.lease_id) if lease is not None else None
    registration = await journal.live_registration(ctx.repo, issue_number)
    guards: dict[str, Any] = {}
    recognised = False
    if lease is not None and done is not None and registration is not None and registration.journal_id == done.id:
        guards = await asyncio.to_thread(_guard_worktree, ctx, done, registration.created_worktree)
        recognised = bool(guards.get("passed"))
    decision = evaluate("lock_issue", GatewayContext(
        caller=caller,
        caller_roles=ctx.roles_of(caller),
        issue_number=issue_number,
        lease_owner=lease.owner if lease is not None else None,
        lease_live=lease_live,
        worktree_registered=recognised,
    ))
    if not decision.allowed:
        envelope = decision.to_error()
        if envelope.error == "tracing_gap" and guards and not recognised:
            envelope = make_envelope(
                "invalid_state",
                f"the worktree registered for #{issue_number} no longer passes the guards: {guards['problems']}",
                "The registered worktree was moved, removed or changed outside foreman; it is left as it is.",
                f"call gitea_release_lease for #{issue_number} with reason=worktree_lost so the controller can"
                " re-allocate it",
                guards=guards,
            )
        return LockResult(issue_number, "refused", proof={"guards": guards}, refusal=envelope)
    assert lease is not None and registration is not None and done is not None
    async with ctx.db.transaction() as conn:
        existing = await journal.live_lock(ctx.repo, issue_number, conn)
        if existing is not None:
            if existing.lease_id == lease.lease_id and existing.registration_id == registration.id:
                return LockResult(issue_number, "locked", lock=existing.to_dict(), proof={"guards": guards},
                                  already_locked=True)
            holder = await live_lease_in(conn, leases, ctx.repo, existing.lease_id)
            if holder is not None and holder.is_live(now):
                return LockResult(issue_number, "refused", refusal=make_envelope(
                    "conflict", f"#{issue_number} is locked by lease {existing.lease_id} of {existing.owner}",
                    "Another live lease holds the issue lock; it is never taken over.",
                    "call gitea_get_runtime_context to find the work assigned to you"))
            await journal.release_lock(conn, existing.lock_id, reason="its lease ended", now=now)
        proof = {"guards": guards, "lease": lease.to_dict(), "registration": registration.to_dict(),
                 "bootstrap_key": done.key}
        try:
            lock = await journal.lock(conn, registration, proof=proof, now=now)
        except JournalConflict:
            return LockResult(issue_number, "refused", refusal=make_envelope(
                "conflict", f"#{issue_number} was locked meanwhile", "Repeat the call to see who holds it.",
                "call gitea_lock_issue again"))
    readback = await journal.live_lock(ctx.repo, issue_number)
    return LockResult(issue_number, "locked", lock=readback.to_dict() if readback else lock.to_dict(), proof=proof)


def _guard_worktree(ctx: BootstrapContext, transition: Transition, created: bool) -> dict[str, Any]:
    """The branches-only and anti-stomp guards, read from git now: the registered path is canonical, reaches
    no symlink, is registered on the issue branch (and, when foreman created it, still carries its lock)."""
    problems: list[str] = []
    path = Path(transition.worktree_path)
    checkout = gitops.ControlCheckout(Path(transition.checkout_path), env=gitops.git_env(ctx.bot_login),
                                      timeout_s=ctx.settings.bootstrap.git_timeout_s)
    try:
        worktree_path_for(PurePosixPath(transition.checkout_path), transition.branch)
    except PathRejected as exc:
        problems.append(str(exc))
    if worktree_files.escapes_root(checkout.branches_root, path):
        problems.append("the path is or goes through a symbolic link out of branches/")
    entry = checkout.worktree_at(path) if checkout.exists() else None
    view: dict[str, str] | None = None
    if entry is None:
        problems.append("git has no worktree registered at the path")
    else:
        if entry.branch != transition.branch:
            problems.append(f"the worktree holds {entry.branch or 'a detached HEAD'}, not {transition.branch}")
        if entry.prunable is not None:
            problems.append("the worktree's directory is gone")
        if created and entry.locked != worktree_lock_reason(transition.key):
            problems.append("the worktree no longer carries the lock foreman gave it")
        if not problems:
            try:
                seen = checkout.worktree_view(path)
                view = seen.to_dict()
                if os.path.realpath(seen.toplevel) != os.path.realpath(path):
                    problems.append("git resolves the worktree to another directory")
                if seen.head_ref != f"refs/heads/{transition.branch}":
                    problems.append(f"HEAD is {seen.head_ref or 'detached'}")
            except gitops.GitFailure as exc:
                problems.append(str(exc))
    return {"passed": not problems, "problems": problems, "worktree": entry.to_dict() if entry else None,
            "view": view, "path": str(path), "branch": transition.branch}
