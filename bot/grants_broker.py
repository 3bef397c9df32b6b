"""The run broker's edge: starts runs (compile + seal), and admits an agent's tool calls against the sealed grant.

The decisions are ``bot.core.grants``'s pure functions; this module only gathers their inputs (the stored grant
and run state, the clock, this host's identity, the run's worktree as the bootstrap journal registers it now) and
records every decision through ``state.grants`` in the same transaction as the state change.

How the MCP server uses it (a session started with a run token)::

    broker = await Broker.for_token(GrantStore(db), settings, token)   # None: not a run token
    admission = await broker.before_call(tool, arguments)
    if not admission.allowed:
        return admission.refusal                      # {"error": <bounded category>, ...}; the tool never ran
    result = await runtime.call(verb, caller, admission.arguments())   # the compiled arguments, never the model's
    completion = await broker.after_call(admission, ok=result.ok, result=result.doc)
    return completion.doc                             # the result (inert-wrapped for plan_only) or the refusal

Nothing here raises out of those methods: an unexpected failure is logged with its traceback, recorded as a
``broker_error`` decision when the database still takes one, and answered with the ``broker_error`` category;
the run's state and recorded outcome are left exactly as they were.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import aiosqlite

from bot.config import Settings
from bot.core.digest import canonical_json, digest
from bot.core.errors import Envelope, EnvelopeError, ErrorKind
from bot.core.evidence import render_evidence
from bot.core.grants import (
    BoundWorktree,
    Category,
    Grant,
    GrantEffect,
    Pins,
    PolicyTemplate,
    ProposedCall,
    RunFacts,
    RunState,
    TemplateError,
    Verdict,
    abort,
    admit,
    broker_refusal,
    compile_grant,
    complete,
    mark_inert,
    reconcile,
    refusal,
    run_end_summary,
    summarize,
)
from state.db import Database, utcnow
from state.grants import (
    CloseHook,
    DecisionContext,
    GrantConflict,
    GrantIntegrityError,
    GrantStore,
    RunRecord,
    StateRaced,
    WorkloadFailed,
)
from state.journal import JournalStore, Registration
from state.leases import LeaseStore
from state.outbox import OutboxIntent, enqueue

log = logging.getLogger("foreman.grants")

HOST_ID_FILE = "host-id"
TOKEN_PREFIX = "frun_"  # noqa: S105 (a prefix, not a token)
#: Worktree UUIDs derived from a registration row (the journal records no UUID of its own).
WORKTREE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:gitea-foreman:worktree-registration")

HostSource = Callable[[], str]
Clock = Callable[[], datetime]
#: The UUID of the run's worktree as registered *now* (None: no live registration for the run's issue).
WorktreeResolver = Callable[[Grant], Awaitable[str | None]]


# ============================================================================ identities and tokens


def host_identity(database_path: Path) -> str:
    """This service's host identity: ``<hostname>/<uuid>``, the UUID stored once in ``<database folder>/host-id``.

    The file is created on first use (mode 0600) and read on every call, so a database copied to another machine
    (other hostname) or a replaced file (other UUID) is a different host: grants sealed here are refused there.
    """
    path = database_path.parent / HOST_ID_FILE
    try:
        stored = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        stored = str(uuid.uuid4())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            stored = path.read_text(encoding="utf-8").strip()
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(stored + "\n")
    if not stored:
        raise ValueError(f"the host identity file {path} is empty")
    return f"{socket.gethostname()}/{stored}"


def token_digest(token: str) -> str:
    """Run tokens are stored only as this SHA-256."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_run_token(token: str | None) -> bool:
    return bool(token) and str(token).startswith(TOKEN_PREFIX)


def registration_uuid(registration: Registration) -> str:
    """A stable UUID for one worktree registration row: the same row always gives the same UUID, a new
    registration (the worktree recreated) another one."""
    key = canonical_json(
        {
            "repo": registration.repo,
            "issue_number": registration.issue_number,
            "registration_id": registration.id,
            "journal_id": registration.journal_id,
            "lease_id": registration.lease_id,
            "branch": registration.branch,
            "worktree_path": registration.worktree_path,
            "registered_at": registration.registered_at,
        }
    )
    return str(uuid.uuid5(WORKTREE_NAMESPACE, key))


