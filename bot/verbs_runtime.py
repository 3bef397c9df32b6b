"""The verb gateway's edge: who calls, the facts the pure gateway decides on, and each verb carried out.

Every MCP tool call and every comment command goes through :meth:`VerbRuntime.call`, in this order:

1. the verb must be in the verb table and offered (``executable``), else ``invalid_input``;
2. the verb's role gate (its first precondition) is decided on the caller's identity alone, so a caller
   without the role is refused ``not_authorized`` before its arguments or any state are looked at;
3. the arguments are checked against the verb's published input schema (``Verb.check_arguments``: JSON Schema
   Draft 2020-12, hostile values refused first; ``invalid_input``, every problem), and handed on as checked
   (integers as ints, JSON text decoded);
4. the facts are gathered (the issue's lease, its registered worktree) and the verb's whole precondition
   list is evaluated (seed 001): a refusal is the gateway's envelope, exactly;
5. only then is the verb carried out. Its own refusals (a stale pin, a lost race) are envelopes too.

Nothing raises out of ``call``: an unexpected failure is logged with its traceback here and answered with
an ``unavailable`` envelope that carries no internals. The caller's identity is never an argument.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from bot.allocation import ACTION_ROLES, AllocationCall, Allocator
from bot.config import Settings
from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope, ErrorKind
from bot.core.evidence import render_evidence
from bot.core.gateway import Decision, GatewayContext, Role, evaluate_preconditions
from bot.core.verbs import PRECONDITION_WORKTREE, VERBS, Verb, evaluate
from state.db import Database, utcnow
from state.issues import IssueStore
from state.leases import Lease, LeaseRefused, LeaseStore
from state.outbox import OutboxIntent, enqueue

if TYPE_CHECKING:
    from bot.gitea import GiteaClient
    from bot.verbs.bootstrap import BootstrapContext, BootstrapResult, LockResult

log = logging.getLogger("foreman.verbs")

Channel = Literal["mcp", "comment"]
#: How many issues a runtime context lists per verb (a controller may see every live lease).
_CONTEXT_ISSUE_LIMIT = 20


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls a verb: a login and its roster roles (from configuration, never from arguments)."""

    login: str
    roles: frozenset[Role]
    channel: Channel


def caller_for(settings: Settings, login: str, channel: Channel) -> Caller:
    """The caller with the roster roles of ``login`` (none if it is not on the roster)."""
    return Caller(login=login, roles=frozenset(settings.roster.get(login, [])), channel=channel)


@dataclass(frozen=True, slots=True)
class VerbResult:
    """One verb call's answer: the structured document, and whether it was refused (with the envelope).

    For a gateway refusal ``doc`` is exactly the envelope (seed 001 keys and order, plus
    ``exact_next_action``). For a verb that ran, ``doc`` is the verb's result with ``verb`` and the
    tools to call next (``next``).
    """

    verb: str
    doc: dict[str, Any]
    refusal: Envelope | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def refused(verb: str, envelope: Envelope) -> VerbResult:
    return VerbResult(verb=verb, doc=envelope.to_dict(), refusal=envelope)


def _envelope(
    error: ErrorKind, message: str, remediate: str, next_action: str, **details: Any
) -> Envelope:
    return Envelope(error=error, message=message, remediate=remediate, exact_next_action=next_action, details=details)


def _decision_result(verb: str, decision: Decision) -> VerbResult:
    return VerbResult(verb=verb, doc=decision.envelope(), refusal=decision.to_error())


# --------------------------------------------------------------------------- the worktree bootstrap seam


@dataclass(frozen=True, slots=True)
class BootstrapAnswer:
    """What the worktree bootstrap (issue 6) answered: its result document, and its refusal if any."""

    doc: dict[str, Any]
    refusal: Envelope | None = None


class WorktreeBootstrap(Protocol):
    """The part of the worktree bootstrap the verbs need (``bot.verbs.bootstrap`` provides it)."""

    async def bootstrap(
        self, *, issue_number: int, caller: str, idempotency_key: str | None, expected_base: str | None
    ) -> BootstrapAnswer: ...

    async def lock(self, *, issue_number: int, caller: str) -> BootstrapAnswer: ...

    async def worktree_registered(self, *, issue_number: int, owner: str) -> bool: ...

    async def locked(self, *, issue_number: int, owner: str) -> bool: ...

    def control_checkout(self) -> Path | None: ...


