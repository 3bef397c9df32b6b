"""The worktree bootstrap transition: issue → branch → worktree under branches/ → lease bound → lock-ready.

Every step is journaled in SQLite with the read-after-write proof it observed (``state.journal``), so that a
replay with the same idempotency key resumes exactly where an interrupted run stopped, and a failure undoes
exactly what this transition proves it created (compensating recovery, never a cross-system rollback).
The caller names only the issue, itself, and optionally a key and an expected base; everything else is derived
from the live lease, the Gitea API and the control checkout. Docs: docs/bootstrap.md.

Crash seams (off unless set, for tests): ``FOREMAN_FAULT_AFTER_PHASE=<phase>`` makes the process exit hard
(status 86) right after that phase's transaction commits; ``FOREMAN_FAULT_AFTER_STEP=<step>`` right after a
git mutation and before the phase that records it (steps: ``ref_created``, ``worktree_added``,
``worktree_removed``, ``branch_deleted``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Protocol

import aiosqlite

from bot import gitops
from bot.config import Settings
from bot.core.bootstrap import (
    Blocked,
    BranchFacts,
    PathRejected,
    Phase,
    UndoFacts,
    WorktreeFacts,
    branch_for,
    derive_key,
    is_issue_branch,
    key_problem,
    plan_branch,
    plan_compensation,
    plan_worktree,
    reflog_message,
    sha_problem,
    worktree_lock_reason,
    worktree_path_for,
)
from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope, ErrorKind
from bot.core.evidence import render_evidence
from bot.core.gateway import ROLES, GatewayContext, Role
from bot.core.verbs import evaluate
from bot.core.vocabulary import label_for_state
from bot.gitea import (
    Branch,
    GiteaClient,
    GiteaError,
    GiteaForbidden,
    GiteaNotFound,
    GiteaUnassignable,
    GiteaUnavailable,
    Issue,
    Repository,
)
from state.db import Database, utcnow
from state.journal import JournalConflict, JournalRaced, JournalStore, NewTransition, Transition
from state.leases import Lease, LeaseRefused, LeaseStore
from state.outbox import OutboxIntent, enqueue

log = logging.getLogger("foreman.bootstrap")

FAULT_PHASE_ENV = "FOREMAN_FAULT_AFTER_PHASE"
FAULT_STEP_ENV = "FOREMAN_FAULT_AFTER_STEP"
FAULT_EXIT_CODE = 86
FAULT_STEPS = ("ref_created", "worktree_added", "worktree_removed", "branch_deleted")
TOOL = "gitea_bootstrap_issue_worktree"

ResultStatus = Literal["completed", "compensated", "refused", "blocked"]


def _fault(env: str, value: str) -> None:
    """The documented crash seam: exit at once, without cleanup, as a killed process would."""
    if os.environ.get(env) == value:
        log.warning("fault seam %s=%s: exiting hard", env, value)
        os._exit(FAULT_EXIT_CODE)


# ------------------------------------------------------------------------------------------- context


class ServiceLike(Protocol):
    """What ``BootstrapContext.from_service`` reads (``bot.app.Service`` has all of it)."""

    @property
    def db(self) -> Database: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def gitea(self) -> GiteaClient | None: ...
    @property
    def bot_login(self) -> str | None: ...


@dataclass
class BootstrapContext:
    """Everything a bootstrap or lock call needs; built once per service (or per CLI run)."""

    db: Database
    settings: Settings
    gitea: GiteaClient | None
    bot_login: str
    clock: Callable[[], datetime] = utcnow
    #: "<checkout path>\0<clone URL>" pairs whose origin was found to be that URL (checked once per process and URL).
    verified_origins: set[str] = field(default_factory=set, repr=False)

    @classmethod
    def from_service(cls, service: ServiceLike) -> BootstrapContext:
        return cls(
            db=service.db,
            settings=service.settings,
            gitea=service.gitea,
            bot_login=service.bot_login or service.settings.gitea.bot_login,
        )

    @property
    def repo(self) -> str:
        """The key leases and journals are stored under (as the allocator stores it)."""
        return f"{self.settings.repository.owner}/{self.settings.repository.name}".lower()

    @property
    def checkout_root(self) -> Path:
        root = self.settings.repository.checkout_root
        return Path(os.path.realpath(root if root.is_absolute() else Path.cwd() / root))

    @property
    def checkout_path(self) -> Path:
        return self.checkout_root / self.settings.repository.owner / self.settings.repository.name

    def locks_dir(self) -> Path:
        return self.checkout_root / ".foreman-locks" / self.settings.repository.owner / self.settings.repository.name

    def roles_of(self, login: str) -> frozenset[Role]:
        return frozenset(r for r in self.settings.roster.get(login, []) if r in ROLES)

    def checkout(self) -> gitops.ControlCheckout:
        return gitops.ControlCheckout(
            self.checkout_path, env=gitops.git_env(self.bot_login), timeout_s=self.settings.bootstrap.git_timeout_s
        )


# ------------------------------------------------------------------------------------------- results


@dataclass
class BootstrapResult:
    """What a bootstrap call returns (and the CLI prints). ``exit_code``: 0 completed, 1 anything else."""

    issue_number: int
    status: ResultStatus
    idempotency_key: str | None = None
    phase: Phase | None = None
    refusal: Envelope | None = None
    proof: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False
    journal: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "completed" else 1

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "status": self.status,
            "issue_number": self.issue_number,
            "idempotency_key": self.idempotency_key,
            "phase": self.phase,
            "replayed": self.replayed,
            "proof": self.proof,
            "journal": self.journal,
            "outbox": self.outbox,
        }
        if self.refusal is not None:
            doc.update(self.refusal.to_dict())
        return doc


@dataclass
class LockResult:
    """What a lock call returns. ``exit_code``: 0 locked (or already locked by the same lease), 1 refused."""

    issue_number: int
    status: Literal["locked", "refused"]
    lock: dict[str, Any] | None = None
    proof: dict[str, Any] = field(default_factory=dict)
    refusal: Envelope | None = None
    already_locked: bool = False

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "locked" else 1

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "status": self.status,
            "issue_number": self.issue_number,
            "lock": self.lock,
            "already_locked": self.already_locked,
            "proof": self.proof,
        }
        if self.refusal is not None:
            doc.update(self.refusal.to_dict())
        return doc


def _envelope(kind: ErrorKind, message: str, remediate: str, action: str, **details: Any) -> Envelope:
    return Envelope(error=kind, message=message, remediate=remediate, exact_next_action=action, details=details)


def _refused(issue_number: int, envelope: Envelope, key: str | None = None) -> BootstrapResult:
    return BootstrapResult(issue_number=issue_number, status="refused", idempotency_key=key, refusal=envelope)


def _again(issue_number: int, key: str | None = None) -> str:
    suffix = f" with idempotency_key={key}" if key else ""
    return f"call {TOOL} for #{issue_number} again{suffix}"


def _unavailable(issue_number: int, what: str, key: str | None = None) -> Envelope:
    return _envelope(
        "unavailable",
        f"{what}; nothing was lost: the transition can resume where it stopped",
        "Wait until Gitea and the control checkout are reachable again, then repeat the same request.",
        _again(issue_number, key),
    )


class _Fail(Exception):
    """A step cannot go on: compensate."""

    def __init__(self, blocked: Blocked, **details: Any) -> None:
        super().__init__(blocked.message)
        self.blocked = blocked
        self.details = details


def _extra(details: dict[str, Any]) -> dict[str, Any]:
    """A failure's observed details (the live base, Gitea's assignees, ...) for an envelope's ``details``."""
    return {k: v for k, v in details.items() if k not in ("reason", "idempotency_key", "kept", "left")}


class _Transient(Exception):
    """Gitea or git is unreachable right now: stop, keep the journal open, let a replay resume."""


class _Operator(Exception):
    """Only the operator can fix this (the token, the clone URL, the checkout's origin): refuse with the envelope
    naming what to change, keep any open transition as it is (a replay resumes once it is fixed)."""

    def __init__(self, envelope: Envelope) -> None:
        super().__init__(envelope.message)
        self.envelope = envelope


REPOINT = "foreman checkout repoint"


def _token_envelope(reason: str, message: str, then: str, **details: Any) -> Envelope:
    """``not_authorized`` for a token Gitea (its API or its git endpoint) refuses; never carries the token."""
    return _envelope(
        "not_authorized", message,
        "foreman authenticates to Gitea's API and to git over HTTP with gitea.token (or gitea.token_file); that"
        " token must be the bot account's, valid, with read:repository and write:issue.",
        f"the operator fixes gitea.token (or gitea.token_file) and checks it with `foreman check-config`, then {then}",
        reason=reason, **details)