async def registered_worktree(db: Database, repo: str, issue_number: int) -> tuple[BoundWorktree, Registration] | None:
    """The issue's live worktree registration (bootstrap journal) as grant facts, or None."""
    registration = await JournalStore(db).live_registration(repo, issue_number)
    if registration is None:
        return None
    facts = BoundWorktree(
        path=registration.worktree_path, uuid=registration_uuid(registration), branch=registration.branch
    )
    return facts, registration


def journal_resolver(db: Database) -> WorktreeResolver:
    """Resolve a run's worktree UUID from the journal's live registration for the run's issue."""

    async def resolve(grant: Grant) -> str | None:
        found = await registered_worktree(db, grant.repo, grant.issue_number)
        return found[0].uuid if found is not None else None

    return resolve


def repo_key(settings: Settings) -> str:
    """Leases, registrations and grants are keyed by ``owner/name`` in lower case (as the verb runtime does)."""
    return f"{settings.repository.owner}/{settings.repository.name}".lower()


def policy_template(settings: Settings, key: str) -> PolicyTemplate | None:
    """The configured template for ``role.action`` (config validation already checked it)."""
    found = settings.grants.get(key)
    return found.template(key) if found is not None else None


# ============================================================================ starting a run


@dataclass(frozen=True, slots=True)
class StartedRun:
    """A sealed run: the token is shown once (only its SHA-256 is stored)."""

    run_id: str
    token: str
    grant: Grant
    record: RunRecord

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "token": self.token,
            "grant": self.grant.to_dict(),
            "run": self.record.summary(),
        }


def _refuse(error: ErrorKind, message: str, remediate: str, next_action: str, **details: Any) -> EnvelopeError:
    return EnvelopeError(
        Envelope(error=error, message=message, remediate=remediate, exact_next_action=next_action, details=details)
    )


async def start_run(
    db: Database,
    settings: Settings,
    *,
    issue_number: int,
    action: str | None = None,
    sealed_by: str,
    now: datetime | None = None,
    host_id: str | None = None,
) -> StartedRun:
    """Compile the grant for the issue's live lease and registered worktree, seal it and open the run.

    Raises EnvelopeError: no live lease (``invalid_state``), no template for the lease's ``role.action``
    (``not_found``), no registered worktree or one bound to another lease (``invalid_state``), a template that
    does not compile for these facts (``invalid_input``), an open run on the worktree or a failed one there
    (``conflict``).
    """
    moment = now or utcnow()
    repo = repo_key(settings)
    lease = await LeaseStore(db).live_for_issue(repo, issue_number)
    if lease is None or not lease.is_live(moment):
        raise _refuse(
            "invalid_state",
            f"issue #{issue_number} has no live lease",
            "a run is bound to a live lease: allocate the issue first",
            f"run foreman allocate --apply, then foreman run start --issue {issue_number}",
        )
    key = f"{lease.role}.{action or lease.action}"
    template = policy_template(settings, key)
    if template is None:
        raise _refuse(
            "not_found",
            f'no run grant template grants."{key}" is configured',
            f'add [grants."{key}"] to the configuration (see config/foreman.example.toml)',
            "run foreman check-config after adding the template",
            key=f"grants.{key}",
        )
    found = await registered_worktree(db, repo, issue_number)
    if found is None:
        raise _refuse(
            "invalid_state",
            f"issue #{issue_number} has no registered worktree",
            "a run is bound to the worktree the bootstrap registered: bootstrap it first",
            f"run foreman bootstrap --issue {issue_number} --owner {lease.owner}",
        )
    worktree, registration = found
    if registration.lease_id != lease.lease_id or registration.owner != lease.owner:
        raise _refuse(
            "invalid_state",
            f"the worktree registered for #{issue_number} belongs to lease {registration.lease_id}, not the live one",
            "bootstrap the issue again for the live lease",
            f"run foreman bootstrap --issue {issue_number} --owner {lease.owner}",
        )
    facts = RunFacts(
        repo=repo,
        issue_number=issue_number,
        owner=lease.owner,
        role=lease.role,
        action=action or lease.action,
        lease_id=lease.lease_id,
        worktree=worktree,
    )
    run_id = f"run-{uuid.uuid4().hex}"
    try:
        grant = compile_grant(
            template, facts, run_id=run_id, host_id=host_id or host_identity(settings.database.path), now=moment
        )
    except TemplateError as exc:
        raise _refuse(
            "invalid_input",
            f'grants."{key}" does not compile for #{issue_number}: {exc}',
            f'fix grants."{key}" in the configuration',
            "run foreman check-config",
            problems=[{"path": p, "problem": m} for p, m in exc.problems],
        ) from None
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    try:
        record = await GrantStore(db).seal(grant, token_sha256=token_digest(token), sealed_by=sealed_by, now=moment)
    except WorkloadFailed as exc:
        raise _refuse(
            "conflict",
            str(exc),
            "a failed workload is never retried on the same worktree: bootstrap a fresh worktree for a new run",
            f"run foreman grants to see the failed run of #{issue_number}",
        ) from None
    except GrantConflict as exc:
        raise _refuse(
            "conflict",
            str(exc),
            "finish or abort the open run first",
            f"run foreman grants to find the open run of #{issue_number}",
        ) from None
    return StartedRun(run_id=run_id, token=token, grant=grant, record=record)


