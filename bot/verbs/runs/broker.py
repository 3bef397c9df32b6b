"""The run broker: admits an agent's tool calls against the run's sealed grant and records every decision."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.config import Settings
from bot.core.digest import digest, text_digest
from bot.core.evidence import render_evidence
from bot.core.grants import (
    Category,
    Grant,
    GrantEffect,
    Pins,
    ProposedCall,
    RunState,
    TemplateError,
    Verdict,
    abort,
    admit,
    broker_refusal,
    complete,
    mark_inert,
    reconcile,
    refusal,
    run_end_summary,
    summarize,
)
from bot.verbs.runs.start import host_identity, policy_template, registered_worktree, token_digest
from state.db import Database, utcnow
from state.grants import CloseHook, DecisionContext, GrantStore, StateRaced
from state.outbox import OutboxIntent, enqueue
from state.sql import Connection

log = logging.getLogger("foreman.grants")

HostSource = Callable[[], str]
Clock = Callable[[], datetime]
#: The UUID of the run's worktree as registered *now* (None: no live registration for the run's issue).
WorktreeResolver = Callable[[Grant], Awaitable[str | None]]


def journal_resolver(db: Database) -> WorktreeResolver:
    """Resolve a run's worktree UUID from the journal's live registration for the run's issue."""

    async def resolve(grant: Grant) -> str | None:
        found = await registered_worktree(db, grant.repo, grant.issue_number)
        return found[0].uuid if found is not None else None

    return resolve


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
        return text_digest(repr(result))




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
    return OutboxIntent(key, grant.issue_number, "comment", {"body": body}, repo=grant.repo)


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

    async def _queue_evidence(self, conn: Connection, grant: Grant, state: RunState) -> None:
        counts = await self._store.decision_counts(grant.run_id, conn)
        # Filed under the run's own repository: this runs outside any door (the run-bound `foreman mcp`, `foreman
        # run teardown/abort`), where no task-wide repository is set.
        queued = await enqueue(conn, run_evidence_intent(grant, state, counts), now=self._clock(), repo=grant.repo)
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

    def _call_context(self, tool: str, **recorded: Any) -> DecisionContext:
        """The context of a call's decision: this host (raises when it cannot be told) and now, in that order."""
        return DecisionContext(host_id=self._host(), broker_id=self.broker_id, now=self._clock(), tool=tool, **recorded)

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
            context = self._call_context(
                proposed.tool,
                arguments_digest=text_digest(proposed_text) if proposed_text is not None else None,
                detail={"origin": "agent"}
                if resolved == grant.worktree.uuid
                else {"origin": "agent", "resolved_worktree": resolved},
            )
            host, now = context.host_id, context.now
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
            context = self._call_context(admission.tool, result_digest=_result_digest(result_copy),
                                         detail={"tool_ok": ok})
            host, now = context.host_id, context.now

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
