"""One bootstrap call's state, shared by the phase groups that make up the transition."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any

from bot import gitops
from bot.core.bootstrap import Blocked, Phase
from bot.core.errors import Envelope
from bot.verbs.bootstrap.checkout import prepare_control_checkout
from bot.verbs.bootstrap.context import BootstrapContext, BootstrapGitea, BootstrapResult
from bot.verbs.bootstrap.faults import FAULT_PHASE_ENV, crash_seam
from bot.verbs.bootstrap.refusals import StepFailed, call_again
from state.journal import JournalStore, Transition
from state.leases import LeaseStore


class RunState:
    """One bootstrap call, holding the per-issue file lock: what it observed and the journal reads its phases share."""

    def __init__(self, ctx: BootstrapContext, issue_number: int, caller: str) -> None:
        self.ctx = ctx
        self.n = issue_number
        self.caller = caller
        self.journal = JournalStore(ctx.db)
        self.leases = LeaseStore(ctx.db)
        self.runner = f"{socket.gethostname()}:{os.getpid()}"
        self.checkout = ctx.checkout()
        self.fresh = False  # the worktree was added by this very call (git's exit status proves it complete)
        self.prepared = False  # the control checkout was fetched by this call
        self.base_fresh = False  # the live base was read by this call's acceptance (no second read needed)
        self.proofs: dict[str, dict[str, Any]] = {}
        self.proofs_of: int | None = None  # the transition whose journal records ``proofs`` holds
        self.seen: dict[str, Any] = {}  # what this call itself observed in git, reused by later steps
        self.cfg = ctx.settings.bootstrap
        self.gitea: BootstrapGitea = ctx.gitea  # type: ignore[assignment]  # checked by the caller
        self.clone_url = ""  # the URL the control checkout is cloned and fetched from (set by _accept)

    def _auth(self, clone_url: str) -> dict[str, str]:
        return gitops.auth_env(clone_url, self.ctx.settings.gitea_token())

    async def _prepare(self, clone_url: str, default_branch: str, *, live_base: str | None = None) -> (
        tuple[str | None, str | None]
    ):
        head = await prepare_control_checkout(self.ctx, self.checkout, clone_url, default_branch, issue_number=self.n,
                                              seen=self.seen, live_base=live_base)
        self.prepared = True
        return head

    async def _git(self, step: Callable[[Transition], dict[str, Any]], t: Transition) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(step, t)
        except gitops.WorktreeRefused as exc:
            restore = f"; an operator restores it with: {exc.restore}" if exc.restore else ""
            raise StepFailed(Blocked("invalid_state", "worktree_refused", f"{exc}{restore}")) from exc
        except gitops.GitFailure as exc:
            raise StepFailed(Blocked("invalid_state", "git_failed", str(exc))) from exc

    async def _commit(self, t: Transition, phase: Phase, proof: dict[str, Any]) -> Transition:
        async with self.ctx.db.transaction() as conn:
            t = await self.journal.advance(conn, t, phase, proof=proof, runner=self.runner, now=self.ctx.clock())
        crash_seam(FAULT_PHASE_ENV, phase)
        return t

    async def _load_proofs(self, t: Transition) -> dict[str, dict[str, Any]]:
        self.proofs = {record.phase: record.proof for record in await self.journal.phases(t.id)}
        self.proofs_of = t.id
        return self.proofs

    async def _journal_view(self, t: Transition) -> list[dict[str, Any]]:
        return [{"phase": r.phase, "recorded_at": r.recorded_at} for r in await self.journal.phases(t.id)]

    async def _finished(self, t: Transition, *, replayed: bool) -> BootstrapResult:
        journal = await self._journal_view(t)
        if t.phase == "completed":
            proof = dict(t.result or {})
            lock = await self.journal.live_lock(t.repo, t.issue_number)
            if lock is not None and lock.lease_id == t.lease_id:
                proof["lock"] = {"state": "locked", "lock": lock.to_dict(), "verb": "gitea_lock_issue"}
            return BootstrapResult(self.n, "completed", t.key, t.phase, None, proof, replayed, journal,
                                   [f"{t.key}:evidence"])
        error = t.error or {}
        envelope = Envelope(
            error=error.get("error", "invalid_state"),
            message=str(error.get("message") or "the bootstrap failed and was compensated"),
            remediate=str(error.get("remediate") or "Start a new request."),
            exact_next_action=str(error.get("exact_next_action") or call_again(self.n)),
            details=dict(error.get("details") or {}),
        )
        return BootstrapResult(self.n, "compensated", t.key, t.phase, envelope, dict(t.result or {}), replayed,
                               journal)