# ============================================================================ the broker


@dataclass(frozen=True, slots=True)
class Admission:
    """The broker's answer before a call. Allowed: run the tool with :meth:`arguments` (the compiled ones), then
    pass this object to :meth:`Broker.after_call`. Denied: return ``refusal`` (the tool must not run)."""

    allowed: bool
    run_id: str
    tool: str
    reason: str
    call_id: str | None = None
    position: int | None = None
    effect: GrantEffect | None = None
    category: Category | None = None
    arguments_json: str | None = None
    worktree_uuid: str | None = None
    worktree_path: str | None = None
    inert: bool = False
    refusal: dict[str, Any] | None = None

    def arguments(self) -> dict[str, Any]:
        """A fresh copy of the compiled arguments of the admitted entry."""
        if not self.allowed or self.arguments_json is None:
            raise ValueError("a denied call has no arguments to run")
        value: dict[str, Any] = json.loads(self.arguments_json)
        return value

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "allowed": self.allowed,
            "run_id": self.run_id,
            "tool": self.tool,
            "reason": self.reason,
            "call_id": self.call_id,
            "position": self.position,
            "effect": self.effect,
            "category": self.category,
            "worktree_uuid": self.worktree_uuid,
            "inert": self.inert,
        }
        if self.allowed:
            out["arguments"] = self.arguments()
        if self.refusal is not None:
            out["refusal"] = self.refusal
        return out


@dataclass(frozen=True, slots=True)
class Completion:
    """The broker's answer after a call: ``doc`` is what the caller hands back (the tool's result, wrapped as
    inert for a plan-only entry; or the refusal of a late result); ``is_error`` marks it as an error."""

    accepted: bool
    run_id: str
    reason: str
    doc: dict[str, Any]
    is_error: bool
    call_id: str | None = None
    category: Category | None = None
    inert: bool = False
    outcome: str | None = None
    unresolved_worktree_uuid: str | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    """The answer to an abort or a reconciliation."""

    ok: bool
    run_id: str
    reason: str
    state: dict[str, Any] | None
    blocking_call_id: str | None = None
    category: Category | None = None
    refusal: dict[str, Any] | None = None
    unresolved_worktree_uuid: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ok": self.ok, "run_id": self.run_id, "reason": self.reason, "run": self.state}
        if self.blocking_call_id is not None:
            out["inflight_call_id"] = self.blocking_call_id
            out["teardown_blocked"] = True
        if self.unresolved_worktree_uuid is not None:
            out["unresolved_worktree_uuid"] = self.unresolved_worktree_uuid
        if self.refusal is not None:
            out["refusal"] = self.refusal
        return out


def _result_digest(result: Mapping[str, Any] | None) -> str | None:
    if result is None:
        return None
    try:
        return digest(result)
    except ValueError:
        return "sha256:" + hashlib.sha256(repr(result).encode("utf-8")).hexdigest()


# ============================================================================ the run's end: evidence comment