BootstrapFactory = Callable[["VerbRuntime"], Awaitable[WorktreeBootstrap | None]]


async def no_bootstrap(runtime: VerbRuntime) -> WorktreeBootstrap | None:
    """A runtime without the worktree bootstrap: its verbs answer ``unavailable`` (tests use it too)."""
    return None


async def module_bootstrap(runtime: VerbRuntime) -> WorktreeBootstrap | None:
    """The worktree bootstrap of ``bot.verbs.bootstrap`` (issue 6) over the runtime's database, settings and Gitea."""
    from bot.verbs.bootstrap import BootstrapContext

    return _ModuleBootstrap(BootstrapContext.from_service(runtime))


class _ModuleBootstrap:
    """``bot.verbs.bootstrap``'s transition and lock behind the seam; its facts read from the bootstrap journal."""

    def __init__(self, ctx: BootstrapContext) -> None:
        from state.journal import JournalStore

        self._ctx = ctx
        self._journal = JournalStore(ctx.db)
        self._leases = LeaseStore(ctx.db)

    @staticmethod
    def _answer(result: BootstrapResult | LockResult) -> BootstrapAnswer:
        doc = result.to_dict()
        if result.exit_code == 0:
            return BootstrapAnswer(doc=doc)
        refusal = result.refusal or _envelope(  # every refusal carries an envelope; this is a guard
            "invalid_state", f"the bootstrap ended {doc.get('status')}",
            "Read the issue's state before trying again.", "call gitea_get_runtime_context",
        )
        return BootstrapAnswer(doc=doc, refusal=refusal)

    async def bootstrap(
        self, *, issue_number: int, caller: str, idempotency_key: str | None, expected_base: str | None
    ) -> BootstrapAnswer:
        from bot.verbs.bootstrap import bootstrap_issue_worktree

        return self._answer(await bootstrap_issue_worktree(
            self._ctx, issue_number=issue_number, caller=caller, idempotency_key=idempotency_key,
            expected_base=expected_base,
        ))

    async def lock(self, *, issue_number: int, caller: str) -> BootstrapAnswer:
        from bot.verbs.bootstrap import lock_issue

        return self._answer(await lock_issue(self._ctx, issue_number=issue_number, caller=caller))

    async def _lease(self, issue_number: int, owner: str) -> Lease | None:
        lease = await self._leases.live_for_issue(self._ctx.repo, issue_number)
        return lease if lease is not None and lease.owner == owner else None

    async def worktree_registered(self, *, issue_number: int, owner: str) -> bool:
        """A completed bootstrap of the owner's live lease registered a worktree that is still registered
        (``lock_issue`` checks the branches-only and anti-stomp guards on disk again)."""
        lease = await self._lease(issue_number, owner)
        if lease is None:
            return False
        done = await self._journal.completed_for_lease(lease.lease_id)
        registration = await self._journal.live_registration(self._ctx.repo, issue_number)
        return done is not None and registration is not None and registration.journal_id == done.id

    async def locked(self, *, issue_number: int, owner: str) -> bool:
        lease = await self._lease(issue_number, owner)
        lock = await self._journal.live_lock(self._ctx.repo, issue_number)
        return lease is not None and lock is not None and lock.lease_id == lease.lease_id

    def control_checkout(self) -> Path | None:
        return self._ctx.checkout_path


# --------------------------------------------------------------------------- the runtime


