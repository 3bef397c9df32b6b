"""Stranded work comes back (issue 31, item 3): another author bootstraps an issue whose earlier owner's lease ended
without a handover. The earlier owner's worktree is kept for it, never deleted or reset: its HEAD detached where it
is (its uncommitted changes and unpushed commits stay there), moved to ``branches/.kept/``, its registration ended
saying where; the issue branch then starts again from what Gitea has (or the base), and the journal says so."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from bot import worktree_files
from bot.core.bootstrap import Blocked, PathRejected, kept_path_for
from bot.verbs.bootstrap.faults import FAULT_PHASE_ENV, FAULT_STEP_ENV, crash_seam
from bot.verbs.bootstrap.refusals import StepFailed
from bot.verbs.bootstrap.run import Run
from state.journal import Registration, Transition
from state.leases import Lease, LeaseStore
from state.publications import PublicationStore

#: Where the new work starts: the issue branch as Gitea has it (it was published), else the default branch's head.
StartFrom = Literal["gitea", "base"]


def stranded(lease: Lease, *, now: datetime, grace: timedelta) -> bool:
    """The lease no longer holds its work: ended (``expired``, ``released``), or still marked live but past its
    expiry and the grace (the allocator reclaims such a lease: docs/allocator.md)."""
    if lease.status in ("expired", "released"):
        return True
    return lease.status == "live" and lease.expires_at + grace <= now


@dataclass(frozen=True, slots=True)
class StrandedWork:
    """Another owner's earlier work on the issue that no live lease holds: its latest completed transition, that
    transition's lease, and the issue's live registration (that owner's worktree; None when none is live)."""

    prior: Transition
    lease: Lease
    registration: Registration | None

    @property
    def lease_status(self) -> str:
        """``expired``, ``released``, or ``live_past_grace`` (marked live, past its expiry and the grace)."""
        return "live_past_grace" if self.lease.status == "live" else self.lease.status


async def find_stranded(run: Run, prior: Transition | None, *, now: datetime) -> StrandedWork | None:
    """The issue's earlier work of another owner, when it is provably stranded: the lease of its latest completed
    transition, and the lease of the issue's live registration, are both ``stranded``. None otherwise (no earlier
    work, the caller's own, or still held: refused as before)."""
    if prior is None or prior.owner == run.caller:
        return None
    grace = timedelta(seconds=run.ctx.settings.allocator.lease_grace_s)
    leases = run.leases
    lease = await leases.get(prior.lease_id)
    if lease is None or not stranded(lease, now=now, grace=grace):
        return None
    registration = await run.journal.live_registration(run.ctx.repo, run.issue_number)
    if registration is not None:
        if registration.owner == run.caller:
            return None
        if registration.lease_id != lease.lease_id:
            held = await leases.get(registration.lease_id)
            if held is None or not stranded(held, now=now, grace=grace):
                return None
    return StrandedWork(prior, lease, registration)


async def registration_stranded(leases: LeaseStore, registration: Registration, *, now: datetime,
                                grace: timedelta) -> bool:
    """The registration's lease no longer holds it (the preflight's view: its worktree would be kept aside)."""
    lease = await leases.get(registration.lease_id)
    return lease is not None and stranded(lease, now=now, grace=grace)


async def plan_takeover(run: Run, work: StrandedWork, *, branch: str, path: Path, base: str,
                        remote_sha: str | None) -> dict[str, Any] | Blocked:
    """What the takeover will do, recorded with the transition's inputs (``accepted``): whose work, which lease,
    where its worktree is kept, and the commit the new work starts from (Gitea's branch, else the base)."""
    registration = work.registration
    kept: str | None = None
    if registration is not None:
        if registration.worktree_path != str(path):
            return Blocked("invalid_state", "foreign_work", f"the worktree registered for {registration.owner} is at"
                           f" {registration.worktree_path}, not the canonical {path}: it is not taken over")
        try:
            kept = str(kept_path_for(PurePosixPath(run.checkout.path), branch, registration.owner,
                                     registration.journal_id))
        except PathRejected as exc:
            return Blocked("invalid_state", "path_escapes_root", f"no place to keep {registration.owner}'s worktree:"
                           f" {exc}")
    start_from: StartFrom = "gitea" if remote_sha is not None else "base"
    start = remote_sha if remote_sha is not None else base
    pushed = [p for p in await PublicationStore(run.ctx.db).pushed_branches(run.ctx.repo, branch)
              if p.commit_sha == start]
    return {
        "from_owner": work.prior.owner,
        "from_lease": work.lease.lease_id,
        "from_lease_status": work.lease_status,
        "from_lease_end_reason": work.lease.end_reason,
        "from_key": work.prior.key,
        "registration_id": registration.id if registration is not None else None,
        "registration_lease": registration.lease_id if registration is not None else None,
        "kept_path": kept,
        "start_sha": start,
        "start_from": start_from,
        "published_by": [{"key": p.key, "owner": p.owner, "lease_id": p.lease_id} for p in pushed],
    }


# --- the git side (run in a thread, as the branch step's first part) -------------------------------------------------


def take_over(run: Run, t: Transition) -> dict[str, Any]:
    """Keep the earlier owner's worktree aside (HEAD detached, then moved), then point the issue branch at the
    start commit: only if what it pointed at stays reachable (from the start, or the kept worktree's HEAD).
    Every part checks where it stands first, so a replay after a crash goes on from there."""
    takeover: dict[str, Any] = t.inputs["takeover"]
    message = f"foreman takeover {t.key}"
    kept = takeover.get("kept_path")
    kept_head = _keep_worktree(run, Path(t.worktree_path), Path(kept), message) if kept else None
    crash_seam(FAULT_STEP_ENV, "worktree_kept")
    start: str = takeover["start_sha"]
    before = run.checkout.branch_sha(t.branch)
    if before != start:
        if run.checkout.rev(start) is None:
            raise StepFailed(Blocked("invalid_state", "git_failed", f"the start commit {start} is not in the control"
                                     " checkout"))
        if before is not None and not any(before == held or run.checkout.is_ancestor(before, held)
                                           for held in (start, kept_head) if held):
            raise StepFailed(Blocked("invalid_state", "foreign_work", f"{t.branch} is at {before}, which neither"
                                     f" {start} nor a kept worktree holds: that work is not taken over"))
        holder = next((e.path for e in run.checkout.worktrees() if e.branch == t.branch), None)
        if holder is not None:
            raise StepFailed(Blocked("invalid_state", "branch_checked_out_elsewhere", f"{t.branch} is checked out"
                                     f" in {holder}"))
        if not run.checkout.move_branch(t.branch, start, before or "", message):
            raise StepFailed(Blocked("stale_pin", "branch_moved", f"{t.branch} moved while it was taken over"))
        run.seen.issue_refs = None  # what the acceptance read of the branch is stale now
    return {**takeover, "kept_head": kept_head, "branch_before": before, "branch_sha": start}


def _keep_worktree(run: Run, canonical: Path, kept: Path, message: str) -> str:
    """The worktree at ``canonical`` detached and moved to ``kept`` (or found there already): its HEAD."""
    root = run.checkout.branches_root
    if worktree_files.escapes_root(root, kept):
        raise StepFailed(Blocked("invalid_state", "path_escapes_root", f"{kept} is or goes through a symbolic link"
                                 " out of branches/"))
    entry = run.checkout.worktree_at(kept) if os.path.lexists(kept) else None
    if entry is None:
        if os.path.lexists(kept):
            raise StepFailed(Blocked("invalid_state", "path_occupied", f"something that is not the kept worktree is"
                                     f" at {kept}; it is left untouched"))
        at = run.checkout.worktree_at(canonical)
        if at is None or at.prunable is not None or not canonical.is_dir() or canonical.is_symlink():
            raise StepFailed(Blocked("invalid_state", "worktree_missing", f"the worktree to keep is not registered"
                                     f" at {canonical}"))
        if not at.detached:
            run.checkout.detach_head(canonical, message)
        kept.parent.mkdir(exist_ok=True)
        if worktree_files.escapes_root(root, kept):
            raise StepFailed(Blocked("invalid_state", "path_escapes_root", f"{kept.parent} became a symbolic link"))
        run.checkout.move_worktree(canonical, kept)
        entry = run.checkout.worktree_at(kept)
        if entry is None:
            raise StepFailed(Blocked("invalid_state", "worktree_missing", f"git does not list the worktree at {kept}"
                                     " after moving it there"))
    if not entry.detached:  # a HEAD reattached since it was kept: it must hold no branch
        return run.checkout.detach_head(kept, message)
    if entry.head is None:
        raise StepFailed(Blocked("invalid_state", "worktree_missing", f"git reads no HEAD of the worktree at {kept}"))
    return entry.head


# --- the record (in the branch step's transaction) -------------------------------------------------------------------


async def record_takeover(run: Run, t: Transition, proof: dict[str, Any]) -> Transition:
    """``branch_confirmed`` with the takeover in its proof, and in the same transaction the earlier owner's
    registration ended saying where its worktree is kept, and the kept worktree's own row (for the teardown)."""
    takeover: dict[str, Any] = proof["takeover"]
    kept, registration_id = takeover.get("kept_path"), takeover.get("registration_id")
    history = await run.journal.registrations(t.repo, t.issue_number)
    now = run.ctx.clock()
    async with run.ctx.db.transaction() as conn:
        current = await run.journal.live_registration(t.repo, t.issue_number, conn)
        if kept and current is not None and current.id == registration_id:
            origin = _origin(current, history)
            await run.journal.end_registration(
                conn, current.id, reason=f"taken over by {t.owner} ({t.key}): worktree kept at {kept}", now=now)
            row = await run.journal.keep_registration(
                conn, current, kept_path=kept, journal_id=origin.journal_id, created_worktree=origin.created_worktree,
                reason=f"the worktree of {current.owner} (lease {current.lease_id}), kept when {t.owner} took"
                f" #{t.issue_number} over ({t.key})", now=now)
            proof = {**proof, "takeover": {**takeover, "ended_registration": current.id,
                                            "kept_registration": row.id}}
        t = await run.journal.advance(conn, t, "branch_confirmed", proof=proof, runner=run.runner, now=now)
    crash_seam(FAULT_PHASE_ENV, "branch_confirmed")
    return t


def _origin(registration: Registration, history: list[Registration]) -> Registration:
    """The registration whose transition created this worktree: itself, or the earliest of the same owner and path
    it superseded (the teardown's proof that the worktree is foreman's, and whose lock reason it carries)."""
    if registration.created_worktree:
        return registration
    earlier = [r for r in history if r.id < registration.id and r.worktree_path == registration.worktree_path
               and r.owner == registration.owner and (r.end_reason or "").startswith("superseded by ")]
    return next((r for r in sorted(earlier, key=lambda r: -r.id) if r.created_worktree), registration)