def run_evidence_key(run_id: str) -> str:
    """The outbox idempotency key (and comment marker) of a run's end: one evidence comment per run."""
    return f"run:{run_id}:summary"


def run_evidence_intent(grant: Grant, state: RunState, decisions: Mapping[str, int]) -> OutboxIntent:
    """The evidence comment posted on the run's issue when the run closes: a one-paragraph summary and, as JSON,
    ``summarize(grant, state)`` with the count of each kind of decision. Only the grant and the recorded state
    go into it: nothing the model proposed or a tool returned."""
    key = run_evidence_key(grant.run_id)
    evidence: dict[str, Any] = {
        "action": "run_end",
        "run": summarize(grant, state),
        "issue_number": grant.issue_number,
        "owner": grant.owner,
        "host_id": grant.host_id,
        "decisions": dict(sorted(decisions.items())),
        "unresolved_worktree_uuid": grant.worktree.uuid if state.teardown != "done" else None,
    }
    body = render_evidence(
        key=key,
        summary=run_end_summary(grant, state, denied=int(decisions.get("denied", 0))),
        state=None,
        evidence=evidence,
    )
    return OutboxIntent(key, grant.issue_number, "comment", {"body": body})


class Broker:
    """Admits one run's tool calls against its sealed grant. Every method reads the run's state from the database
    inside its own transaction, so any number of brokers (in one process or several) over the same database
    share one plan: a step consumed by one is never admitted by another.

    ``host`` gives this host's identity now (read on every decision); ``worktree`` resolves the run's worktree
    UUID now (default: the journal's live registration); ``policy_digest``: the digest of the template in force
    (None: not checked); ``grant_digest``: the digest the run token was bound to (None: the stored one).
    ``evidence``: queue the run's evidence comment (:func:`run_evidence_intent`) in the outbox, in the same
    transaction as the decision that closes the run (the teardown's result, or its reconciliation).
    """

    def __init__(
        self,
        store: GrantStore,
        run_id: str,
        *,
        host: HostSource,
        clock: Clock = utcnow,
        worktree: WorktreeResolver | None = None,
        policy_digest: str | None = None,
        grant_digest: str | None = None,
        broker_id: str | None = None,
        evidence: bool = True,
    ) -> None:
        self._store = store
        self.run_id = run_id
        self._host = host
        self._clock = clock
        self._worktree = worktree or journal_resolver(store.db)
        self._policy_digest = policy_digest
        self._grant_digest = grant_digest
        self.broker_id = broker_id or f"broker-{uuid.uuid4().hex[:12]}"
        self._grant: Grant | None = None
        self._on_close: CloseHook | None = self._queue_evidence if evidence else None

    @classmethod
    async def for_token(
        cls,
        store: GrantStore,
        settings: Settings,
        token: str,
        *,
        host: HostSource | None = None,
        clock: Clock = utcnow,
        worktree: WorktreeResolver | None = None,
    ) -> Broker | None:
        """The broker of the run a token names (None: no run has this token). The policy digest pinned is the
        one of the template configured *now*: a changed or removed template refuses the run's calls."""
        record = await store.run_for_token(token_digest(token))
        if record is None:
            return None
        try:
            template = policy_template(settings, record.policy_key)
        except TemplateError:
            template = None
        return cls(
            store,
            record.run_id,
            host=host or (lambda: host_identity(settings.database.path)),
            clock=clock,
            worktree=worktree,
            policy_digest=template.digest if template is not None else "sha256:<no template configured>",
            grant_digest=record.grant_digest,
        )

    async def grant(self) -> Grant:
        """The run's sealed grant (checked against its digest when loaded)."""
        if self._grant is None:
            grant = await self._store.grant(self.run_id)
            if grant is None:
                raise LookupError(f"no run {self.run_id}")
            self._grant = grant
        return self._grant

    async def state(self) -> RunState:
        record = await self._store.run(self.run_id)
        if record is None:
            raise LookupError(f"no run {self.run_id}")
        return record.state

    def _pins(self, grant: Grant) -> Pins:
        return Pins(
            run_id=self.run_id,
            grant_digest=self._grant_digest or grant.digest,
            policy_digest=self._policy_digest,
        )

    async def _decide(
        self, decide: Callable[[Grant, RunState], Verdict], context: DecisionContext
    ) -> tuple[Grant, Verdict]:
        try:
            return await self._store.decide(self.run_id, decide, context, on_close=self._on_close)
        except StateRaced:
            # Another broker decided between our read and write (possible on a multi-writer backend): decide
            # again on the state it left. Twice in a row is a broker_error.
            return await self._store.decide(self.run_id, decide, context, on_close=self._on_close)

    async def _queue_evidence(self, conn: aiosqlite.Connection, grant: Grant, state: RunState) -> None:
        counts = await self._store.decision_counts(grant.run_id, conn)
        queued = await enqueue(conn, run_evidence_intent(grant, state, counts), now=self._clock())
        log.info(
            "run %s closed (outcome %s, teardown %s): evidence %s %s",
            grant.run_id,
            state.outcome,
            state.teardown,
            run_evidence_key(grant.run_id),
            "queued" if queued else "was already queued",
        )

    def _context(self, **kwargs: Any) -> DecisionContext:
        return DecisionContext(host_id=self._safe_host(), broker_id=self.broker_id, now=self._clock(), **kwargs)

    def _safe_host(self) -> str:
        try:
            return self._host()
        except Exception:
            return "<unknown host>"

    async def _broker_error(
        self, what: str, context: DecisionContext | None, call_id: str | None = None, tool: str | None = None
    ) -> None:
        """Log the traceback here (never to the caller) and record a ``broker_error`` decision if the database
        still takes one. The run's state is not touched."""
        log.exception("run %s: broker failed during %s", self.run_id, what)
        if context is None:
            try:
                context = self._context(tool=tool, detail={"during": what})
            except Exception:
                return
        await self._store.record_error(self.run_id, context, call_id=call_id)

    # -- before and after each call

    async def before_call(self, tool: str, arguments: Mapping[str, Any] | None) -> Admission:
        """Admit ``tool(arguments)`` only if it is exactly the grant's next entry. Never raises.

        The arguments are snapshotted (canonical text) before anything else, so a caller mutating its dict
        while this runs changes nothing.
        """
        proposed_text = ProposedCall.of(tool, arguments, worktree_uuid=None).arguments_json
        call_id = f"call-{uuid.uuid4().hex}"
        context: DecisionContext | None = None
        try:
            grant = await self.grant()
            resolved = await self._worktree(grant)
            proposed = ProposedCall(tool=str(tool), arguments_json=proposed_text, worktree_uuid=resolved)
            host = self._host()
            now = self._clock()
            context = DecisionContext(
                host_id=host,
                broker_id=self.broker_id,
                now=now,
                tool=proposed.tool,
                arguments_digest=(
                    "sha256:" + hashlib.sha256(proposed_text.encode("utf-8")).hexdigest()
                    if proposed_text is not None
                    else None
                ),
                detail={"origin": "agent"}
                if resolved == grant.worktree.uuid
                else {"origin": "agent", "resolved_worktree": resolved},
            )
            pins = self._pins(grant)

            def decide(g: Grant, s: RunState) -> Verdict:
                return admit(g, s, proposed, now=now, host_id=host, call_id=call_id, pins=pins)

            grant, verdict = await self._decide(decide, context)
        except Exception:
            await self._broker_error("before_call", context, call_id, str(tool))
            return self._error_admission(str(tool))
        return self._admission(grant, verdict, str(tool))

    def _error_admission(self, tool: str) -> Admission:
        return Admission(
            allowed=False,
            run_id=self.run_id,
            tool=tool,
            reason="broker_error",
            category="broker_error",
            refusal=broker_refusal("broker_error", self.run_id),
        )

    def _admission(self, grant: Grant, verdict: Verdict, tool: str) -> Admission:
        if not verdict.ok:
            if verdict.category == "host_mismatch" and verdict.unresolved_uuid is not None:
                log.warning(
                    "run %s: teardown refused on a host other than the grant's; worktree %s is unresolved",
                    self.run_id,
                    verdict.unresolved_uuid,
                )
            return Admission(
                allowed=False,
                run_id=self.run_id,
                tool=tool,
                reason=verdict.reason,
                category=verdict.category,
                refusal=refusal(verdict, self.run_id),
            )
        call = verdict.call
        assert call is not None
        return Admission(
            allowed=True,
            run_id=self.run_id,
            tool=call.tool,
            reason=verdict.reason,
            call_id=verdict.call_id,
            position=call.position,
            effect=call.effect,
            arguments_json=call.arguments_json,
            worktree_uuid=grant.worktree.uuid,
            worktree_path=grant.worktree.path,
            inert=verdict.inert,
        )

    async def after_call(self, admission: Admission, *, ok: bool, result: Mapping[str, Any] | None) -> Completion:
        """Settle an admitted call with its result (``ok``: the tool succeeded). Never raises.

        Host identity and expiry are checked again: a late result, or one arriving on another host, is refused and
        does not advance the plan. A failure is accepted as the step's result and ends the plan (only the reserved
        teardown remains; nothing is retried). The result itself is only digested and handed back; a plan-only
        result is handed back wrapped as inert.
        """
        call_id = admission.call_id
        if not admission.allowed or call_id is None:
            doc = broker_refusal("grant_denied", self.run_id, reason="unknown_call")
            return Completion(
                accepted=False,
                run_id=self.run_id,
                reason="unknown_call",
                doc=doc,
                is_error=True,
                category="grant_denied",
            )
        context: DecisionContext | None = None
        try:
            result_copy = dict(result) if result is not None else {}
            host = self._host()
            now = self._clock()
            context = DecisionContext(
                host_id=host,
                broker_id=self.broker_id,
                now=now,
                tool=admission.tool,
                result_digest=_result_digest(result_copy),
                detail={"tool_ok": ok},
            )

            def decide(g: Grant, s: RunState) -> Verdict:
                return complete(g, s, call_id=call_id, ok=ok, now=now, host_id=host)

            _grant, verdict = await self._decide(decide, context)
        except Exception:
            await self._broker_error("after_call", context, call_id, admission.tool)
            return Completion(
                accepted=False,
                run_id=self.run_id,
                reason="broker_error",
                doc=broker_refusal("broker_error", self.run_id),
                is_error=True,
                call_id=call_id,
                category="broker_error",
            )
        if not verdict.ok:
            return Completion(
                accepted=False,
                run_id=self.run_id,
                reason=verdict.reason,
                doc=refusal(verdict, self.run_id),
                is_error=True,
                call_id=call_id,
                category=verdict.category,
                outcome=verdict.state.outcome,
                unresolved_worktree_uuid=verdict.unresolved_uuid,
            )
        position = verdict.call.position if verdict.call is not None else -1
        doc = mark_inert(result_copy, run_id=self.run_id, position=position) if verdict.inert else result_copy
        return Completion(
            accepted=True,
            run_id=self.run_id,
            reason=verdict.reason,
            doc=doc,
            is_error=not ok,
            call_id=call_id,
            inert=verdict.inert,
            outcome=verdict.state.outcome,
            unresolved_worktree_uuid=verdict.unresolved_uuid,
        )

    # -- the trusted side: abort, teardown, reconciliation

    async def abort(self, reason: str = "aborted") -> Settlement:
        """Record the run as aborted (unless it already has an outcome). An in-flight call is kept and blocks the
        teardown until it settles (its result is then refused) or is reconciled. Never raises."""
        context: DecisionContext | None = None
        try:
            context = self._context(detail={"abort_reason": reason})
            now = context.now

            def decide(g: Grant, s: RunState) -> Verdict:
                return abort(g, s, now=now)

            _grant, verdict = await self._decide(decide, context)
        except Exception:
            await self._broker_error("abort", context)
            return self._error_settlement()
        return self._settlement(verdict)

    async def reconcile(self, call_id: str, *, note: str) -> Settlement:
        """An operator's independent reconciliation of an in-flight call whose result will never come: settles it
        without advancing the plan (a reconciled teardown leaves the worktree reported unresolved). Never raises."""
        context: DecisionContext | None = None
        try:
            context = self._context(detail={"note": note})
            now = context.now

            def decide(g: Grant, s: RunState) -> Verdict:
                return reconcile(g, s, call_id=call_id, now=now)

            _grant, verdict = await self._decide(decide, context)
        except Exception:
            await self._broker_error("reconcile", context, call_id)
            return self._error_settlement()
        return self._settlement(verdict)

    async def teardown(self) -> Admission:
        """Admit the grant's reserved teardown on the trusted side (after the plan ended, failed, expired or was
        aborted). The caller runs it with ``admission.arguments()`` and settles it with :meth:`after_call`.
        Refused while a call is in flight, once it ran, on another host (the worktree UUID is reported unresolved)
        or when the issue's worktree is no longer the bound one. Never raises."""
        try:
            grant = await self.grant()
        except Exception:
            await self._broker_error("teardown", None)
            return self._error_admission("<teardown>")
        entry = grant.teardown
        return await self.before_call(entry.tool, entry.arguments())

    def _error_settlement(self) -> Settlement:
        return Settlement(
            ok=False,
            run_id=self.run_id,
            reason="broker_error",
            state=None,
            category="broker_error",
            refusal=broker_refusal("broker_error", self.run_id),
        )

    def _settlement(self, verdict: Verdict) -> Settlement:
        inflight = verdict.state.inflight
        return Settlement(
            ok=verdict.ok,
            run_id=self.run_id,
            reason=verdict.reason,
            state=verdict.state.to_dict(),
            blocking_call_id=inflight.call_id if inflight is not None else None,
            category=verdict.category,
            refusal=refusal(verdict, self.run_id) if not verdict.ok else None,
            unresolved_worktree_uuid=verdict.unresolved_uuid,
        )