@dataclass
class VerbRuntime:
    """Runs verbs for callers against the database, Gitea (optional) and the worktree bootstrap (optional).

    ``wakeup`` is called after outbox entries were committed (the service's sender sends them; a
    stand-alone ``foreman mcp`` leaves them for ``foreman serve``). ``bootstrap_factory`` builds the
    worktree bootstrap on first use (``bot.verbs.bootstrap`` by default; ``no_bootstrap`` for none, whose
    verbs then answer ``unavailable``).
    """

    db: Database
    settings: Settings
    gitea: GiteaClient | None = None
    bot_login: str = ""
    wakeup: Callable[[], None] | None = None
    bootstrap_factory: BootstrapFactory = module_bootstrap
    clock: Callable[[], datetime] = utcnow
    _bootstrap: WorktreeBootstrap | None = field(default=None, init=False, repr=False)
    _bootstrap_loaded: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.leases = LeaseStore(self.db)
        self.issues = IssueStore(self.db)

    @property
    def repo(self) -> str:
        """Leases and issue state are keyed by ``owner/name`` in lower case."""
        return f"{self.settings.repository.owner}/{self.settings.repository.name}".lower()

    async def worktree_bootstrap(self) -> WorktreeBootstrap | None:
        if not self._bootstrap_loaded:
            self._bootstrap = await self.bootstrap_factory(self)
            self._bootstrap_loaded = True
        return self._bootstrap

    # --- the gateway ----------------------------------------------------------------------------------
    async def call(
        self, verb_name: str, caller: Caller, arguments: Mapping[str, object], *, delivery_id: str | None = None
    ) -> VerbResult:
        """Decide, then (if allowed) carry out ``verb_name`` for ``caller``. Never raises."""
        try:
            return await self._call(verb_name, caller, arguments, delivery_id)
        except Exception:
            log.exception("%s by %s failed unexpectedly", verb_name, caller.login)
            return refused(
                verb_name,
                _envelope(
                    "unavailable",
                    f"foreman failed while running {verb_name}; the failure is in its log, and the call may "
                    "or may not have taken effect",
                    "Read the current state before trying again; tell an operator if it keeps failing.",
                    "call gitea_get_runtime_context, then retry the call if it is still needed",
                ),
            )

    async def _call(
        self, verb_name: str, caller: Caller, arguments: Mapping[str, object], delivery_id: str | None
    ) -> VerbResult:
        verb = VERBS.get(verb_name)
        if verb is None or not verb.executable:
            offered = ", ".join(v.tool for v in VERBS.values() if v.executable)
            return refused(
                verb_name,
                _envelope(
                    "invalid_input",
                    f"{str(verb_name)[:80]!a} is not a verb foreman carries out",
                    f"Use one of: {offered}.",
                    "call gitea_get_runtime_context to see what you can do now",
                ),
            )
        identity = GatewayContext(caller=caller.login, caller_roles=caller.roles)
        gate = evaluate_preconditions(verb.preconditions[:1], identity)
        if not gate.allowed:
            return _decision_result(verb.name, gate)
        values, problems = verb.check_arguments(arguments)
        if problems:
            return refused(
                verb.name,
                _envelope(
                    "invalid_input",
                    f"{verb.tool}: " + "; ".join(f"{p['argument']}: {p['problem']}" for p in problems),
                    "Call again with arguments that match the tool's input schema.",
                    f"call {verb.tool} again with corrected arguments",
                    problems=problems,
                ),
            )
        context, lease = await self._facts(verb, caller, values)
        decision = evaluate(verb.name, context)
        if not decision.allowed:
            log.info("%s by %s refused: %s %s", verb.name, caller.login, decision.kind, list(decision.failed))
            return _decision_result(verb.name, decision)
        result = await _EXECUTORS[verb.name](self, verb, caller, values, lease, delivery_id)
        log.info("%s by %s (%s): %s", verb.name, caller.login, caller.channel, "ok" if result.ok else "refused")
        return result

    async def _facts(
        self, verb: Verb, caller: Caller, values: Mapping[str, object]
    ) -> tuple[GatewayContext, Lease | None]:
        """The facts the verb's preconditions read, gathered from SQLite and the worktree bootstrap."""
        issue = values.get("issue_number") if verb.issue_scoped else None
        lease: Lease | None = None
        live = False
        worktree = False
        if isinstance(issue, int):
            lease = await self.leases.live_for_issue(self.repo, issue)
            live = lease is not None and lease.is_live(self.clock())
            if lease is not None and live and PRECONDITION_WORKTREE in verb.preconditions:
                worktree = await self._worktree_registered(issue, lease.owner)
        context = GatewayContext(
            caller=caller.login,
            caller_roles=caller.roles,
            issue_number=issue if isinstance(issue, int) else None,
            lease_owner=lease.owner if lease is not None else None,
            lease_live=live,
            worktree_registered=worktree,
        )
        return context, lease

    async def _worktree_registered(self, issue: int, owner: str) -> bool:
        bootstrap = await self.worktree_bootstrap()
        if bootstrap is None:
            return False
        return await bootstrap.worktree_registered(issue_number=issue, owner=owner)

    def next_tools(self, verb: Verb, caller: Caller) -> list[str]:
        """The verb's suggested next tools that exist and whose role gate the caller passes."""
        identity = GatewayContext(caller=caller.login, caller_roles=caller.roles)
        out = []
        for name in verb.next_verbs:
            nxt = VERBS[name]
            if nxt.executable and nxt.preconditions[0].check(identity):
                out.append(nxt.tool)
        return out

    def _done(self, verb: Verb, caller: Caller, doc: dict[str, Any]) -> VerbResult:
        return VerbResult(verb=verb.name, doc={"verb": verb.name, **doc, "next": self.next_tools(verb, caller)})

    def _woken(self) -> None:
        if self.wakeup is not None:
            self.wakeup()

    # --- verbs ----------------------------------------------------------------------------------------
    async def _allocate(
        self, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None, delivery_id: str | None
    ) -> VerbResult:
        action = str(values["action"])
        owner = values.get("owner")
        if owner is None:
            role = ACTION_ROLES.get(action, "author")
            fits = [login for login, roles in self.settings.roster.items() if role in roles]
            if role == "author" and len(fits) > 1:
                # Several authors: the next idle one by the auto-allocation policy (issue 20).
                from bot.auto_allocation import author_pick

                pick = await author_pick(self.db, self.settings, self.clock())
                if not pick.order:
                    busy = ", ".join(s.login for s in pick.skipped)
                    return refused(verb.name, _envelope(
                        "conflict",
                        f"no owner given and every author is busy ({busy})",
                        "Wait for an author to free up (foreman allocates ready issues automatically when one "
                        "does), or name the owner.",
                        f"call {verb.tool} again with owner set, or once an author has released its lease",
                        reason="authors_busy", authors=pick.to_dict(),
                    ))
                fits = [pick.order[0]]
            if len(fits) != 1:
                return refused(
                    verb.name,
                    _envelope(
                        "invalid_input",
                        f"no owner given and the roster has {len(fits)} identities with the {role} role",
                        f"Name the owner: one of {', '.join(fits) or '(none: add one to [roster])'}.",
                        f"call {verb.tool} again with owner set",
                    ),
                )
            owner = fits[0]
        assert isinstance(owner, str)
        expected = values.get("expected_fingerprint")
        call = AllocationCall(
            actor=caller.login,
            owner=owner.lstrip("@"),
            candidates_json=values.get("candidates_json"),
            exclude_issue_numbers=values.get("exclude_issue_numbers"),
            dry_run=bool(values["dry_run"]),
            expected_fingerprint=expected if isinstance(expected, str) else None,
            action=action,
            delivery_id=delivery_id,
        )
        outcome = await Allocator(self.db, self.settings, self.gitea, bot_login=self.bot_login).run(call)
        if outcome.applied:
            self._woken()
        doc = {"verb": verb.name, **outcome.to_dict()}
        if outcome.exit_code == 0:
            doc["next"] = self.next_tools(verb, caller)
            return VerbResult(verb=verb.name, doc=doc)
        refusal = outcome.refusal
        if refusal is None and outcome.decision is not None:
            refusal = getattr(outcome.decision, "envelope", None)
        if refusal is None:  # pragma: no cover - every refused outcome carries an envelope
            refusal = _envelope("invalid_state", "allocation refused", "Run a dry-run.", f"call {verb.tool}")
        return VerbResult(verb=verb.name, doc=doc, refusal=refusal)

    async def _bootstrap_verb(
        self, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None, delivery_id: str | None
    ) -> VerbResult:
        issue = _issue(values)
        bootstrap = await self.worktree_bootstrap()
        if bootstrap is None:
            return refused(verb.name, _bootstrap_missing(verb, issue))
        if verb.name == "lock_issue":
            answer = await bootstrap.lock(issue_number=issue, caller=caller.login)
        else:
            key, base = values.get("idempotency_key"), values.get("expected_base")
            answer = await bootstrap.bootstrap(
                issue_number=issue,
                caller=caller.login,
                idempotency_key=key if isinstance(key, str) else None,
                expected_base=base if isinstance(base, str) else None,
            )
        self._woken()
        if answer.refusal is not None:
            return VerbResult(verb=verb.name, doc={"verb": verb.name, **answer.doc}, refusal=answer.refusal)
        return self._done(verb, caller, answer.doc)

    async def _heartbeat(
        self, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None, delivery_id: str | None
    ) -> VerbResult:
        assert lease is not None  # the live_lease precondition held
        ttl = timedelta(seconds=self.settings.allocator.lease_ttl_s)
        try:
            beat = await self.leases.heartbeat(lease.lease_id, owner=lease.owner, ttl=ttl, now=self.clock())
        except LeaseRefused:
            return refused(verb.name, _lease_changed(verb, lease))
        return self._done(verb, caller, {"issue_number": lease.issue_number, "lease": beat.to_dict()})

    async def _release(
        self, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None, delivery_id: str | None
    ) -> VerbResult:
        assert lease is not None  # the live_lease precondition held
        reason = str(values["reason"])
        now = self.clock()
        key = f"{lease.lease_id}:release"
        body = render_evidence(
            key=key,
            summary=f"Lease on #{lease.issue_number} released by {caller.login} ({reason}); it was held by "
            f"{lease.owner} for {lease.action}.",
            state=None,
            evidence={
                "action": "release_lease",
                "lease_id": lease.lease_id,
                "owner": lease.owner,
                "released_by": caller.login,
                "reason": reason,
                "channel": caller.channel,
                "delivery": delivery_id,
                "released_at": now.isoformat(),
            },
        )
        try:
            async with self.db.transaction() as conn:
                await self.leases.release(conn, lease.lease_id, actor=caller.login, reason=reason, now=now)
                await enqueue(conn, OutboxIntent(key, lease.issue_number, "comment", {"body": body}, delivery_id))
        except LeaseRefused:
            return refused(verb.name, _lease_changed(verb, lease))
        self._woken()
        released = await self.leases.get(lease.lease_id)
        # The owner is free now: the next ready issue goes to the next idle author (issue 20), once.
        auto = await self._auto_allocate_after_release(delivery_id)
        return self._done(
            verb,
            caller,
            {
                "issue_number": lease.issue_number,
                "lease": released.to_dict() if released is not None else None,
                "outbox": [key],
                **({"auto_allocation": auto} if auto is not None else {}),
            },
        )

    async def _auto_allocate_after_release(self, delivery_id: str | None) -> dict[str, Any] | None:
        """Run auto-allocation after a release; its failure never undoes or fails the release (the next trigger
        or catch-up run allocates instead)."""
        from bot.auto_allocation import auto_allocate

        if not self.settings.auto_allocation() or self.gitea is None:
            return None
        try:
            report = await auto_allocate(self.db, self.settings, self.gitea, bot_login=self.bot_login,
                                         trigger="release", delivery_id=delivery_id, wakeup=self.wakeup)
        except Exception as exc:  # reported in the result and the log; the release stands
            log.warning("auto-allocation after a release failed: %s: %s", type(exc).__name__, exc)
            return {"error": "unavailable", "message": f"{type(exc).__name__}: {exc}"}
        if report.outbox:
            self._woken()
        return {"leased": report.leased, "waiting": report.waiting, "blocked": report.blocked}

    async def _get_state(
        self, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None, delivery_id: str | None
    ) -> VerbResult:
        issue = _issue(values)
        snapshot = await self.issues.snapshot(self.repo, issue)
        doc: dict[str, Any] = {
            "issue_number": issue,
            "state": snapshot.state.to_dict() if snapshot is not None and snapshot.state is not None else None,
            "lease": lease.to_dict() if lease is not None else None,
            "lease_live": lease is not None and lease.is_live(self.clock()),
        }
        if snapshot is None:
            doc["note"] = "foreman has not seen this issue yet (no webhook about it, no state posted)"
        else:
            doc.update(
                is_open=snapshot.is_open,
                labels=list(snapshot.label_names),
                label_sync=snapshot.label_sync,
                open_blockers=list(snapshot.open_blockers),
                state_comment_id=snapshot.state_comment_id,
            )
        return self._done(verb, caller, doc)

    async def _post_state(
        self, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None, delivery_id: str | None
    ) -> VerbResult:
        issue = _issue(values)
        raw = values["state"]
        assert isinstance(raw, dict)
        try:
            state = CanonicalState.from_dict({"extra": {}, **raw, "last_updated_by": caller.login})
        except (ValueError, TypeError) as exc:
            return refused(
                verb.name,
                _envelope(
                    "invalid_input",
                    f"state is not a valid Canonical Issue State: {exc}",
                    "Send every field in snake_case, as gitea_get_issue_state returns them.",
                    f"call gitea_get_issue_state for #{issue}, edit its state and call {verb.tool} with it",
                ),
            )
        snapshot = await self.issues.snapshot(self.repo, issue)
        basis = snapshot.state_record_id if snapshot is not None else None
        summary = values.get("summary")
        digest = hashlib.sha256(
            json.dumps([caller.login, state.to_dict(), summary, basis], sort_keys=True).encode()
        ).hexdigest()[:24]
        key = f"state:{issue}:{digest}"
        default_summary = f"{caller.login} set #{issue} to {state.state}; next: {state.who_is_next}."
        body = render_evidence(
            key=key,
            summary=str(summary) if summary else default_summary,
            state=state,
            evidence={
                "action": "post_issue_state",
                "by": caller.login,
                "channel": caller.channel,
                "lease_id": lease.lease_id if lease is not None else None,
                "replaces_record": basis,
            },
        )
        async with self.db.transaction() as conn:
            queued = await enqueue(conn, OutboxIntent(key, issue, "comment", {"body": body}, delivery_id))
        self._woken()
        return self._done(
            verb,
            caller,
            {
                "issue_number": issue,
                "state": state.to_dict(),
                "outbox": [key],
                "queued": queued,
                "note": (
                    "queued in the outbox: foreman serve posts it, reads it back and then makes it the issue's state"
                    if queued
                    else "the same state was already queued; nothing new was added"
                ),
            },
        )

    async def _runtime_context(
        self, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None, delivery_id: str | None
    ) -> VerbResult:
        now = self.clock()
        open_leases = [lease for lease in await self.leases.open_leases(self.repo) if lease.is_live(now)]
        mine = [lease for lease in open_leases if lease.owner == caller.login]
        callable_now = await self._callable_now(caller, open_leases)
        branch = await self._default_branch()
        doc: dict[str, Any] = {
            "identity": {"login": caller.login, "roles": sorted(caller.roles), "channel": caller.channel},
            "role": sorted(caller.roles)[0] if len(caller.roles) == 1 else sorted(caller.roles),
            "repository": f"{self.settings.repository.owner}/{self.settings.repository.name}",
            "default_branch": branch,
            "leases": [lease.to_dict() for lease in mine],
            "callable_now": callable_now,
            "exact_next_action": await self._next_action(caller, mine),
        }
        return self._done(verb, caller, doc)

    async def _callable_now(self, caller: Caller, live: list[Lease]) -> list[dict[str, Any]]:
        """Each offered verb the gateway allows this caller now; issue verbs once per issue it applies to."""
        out: list[dict[str, Any]] = []
        relevant = [lease for lease in live if lease.owner == caller.login or "controller" in caller.roles]
        for verb in VERBS.values():
            if not verb.executable:
                continue
            if not verb.issue_scoped:
                if evaluate(verb.name, GatewayContext(caller=caller.login, caller_roles=caller.roles)).allowed:
                    out.append({"tool": verb.tool})
                continue
            issues: list[int] = []
            for lease in relevant[:_CONTEXT_ISSUE_LIMIT]:
                worktree = False
                if PRECONDITION_WORKTREE in verb.preconditions:
                    worktree = await self._worktree_registered(lease.issue_number, lease.owner)
                ctx = GatewayContext(
                    caller=caller.login,
                    caller_roles=caller.roles,
                    issue_number=lease.issue_number,
                    lease_owner=lease.owner,
                    lease_live=True,
                    worktree_registered=worktree,
                )
                if evaluate(verb.name, ctx).allowed:
                    issues.append(lease.issue_number)
            if issues:
                out.append({"tool": verb.tool, "issue_numbers": issues})
            elif verb.name == "get_issue_state":
                out.append({"tool": verb.tool, "issue_numbers": "any"})
        return out

    async def _next_action(self, caller: Caller, mine: list[Lease]) -> str:
        if mine:
            lease = mine[0]
            n = lease.issue_number
            until = lease.expires_at.isoformat()
            bootstrap = await self.worktree_bootstrap()
            if bootstrap is not None and not await bootstrap.worktree_registered(issue_number=n, owner=caller.login):
                return f"call gitea_bootstrap_issue_worktree with issue_number={n}"
            if bootstrap is not None and not await bootstrap.locked(issue_number=n, owner=caller.login):
                return f"call gitea_lock_issue with issue_number={n}"
            if bootstrap is None:
                return (
                    f"call gitea_get_issue_state with issue_number={n} and follow its next_action; "
                    f"call gitea_heartbeat_lease with issue_number={n} before {until}"
                )
            return (
                f"work on #{n} in its registered worktree; call gitea_heartbeat_lease with issue_number={n} "
                f"before {until}, and gitea_post_issue_state with issue_number={n} when the step is done"
            )
        if "controller" in caller.roles:
            return (
                "call gitea_allocate_next_work with dry_run=true, then with dry_run=false and "
                "expected_fingerprint set to the dry run's fingerprint"
            )
        return "nothing is leased to you: call gitea_get_runtime_context again after a controller allocates work to you"

    async def _default_branch(self) -> dict[str, Any]:
        """The default branch's SHA live on Gitea and in the control checkout, side by side."""
        out: dict[str, Any] = {"name": None, "live_sha": None, "checkout_sha": None, "checkout": None}
        notes: list[str] = []
        if self.gitea is None:
            notes.append("no gitea.token configured: the live SHA cannot be read")
        else:
            try:
                repo = await self.gitea.get_repo()
                out["name"] = repo.default_branch
                out["live_sha"] = (await self.gitea.get_branch(repo.default_branch)).commit_id
            except Exception as exc:
                notes.append(f"Gitea did not answer: {type(exc).__name__}")
        bootstrap = await self.worktree_bootstrap()
        checkout = bootstrap.control_checkout() if bootstrap is not None else None
        if checkout is None:
            notes.append("no control checkout: the worktree bootstrap is not available in this foreman")
        elif not (checkout / ".git").exists():
            out["checkout"] = str(checkout)
            notes.append("no control checkout yet: the first worktree bootstrap clones it")
        else:
            out["checkout"] = str(checkout)
            ref = f"refs/heads/{out['name']}" if out["name"] else "HEAD"
            out["checkout_sha"] = await _git_rev(checkout, ref)
        live, held = out["live_sha"], out["checkout_sha"]
        out["in_sync"] = (live == held) if live and held else None
        if live and held and live != held:
            notes.append("the control checkout is behind or ahead of Gitea; the next bootstrap fetches first")
        out["detail"] = "; ".join(notes) or "live and checkout agree"
        return out


