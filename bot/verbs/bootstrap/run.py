"""One bootstrap call's explicit context: what it runs against, what it observed itself, and the journal writes and
reads its steps share. Every step is a plain function of this context (``steps.STEPS``); nothing is inherited."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

from bot import gitops
from bot.config_sections import BootstrapConfig
from bot.core.bootstrap import Blocked, Phase
from bot.core.errors import Envelope
from bot.verbs.bootstrap.checkout import PreparedCheckout, prepare_control_checkout
from bot.verbs.bootstrap.context import BootstrapContext, BootstrapGitea, BootstrapResult, ProofReads
from bot.verbs.bootstrap.faults import FAULT_PHASE_ENV, crash_seam
from bot.verbs.bootstrap.refusals import StepFailed, call_again
from state.journal import JournalStore, Transition
from state.leases import LeaseStore


@dataclass
class Observed:
    """What this call itself read from git and Gitea, reused by its later steps (a resumed call reads again)."""

    #: The control checkout's tracking ref of the default branch and HEAD's branch, as the preparation read them.
    refs: dict[str, str] | None = None
    #: ``refs/heads/<name>`` -> sha of this issue's branches, read while accepting (None: not read by this call).
    issue_refs: dict[str, str] | None = None
    #: Whether the branch's reflog was read since it last changed, its creation entry (sha, message) and its
    #: newest sha (None: no reflog).
    reflog_read: bool = False
    creation: tuple[str, str] | None = None
    newest: str | None = None
    #: The worktree's registration and view as this call read them back after its own writes.
    entry: gitops.WorktreeEntry | None = None
    view: gitops.WorktreeView | None = None
    #: Gitea's assignees as read back after this call's own assignment.
    assignment: dict[str, Any] | None = None


@dataclass
class Run:
    """One bootstrap call, holding the per-issue file lock: the context every step is given."""

    ctx: BootstrapContext
    issue_number: int
    caller: str
    journal: JournalStore
    leases: LeaseStore
    gitea: BootstrapGitea
    checkout: gitops.ControlCheckout
    runner: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    seen: Observed = field(default_factory=Observed)
    fresh: bool = False  # the worktree was added by this very call (git's exit status proves it complete)
    prepared: bool = False  # the control checkout was fetched by this call
    base_fresh: bool = False  # the live base was read by this call's acceptance (no second read needed)
    proofs: dict[str, dict[str, Any]] = field(default_factory=dict)
    proofs_of: int | None = None  # the transition whose journal records ``proofs`` holds
    clone_url: str = ""  # the URL the control checkout is cloned and fetched from (set by the acceptance)
    #: The allocation's proof's Gitea reads, used by the acceptance while ``fresh_for`` this issue (else read again).
    proof_reads: ProofReads | None = None

    @classmethod
    def start(cls, ctx: BootstrapContext, issue_number: int, caller: str, *,
              proof_reads: ProofReads | None = None) -> Run:
        gitea = cast("BootstrapGitea", ctx.gitea)  # checked by the caller (a replay needs none)
        return cls(ctx, issue_number, caller, JournalStore(ctx.db), LeaseStore(ctx.db), gitea, ctx.checkout(),
                   proof_reads=proof_reads)

    def reused_reads(self) -> ProofReads | None:
        """The proof's reads when this call may still use them (this issue's, at most ``PROOF_READS_FRESH_S``
        old), else None: read again."""
        reads = self.proof_reads
        return reads if reads is not None and reads.fresh_for(self.issue_number) else None

    @property
    def cfg(self) -> BootstrapConfig:
        return self.ctx.settings.bootstrap

    def auth(self, clone_url: str) -> dict[str, str]:
        return gitops.auth_env(clone_url, self.ctx.settings.gitea_token())

    async def prepare(self, clone_url: str, default_branch: str, *, live_base: str | None = None) -> (
        PreparedCheckout
    ):
        prepared = await prepare_control_checkout(self.ctx, self.checkout, clone_url, default_branch,
                                                  issue_number=self.issue_number, live_base=live_base)
        self.seen.refs = prepared.refs
        self.prepared = True
        return prepared

    async def in_thread(self, work: Callable[[Run, Transition], dict[str, Any]], t: Transition) -> dict[str, Any]:
        """A git step run in a thread, git's refusals and failures made the step's failure."""
        try:
            return await asyncio.to_thread(work, self, t)
        except gitops.WorktreeRefused as exc:
            restore = f"; an operator restores it with: {exc.restore}" if exc.restore else ""
            raise StepFailed(Blocked("invalid_state", "worktree_refused", f"{exc}{restore}")) from exc
        except gitops.GitFailure as exc:
            raise StepFailed(Blocked("invalid_state", "git_failed", str(exc))) from exc

    async def commit(self, t: Transition, phase: Phase, proof: dict[str, Any]) -> Transition:
        async with self.ctx.db.transaction() as conn:
            t = await self.journal.advance(conn, t, phase, proof=proof, runner=self.runner, now=self.ctx.clock())
        crash_seam(FAULT_PHASE_ENV, phase)
        return t

    async def load_proofs(self, t: Transition) -> dict[str, dict[str, Any]]:
        self.proofs = {record.phase: record.proof for record in await self.journal.phases(t.id)}
        self.proofs_of = t.id
        return self.proofs

    async def journal_view(self, t: Transition) -> list[dict[str, Any]]:
        return [{"phase": r.phase, "recorded_at": r.recorded_at} for r in await self.journal.phases(t.id)]

    async def finished(self, t: Transition, *, replayed: bool) -> BootstrapResult:
        n = self.issue_number
        journal = await self.journal_view(t)
        if t.phase == "completed":
            proof = dict(t.result or {})
            lock = await self.journal.live_lock(t.repo, t.issue_number)
            if lock is not None and lock.lease_id == t.lease_id:
                proof["lock"] = {"state": "locked", "lock": lock.to_dict(), "verb": "gitea_lock_issue"}
            return BootstrapResult(n, "completed", t.key, t.phase, None, proof, replayed, journal,
                                   [f"{t.key}:evidence"])
        error = t.error or {}
        envelope = Envelope.recorded(error, error="invalid_state", message="the bootstrap failed and was compensated",
                                     remediate="Start a new request.", exact_next_action=call_again(n))
        return BootstrapResult(n, "compensated", t.key, t.phase, envelope, dict(t.result or {}), replayed, journal)