class ToolRunner(Protocol):
    """Runs one tool call the way the MCP server does (through the gateway); answers (ok, result document)."""

    async def __call__(self, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]: ...


async def run_teardown(broker: Broker, run_tool: ToolRunner) -> dict[str, Any]:
    """The trusted side's teardown: admit the reserved teardown, run it with its compiled arguments, settle it.

    Refused (nothing runs) while a call is in flight, once it ran, on another host or when the issue's worktree
    is no longer the bound one. A teardown that raises counts as failed: it is never run again, and the worktree
    UUID is reported unresolved.
    """
    admission = await broker.teardown()
    if not admission.allowed:
        return {"ok": False, "run_id": broker.run_id, "refusal": admission.refusal}
    try:
        ok, doc = await run_tool(admission.tool, admission.arguments())
    except Exception:
        log.exception("run %s: the teardown call failed", broker.run_id)
        ok, doc = False, {"error": "unavailable", "message": "the teardown call failed; see the service log"}
    completion = await broker.after_call(admission, ok=ok, result=doc)
    return {
        "ok": completion.accepted and ok,
        "run_id": broker.run_id,
        "teardown": admission.to_dict(),
        "result": completion.doc,
        "unresolved_worktree_uuid": completion.unresolved_worktree_uuid,
    }


