"""Compensating recovery: undo exactly what the journal proves this transition made, then report it."""

from __future__ import annotations

import asyncio
from typing import Any

from bot import gitops
from bot.core.bootstrap import Blocked, UndoFacts, plan_compensation, reflog_message
from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope
from bot.core.evidence import render_evidence
from bot.core.vocabulary import label_for_state
from bot.gitea import GiteaError
from bot.verbs.bootstrap.context import BootstrapResult
from bot.verbs.bootstrap.faults import FAULT_PHASE_ENV, FAULT_STEP_ENV, crash_seam
from bot.verbs.bootstrap.git_steps import GitSteps
from bot.verbs.bootstrap.refusals import blocked_envelope, observed_details, refused_result, unavailable
from state.journal import Transition
from state.leases import LeaseRefused
from state.outbox import OutboxIntent, enqueue


class Compensation(GitSteps):
    """The failure path: record that compensation is required, undo what is provably ours, release or keep the lease."""

    async def _require_compensation(self, t: Transition, blocked: Blocked, **details: Any) -> Transition:
        proof = {"kind": blocked.kind, "reason": blocked.reason, "message": blocked.message,
                 "failed_phase": t.phase, **details}
        error = blocked_envelope(self.n, blocked, released=False, key=t.key, **observed_details(details)).to_dict()
        async with self.ctx.db.transaction() as conn:
            t = await self.journal.advance(conn, t, "compensation_required", proof=proof, runner=self.runner,
                                           now=self.ctx.clock(), error=error)
        crash_seam(FAULT_PHASE_ENV, "compensation_required")
        return t

    def _undo_git(self, t: Transition, release: bool, registration_live: bool, lease_ours: bool) -> dict[str, Any]:
        """Observe, plan and perform the git side of compensation (only artifacts this journal proves it made)."""
        if not self.checkout.exists():
            facts = UndoFacts(False, False, False, False, False, False, False, registration_live, lease_ours)
            plan = plan_compensation(facts, release_lease=release)
            return {"plan": plan, "observed": {"checkout": "absent"}, "done": []}
        reflog = self.checkout.reflog(t.branch)
        branch_ours = bool(reflog) and reflog[0][1] == reflog_message(t.key)
        created_sha = reflog[0][0] if branch_ours else None
        branch_sha = self.checkout.branch_sha(t.branch)
        wt = self._worktree_facts(t, every=True)  # a failure's undo looks at every registration (git's own list)
        entry_dir_present = wt.path_exists and not wt.path_is_symlink
        present = wt.entry_branch is not None or wt.admin_dir_by_this or entry_dir_present
        # An unregistered directory is ours only if the path was reserved free (a directory that was there before,
        # even one identical to the branch tree, is preexisting work and stays byte for byte).
        created = wt.entry_locked_by_this or wt.admin_dir_by_this or (
            wt.entry_branch is None and entry_dir_present and wt.content_proven and branch_ours and wt.reserved_empty)
        head_ok = wt.entry_head is None or wt.entry_head == created_sha
        preserves = head_ok and (wt.entry_prunable or not entry_dir_present or wt.clean or wt.content_proven)
        facts = UndoFacts(
            worktree_created=created,
            worktree_present=present,
            worktree_registered=wt.entry_branch is not None,
            worktree_preserves=preserves,
            branch_created=branch_ours,
            branch_present=branch_sha is not None,
            branch_at_created=branch_sha is not None and branch_sha == created_sha,
            registration_live=registration_live,
            lease_live_and_ours=lease_ours,
        )
        plan = plan_compensation(facts, release_lease=release)
        done: list[str] = []
        if "worktree" in plan.undo:
            done += [f"worktree {item}" for item in self._remove_partial(t, force=not wt.clean)]
            crash_seam(FAULT_STEP_ENV, "worktree_removed")
        if "branch" in plan.undo and created_sha is not None:
            if self.checkout.delete_branch(t.branch, created_sha):
                done.append(f"branch {t.branch} at {created_sha}")
                crash_seam(FAULT_STEP_ENV, "branch_deleted")
        observed = {"branch_sha": branch_sha, "branch_created_sha": created_sha,
                    "worktree": {"present": present, "created_by_this": created, "preserves": preserves,
                                 "registered_branch": wt.entry_branch, "path_exists": wt.path_exists}}
        return {"plan": plan, "observed": observed, "done": done}

    async def _compensate(self, t: Transition) -> BootstrapResult:
        await self._load_proofs(t)  # what the journal proves this transition made (the path reserved free, ...)
        now = self.ctx.clock()
        registration = await self.journal.registration_for_journal(t.id)
        registration_live = registration is not None and registration.ended_at is None
        lease = await self.leases.get(t.lease_id)
        lease_ours = lease is not None and lease.is_live(now) and lease.owner == t.owner
        try:
            undone = await asyncio.to_thread(self._undo_git, t, self.cfg.release_lease_on_failure,
                                             registration_live, lease_ours)
        except gitops.GitFailure as exc:
            return refused_result(self.n, unavailable(self.n, f"git failed during compensation: {exc}", t.key), t.key)
        plan = undone["plan"]
        releasing = "lease" in plan.undo
        assignees: list[str] = []
        if releasing:
            try:
                assignees = sorted(u.login for u in (await self.gitea.get_issue(self.n)).assignees)
            except GiteaError as exc:
                return refused_result(self.n, unavailable(self.n, f"Gitea did not answer ({exc})", t.key), t.key)
        failure = t.error or {}
        kind = str(failure.get("error", "invalid_state"))
        message = str(failure.get("message", "the bootstrap failed"))
        if plan.blocked:
            blocked = Blocked("invalid_state", "compensation_blocked", f"{message}; compensation left"
                              f" {', '.join(plan.blocked)} in place because removing it could lose content")
        elif kind == "stale_pin":
            blocked = Blocked("stale_pin", str(failure.get("details", {}).get("reason", "stale_pin")), message)
        else:
            blocked = Blocked("invalid_state", str(failure.get("details", {}).get("reason", "failed")), message)
        envelope = blocked_envelope(self.n, blocked, released=releasing or not lease_ours, key=t.key,
                                    kept=list(plan.keep), left=list(plan.blocked),
                                    **observed_details(failure.get("details") or {}))
        proof = {"undone": undone["done"] + [u for u in plan.undo if u in ("registration", "lease")],
                 "kept": list(plan.keep), "blocked": list(plan.blocked), "observed": undone["observed"],
                 "failure": failure}
        outbox: list[str] = []
        async with self.ctx.db.transaction() as conn:
            if registration_live and registration is not None:
                await self.journal.end_registration(conn, registration.id, reason=f"compensated: {t.key}", now=now)
            if releasing and lease is not None:
                try:
                    await self.leases.release(conn, lease.lease_id, actor=self.ctx.bot_login,
                                              reason=f"bootstrap failed: {failure.get('message', 'compensated')}"[:300],
                                              now=now)
                except LeaseRefused:
                    releasing = False
            for intent in self._failure_intents(t, assignees, envelope, released=releasing,
                                                stale=kind == "stale_pin" and not plan.blocked):
                await enqueue(conn, intent, now=now)
                outbox.append(intent.key)
            if plan.blocked:
                t = await self.journal.note_error(conn, t, {**envelope.to_dict(), "compensation": proof}, now=now)
            else:
                t = await self.journal.advance(conn, t, "compensation_completed", proof=proof, runner=self.runner,
                                               now=now, error=envelope.to_dict(), result=proof)
        if outbox:
            self.ctx.woken()
        if plan.blocked:
            return BootstrapResult(self.n, "blocked", t.key, t.phase, envelope, proof=proof,
                                   journal=await self._journal_view(t), outbox=outbox)
        crash_seam(FAULT_PHASE_ENV, "compensation_completed")
        result = await self._finished(t, replayed=False)
        result.outbox = outbox
        return result

    def _failure_intents(self, t: Transition, assignees: list[str], envelope: Envelope, *, released: bool,
                         stale: bool) -> list[OutboxIntent]:
        """The Gitea side of a compensation, in order: with the lease released, the status label and the
        assignee follow it back (ready after a stale pin, else blocked); always, a failure evidence comment."""
        key, n = t.key, t.issue_number
        intents: list[OutboxIntent] = []
        message = " ".join(envelope.message.split())[:300]
        if released:
            target = "ready" if stale else "blocked"
            intents.append(OutboxIntent(f"{key}:labels", n, "labels",
                                        {"add": [label_for_state(target)], "remove": [label_for_state("in-progress")]}))
            # Always, even when Gitea does not list the owner now: the allocation's assignment may still be queued
            # in the outbox, and this entry, queued after it, is sent after it.
            intents.append(OutboxIntent(f"{key}:assignees", n, "assignees",
                                        {"assignees": [a for a in assignees if a.lower() != t.owner.lower()]}))
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
            last_updated_by=self.ctx.bot_login,
        )
        body = render_evidence(
            key=f"{key}:failure",
            summary=f"The worktree bootstrap of #{t.issue_number} for {t.owner} failed: {envelope.message}",
            state=state,
            evidence={"action": "bootstrap_compensated", "refusal": envelope.to_dict(), "idempotency_key": key},
        )
        intents.append(OutboxIntent(f"{key}:failure", t.issue_number, "comment", {"body": body}))
        return intents
