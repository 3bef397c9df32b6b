"""The one door to every verb: who calls, the facts the pure gateway decides on, and the verb carried out."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from bot.config import Settings
from bot.core.errors import Envelope, ErrorKind
from bot.core.gateway import Decision, GatewayContext, Role, evaluate_preconditions
from bot.core.verbs import (
    PRECONDITION_COMMITS,
    PRECONDITION_LOCK,
    PRECONDITION_PR_EXISTS,
    PRECONDITION_WORKTREE,
    VERBS,
    Verb,
    evaluate,
)
from state.db import Database, utcnow
from state.issues import IssueStore
from state.leases import Lease, LeaseStore

if TYPE_CHECKING:
    from bot.core.allocator import Candidate
    from bot.verbs.allocate import AllocatorGitea
    from bot.verbs.bootstrap import BootstrapContext, BootstrapResult, LockResult
    from bot.verbs.context import BranchGitea
    from bot.verbs.merge import MergeGitea
    from bot.verbs.review import ReviewGitea

    class VerbsGitea(AllocatorGitea, BranchGitea, ReviewGitea, MergeGitea, Protocol):
        """What the door hands on: the allocator's Gitea (with the bootstrap's) and the runtime context's reads.
        Declared for the type checker only: the families it unites import this module."""

log = logging.getLogger("foreman.verbs")

#: How a call reached the door: an MCP tool, a comment command, the operator's command line, auto-allocation,
#: start-up recovery (for the owner of the lease it resumes), or the dashboard's allocation preview.
Channel = Literal["mcp", "comment", "cli", "auto", "recovery", "dashboard"]
#: The channels of the operator: its command line, auto-allocation and the dashboard's preview.
OperatorChannel = Literal["cli", "auto", "dashboard"]
#: The roles the operator's channels act with. Whoever runs foreman on this configuration and database is its
#: operator; auto-allocation is switched on by that configuration (``[allocator] auto``).
OPERATOR_ROLES: frozenset[Role] = frozenset({"controller"})


@dataclass(frozen=True, slots=True)
class Caller:
    """Who calls a verb: a login and its roster roles (from configuration, never from arguments).

    ``operator`` is True only for the caller ``operator_caller`` makes: who calls decides, never the channel (a
    roster identity whose call came by an operator's channel is still that identity).
    """

    login: str
    roles: frozenset[Role]
    channel: Channel
    operator: bool = False


def caller_for(settings: Settings, login: str, channel: Channel) -> Caller:
    """The caller with the roster roles of ``login`` (none if it is not on the roster)."""
    return Caller(login=login, roles=frozenset(settings.roster.get(login, [])), channel=channel)


def operator_caller(login: str, channel: OperatorChannel) -> Caller:
    """The operator (command line, dashboard) or foreman allocating on its own: ``OPERATOR_ROLES``, never the
    roster's."""
    return Caller(login=login, roles=OPERATOR_ROLES, channel=channel, operator=True)


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What an in-process caller (auto-allocation, the command line) adds to a call; no MCP tool or comment command
    can set it, so none of the tool schema's bounds (sized for one agent's call) apply to it.

    ``resume_own`` False gives an owner that holds a live lease another issue; ``max_live`` refuses an apply when the
    owner already holds that many live leases; ``now`` pins the allocator's clock. ``exclusions`` are excluded on
    top of the call's own ``exclude_issue_numbers`` (and never stated as a controller's standing exclusions);
    ``candidates``, already normalized, are decided on in place of ``candidates_json``.
    """

    resume_own: bool = True
    max_live: int | None = None
    now: datetime | None = None
    exclusions: frozenset[int] = frozenset()
    candidates: tuple[Candidate, ...] | None = None


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
    #: The executor's typed result for an in-process caller (the allocator's ``AllocationOutcome``), else None.
    outcome: object = None

    @property
    def ok(self) -> bool:
        return self.refusal is None

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def refused(verb: str, envelope: Envelope) -> VerbResult:
    return VerbResult(verb=verb, doc=envelope.to_dict(), refusal=envelope)


def envelope(
    error: ErrorKind, message: str, remediate: str, next_action: str, **details: Any
) -> Envelope:
    return Envelope(error=error, message=message, remediate=remediate, exact_next_action=next_action, details=details)


def _decision_result(verb: str, decision: Decision) -> VerbResult:
    return VerbResult(verb=verb, doc=decision.envelope(), refusal=decision.to_error())


# --- the worktree bootstrap seam --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BootstrapAnswer:
    """What the worktree bootstrap answered: its result document, and its refusal if any."""

    doc: dict[str, Any]
    refusal: Envelope | None = None
    #: The bootstrap's typed result (``BootstrapResult``, ``LockResult``) for an in-process caller.
    outcome: object = None


class WorktreeBootstrap(Protocol):
    """The part of the worktree bootstrap the verbs need (``bot.verbs.bootstrap`` provides it)."""

    async def bootstrap(
        self, *, issue_number: int, caller: str, idempotency_key: str | None, expected_base: str | None
    ) -> BootstrapAnswer: ...

    async def replay(
        self, *, issue_number: int, caller: str, idempotency_key: str, expected_base: str | None
    ) -> BootstrapAnswer | None:
        """The recorded answer to the caller's own finished request ``idempotency_key``; None for any other key
        (new, unfinished, or another identity's: that one is not revealed)."""

    async def lock(self, *, issue_number: int, caller: str) -> BootstrapAnswer: ...

    async def worktree_registered(self, *, issue_number: int, owner: str) -> bool: ...

    async def locked(self, *, issue_number: int, owner: str) -> bool: ...

    def control_checkout(self) -> Path | None: ...


BootstrapFactory = Callable[["VerbRuntime"], Awaitable[WorktreeBootstrap | None]]


async def no_bootstrap(runtime: VerbRuntime) -> WorktreeBootstrap | None:
    """A runtime without the worktree bootstrap: its verbs answer ``unavailable`` (tests use it too)."""
    return None


async def module_bootstrap(runtime: VerbRuntime) -> WorktreeBootstrap | None:
    """The worktree bootstrap of ``bot.verbs.bootstrap`` over the runtime's database, settings and Gitea."""
    from bot.verbs.bootstrap import BootstrapContext

    return _ModuleBootstrap(BootstrapContext.from_service(runtime))


def bootstrap_over(ctx: BootstrapContext) -> BootstrapFactory:
    """The worktree bootstrap of ``bot.verbs.bootstrap`` over an existing context (its Gitea, clock and caches)."""

    async def factory(runtime: VerbRuntime) -> WorktreeBootstrap | None:
        return _ModuleBootstrap(ctx)

    return factory


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
            return BootstrapAnswer(doc=doc, outcome=result)
        refusal = result.refusal or envelope(  # every refusal carries an envelope; this is a guard
            "invalid_state", f"the bootstrap ended {doc.get('status')}",
            "Read the issue's state before trying again.", "call gitea_get_runtime_context",
        )
        return BootstrapAnswer(doc=doc, refusal=refusal, outcome=result)

    async def bootstrap(
        self, *, issue_number: int, caller: str, idempotency_key: str | None, expected_base: str | None
    ) -> BootstrapAnswer:
        from bot.verbs.bootstrap import bootstrap_issue_worktree

        return self._answer(await bootstrap_issue_worktree(
            self._ctx, issue_number=issue_number, caller=caller, idempotency_key=idempotency_key,
            expected_base=expected_base,
        ))

    async def replay(
        self, *, issue_number: int, caller: str, idempotency_key: str, expected_base: str | None
    ) -> BootstrapAnswer | None:
        from bot.verbs.bootstrap.transition import replay_finished

        existing = await self._journal.get(idempotency_key)
        if existing is None or existing.owner != caller:
            return None  # not the caller's own request: the preconditions answer, whether or not the key exists
        result = await replay_finished(self._ctx, issue_number=issue_number, caller=caller,
                                       idempotency_key=idempotency_key, expected_base=expected_base)
        return None if result is None else self._answer(result)

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


# --- the runtime ------------------------------------------------------------------------------------------------------


@dataclass
class VerbRuntime:
    """Runs verbs for callers against the database, Gitea (optional) and the worktree bootstrap (optional).

    ``wakeup`` is called after outbox entries were committed (the service's sender sends them; a
    stand-alone ``foreman mcp`` leaves them for ``foreman serve``). ``bootstrap_factory`` builds the
    worktree bootstrap on first use (``bot.verbs.bootstrap`` by default; ``no_bootstrap`` for none, whose
    verbs then answer ``unavailable``). ``gitea`` is only handed on, typed by the union of the Protocols next to
    each verb family (``AllocatorGitea`` in allocate, ``BranchGitea`` in context, ``BootstrapGitea``).
    """

    db: Database
    settings: Settings
    gitea: VerbsGitea | None = None
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
        return self.settings.repo_key

    async def worktree_bootstrap(self) -> WorktreeBootstrap | None:
        if not self._bootstrap_loaded:
            self._bootstrap = await self.bootstrap_factory(self)
            self._bootstrap_loaded = True
        return self._bootstrap

    async def call(
        self,
        verb_name: str,
        caller: Caller,
        arguments: Mapping[str, object],
        *,
        delivery_id: str | None = None,
        options: CallOptions | None = None,
    ) -> VerbResult:
        """Decide, then (if allowed) carry out ``verb_name`` for ``caller``. Never raises.

        In this order: the verb must be in the verb table and offered (``executable``), else ``invalid_input``;
        its role gate (the first precondition) is decided on the caller's identity alone, so a caller without the
        role is refused ``not_authorized`` before its arguments or any state are looked at; the arguments are
        checked against the verb's published input schema (``invalid_input``, every problem) and handed on as
        checked; the facts are gathered (the issue's lease, its registered worktree) and the verb's whole
        precondition list is evaluated (seed 001); only then is the verb carried out, whose own refusals (a stale
        pin, a lost race) are envelopes too. An unexpected failure is logged with its traceback and answered with
        an ``unavailable`` envelope that carries no internals. The caller's identity is never an argument.
        """
        try:
            return await self._call(verb_name, caller, arguments, delivery_id, options or CallOptions())
        except Exception:
            log.exception("%s by %s failed unexpectedly", verb_name, caller.login)
            return refused(
                verb_name,
                envelope(
                    "unavailable",
                    f"foreman failed while running {verb_name}; the failure is in its log, and the call may "
                    "or may not have taken effect",
                    "Read the current state before trying again; tell an operator if it keeps failing.",
                    "call gitea_get_runtime_context, then retry the call if it is still needed",
                ),
            )

    async def _call(
        self, verb_name: str, caller: Caller, arguments: Mapping[str, object], delivery_id: str | None,
        options: CallOptions,
    ) -> VerbResult:
        verb = VERBS.get(verb_name)
        if verb is None or not verb.executable:
            offered = ", ".join(v.tool for v in VERBS.values() if v.executable)
            return refused(
                verb_name,
                envelope(
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
                envelope(
                    "invalid_input",
                    f"{verb.tool}: " + "; ".join(f"{p['argument']}: {p['problem']}" for p in problems),
                    "Call again with arguments that match the tool's input schema.",
                    f"call {verb.tool} again with corrected arguments",
                    problems=problems,
                ),
            )
        replay = replayers().get(verb.name)
        replayed = await replay(self, verb, caller, values) if replay is not None else None
        if replayed is not None:
            log.info("%s by %s (%s): replayed", verb.name, caller.login, caller.channel)
            return replayed
        context, lease = await self._facts(verb, caller, values)
        decision = evaluate(verb.name, context)
        if not decision.allowed:
            log.info("%s by %s refused: %s %s", verb.name, caller.login, decision.kind, list(decision.failed))
            return _decision_result(verb.name, decision)
        result = await executors()[verb.name](self, verb, caller, values, lease, delivery_id, options)
        log.info("%s by %s (%s): %s", verb.name, caller.login, caller.channel, "ok" if result.ok else "refused")
        return result

    async def _facts(
        self, verb: Verb, caller: Caller, values: Mapping[str, object]
    ) -> tuple[GatewayContext, Lease | None]:
        """The facts the verb's preconditions read, gathered from SQLite and the worktree bootstrap."""
        issue = values.get("issue_number") if verb.issue_scoped else None
        lease: Lease | None = None
        live = False
        worktree = locked = False
        commits = 0
        if isinstance(issue, int):
            lease = await self.leases.live_for_issue(self.repo, issue)
            live = lease is not None and lease.is_live(self.clock())
            if lease is not None and live and PRECONDITION_WORKTREE in verb.preconditions:
                worktree = await self.worktree_registered(issue, lease.owner)
            if lease is not None and live and PRECONDITION_LOCK in verb.preconditions:
                locked = await self.issue_locked(issue, lease.owner)
            if lease is not None and live and PRECONDITION_COMMITS in verb.preconditions:
                from bot.verbs.pulls import commits_ahead

                commits = await commits_ahead(self, issue)
        context = GatewayContext(
            caller=caller.login,
            caller_roles=caller.roles,
            issue_number=issue if isinstance(issue, int) else None,
            lease_owner=lease.owner if lease is not None else None,
            lease_live=live,
            worktree_registered=worktree,
            commits_ahead=commits,
            locked=locked,
        )
        if isinstance(issue, int) and PRECONDITION_PR_EXISTS in verb.preconditions:
            context = await self._pull_facts(context, issue)
        return context, lease

    async def _pull_facts(self, context: GatewayContext, issue: int) -> GatewayContext:
        """The review and merge facts: the issue's PR (its author), the verdict on it, the implementer, the state."""
        from bot.verbs.review import pull_facts

        facts = await pull_facts(self, issue)
        pull = facts.pull
        return replace(context, pr_number=pull.number if pull is not None else None,
                       pr_author=pull.user.login if pull is not None else None, pr_approved=facts.approved,
                       implementer=facts.implementer, issue_state=facts.issue_state)

    async def worktree_registered(self, issue: int, owner: str) -> bool:
        bootstrap = await self.worktree_bootstrap()
        if bootstrap is None:
            return False
        return await bootstrap.worktree_registered(issue_number=issue, owner=owner)

    async def issue_locked(self, issue: int, owner: str) -> bool:
        bootstrap = await self.worktree_bootstrap()
        return bootstrap is not None and await bootstrap.locked(issue_number=issue, owner=owner)

    def next_tools(self, verb: Verb, caller: Caller) -> list[str]:
        """The verb's suggested next tools that exist and whose role gate the caller passes."""
        identity = GatewayContext(caller=caller.login, caller_roles=caller.roles)
        out = []
        for name in verb.next_verbs:
            nxt = VERBS[name]
            if nxt.executable and nxt.preconditions[0].check(identity):
                out.append(nxt.tool)
        return out

    def done(self, verb: Verb, caller: Caller, doc: dict[str, Any]) -> VerbResult:
        return VerbResult(verb=verb.name, doc={"verb": verb.name, **doc, "next": self.next_tools(verb, caller)})

    def woken(self) -> None:
        if self.wakeup is not None:
            self.wakeup()


async def bootstrap_verb(
    rt: VerbRuntime, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    issue = issue_of(values)
    bootstrap = await rt.worktree_bootstrap()
    if bootstrap is None:
        return refused(verb.name, bootstrap_missing(verb, issue))
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
    rt.woken()
    return _answered(rt, verb, caller, answer)


async def bootstrap_replay(
    rt: VerbRuntime, verb: Verb, caller: Caller, values: Mapping[str, object]
) -> VerbResult | None:
    """A bootstrap request that already finished, answered from its journal (before the preconditions: a replay
    changes nothing, so its lease may have ended since); None for a new or unfinished request."""
    key, base = values.get("idempotency_key"), values.get("expected_base")
    bootstrap = await rt.worktree_bootstrap() if isinstance(key, str) else None
    if bootstrap is None or not isinstance(key, str):
        return None
    answer = await bootstrap.replay(issue_number=issue_of(values), caller=caller.login, idempotency_key=key,
                                    expected_base=base if isinstance(base, str) else None)
    return None if answer is None else _answered(rt, verb, caller, answer)


def _answered(rt: VerbRuntime, verb: Verb, caller: Caller, answer: BootstrapAnswer) -> VerbResult:
    if answer.refusal is not None:
        return VerbResult(verb=verb.name, doc={"verb": verb.name, **answer.doc}, refusal=answer.refusal,
                          outcome=answer.outcome)
    return replace(rt.done(verb, caller, answer.doc), outcome=answer.outcome)


async def bootstrap_through_door(ctx: BootstrapContext, caller: Caller, arguments: Mapping[str, object]) -> (
    BootstrapResult
):
    """The bootstrap verb through the door for an in-process caller (start-up recovery, the allocation's own
    bootstrap) over ``ctx``: the transition's typed result, or the door's refusal as a refused one."""
    from bot.verbs.bootstrap import BootstrapResult
    from bot.verbs.bootstrap.refusals import refused_result

    runtime = VerbRuntime(db=ctx.db, settings=ctx.settings, bot_login=ctx.bot_login, clock=ctx.clock,
                          bootstrap_factory=bootstrap_over(ctx))
    result = await runtime.call("bootstrap_issue_worktree", caller, arguments)
    if isinstance(result.outcome, BootstrapResult):
        return result.outcome
    issue, key = arguments.get("issue_number"), arguments.get("idempotency_key")
    refusal = result.refusal or envelope(  # a door answer without a typed result is a refusal; this is a guard
        "unavailable", "the bootstrap gave no result", "Read the issue's state.", "call gitea_get_runtime_context")
    return refused_result(issue if isinstance(issue, int) else 0, refusal, key if isinstance(key, str) else None)


def issue_of(values: Mapping[str, object]) -> int:
    issue = values["issue_number"]
    assert isinstance(issue, int)
    return issue


def bootstrap_missing(verb: Verb, issue: int) -> Envelope:
    return envelope(
        "unavailable",
        f"{verb.tool} is not available: this foreman runs without the worktree bootstrap (bot.verbs.bootstrap)",
        "An operator must run foreman with the worktree bootstrap.",
        f"call gitea_post_issue_state with issue_number={issue}, state blocked and blockers naming the missing "
        "worktree bootstrap",
        missing_component="bot.verbs.bootstrap",
    )


Executor = Callable[
    [VerbRuntime, Verb, Caller, Mapping[str, object], Lease | None, str | None, CallOptions], Awaitable[VerbResult]
]
Replayer = Callable[[VerbRuntime, Verb, Caller, Mapping[str, object]], Awaitable[VerbResult | None]]


def replayers() -> Mapping[str, Replayer]:
    """The verbs that answer a finished request from its record before the preconditions (after the role gate)."""
    from bot.verbs.merge import merge_replay
    from bot.verbs.pulls import open_pull_request_replay, release_after_handover_replay
    from bot.verbs.review import submit_review_replay

    return {"bootstrap_issue_worktree": bootstrap_replay, "submit_review": submit_review_replay,
            "merge_pull_request": merge_replay, "open_pull_request": open_pull_request_replay,
            "release_lease": release_after_handover_replay}


@cache
def executors() -> Mapping[str, Executor]:
    """Each offered verb's executor, by verb family (imported on first use: the families import this door)."""
    from bot.verbs.allocate import allocate
    from bot.verbs.context import runtime_context
    from bot.verbs.duplicates import assess_duplicate
    from bot.verbs.issue_state import get_state, post_state
    from bot.verbs.leases import heartbeat, release
    from bot.verbs.merge import merge_pull_request
    from bot.verbs.publish import publish
    from bot.verbs.pulls import open_pull_request
    from bot.verbs.review import claim_review, submit_review

    table: dict[str, Executor] = {
        "allocate_next_work": allocate,
        "bootstrap_issue_worktree": bootstrap_verb,
        "lock_issue": bootstrap_verb,
        "heartbeat_lease": heartbeat,
        "release_lease": release,
        "get_issue_state": get_state,
        "post_issue_state": post_state,
        "get_runtime_context": runtime_context,
        "claim_review": claim_review,
        "submit_review": submit_review,
        "merge_pull_request": merge_pull_request,
        "publish_worktree": publish,
        "open_pull_request": open_pull_request,
        "assess_work_issue_duplicate": assess_duplicate,
    }
    offered = {name for name, verb in VERBS.items() if verb.executable}
    if offered != set(table):
        raise RuntimeError(f"executable verbs {sorted(offered)} and executors {sorted(table)} differ")
    return table