async def open_broker_for_token(db: Database, settings: Settings, token: str) -> Broker | None:
    """``Broker.for_token`` over a database (what ``foreman mcp`` calls with FOREMAN_MCP_TOKEN)."""
    return await Broker.for_token(GrantStore(db), settings, token)


async def inspect(db: Database, run_id: str | None) -> dict[str, Any]:
    """What ``foreman grants [RUN_ID]`` prints: each run's grant, state and every decision, oldest first.

    LookupError: no such run. A grant whose stored form fails its digest is reported, not trusted.
    """
    store = GrantStore(db)
    if run_id is not None:
        record = await store.run(run_id)
        if record is None:
            raise LookupError(f"no run {run_id}")
        records = [record]
    else:
        records = await store.runs(limit=1000)
    runs: list[dict[str, Any]] = []
    for record in records:
        try:
            grant = await store.grant(record.run_id)
            grant_doc: dict[str, Any] | None = grant.to_dict() if grant is not None else None
            integrity = "intact"
        except GrantIntegrityError as exc:
            grant_doc, integrity = None, f"not intact: {exc}"
        runs.append(
            {
                "run": record.summary(),
                "grant": grant_doc,
                "grant_integrity": integrity,
                "decisions": [d.to_dict() for d in await store.decisions(record.run_id)],
            }
        )
    return {"runs": runs}