def _git_envelope(reason: str, url: str, failure: str, then: str) -> Envelope:
    if reason == "clone_auth_failed":
        return _token_envelope(reason, f"git over HTTP refused gitea.token for {url}: {failure}", then,
                               clone_url=url)
    return _envelope(
        "not_authorized", f"git at {url} answers that the repository is not there for the bot account: {failure}",
        "Gitea shows a private repository only to accounts with access; the URL may also name another server.",
        f"the operator gives the bot account read access to the repository (or corrects repository.clone_url /"
        f" repository.clone_url_rewrite), then {then}", reason=reason, clone_url=url)


def _api_refusal(exc: GiteaError, then: str) -> Envelope | None:
    """The envelope for Gitea's API refusing the token (401) or its scope (403), else None."""
    if isinstance(exc, GiteaForbidden):
        what = "refused gitea.token" if exc.status == 401 else "does not let gitea.token read the repository"
        return _token_envelope("gitea_token_refused", f"Gitea's API {what} ({exc.status})", then,
                               status=exc.status)
    return None


def effective_clone_url(ctx: BootstrapContext, reported: str) -> str:
    """The URL the control checkout is cloned and fetched from: ``[repository] clone_url``, else the reported one
    through ``clone_url_rewrite``, else the ``clone_url`` Gitea reports."""
    return ctx.settings.repository.effective_clone_url(reported)


def _origin_envelope(n: int, origin: str | None, url: str) -> Envelope:
    return _envelope(
        "invalid_state",
        f"the control checkout's origin ({origin}) is not the clone URL foreman uses now ({url}): Gitea reports"
        " another clone_url (an upgrade, a new ROOT_URL, Host or proxy) or repository.clone_url changed",
        "foreman never changes the checkout's origin on its own; the worktrees under branches/ are untouched.",
        f"the operator runs `{REPOINT}` (it proves {url} serves the same repository, points origin at it and"
        f" touches no worktree), then call {TOOL} for #{n} again",
        reason="checkout_origin", checkout_origin=origin, clone_url=url)


def _input_problem(issue_number: object, caller: object, key: str | None, expected_base: str | None) -> str | None:
    if isinstance(issue_number, bool) or not isinstance(issue_number, int) or issue_number < 1:
        return "issue_number must be a positive integer"
    if not isinstance(caller, str) or not caller.strip():
        return "caller must be a login"
    if key is not None and key_problem(key):
        return f"idempotency_key {key_problem(key)}"
    if expected_base is not None and sha_problem(expected_base):
        return f"expected_base {sha_problem(expected_base)}"
    return None


