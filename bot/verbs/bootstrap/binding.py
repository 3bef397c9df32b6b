"""The transition's last steps: lease, registration and Gitea assignment bound together, then the read-back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bot import gitops
from bot.core.bootstrap import Blocked
from bot.core.canonical import CanonicalState
from bot.core.evidence import render_evidence
from bot.gitea import GiteaError, GiteaUnassignable, GiteaUnavailable
from bot.verbs.bootstrap.context import live_lease_in
from bot.verbs.bootstrap.faults import FAULT_PHASE_ENV, crash_seam
from bot.verbs.bootstrap.refusals import StepFailed, TransientFailure
from bot.verbs.bootstrap.run import Run
from state.journal import Transition
from state.outbox import OutboxIntent, enqueue


async def ensure_assigned(run: Run, t: Transition) -> dict[str, Any]:
    """Make the owner an assignee of the issue in Gitea (keeping whoever else is assigned) and read the issue
    back: the assignment is what Gitea lists afterwards, never what foreman asked for. Gitea silently drops
    assignees it does not accept (an identity without write access, for one), so a read-back without the
    owner fails the transition (``assignment_unverified``) instead of being reported as done (AC1, AC8)."""
    n, owner = run.issue_number, t.owner.lower()
    refused: str | None = None
    try:
        before = sorted(u.login for u in (await run.gitea.get_issue(n)).assignees)
        after, wrote = before, False
        if owner not in {a.lower() for a in before}:
            try:
                # set_assignees: Gitea answers an account it cannot assign (CanBeAssigned: no access to a
                # private repository) with a 500; this names it once instead of retrying it as an outage.
                await run.gitea.set_assignees(n, sorted({*before, t.owner}))
                wrote = True
            except GiteaUnassignable as exc:
                raise StepFailed(Blocked("invalid_state", "owner_unassignable", f"Gitea cannot assign {t.owner} on"
                                         f" #{n}: {exc.message}"), owner=t.owner, reasons=exc.reasons) from exc
            except GiteaUnavailable:
                raise
            except GiteaError as exc:
                refused = str(exc)
            after = sorted(u.login for u in (await run.gitea.get_issue(n)).assignees)
    except GiteaUnavailable as exc:
        raise TransientFailure(f"Gitea did not answer ({exc})") from exc
    except GiteaError as exc:
        raise StepFailed(Blocked("invalid_state", "assignment_unverified", f"Gitea could not show #{n}'s"
                                 f" assignees: {exc}")) from exc
    if owner not in {a.lower() for a in after}:
        why = f"Gitea refused the change ({refused})" if refused else "foreman assigned it"
        raise StepFailed(Blocked("invalid_state", "assignment_unverified", f"Gitea does not list {t.owner} as an"
                                 f" assignee of #{n} after {why} (read back: {', '.join(after) or 'nobody'})"),
                         gitea_assignees=after)
    seen = {"gitea_assignees": after, "assigned": True, "read_back": True, "written_by_bootstrap": wrote,
            "outbox_key": f"{t.lease_id}:assignee"}
    run.seen.assignment = seen
    return seen


async def bind(run: Run, t: Transition) -> Transition:
    """``lock_established``: the lease, the registration and Gitea's assignment bound together, in one transaction
    with the phase (the lease must still be live and the issue's registration not another owner's)."""
    n, proofs = run.issue_number, await run.load_proofs(t)
    assignment = await ensure_assigned(run, t)
    now = run.ctx.clock()
    blocked: Blocked | None = None
    async with run.ctx.db.transaction() as conn:
        lease = await live_lease_in(conn, run.leases, t.repo, t.lease_id)
        if lease is None or not lease.is_live(now) or lease.owner != t.owner:
            blocked = Blocked("stale_pin", "lease_changed", f"lease {t.lease_id} is no longer live for {t.owner}")
        else:
            current = await run.journal.live_registration(t.repo, t.issue_number, conn)
            if current is not None and current.journal_id != t.id:
                if current.owner == t.owner:
                    await run.journal.end_registration(conn, current.id, reason=f"superseded by {t.key}",
                                                        now=now)
                else:
                    blocked = Blocked("invalid_state", "foreign_registration", f"#{n} has a worktree"
                                      f" registered for {current.owner}")
        if blocked is None:
            assert lease is not None
            registration = await run.journal.registration_for_journal(t.id, conn)
            if registration is None or registration.ended_at is not None:
                registration = await run.journal.register(
                    conn, t,
                    created_branch=bool(proofs.get("branch_confirmed", {}).get("created")),
                    created_worktree=bool(proofs.get("worktree_confirmed", {}).get("created")),
                    now=now,
                )
            lock = await run.journal.live_lock(t.repo, t.issue_number, conn)
            proof = {
                "lease": lease.to_dict(),
                "registration": registration.to_dict(),
                "assignment": assignment,
                "lock": {"state": "locked" if lock is not None else "ready",
                         "lock": lock.to_dict() if lock is not None else None},
            }
            t = await run.journal.advance(conn, t, "lock_established", proof=proof, runner=run.runner, now=now)
    if blocked is not None:
        raise StepFailed(blocked)
    crash_seam(FAULT_PHASE_ENV, "lock_established")
    return t


async def complete(run: Run, t: Transition) -> Transition:
    """``completed``: everything read back from git, the database and Gitea, recorded as the result, with the
    evidence comment queued in the same transaction."""
    proofs = await run.load_proofs(t)
    path = Path(t.worktree_path)

    def readback() -> dict[str, Any]:
        # What this very call read after its own writes is reused; a resumed call reads it again.
        entry = run.seen.entry or run.checkout.worktree_at(path)
        view = run.seen.view or run.checkout.worktree_view(path)
        head_ref = gitops.symbolic_head(run.checkout.git_dir / "HEAD")
        head_sha = run.checkout.read_ref(head_ref) if head_ref else run.checkout.rev("HEAD")
        branch_sha = run.checkout.read_ref(f"refs/heads/{t.branch}")
        return {"branch_sha": branch_sha, "entry": entry.to_dict() if entry else None,
                "head": view.head, "head_ref": view.head_ref,
                "checkout": {"head_ref": head_ref, "head_sha": head_sha}}

    try:
        seen = await asyncio.to_thread(readback)
    except gitops.GitFailure as exc:
        raise StepFailed(Blocked("invalid_state", "readback_failed", str(exc))) from exc
    if seen["entry"] is None or seen["head_ref"] != f"refs/heads/{t.branch}":
        raise StepFailed(Blocked("invalid_state", "readback_failed", "the worktree is gone or off its branch"))
    before = t.inputs.get("control_checkout", {})
    # Gitea's assignees as read back after this call's own assignment, or (a resumed call) read again now.
    assignment = run.seen.assignment or await ensure_assigned(run, t)
    lease = await run.leases.get(t.lease_id)
    registration = await run.journal.registration_for_journal(t.id)
    lock = await run.journal.live_lock(t.repo, t.issue_number)
    result = {
        "idempotency_key": t.key,
        "repo": t.repo,
        "branch": t.branch,
        "ref": f"refs/heads/{t.branch}",
        "branch_sha": seen["branch_sha"],
        "worktree_path": t.worktree_path,
        "worktree": seen["entry"],
        "head_sha": seen["head"],
        "base_branch": t.base_branch,
        "base_sha": t.base_sha,
        "base_equivalent": seen["head"] == t.base_sha,
        "created": {"branch": bool(proofs.get("branch_confirmed", {}).get("created")),
                    "worktree": bool(proofs.get("worktree_confirmed", {}).get("created"))},
        "lease": lease.to_dict() if lease is not None else None,
        "registration": registration.to_dict() if registration is not None else None,
        "assignment": assignment,
        "lock": {"state": "locked" if lock is not None else "ready",
                 "lock": lock.to_dict() if lock is not None else None, "verb": "gitea_lock_issue"},
        "control_checkout": {**seen["checkout"], "path": t.checkout_path,
                             "unchanged": seen["checkout"] == {"head_ref": before.get("head_ref"),
                                                              "head_sha": before.get("head_sha")}},
    }
    if (taken := proofs.get("branch_confirmed", {}).get("takeover")) is not None:
        result["takeover"] = taken  # whose stranded work this continues, and where theirs is kept
    now = run.ctx.clock()
    async with run.ctx.db.transaction() as conn:
        t = await run.journal.advance(conn, t, "completed", proof=result, runner=run.runner, now=now,
                                       result=result)
        await enqueue(conn, evidence(run, t, result), now=now)
    crash_seam(FAULT_PHASE_ENV, "completed")
    return t


def evidence(run: Run, t: Transition, result: dict[str, Any]) -> OutboxIntent:
    key = f"{t.key}:evidence"
    created = result["created"]
    what = "created" if created["branch"] and created["worktree"] else "confirmed"
    state = CanonicalState(
        state="in-progress",
        who_is_next=t.role if t.role in ("author", "reviewer", "merger", "controller") else "author",
        next_action=f"{t.owner}: lock #{t.issue_number} with gitea_lock_issue, then work in {t.branch}",
        next_prompt=(
            f"Your worktree for #{t.issue_number} is registered at branches/{t.branch} on {t.branch}\n"
            f"(base {t.base_sha[:12]}). Call gitea_lock_issue for #{t.issue_number}, work only there,\n"
            "heartbeat your lease, and post the next state when done."
        ),
        what_happened=f"{what} branch {t.branch} and worktree branches/{t.branch} for lease {t.lease_id}",
        why=f"{t.owner} holds the live lease and asked for its worktree (idempotency key {t.key})",
        related_prs=(),
        blockers="none",
        validation=(
            "branch ref, git worktree list --porcelain entry, worktree HEAD, lease and registration read back"
            " after writing; this comment is read back by foreman"
        ),
        last_updated_by=run.ctx.bot_login,
    )
    summary = (f"Bootstrapped #{t.issue_number} for {t.owner}: branch {t.branch} at {result['head_sha']},"
               f" worktree branches/{t.branch} registered and bound to lease {t.lease_id}.")
    taken = result.get("takeover")
    if taken is not None:
        start = "the branch as pushed to Gitea" if taken["start_from"] == "gitea" else "the base"
        kept = f"; their worktree is kept at {taken['kept_path']}" if taken.get("kept_path") else ""
        summary += (f" It takes over {taken['from_owner']}'s stranded work (lease {taken['from_lease']},"
                    f" {taken['from_lease_status']}) from {start}{kept}.")
    body = render_evidence(
        key=key,
        summary=summary,
        state=state,
        evidence={"action": "bootstrap_issue_worktree", **result},
    )
    return OutboxIntent(key, t.issue_number, "comment", {"body": body}, repo=t.repo)