async def _git_rev(checkout: Path, ref: str) -> str | None:
    """``ref`` resolved in ``checkout`` (argument list, never a shell), or None."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "git", "-C", str(checkout), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=10)
    except (OSError, TimeoutError):
        return None
    text = out.decode().strip()
    return text if proc.returncode == 0 and text else None


def _issue(values: Mapping[str, object]) -> int:
    issue = values["issue_number"]
    assert isinstance(issue, int)
    return issue


def _bootstrap_missing(verb: Verb, issue: int) -> Envelope:
    return _envelope(
        "unavailable",
        f"{verb.tool} is not available: this foreman runs without the worktree bootstrap (bot.verbs.bootstrap)",
        "An operator must run foreman with the worktree bootstrap.",
        f"call gitea_post_issue_state with issue_number={issue}, state blocked and blockers naming the missing "
        "worktree bootstrap",
        missing_component="bot.verbs.bootstrap",
    )


def _lease_changed(verb: Verb, lease: Lease) -> Envelope:
    return _envelope(
        "conflict",
        f"the lease on #{lease.issue_number} changed while {verb.tool} ran (released, expired or taken over)",
        "Read the issue's lease again before acting on it.",
        f"call gitea_get_issue_state with issue_number={lease.issue_number}",
    )


Executor = Callable[
    [VerbRuntime, Verb, Caller, Mapping[str, object], Lease | None, str | None], Awaitable[VerbResult]
]

_EXECUTORS: dict[str, Executor] = {
    "allocate_next_work": VerbRuntime._allocate,
    "bootstrap_issue_worktree": VerbRuntime._bootstrap_verb,
    "lock_issue": VerbRuntime._bootstrap_verb,
    "heartbeat_lease": VerbRuntime._heartbeat,
    "release_lease": VerbRuntime._release,
    "get_issue_state": VerbRuntime._get_state,
    "post_issue_state": VerbRuntime._post_state,
    "get_runtime_context": VerbRuntime._runtime_context,
}


def _check_executors() -> None:
    offered = {name for name, verb in VERBS.items() if verb.executable}
    if offered != set(_EXECUTORS):
        raise RuntimeError(f"executable verbs {sorted(offered)} and executors {sorted(_EXECUTORS)} differ")


_check_executors()