# ------------------------------------------------------------------------------------------- public API


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

    Only the live lease's owner may call it (``not_authorized`` otherwise). ``idempotency_key``: replaying the
    same key returns or resumes the same transition (derived from the lease when omitted). ``expected_base``:
    the default branch's commit the caller expects; a different live base is a ``stale_pin`` refusal.
    """
    problem = _input_problem(issue_number, caller, idempotency_key, expected_base)
    if problem is not None:
        return _refused(
            issue_number if isinstance(issue_number, int) else 0,
            _envelope("invalid_input", problem, "Correct the argument and call again.",
                      f"call {TOOL} again with corrected arguments (omit idempotency_key to have one derived)"),
        )
    if ctx.gitea is None:
        return _refused(issue_number, _unavailable(issue_number, "foreman has no Gitea connection configured"))
    lock_path = ctx.locks_dir() / f"issue-{issue_number}.lock"
    async with gitops.file_lock(lock_path, wait_s=ctx.settings.bootstrap.lock_wait_s) as held:
        if not held:
            return _refused(issue_number, _envelope(
                "conflict",
                f"another bootstrap of #{issue_number} is still running",
                "Wait for it to finish; a repeat of the same request then returns its result.",
                _again(issue_number, idempotency_key),
            ), idempotency_key)
        return await _Run(ctx, issue_number, caller).execute(idempotency_key, expected_base)


async def recover_open_transitions(ctx: BootstrapContext) -> list[BootstrapResult]:
    """Finish or undo what a dead process left half-way (the service runs this when it starts): a transition of
    a live lease is resumed for its owner, exactly as the owner's replay of the same key would; a transition
    whose lease has ended meanwhile (released, expired) is compensated now instead of when the next lease of
    the issue asks for its worktree. Each holds the per-issue lock; a transition someone else is driving (the
    lock is held) is left to them."""
    if ctx.gitea is None:
        return []
    results: list[BootstrapResult] = []
    journal, leases = JournalStore(ctx.db), LeaseStore(ctx.db)
    for t in await journal.open_transitions(ctx.repo):
        lease = await leases.get(t.lease_id)
        if lease is not None and lease.is_live(ctx.clock()) and lease.owner == t.owner:
            result = await bootstrap_issue_worktree(ctx, issue_number=t.issue_number, caller=t.owner,
                                                    idempotency_key=t.key)
        else:
            lock_path = ctx.locks_dir() / f"issue-{t.issue_number}.lock"
            async with gitops.file_lock(lock_path, wait_s=ctx.settings.bootstrap.lock_wait_s) as held:
                current = await journal.get(t.key) if held else None
                if current is None or current.outcome != "open":
                    continue
                result = await _Run(ctx, t.issue_number, t.owner)._drive(current, resumed=True, fail_with=Blocked(
                    "stale_pin", "lease_changed", f"its lease {t.lease_id} is no longer the live lease"))
        log.info("recovered the open bootstrap %s of #%d: %s", t.key, t.issue_number, result.status)
        results.append(result)
    if ctx.settings.bootstrap.on_allocate == "run":
        results += await _bootstrap_unstarted_leases(ctx)
    return results


async def _bootstrap_unstarted_leases(ctx: BootstrapContext) -> list[BootstrapResult]:
    """A process killed between an allocation's lease commit and its bootstrap's first phase left a live lease with
    no transition at all (issue 20): its bootstrap is run now for the owner, as the allocation would have; refused
    (not `unavailable`), the lease is released as unworkable, exactly as the allocation does."""
    from bot.verbs.allocate import AllocationCall, Allocator

    results: list[BootstrapResult] = []
    journal, leases = JournalStore(ctx.db), LeaseStore(ctx.db)
    for lease in await leases.open_leases(ctx.repo):
        if not lease.is_live(ctx.clock()):
            continue
        if any(t.lease_id == lease.lease_id for t in await journal.history(ctx.repo, lease.issue_number)):
            continue
        result = await bootstrap_issue_worktree(ctx, issue_number=lease.issue_number, caller=lease.owner)
        if result.status == "refused" and result.refusal is not None and result.refusal.error != "unavailable":
            allocator = Allocator(ctx.db, ctx.settings, ctx.gitea, bot_login=ctx.bot_login or "")
            call = AllocationCall(actor="foreman:recovery", owner=lease.owner, actor_is_operator=True)
            await allocator.release_unworkable(lease, result.refusal, call, ctx.clock())
        log.info("bootstrapped the unstarted lease %s of #%d: %s", lease.lease_id, lease.issue_number, result.status)
        results.append(result)
    return results


async def lock_issue(ctx: BootstrapContext, *, issue_number: int, caller: str) -> LockResult:
    """Lock the issue to the caller's registered worktree: only a worktree a completed bootstrap of the caller's
    live lease registered, still registered in git under ``branches/`` on the issue branch (branches-only and
    anti-stomp guards). Idempotent for the same lease; the lock is recorded with the lease and the worktree."""
    problem = _input_problem(issue_number, caller, None, None)
    if problem is not None:
        return LockResult(issue_number if isinstance(issue_number, int) else 0, "refused", refusal=_envelope(
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
            envelope = _envelope(
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
            holder = await _live_lease_in(conn, leases, ctx.repo, existing.lease_id)
            if holder is not None and holder.is_live(now):
                return LockResult(issue_number, "refused", refusal=_envelope(
                    "conflict", f"#{issue_number} is locked by lease {existing.lease_id} of {existing.owner}",
                    "Another live lease holds the issue lock; it is never taken over.",
                    "call gitea_get_runtime_context to find the work assigned to you"))
            await journal.release_lock(conn, existing.lock_id, reason="its lease ended", now=now)
        proof = {"guards": guards, "lease": lease.to_dict(), "registration": registration.to_dict(),
                 "bootstrap_key": done.key}
        try:
            lock = await journal.lock(conn, registration, proof=proof, now=now)
        except JournalConflict:
            return LockResult(issue_number, "refused", refusal=_envelope(
                "conflict", f"#{issue_number} was locked meanwhile", "Repeat the call to see who holds it.",
                "call gitea_lock_issue again"))
    readback = await journal.live_lock(ctx.repo, issue_number)
    return LockResult(issue_number, "locked", lock=readback.to_dict() if readback else lock.to_dict(), proof=proof)


async def ensure_control_checkout(ctx: BootstrapContext) -> dict[str, Any]:
    """Clone the control checkout on first use (from the ``clone_url`` Gitea reports) and fetch its default
    branch; its working tree is never touched. Returns where it stands, or ``ok: False`` with the reason."""
    if ctx.gitea is None:
        return {"ok": False, "detail": "no Gitea connection configured"}
    try:
        repo = await ctx.gitea.get_repo()
    except GiteaError as exc:
        refusal = _api_refusal(exc, "the next bootstrap clones the control checkout")
        return {"ok": False, "detail": str(exc), **(refusal.to_dict() if refusal else {})}
    url = effective_clone_url(ctx, repo.clone_url)
    problem = gitops.clone_url_problem(url)
    if problem is not None:
        return {"ok": False, "detail": problem}
    try:
        head_ref, head_sha = await _Run(ctx, 1, ctx.bot_login)._prepare(url, repo.default_branch)
    except _Operator as exc:
        return {"ok": False, "detail": str(exc), **exc.envelope.to_dict()}
    except (_Transient, _Fail) as exc:
        return {"ok": False, "detail": str(exc)}
    return {"ok": True, "path": str(ctx.checkout_path), "default_branch": repo.default_branch,
            "head_ref": head_ref, "head_sha": head_sha}


ORIGIN_RECORD = "foreman-origin.jsonl"


async def repoint_control_checkout(ctx: BootstrapContext) -> dict[str, Any]:
    """``foreman checkout repoint``: point the control checkout's origin at the clone URL foreman uses now (the
    one Gitea reports, through ``[repository] clone_url`` / ``clone_url_rewrite``), after proving that URL serves
    the same repository: git there must show the default branch at the commit Gitea's API reports for it.

    Only ``.git/config``'s ``remote.origin.url`` and ``refs/remotes/origin/<default>`` (the fetch) change: no
    branch, worktree, index or working tree is touched. Each change is appended to ``.git/foreman-origin.jsonl``
    (time, from, to, the reported URL, the proven commit) and logged. ``ok: False`` carries the error envelope.
    """

    def refused(envelope: Envelope) -> dict[str, Any]:
        return {"ok": False, "changed": False, "path": str(ctx.checkout_path), **envelope.to_dict()}

    again = f"run `{REPOINT}` again"
    if ctx.gitea is None:
        return refused(_unavailable(0, "foreman has no Gitea connection configured"))
    try:
        repo = await ctx.gitea.get_repo()
        base = (await ctx.gitea.get_branch(repo.default_branch)).commit_id
    except GiteaError as exc:
        return refused(_api_refusal(exc, again) or _envelope(
            "unavailable", f"Gitea did not show the repository: {exc}", "Nothing was changed.",
            f"{again} when Gitea answers"))
    url = effective_clone_url(ctx, repo.clone_url)
    problem = gitops.clone_url_problem(url)
    if problem is not None:
        return refused(_envelope("invalid_input", problem, "Nothing was changed.",
                                 f"correct repository.clone_url or repository.clone_url_rewrite, then {again}"))
    checkout = ctx.checkout()
    doc: dict[str, Any] = {"path": str(checkout.path), "to": url, "reported_clone_url": repo.clone_url,
                           "default_branch": repo.default_branch}
    token = ctx.settings.gitea_token()

    def work() -> dict[str, Any]:
        if not checkout.exists():
            return {"ok": True, "changed": False, "from": None,
                    "detail": "no control checkout yet: the first bootstrap clones it from this URL"}
        old = checkout.origin_url()
        if old == url:
            return {"ok": True, "changed": False, "from": old, "detail": "origin already is this URL"}
        status, out, err = checkout.git.attempt("ls-remote", "--", url, f"refs/heads/{repo.default_branch}",
                                                extra_env=gitops.auth_env(url, token))
        if status != 0:
            reason = gitops.git_refusal(err)
            return refused(_git_envelope(reason, url, err.strip()[-300:], again) if reason else _envelope(
                "unavailable", f"git could not reach {url}: {err.strip()[-300:]}", "Nothing was changed.",
                f"{again} when {url} is reachable (or correct repository.clone_url)"))
        seen = out.split("\t", 1)[0].strip() or None
        if seen != base:
            return refused(_envelope(
                "invalid_state",
                f"{url} does not serve {repo.full_name}: its {repo.default_branch} is {seen or 'absent'}, Gitea's API"
                f" says {base}", "The origin was left as it is.",
                f"correct repository.clone_url or repository.clone_url_rewrite to name {repo.full_name}, then {again}",
                reason="origin_not_same_repository", clone_url=url, remote_sha=seen, api_sha=base))
        checkout.set_origin(url)
        checkout.fetch(repo.default_branch, auth=gitops.auth_env(url, token))
        record = {"at": ctx.clock().isoformat(), "from": old, "to": url, "reported_clone_url": repo.clone_url,
                  "default_branch": repo.default_branch, "sha": base, "by": REPOINT}
        with (checkout.git_dir / ORIGIN_RECORD).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        log.warning("control checkout %s: origin repointed from %s to %s (same repository: %s at %s)",
                    checkout.path, old, url, repo.default_branch, base)
        return {"ok": True, "changed": True, "from": old, "sha": base, "record": str(checkout.git_dir / ORIGIN_RECORD)}

    lock = ctx.locks_dir() / "checkout.lock"
    async with gitops.file_lock(lock, wait_s=max(ctx.settings.bootstrap.lock_wait_s, 60)) as held:
        if not held:
            return refused(_envelope("conflict", "the control checkout is busy (a clone or fetch is running)",
                                     "Nothing was changed.", again))
        try:
            found = await asyncio.to_thread(work)
        except gitops.GitFailure as exc:
            return refused(_envelope("unavailable", f"git failed: {exc}", "origin may point at the new URL; a"
                                     " repeat checks and fetches again.", again))
    return {**doc, **found}


async def bootstrap_preflight(
    ctx: BootstrapContext, issue_number: int, owner: str, *, now: datetime | None = None
) -> dict[str, Any]:
    """The allocator's dry-run proof that ``owner`` could bootstrap ``issue_number`` now, changing nothing:
    the repository is reachable (API and git), the canonical path is free (or the owner's own), the base is
    known, and the control checkout is on its default branch and clean. ``ok`` is True when every check passed.
    """
    checks: dict[str, dict[str, Any]] = {}
    doc: dict[str, Any] = {"issue_number": issue_number, "owner": owner, "checks": checks}

    def done() -> dict[str, Any]:
        doc["ok"] = bool(checks) and all(c.get("ok") for c in checks.values())
        return doc

    roles = ctx.roles_of(owner)
    checks["owner_on_roster"] = {"ok": bool(roles), "roles": sorted(roles)}
    lease = await LeaseStore(ctx.db).live_for_issue(ctx.repo, issue_number)
    # A foreign lease past its expiry and the grace is the allocator's to reclaim (docs/allocator.md): not a holder.
    grace = timedelta(seconds=ctx.settings.allocator.lease_grace_s)
    reclaimable = lease is not None and lease.expires_at + grace <= (now or utcnow())
    checks["no_foreign_lease"] = {"ok": lease is None or lease.owner == owner or reclaimable,
                                  "lease_owner": lease.owner if lease is not None else None,
                                  "reclaimable": reclaimable}
    if ctx.gitea is None:
        checks["repo_reachable"] = {"ok": False, "detail": "no Gitea connection configured"}
        return done()
    try:
        repo, issue = await asyncio.gather(ctx.gitea.get_repo(), ctx.gitea.get_issue(issue_number))
        base = (await ctx.gitea.get_branch(repo.default_branch)).commit_id
    except GiteaError as exc:
        refusal = _api_refusal(exc, "allocate again")
        checks["repo_reachable"] = {"ok": False, "detail": str(exc), **(_check_refusal(refusal) if refusal else {})}
        return done()
    clone_url = effective_clone_url(ctx, repo.clone_url)
    url_problem = gitops.clone_url_problem(clone_url)
    token = ctx.settings.gitea_token()

    def remote() -> dict[str, Any]:
        runner = gitops.GitRunner(ctx.checkout_root if ctx.checkout_root.is_dir() else Path("/"),
                                  env=gitops.git_env(ctx.bot_login), timeout_s=ctx.settings.bootstrap.git_timeout_s)
        status, out, err = runner.attempt("ls-remote", "--", clone_url, f"refs/heads/{repo.default_branch}",
                                          extra_env=gitops.auth_env(clone_url, token))
        remote_sha = out.split("\t", 1)[0].strip() if status == 0 and out.strip() else None
        return {"git_reachable": status == 0, "git_base": remote_sha,
                "git_error": err.strip()[-300:] if status else None}

    def local() -> dict[str, Any]:
        checkout = ctx.checkout()
        found: dict[str, Any] = {"checkout_exists": checkout.exists()}
        found["checkout_path_used"] = not found["checkout_exists"] and ctx.checkout_path.exists() and any(
            ctx.checkout_path.iterdir())
        if checkout.exists():
            head_ref, head_sha = checkout.head()
            found["head_ref"], found["head_sha"] = head_ref, head_sha
            found["checkout_status"] = checkout.status()
            found["tracks_branches"] = checkout.tracks("branches")
            found["origin"] = checkout.origin_url()
        return found

    if url_problem is not None:
        checks["repo_reachable"] = {"ok": False, "detail": url_problem}
        return done()
    journal = JournalStore(ctx.db)
    prior = await journal.latest_completed(ctx.repo, issue_number)
    branch = prior.branch if prior is not None and prior.owner == owner else branch_for(
        issue_number, issue.title, slug_length=ctx.settings.bootstrap.slug_length)
    doc["branch"] = branch
    path: Path | None = None
    rejected: str | None = None
    try:
        path = Path(str(worktree_path_for(PurePosixPath(ctx.checkout_path), branch)))
    except PathRejected as exc:
        rejected = str(exc)
    open_other = await journal.open_for_issue(ctx.repo, issue_number)
    registration = await journal.live_registration(ctx.repo, issue_number)

    def path_state() -> dict[str, Any]:
        assert path is not None
        root = ctx.checkout_path / "branches"
        escapes = ctx.checkout_path.exists() and gitops.escapes_root(root, path)
        entry = ctx.checkout().worktree_at(path) if ctx.checkout().exists() else None
        return {"exists": os.path.lexists(path), "escapes_root": escapes,
                "registered": entry.to_dict() if entry is not None else None}

    # The git probes are read-only and independent: run side by side (the proof runs before every lease).
    probes = [asyncio.to_thread(remote), asyncio.to_thread(local)]
    if path is not None:
        probes.append(asyncio.to_thread(path_state))
    found_remote, found, *rest = await asyncio.gather(*probes)
    checks["repo_reachable"] = {"ok": bool(found_remote["git_reachable"]), "clone_url": clone_url,
                                "reported_clone_url": repo.clone_url,
                                "default_branch": repo.default_branch, "detail": found_remote["git_error"]}
    git_reason = gitops.git_refusal(found_remote["git_error"] or "") if not found_remote["git_reachable"] else None
    if git_reason is not None:
        checks["repo_reachable"].update(_check_refusal(_git_envelope(
            git_reason, clone_url, found_remote["git_error"], "allocate again")))
    checks["base_known"] = {"ok": bool(base) and found_remote["git_base"] == base, "api_sha": base,
                            "git_sha": found_remote["git_base"]}
    doc["base_sha"] = base
    if found["checkout_exists"]:
        same_origin = found["origin"] == clone_url
        checks["control_checkout"] = {
            "ok": found["head_ref"] == f"refs/heads/{repo.default_branch}" and not found["checkout_status"]
            and same_origin,
            "head_ref": found["head_ref"], "head_sha": found["head_sha"], "dirty": found["checkout_status"][:20],
            "tracks_branches_dir": found["tracks_branches"], "origin": found["origin"],
            **({} if same_origin else _check_refusal(_origin_envelope(issue_number, found["origin"], clone_url))),
        }
    elif found["checkout_path_used"]:
        # Something that is not a checkout is where the control checkout goes: the first clone would fail.
        checks["control_checkout"] = {"ok": False, "head_ref": None,
                                      "detail": f"{ctx.checkout_path} exists and is not a git checkout"}
    else:
        checks["control_checkout"] = {"ok": True, "detail": "not cloned yet: the first bootstrap clones it"}
    if path is None:
        checks["path_free"] = {"ok": False, "detail": rejected}
        return done()
    doc["worktree_path"] = str(path)
    state = rest[0]
    own = registration is not None and registration.owner == owner and registration.worktree_path == str(path)
    checks["path_free"] = {
        "ok": not state["escapes_root"] and (not state["exists"] or own)
        and (open_other is None or open_other.owner == owner)
        and (registration is None or registration.owner == owner),
        **state,
        "open_transition": open_other.key if open_other is not None else None,
        "registered_to": registration.owner if registration is not None else None,
    }
    return done()


def _check_refusal(envelope: Envelope) -> dict[str, Any]:
    """A preflight check's typed refusal: ``error``, ``reason``, ``exact_next_action`` beside ``ok: False``."""
    return {"error": envelope.error, "reason": envelope.details.get("reason"),
            "exact_next_action": envelope.exact_next_action}


# ------------------------------------------------------------------------------------------- the run


async def _live_lease_in(conn: aiosqlite.Connection, leases: LeaseStore, repo: str, lease_id: str) -> Lease | None:
    """The lease ``lease_id`` if it is still marked live, read inside the caller's transaction."""
    return next((lease for lease in await leases.open_leases(repo, conn) if lease.lease_id == lease_id), None)


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
    if gitops.escapes_root(checkout.branches_root, path):
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


class _Run:
    """One bootstrap call, holding the per-issue file lock."""

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
        self.gitea: GiteaClient = ctx.gitea  # type: ignore[assignment]  # checked by the caller
        self.clone_url = ""  # the URL the control checkout is cloned and fetched from (set by _accept)

    # -- entry

    async def execute(self, key: str | None, expected_base: str | None) -> BootstrapResult:
        now = self.ctx.clock()
        if key is not None:
            existing = await self.journal.get(key)
            if existing is not None and existing.outcome != "open":
                refusal = self._identity_mismatch(existing, None, expected_base)
                return refusal or await self._finished(existing, replayed=True)
        lease = await self.leases.live_for_issue(self.ctx.repo, self.n)
        decision = evaluate("bootstrap_issue_worktree", GatewayContext(
            caller=self.caller,
            caller_roles=self.ctx.roles_of(self.caller),
            issue_number=self.n,
            lease_owner=lease.owner if lease is not None else None,
            lease_live=lease is not None and lease.is_live(now),
        ))
        if not decision.allowed:
            return _refused(self.n, decision.to_error(), key)
        assert lease is not None
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
                return _refused(self.n, _envelope(
                    "conflict",
                    f"an unfinished bootstrap of #{self.n} for this lease exists under another idempotency key",
                    "Resume that transition instead of starting a second one.",
                    _again(self.n, open_other.key), existing_key=open_other.key), key)
            # An unfinished transition of an ended lease: undo what it made before starting anew.
            stale = await self._drive(open_other, resumed=True, fail_with=Blocked(
                "stale_pin", "lease_changed", f"its lease {open_other.lease_id} is no longer the live lease"))
            if stale.status != "compensated":
                return stale
            self.seen.clear()  # what was observed for the old transition says nothing about the new one
            self.proofs = {}
        completed = await self.journal.completed_for_lease(lease.lease_id)
        if completed is not None:
            return _refused(self.n, _envelope(
                "conflict",
                f"#{self.n} is already bootstrapped for this lease (idempotency key {completed.key})",
                "One lease gets one worktree; use the one already registered.",
                f"call gitea_lock_issue for #{self.n}", existing_key=completed.key), key)
        accepted = await self._accept(key, source, lease, expected_base, attempt)
        if isinstance(accepted, BootstrapResult):
            return accepted
        return await self._drive(accepted, resumed=False)

    def _identity_mismatch(self, existing: Transition, lease: Lease | None, expected_base: str | None) -> (
        BootstrapResult | None
    ):
        """Reuse only after exact identity and compatibility are proven (amendment 2)."""
        key = existing.key
        if existing.owner != self.caller:
            return _refused(self.n, _envelope(
                "not_authorized", "this idempotency key belongs to a transition of another identity",
                "Use your own request's key, or none.", f"call {TOOL} for #{self.n} without idempotency_key"), key)
        if existing.issue_number != self.n:
            return _refused(self.n, _envelope(
                "conflict", f"this idempotency key was used for #{existing.issue_number}",
                "A key names exactly one request.", f"call {TOOL} for #{self.n} without idempotency_key"), key)
        if lease is not None and existing.lease_id != lease.lease_id:
            return _refused(self.n, _envelope(
                "stale_pin", f"this idempotency key belongs to lease {existing.lease_id}, not the live lease"
                f" {lease.lease_id}", "The allocation changed since that request; start a new one.",
                f"call {TOOL} for #{self.n} without idempotency_key"), key)
        if expected_base is not None and expected_base != existing.base_sha:
            return _refused(self.n, _envelope(
                "stale_pin", f"this transition is pinned to base {existing.base_sha}, not {expected_base}",
                "A replay must carry the same pin as the original request.",
                _again(self.n, key)), key)
        return None

    # -- acceptance: authoritative inputs

    async def _accept(
        self, key: str, source: Literal["caller", "derived"], lease: Lease, expected_base: str | None, attempt: int
    ) -> Transition | BootstrapResult:
        gitea = self.gitea
        not_found = _envelope("not_found", f"issue #{self.n} or the repository is not visible to foreman",
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
                raise _Fail(Blocked("invalid_state", "clone_url_unusable", "the repository's clone_url cannot be"
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
        operator = next((f for f in failures if isinstance(f, _Operator)), None)
        if operator is not None:
            return _refused(self.n, operator.envelope, key)
        token = next((r for f in failures if isinstance(f, GiteaError) and (r := _api_refusal(f, _again(self.n)))),
                     None)
        if token is not None:
            return _refused(self.n, token, key)
        if any(isinstance(f, GiteaNotFound) for f in failures):
            return _refused(self.n, not_found, key)
        blocked = next((f for f in failures if isinstance(f, _Fail)), None)
        if blocked is not None:
            return _refused(self.n, self._blocked_envelope(blocked.blocked, released=False, key=None), key)
        if failures:
            return _refused(self.n, _unavailable(self.n, f"Gitea or git did not answer ({failures[0]})", key), key)
        prepared, found = outcomes
        assert not isinstance(prepared, BaseException) and not isinstance(found, BaseException)
        (repo, base, head), (issue, branch, remote_sha) = prepared, found
        if issue.is_pull or issue.state != "open":
            return _refused(self.n, _envelope(
                "invalid_state", f"#{self.n} is {'a pull request' if issue.is_pull else 'closed'}",
                "Only open issues get a worktree.", "call gitea_get_runtime_context to find your work"), key)
        if expected_base is not None and expected_base != base:
            return _refused(self.n, _envelope(
                "stale_pin",
                f"the live base of {repo.default_branch} is {base}, not the expected {expected_base}",
                "The default branch moved since the pin was taken; nothing was created.",
                f"call {TOOL} for #{self.n} again with expected_base={base} (or without expected_base)",
                live_base=base), key)
        try:
            path = Path(str(worktree_path_for(PurePosixPath(self.checkout.path), branch)))
        except PathRejected as exc:
            return _refused(self.n, _envelope(
                "invalid_state", f"the canonical worktree path is refused: {exc}",
                "foreman never creates a worktree outside branches/.", "call gitea_get_runtime_context"), key)

        def local_checks() -> tuple[bool, list[str], bool]:
            tracking = f"refs/remotes/origin/{repo.default_branch}"
            refs: dict[str, str] = self.seen.get("refs") or self.checkout.refs("refs/heads/", tracking)
            have_base = refs.get(tracking) == base or self.checkout.rev(base) is not None
            if not have_base:  # the base moved between the fetch and the API read: fetch once more
                self.checkout.fetch(repo.default_branch, auth=self._auth(self.clone_url))
                have_base = self.checkout.rev(base) is not None
            others = [name.removeprefix("refs/heads/") for name in refs if name.startswith("refs/heads/")]
            others = [b for b in others if is_issue_branch(b, self.n) and b != branch]
            return gitops.escapes_root(self.checkout.branches_root, path), others, have_base

        try:
            escapes, others, have_base = await asyncio.to_thread(local_checks)
        except gitops.GitFailure as exc:
            return _refused(self.n, _unavailable(self.n, f"git failed: {exc}", key), key)
        refusal: Envelope | None = None
        if not have_base:
            refusal = _unavailable(self.n, f"the base commit {base} could not be fetched", key)
        elif escapes:
            refusal = self._blocked_envelope(Blocked("invalid_state", "path_escapes_root", f"{path} is or goes"
                                                     " through a symbolic link out of branches/"), False, None)
        elif others and not same_owner:
            refusal = self._blocked_envelope(Blocked("invalid_state", "ambiguous_branches", "other branches of"
                                                     f" #{self.n} exist: {', '.join(others)}"), False, None)
        elif prior is not None and not same_owner:
            refusal = self._blocked_envelope(Blocked("invalid_state", "foreign_work", f"#{self.n} was bootstrapped"
                                                     f" for {prior.owner} before; that work is not reclaimed"),
                                             False, None)
        elif remote_sha is not None and remote_sha != base and not same_owner:
            refusal = self._blocked_envelope(Blocked("invalid_state", "remote_branch_exists", f"{branch} exists on"
                                                     f" Gitea at {remote_sha}, not at the base"), False, None)
        if refusal is not None:
            return _refused(self.n, refusal, key)
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
                live = await _live_lease_in(conn, self.leases, self.ctx.repo, lease.lease_id)
                if live is None or not live.is_live(now) or live.owner != self.caller:
                    return _refused(self.n, _envelope(
                        "stale_pin", "the lease ended while the request was being checked",
                        "Nothing was created.", "call gitea_get_runtime_context to see your leases"), key)
                transition = await self.journal.accept(conn, new, proof=inputs, runner=self.runner, now=now)
        except JournalConflict as exc:
            return _refused(self.n, _envelope(
                "conflict", f"another transition holds #{self.n} or its path ({exc})",
                "Only one bootstrap per issue, path and lease runs at a time.", _again(self.n)), key)
        self.base_fresh = True
        _fault(FAULT_PHASE_ENV, "accepted")
        return transition

    def _auth(self, clone_url: str) -> dict[str, str]:
        return gitops.auth_env(clone_url, self.ctx.settings.gitea_token())

    async def _prepare(self, clone_url: str, default_branch: str, *, live_base: str | None = None) -> (
        tuple[str | None, str | None]
    ):
        """Clone the control checkout on first use, fetch the default branch, check it is where it must be.

        The fetch is skipped only when ``origin/<default>`` already is ``live_base`` (what Gitea reported a moment
        ago): fetching would change nothing then. The refs read here are kept for the steps that follow.
        """
        checkout = self.checkout
        auth = self._auth(clone_url)
        every = self.cfg.control_clean_check == "every_transition"
        verified = f"{checkout.path}\0{clone_url}"
        tracking = f"refs/remotes/origin/{default_branch}"

        def work() -> tuple[str | None, str | None, list[str]]:
            if not checkout.exists():
                checkout.clone(clone_url, default_branch, auth=auth)
            elif verified not in self.ctx.verified_origins and (origin := checkout.origin_url()) != clone_url:
                raise _Operator(_origin_envelope(self.n, origin, clone_url))
            checkout.ensure_excluded()
            refs = checkout.refs("refs/heads/", tracking)
            if live_base is None or refs.get(tracking) != live_base:
                checkout.fetch(default_branch, auth=auth)
                refs = checkout.refs("refs/heads/", tracking)
                self.seen["fetched"] = True
            self.seen["refs"] = refs
            head_ref = gitops.symbolic_head(checkout.git_dir / "HEAD")
            head_sha = refs.get(head_ref) if head_ref else checkout.rev("HEAD")
            return head_ref, head_sha, (checkout.status() if every else [])

        lock = self.ctx.locks_dir() / "checkout.lock"
        async with gitops.file_lock(lock, wait_s=max(self.cfg.lock_wait_s, 60)) as held:
            if not held:
                raise _Transient("the control checkout is busy (another clone or fetch did not finish)")
            try:
                head_ref, head_sha, dirty = await asyncio.to_thread(work)
            except gitops.GitFailure as exc:
                reason = gitops.git_refusal(exc.stderr)
                if reason is not None:
                    raise _Operator(_git_envelope(reason, clone_url, str(exc), _again(self.n))) from exc
                raise _Transient(f"the control checkout could not be cloned or fetched: {exc}") from exc
        if head_ref != f"refs/heads/{default_branch}" or dirty:
            raise _Fail(Blocked("invalid_state", "checkout_not_clean", f"the control checkout is on"
                                f" {head_ref or 'a detached HEAD'}{' with changes' if dirty else ''}, not clean on"
                                f" {default_branch}; foreman never changes it"))
        self.prepared = True
        self.ctx.verified_origins.add(verified)
        self.seen["checkout_head"] = (head_ref, head_sha)
        return head_ref, head_sha

    # -- driving the phases

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
            except _Transient as exc:
                return _refused(self.n, _unavailable(self.n, str(exc), t.key), t.key)
            except _Operator as exc:
                return _refused(self.n, exc.envelope, t.key)
            except _Fail as exc:
                t = await self._require_compensation(t, exc.blocked, **exc.details)
            except JournalRaced as exc:
                return _refused(self.n, _envelope("conflict", str(exc), "Another runner advanced this transition.",
                                                  _again(self.n, t.key)), t.key)

    async def _step(self, t: Transition) -> Transition:
        if not self.prepared:
            # The URL as it is now (a repoint since the transition was accepted moved origin to it).
            try:
                url = effective_clone_url(self.ctx, (await self.gitea.get_repo()).clone_url)
            except GiteaUnavailable as exc:
                raise _Transient(f"Gitea did not answer ({exc})") from exc
            except GiteaError as exc:
                refusal = _api_refusal(exc, _again(self.n, t.key))
                if refusal is None:
                    raise _Transient(f"Gitea did not show the repository ({exc})") from exc
                raise _Operator(refusal) from exc
            try:
                await self._prepare(url, t.base_branch)
            except gitops.GitFailure as exc:
                raise _Transient(str(exc)) from exc
        if not self.base_fresh:
            # A resumed transition goes on only while the live base is still its pin: a moved base is a stale
            # pin (compensated), never a reason to rebase, repoint or continue against newer state.
            try:
                live = (await self.gitea.get_branch(t.base_branch)).commit_id
            except GiteaUnavailable as exc:
                raise _Transient(f"Gitea did not answer ({exc})") from exc
            except GiteaError as exc:
                raise _Fail(Blocked("invalid_state", "base_unreadable", str(exc))) from exc
            if live != t.base_sha:
                raise _Fail(Blocked("stale_pin", "base_moved", f"{t.base_branch} moved from the pinned"
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

    async def _git(self, step: Callable[[Transition], dict[str, Any]], t: Transition) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(step, t)
        except gitops.GitFailure as exc:
            raise _Fail(Blocked("invalid_state", "git_failed", str(exc))) from exc

    async def _commit(self, t: Transition, phase: Phase, proof: dict[str, Any]) -> Transition:
        async with self.ctx.db.transaction() as conn:
            t = await self.journal.advance(conn, t, phase, proof=proof, runner=self.runner, now=self.ctx.clock())
        _fault(FAULT_PHASE_ENV, phase)
        return t

    # -- git steps (run in a thread)

    def _reflog_creation(self, t: Transition) -> tuple[str, str] | None:
        """The branch's reflog creation entry (sha, message), read once per call and after every change."""
        if "creation" not in self.seen:
            reflog = self.checkout.reflog(t.branch)
            self.seen["creation"] = reflog[0] if reflog else None
            self.seen["newest"] = reflog[-1][0] if reflog else None
        creation: tuple[str, str] | None = self.seen["creation"]
        return creation

    def _created_branch(self, t: Transition) -> bool:
        creation = self._reflog_creation(t)
        return creation is not None and creation[1] == reflog_message(t.key)

    def _branch_facts(self, t: Transition, *, just_created: bool = False, known_absent: bool = False) -> (
        BranchFacts
    ):
        self.seen.pop("creation", None)
        if just_created:
            # git wrote the ref and its reflog entry together: the reflog read back is the ref's value now
            # (the completion reads refs/heads/<branch> itself once more).
            created = self._reflog_creation(t)
            sha = self.seen["newest"] if created is not None else self.checkout.branch_sha(t.branch)
        else:
            sha = None if known_absent else self.checkout.branch_sha(t.branch)
        ours = sha is not None and self._created_branch(t)
        creation = self._reflog_creation(t) if sha is not None else None
        elsewhere = None
        # A branch that did not exist (or that this call just created) cannot be checked out anywhere.
        if sha is not None and not (just_created and ours):
            elsewhere = next((e.path for e in self.checkout.worktrees()
                              if e.branch == t.branch and e.path != t.worktree_path), None)
        return BranchFacts(sha=sha, created_by_this=ours, created_sha=creation[0] if ours and creation else None,
                           prior_same_owner=t.inputs.get("prior_key") is not None, checked_out_elsewhere=elsewhere)

    def _branch_step(self, t: Transition) -> dict[str, Any]:
        # This call's refs (read while accepting) say whether the branch existed; creation is create-only anyway,
        # so a branch that appeared since makes it fail instead of being overwritten.
        refs = self.seen.get("refs")
        facts = self._branch_facts(t, known_absent=refs is not None and f"refs/heads/{t.branch}" not in refs)
        plan = plan_branch(facts, pin=t.base_sha)
        if plan == "create":
            made = self.checkout.create_branch(t.branch, t.base_sha, reflog_message(t.key))
            if made:
                _fault(FAULT_STEP_ENV, "ref_created")
            facts = self._branch_facts(t, just_created=made)  # read back what git holds now
            plan = "ours" if made and facts.created_by_this else plan_branch(facts, pin=t.base_sha)
        if isinstance(plan, Blocked):
            raise _Fail(plan)
        creation = self._reflog_creation(t)
        return {
            "ref": f"refs/heads/{t.branch}",
            "sha": facts.sha,
            "created": plan == "ours",
            "plan": plan,
            "reflog_creation": {"sha": creation[0], "message": creation[1]} if creation else None,
        }

    def _path_step(self, t: Transition) -> dict[str, Any]:
        root, path = self.checkout.branches_root, Path(t.worktree_path)
        if gitops.escapes_root(root, path):
            raise _Fail(Blocked("invalid_state", "path_escapes_root", f"{path} is or goes through a symbolic link"
                                " out of branches/"))
        root_existed = root.exists()
        root.mkdir(exist_ok=True)
        if gitops.escapes_root(root, path):
            raise _Fail(Blocked("invalid_state", "path_escapes_root", "branches/ became a symbolic link"))
        facts = self._worktree_facts(t)
        plan = plan_worktree(facts, branch=t.branch, pin=t.base_sha, branch_created_by_this=self._created_branch(t))
        if isinstance(plan, Blocked):
            raise _Fail(plan)
        return {
            "path": str(path),
            "branches_root": str(root),
            "branches_root_created": not root_existed,
            "existed": facts.path_exists,
            "plan": "reserved" if plan == "create" else plan,
            "parent_realpath": os.path.realpath(path.parent),
        }

    def _git_file_ok(self, text: str) -> bool:
        return text.startswith(f"gitdir: {self.checkout.git_dir}/worktrees/")

    def _worktree_facts(self, t: Transition) -> WorktreeFacts:
        """What is at the canonical path. Nothing there and no metadata naming it (the usual case) is decided
        from the file system alone; anything else is examined with git (registration, status, content)."""
        root, path = self.checkout.branches_root, Path(t.worktree_path)
        prior = t.inputs.get("prior_key") is not None
        exists = os.path.lexists(path)
        admin = self.checkout.admin_dir_for(path)
        reserved_empty = self._reserved_empty(t)
        if not exists and admin is None:
            return WorktreeFacts(False, False, gitops.escapes_root(root, path), None, None, False, False, False,
                                 False, False, prior, reserved_empty)
        entry = self.checkout.worktree_at(path)
        admin_ours = entry is None and admin is not None and self._admin_ours(t, admin.locked)
        locked_ours = entry is not None and entry.locked == worktree_lock_reason(t.key)
        is_dir = exists and path.is_dir() and not path.is_symlink()
        clean = False
        if entry is not None and entry.prunable is None and is_dir:
            clean = not self.checkout.worktree_status(path)
        proven = False
        if is_dir and ((locked_ours and not clean) or entry is None):
            creation = self._reflog_creation(t)
            sha = creation[0] if creation else self.checkout.branch_sha(t.branch)
            if sha:
                files = self.checkout.tree_files(sha)
                proven = not gitops.content_problems(path, files, git_file_ok=self._git_file_ok)
        return WorktreeFacts(
            path_exists=exists,
            path_is_symlink=path.is_symlink(),
            escapes_root=gitops.escapes_root(root, path),
            entry_branch=(entry.branch or "") if entry is not None else None,
            entry_head=entry.head if entry is not None else None,
            # git never calls a locked worktree prunable: a registration without its directory is, for us
            entry_prunable=entry is not None and (entry.prunable is not None or not exists),
            entry_locked_by_this=locked_ours,
            admin_dir_by_this=admin_ours,
            content_proven=proven,
            clean=clean,
            prior_same_owner=prior,
            reserved_empty=reserved_empty,
        )

    def _reserved_empty(self, t: Transition) -> bool:
        """This transition's journal recorded the canonical path free when it reserved it. Only then can anything
        found there since (a half-made checkout, git's "initializing" metadata) be its own: before that, or when
        the path was taken already, whatever is there is preexisting and is kept as it is (issue 12, item 12)."""
        reserved = self.proofs.get("path_reserved") if self.proofs_of == t.id else None
        return reserved is not None and reserved.get("existed") is False

    def _admin_ours(self, t: Transition, locked: str | None) -> bool:
        """Worktree metadata this transition provably made: locked with its reason, or with git's own
        "initializing" (an add that never finished) at a path this transition reserved free."""
        return locked == worktree_lock_reason(t.key) or (locked == "initializing" and self._reserved_empty(t))

    def _remove_partial(self, t: Transition, *, force: bool = True) -> list[str]:
        """Remove a worktree this transition provably made (registration, directory, metadata). Without
        ``force`` (a clean worktree) git itself refuses if anything appeared in it since it was judged."""
        path, reason = Path(t.worktree_path), worktree_lock_reason(t.key)
        removed: list[str] = []
        # Which metadata is ours is read before anything changes (unlocking deletes the lock that proves it).
        ours = [a for a in self.checkout.admin_dirs() if a.worktree_path == str(path) and self._admin_ours(t, a.locked)]
        entry = self.checkout.worktree_at(path)
        has_dir = os.path.lexists(path) and path.is_dir() and not path.is_symlink()
        if entry is not None and entry.locked == reason and has_dir:
            self.checkout.unlock_worktree(path)
            self.checkout.remove_worktree(path, force=force)
            removed.append("registration")
        if os.path.lexists(path) and path.is_dir() and not path.is_symlink():
            gitops.remove_tree(path)
            removed.append("directory")
        for admin in ours:
            if admin.path.is_dir():
                self.checkout.remove_admin_dir(admin)
                removed.append(f"metadata {admin.name}")
        return removed

    def _worktree_step(self, t: Transition) -> dict[str, Any]:
        path = Path(t.worktree_path)
        facts = self._worktree_facts(t)
        plan = plan_worktree(facts, branch=t.branch, pin=t.base_sha, branch_created_by_this=self._created_branch(t))
        if isinstance(plan, Blocked):
            raise _Fail(plan)
        repaired: list[str] = []
        if plan == "repair":
            repaired = self._remove_partial(t)
        if plan in ("create", "repair"):
            self.checkout.add_worktree(path, t.branch, worktree_lock_reason(t.key))
            self.fresh = True
            _fault(FAULT_STEP_ENV, "worktree_added")
        entry = self.checkout.worktree_at(path)
        if entry is None or entry.branch != t.branch:
            raise _Fail(Blocked("invalid_state", "worktree_missing", "git does not list the worktree on its branch"))
        self.seen["entry"] = entry
        admin = self.checkout.admin_dir_for(path)
        return {
            "entry": entry.to_dict(),
            "created": plan in ("create", "repair", "ours"),
            "plan": plan,
            "repaired": repaired,
            "admin_dir": str(admin.path) if admin is not None else None,
        }

    def _registration_step(self, t: Transition) -> dict[str, Any]:
        path = Path(t.worktree_path)
        problems: list[str] = []
        if gitops.escapes_root(self.checkout.branches_root, path):
            problems.append("the path is or goes through a symbolic link out of branches/")
        view = self.checkout.worktree_view(path)
        entry: gitops.WorktreeEntry | None = self.seen.get("entry") or self.checkout.worktree_at(path)
        git_file = (path / ".git").read_text(encoding="utf-8").strip() if (path / ".git").is_file() else ""
        admin_gitdir = ""
        if git_file.startswith("gitdir: "):
            backlink = Path(git_file.removeprefix("gitdir: ")) / "gitdir"
            admin_gitdir = backlink.read_text(encoding="utf-8").strip() if backlink.is_file() else ""
        if os.path.realpath(view.toplevel) != os.path.realpath(path):
            problems.append(f"git resolves the worktree to {view.toplevel}")
        if os.path.realpath(view.common_dir) != os.path.realpath(self.checkout.git_dir):
            problems.append("the worktree belongs to another repository")
        branch_sha = (self.proofs.get("branch_confirmed") or {}).get("sha")
        if view.head_ref != f"refs/heads/{t.branch}" or (branch_sha and view.head != branch_sha):
            problems.append(f"HEAD is {view.head_ref or 'detached'} at {view.head}, not {t.branch} at {branch_sha}")
        if git_file != f"gitdir: {view.git_dir}" or os.path.realpath(admin_gitdir) != os.path.realpath(path / ".git"):
            problems.append("the worktree's .git file and its metadata do not point at each other")
        created = bool((self.proofs.get("worktree_confirmed") or {}).get("created"))
        if entry is None or entry.branch != t.branch:
            problems.append("git does not list the worktree on the issue branch")
        elif created and entry.locked != worktree_lock_reason(t.key):
            problems.append("the worktree lost the lock foreman gave it")
        if problems:
            raise _Fail(Blocked("invalid_state", "registration_mismatch", "; ".join(problems)))
        self.seen["view"] = view
        return {
            "view": view.to_dict(),
            "entry": entry.to_dict() if entry is not None else None,
            "git_file": git_file,
            "admin_gitdir": admin_gitdir,
            "complete": "added by this call (git exit status 0)" if self.fresh else "registered earlier",
        }

    async def _load_proofs(self, t: Transition) -> dict[str, dict[str, Any]]:
        self.proofs = {record.phase: record.proof for record in await self.journal.phases(t.id)}
        self.proofs_of = t.id
        return self.proofs

    # -- binding: lease, registration, assignment (one transaction with the phase)

    async def _ensure_assigned(self, t: Transition) -> dict[str, Any]:
        """Make the owner an assignee of the issue in Gitea (keeping whoever else is assigned) and read the issue
        back: the assignment is what Gitea lists afterwards, never what foreman asked for. Gitea silently drops
        assignees it does not accept (an identity without write access, for one), so a read-back without the
        owner fails the transition (``assignment_unverified``) instead of being reported as done (AC1, AC8)."""
        owner = t.owner.lower()
        refused: str | None = None
        try:
            before = sorted(u.login for u in (await self.gitea.get_issue(self.n)).assignees)
            after, wrote = before, False
            if owner not in {a.lower() for a in before}:
                try:
                    # set_assignees: Gitea answers an account it cannot assign (CanBeAssigned: no access to a
                    # private repository) with a 500; this names it once instead of retrying it as an outage.
                    await self.gitea.set_assignees(self.n, sorted({*before, t.owner}))
                    wrote = True
                except GiteaUnassignable as exc:
                    raise _Fail(Blocked("invalid_state", "owner_unassignable", f"Gitea cannot assign {t.owner} on"
                                        f" #{self.n}: {exc.message}"), owner=t.owner, reasons=exc.reasons) from exc
                except GiteaUnavailable:
                    raise
                except GiteaError as exc:
                    refused = str(exc)
                after = sorted(u.login for u in (await self.gitea.get_issue(self.n)).assignees)
        except GiteaUnavailable as exc:
            raise _Transient(f"Gitea did not answer ({exc})") from exc
        except GiteaError as exc:
            raise _Fail(Blocked("invalid_state", "assignment_unverified", f"Gitea could not show #{self.n}'s"
                                f" assignees: {exc}")) from exc
        if owner not in {a.lower() for a in after}:
            why = f"Gitea refused the change ({refused})" if refused else "foreman assigned it"
            raise _Fail(Blocked("invalid_state", "assignment_unverified", f"Gitea does not list {t.owner} as an"
                                f" assignee of #{self.n} after {why} (read back: {', '.join(after) or 'nobody'})"),
                        gitea_assignees=after)
        seen = {"gitea_assignees": after, "assigned": True, "read_back": True, "written_by_bootstrap": wrote,
                "outbox_key": f"{t.lease_id}:assignee"}
        self.seen["assignment"] = seen
        return seen

    async def _bind(self, t: Transition) -> Transition:
        proofs = await self._load_proofs(t)
        assignment = await self._ensure_assigned(t)
        now = self.ctx.clock()
        blocked: Blocked | None = None
        async with self.ctx.db.transaction() as conn:
            lease = await _live_lease_in(conn, self.leases, t.repo, t.lease_id)
            if lease is None or not lease.is_live(now) or lease.owner != t.owner:
                blocked = Blocked("stale_pin", "lease_changed", f"lease {t.lease_id} is no longer live for {t.owner}")
            else:
                current = await self.journal.live_registration(t.repo, t.issue_number, conn)
                if current is not None and current.journal_id != t.id:
                    if current.owner == t.owner:
                        await self.journal.end_registration(conn, current.id, reason=f"superseded by {t.key}",
                                                            now=now)
                    else:
                        blocked = Blocked("invalid_state", "foreign_registration", f"#{self.n} has a worktree"
                                          f" registered for {current.owner}")
            if blocked is None:
                assert lease is not None
                registration = await self.journal.registration_for_journal(t.id, conn)
                if registration is None or registration.ended_at is not None:
                    registration = await self.journal.register(
                        conn, t,
                        created_branch=bool(proofs.get("branch_confirmed", {}).get("created")),
                        created_worktree=bool(proofs.get("worktree_confirmed", {}).get("created")),
                        now=now,
                    )
                lock = await self.journal.live_lock(t.repo, t.issue_number, conn)
                proof = {
                    "lease": lease.to_dict(),
                    "registration": registration.to_dict(),
                    "assignment": assignment,
                    "lock": {"state": "locked" if lock is not None else "ready",
                             "lock": lock.to_dict() if lock is not None else None},
                }
                t = await self.journal.advance(conn, t, "lock_established", proof=proof, runner=self.runner, now=now)
        if blocked is not None:
            raise _Fail(blocked)
        _fault(FAULT_PHASE_ENV, "lock_established")
        return t

    async def _complete(self, t: Transition) -> Transition:
        proofs = await self._load_proofs(t)
        path = Path(t.worktree_path)

        def readback() -> dict[str, Any]:
            # What this very call read after its own writes is reused; a resumed call reads it again.
            entry: gitops.WorktreeEntry | None = self.seen.get("entry") or self.checkout.worktree_at(path)
            view: gitops.WorktreeView = self.seen.get("view") or self.checkout.worktree_view(path)
            head_ref = gitops.symbolic_head(self.checkout.git_dir / "HEAD")
            head_sha = self.checkout.read_ref(head_ref) if head_ref else self.checkout.rev("HEAD")
            branch_sha = self.checkout.read_ref(f"refs/heads/{t.branch}")
            return {"branch_sha": branch_sha, "entry": entry.to_dict() if entry else None,
                    "head": view.head, "head_ref": view.head_ref,
                    "checkout": {"head_ref": head_ref, "head_sha": head_sha}}

        try:
            seen = await asyncio.to_thread(readback)
        except gitops.GitFailure as exc:
            raise _Fail(Blocked("invalid_state", "readback_failed", str(exc))) from exc
        if seen["entry"] is None or seen["head_ref"] != f"refs/heads/{t.branch}":
            raise _Fail(Blocked("invalid_state", "readback_failed", "the worktree is gone or off its branch"))
        before = t.inputs.get("control_checkout", {})
        # Gitea's assignees as read back after this call's own assignment, or (a resumed call) read again now.
        assignment = self.seen.get("assignment") or await self._ensure_assigned(t)
        lease = await self.leases.get(t.lease_id)
        registration = await self.journal.registration_for_journal(t.id)
        lock = await self.journal.live_lock(t.repo, t.issue_number)
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
        now = self.ctx.clock()
        async with self.ctx.db.transaction() as conn:
            t = await self.journal.advance(conn, t, "completed", proof=result, runner=self.runner, now=now,
                                           result=result)
            await enqueue(conn, self._evidence(t, result), now=now)
        _fault(FAULT_PHASE_ENV, "completed")
        return t

    def _evidence(self, t: Transition, result: dict[str, Any]) -> OutboxIntent:
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
            last_updated_by=self.ctx.bot_login,
        )
        body = render_evidence(
            key=key,
            summary=(f"Bootstrapped #{t.issue_number} for {t.owner}: branch `{t.branch}` at `{result['head_sha']}`,"
                     f" worktree `branches/{t.branch}` registered and bound to lease {t.lease_id}."),
            state=state,
            evidence={"action": "bootstrap_issue_worktree", **result},
        )
        return OutboxIntent(key, t.issue_number, "comment", {"body": body})

    # -- compensation

    async def _require_compensation(self, t: Transition, blocked: Blocked, **details: Any) -> Transition:
        proof = {"kind": blocked.kind, "reason": blocked.reason, "message": blocked.message,
                 "failed_phase": t.phase, **details}
        error = self._blocked_envelope(blocked, released=False, key=t.key, **_extra(details)).to_dict()
        async with self.ctx.db.transaction() as conn:
            t = await self.journal.advance(conn, t, "compensation_required", proof=proof, runner=self.runner,
                                           now=self.ctx.clock(), error=error)
        _fault(FAULT_PHASE_ENV, "compensation_required")
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
        wt = self._worktree_facts(t)
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
            _fault(FAULT_STEP_ENV, "worktree_removed")
        if "branch" in plan.undo and created_sha is not None:
            if self.checkout.delete_branch(t.branch, created_sha):
                done.append(f"branch {t.branch} at {created_sha}")
                _fault(FAULT_STEP_ENV, "branch_deleted")
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
            return _refused(self.n, _unavailable(self.n, f"git failed during compensation: {exc}", t.key), t.key)
        plan = undone["plan"]
        releasing = "lease" in plan.undo
        assignees: list[str] = []
        if releasing:
            try:
                assignees = sorted(u.login for u in (await self.gitea.get_issue(self.n)).assignees)
            except GiteaError as exc:
                return _refused(self.n, _unavailable(self.n, f"Gitea did not answer ({exc})", t.key), t.key)
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
        envelope = self._blocked_envelope(blocked, released=releasing or not lease_ours, key=t.key,
                                          kept=list(plan.keep), left=list(plan.blocked),
                                          **_extra(failure.get("details") or {}))
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
        if plan.blocked:
            return BootstrapResult(self.n, "blocked", t.key, t.phase, envelope, proof=proof,
                                   journal=await self._journal_view(t), outbox=outbox)
        _fault(FAULT_PHASE_ENV, "compensation_completed")
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
            # in the outbox, and this entry, queued after it, is sent after it (issue 12 item 10(i)).
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

    def _blocked_envelope(self, blocked: Blocked, released: bool, key: str | None, **details: Any) -> Envelope:
        n = self.n
        if blocked.reason == "owner_unassignable":
            who = details.get("owner") or "the lease owner"
            action = (f"the operator grants {who} access to the repository in Gitea (read on pull requests or write"
                      f" on any unit; on a private repository an account without access cannot be assigned), then"
                      f" labels #{n} status:ready again")
        elif released:
            action = "call gitea_get_runtime_context to find your next assignment (foreman reported this on the issue)"
        elif blocked.kind == "stale_pin":
            action = _again(n) + " (a new attempt pins the live base)"
        else:
            action = f"call gitea_post_issue_state on #{n} with BLOCKERS naming: {blocked.reason}"
        remediate = {
            "stale_pin": "The pinned state changed; nothing was rebased, repointed or overwritten.",
            "invalid_state": "Existing state is foreign, ambiguous or unprovable; it was left byte for byte as it is.",
            "conflict": "Another request holds the issue.",
        }[blocked.kind]
        return _envelope(blocked.kind, blocked.message, remediate, action, reason=blocked.reason,
                         **({"idempotency_key": key} if key else {}), **details)

    # -- results

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
            exact_next_action=str(error.get("exact_next_action") or _again(self.n)),
            details=dict(error.get("details") or {}),
        )
        return BootstrapResult(self.n, "compensated", t.key, t.phase, envelope, dict(t.result or {}), replayed,
                               journal)
