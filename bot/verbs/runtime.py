"""The one door to every verb: who calls, the facts the pure gateway decides on, and the verb carried out."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Hashable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Generic, Literal, Protocol

from typing_extensions import TypeVar

from bot.config import Settings
from bot.core.allocator import Candidate
from bot.core.errors import Envelope, ErrorKind
from bot.core.gateway import Decision, GatewayContext, Precondition, Role, evaluate_preconditions
from bot.core.reasons import RefusalReason
from bot.core.verbs import PRECONDITION_LOCK, PRECONDITION_WORKTREE, VERBS, Verb, evaluate, identity_gate
from bot.shared_reads import SharedReads
from state.db import Database, utcnow
from state.issues import IssueStore
from state.leases import Lease, LeaseStore

log = logging.getLogger("foreman.verbs")

#: The Gitea client a door hands on. The door itself calls none of it: each verb family declares the narrow client it
#: needs (``AllocatorGitea``, ``ReviewGitea``, ...) and types its executors ``VerbRuntime[ThatGitea]``.
G = TypeVar("G", covariant=True, default=Any)

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
    #: By issue, the issue's latest lease (its id, None for none) when its candidate was read: an apply whose issue's
    #: lease history moved since (a verdict recorded, a lease granted or ended) is refused ``conflict``.
    lease_history: Mapping[int, str | None] | None = None


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
    error: ErrorKind, message: str, remediate: str, next_action: str, *, reason: RefusalReason | None = None,
    **details: Any,
) -> Envelope:
    return Envelope(error=error, message=message, remediate=remediate, exact_next_action=next_action, details=details,
                    reason=reason)


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
    """The part of the worktree bootstrap the verbs need (``bot.verbs.worktree`` provides it)."""

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


BootstrapFactory = Callable[["VerbRuntime[Any]"], Awaitable[WorktreeBootstrap | None]]


async def no_bootstrap(runtime: VerbRuntime[Any]) -> WorktreeBootstrap | None:
    """A runtime without the worktree bootstrap: its verbs answer ``unavailable`` (tests use it too)."""
    return None


async def registered_bootstrap(runtime: VerbRuntime[Any]) -> WorktreeBootstrap | None:
    """The worktree bootstrap the verb families registered (``bot.verbs.worktree``), or none when it is not loaded."""
    factory = _REGISTRY.bootstrap
    return None if factory is None else await factory(runtime)


# --- the runtime ------------------------------------------------------------------------------------------------------


@dataclass
class VerbRuntime(Generic[G]):
    """Runs verbs for callers against the database, Gitea (optional) and the worktree bootstrap (optional).

    The outbox entries a verb stores wake the service's sender when they commit (``Database.on_commit``; a
    stand-alone ``foreman mcp`` leaves them for ``foreman serve``'s). ``bootstrap_factory`` builds the
    worktree bootstrap on first use (``bot.verbs.bootstrap`` by default; ``no_bootstrap`` for none, whose
    verbs then answer ``unavailable``). ``gitea`` is only handed on: each verb family types the runtime it takes
    with the narrow client it declares (``VerbRuntime[AllocatorGitea]``, ``VerbRuntime[ReviewGitea]``, ...).

    The door imports no verb: the families register their executors here (``executes``, ``replays``,
    ``reads_facts``, ``provides_bootstrap``) and the composition root loads them (``bot.catalog``).
    """

    db: Database
    settings: Settings
    gitea: G | None = None
    bot_login: str = ""
    bootstrap_factory: BootstrapFactory = registered_bootstrap
    clock: Callable[[], datetime] = utcnow
    _bootstrap: WorktreeBootstrap | None = field(default=None, init=False, repr=False)
    _bootstrap_loaded: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.leases = LeaseStore(self.db)
        self.issues = IssueStore(self.db)
        #: Reads every caller of this repository shares for a stated bound (``bot.shared_reads``).
        self.shared_reads = SharedReads()

    @property
    def repo(self) -> str:
        return self.settings.repo_key

    def learned_login(self, login: str) -> None:
        """The bot's login as Gitea told it (the service's probe): the door and the worktree bootstrap it builds
        from now on act as it (a bootstrap built before, with the configured login, is built again)."""
        self.bot_login = login
        self._bootstrap, self._bootstrap_loaded = None, False

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
        scope = _CALL_FACTS.set({})
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
        finally:
            _CALL_FACTS.reset(scope)

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
        gate = evaluate_preconditions(identity_gate(verb), identity)
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
        replay = _REGISTRY.replayers.get(verb.name)
        replayed = await replay(self, verb, caller, values) if replay is not None else None
        if replayed is not None:
            log.info("%s by %s (%s): replayed", verb.name, caller.login, caller.channel)
            return replayed
        context, lease = await self._facts(verb, caller, values)
        decision = evaluate(verb.name, context)
        if not decision.allowed:
            log.info("%s by %s refused: %s %s", verb.name, caller.login, decision.kind, list(decision.failed))
            ended = await self._ended_lease(verb, caller, context, decision)
            return ended if ended is not None else _decision_result(verb.name, decision)
        execute = _REGISTRY.executors.get(verb.name)
        if execute is None:  # the composition root did not load the verb families (bot.catalog)
            raise RuntimeError(f"no executor is registered for {verb.name}: import bot.catalog")
        result = await execute(self, verb, caller, values, lease, delivery_id, options)
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
        if isinstance(issue, int):
            lease = await self.leases.live_for_issue(self.repo, issue)
            live = lease is not None and lease.is_live(self.clock())
            if lease is not None and live and PRECONDITION_WORKTREE in verb.preconditions:
                worktree = await self.worktree_registered(issue, lease.owner)
            if lease is not None and live and PRECONDITION_LOCK in verb.preconditions:
                locked = await self.issue_locked(issue, lease.owner)
        context = GatewayContext(
            caller=caller.login,
            caller_roles=caller.roles,
            issue_number=issue if isinstance(issue, int) else None,
            lease_owner=lease.owner if lease is not None else None,
            lease_live=live,
            worktree_registered=worktree,
            locked=locked,
        )
        if isinstance(issue, int):
            for precondition, read in _REGISTRY.fact_readers.items():  # the families' own facts (commits, the PR)
                if precondition in verb.preconditions:
                    context = await read(self, context, lease if live else None, issue)
        return context, lease

    async def _ended_lease(self, verb: Verb, caller: Caller, context: GatewayContext, decision: Decision) -> (
        VerbResult | None
    ):
        """A call refused for want of the caller's live lease, by the caller whose own lease on the issue ended
        (expired, or released by someone else): said so, with when and what became of the issue (``lease_expired``
        or ``lease_released``), never only "not leased to you". None for any other refusal."""
        issue = context.issue_number
        if issue is None or not set(decision.failed) & _LEASE_GATES:
            return None
        history = await self.leases.history(self.repo, issue)
        mine = [lease for lease in history if lease.owner == caller.login]
        now = self.clock()
        if not mine or mine[-1].is_live(now) or (mine[-1].status == "released" and mine[-1].end_reason in _HANDED_ON):
            return None
        last = mine[-1]
        expired = last.status != "released"
        current = next((lease for lease in reversed(history) if lease.is_live(now)), None)
        snapshot = await self.issues.snapshot(self.repo, issue)
        labels = sorted(label.name for label in snapshot.labels or ()) if snapshot is not None else []
        ended_at = last.ended_at or last.expires_at
        now_held = (f"it is leased to {current.owner} for {current.action} now" if current is not None else
                    "nobody holds it now")
        what = (f"expired at {last.expires_at.isoformat()}" if expired else
                f"was released at {ended_at.isoformat()} ({last.end_reason})")
        return refused(verb.name, envelope(
            "not_authorized",
            f"your {last.action} lease on #{issue} {what}; {now_held} (labels: {', '.join(labels) or 'none'})",
            ("Your work is kept: your worktree stays until the issue's teardown, and if the issue comes back to you "
             "its bootstrap resumes it" if last.action == "implement" else
             f"The {last.action} went back to its queue for the next idle {last.role}")
            + " (docs/operating.md, \"Stranded work and the queues\").",
            "call gitea_get_runtime_context to find the work leased to you now",
            reason="lease_expired" if expired else "lease_released",
            lease_id=last.lease_id, expires_at=last.expires_at.isoformat(), ended_at=ended_at.isoformat(),
            end_reason=last.end_reason or "expired", issue_labels=labels,
            current_lease=({"owner": current.owner, "action": current.action,
                            "expires_at": current.expires_at.isoformat()} if current is not None else None)))

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



Executor = Callable[
    [VerbRuntime[Any], Verb, Caller, Mapping[str, object], Lease | None, str | None, CallOptions],
    Awaitable[VerbResult],
]
Replayer = Callable[[VerbRuntime[Any], Verb, Caller, Mapping[str, object]], Awaitable[VerbResult | None]]
#: Reads a precondition's facts into the gateway's context: the runtime, the context so far, the issue's live lease
#: (None when there is none) and the issue number.
FactReader = Callable[[VerbRuntime[Any], GatewayContext, Lease | None, int], Awaitable[GatewayContext]]
#: Runs when a release freed an author (auto-allocation registers one): the runtime and the delivery id; its report
#: (None: nothing ran) goes into the release's answer.
AuthorFreed = Callable[[VerbRuntime[Any], str | None], Awaitable[dict[str, Any] | None]]
#: Queues one auto-allocation for the service's worker when a verb freed an author off its caller's path (the queued
#: triggers register one): the runtime, the trigger and its key; the queued delivery's id (None: nothing queued).
QueueAllocation = Callable[[VerbRuntime[Any], str, str], Awaitable[str | None]]
_E = TypeVar("_E", bound=Callable[..., Awaitable[object]])
#: The gates a caller fails when it holds no live lease on the issue (``_ended_lease`` then says why).
_LEASE_GATES = frozenset({"owns_lease", "owns_lease_or_controller", "live_lease"})
#: Lease ends that hand the issue on by the life's own steps (the PR's opening, a verdict, the teardown): a later
#: call of the old owner is refused as before, with no stranded-work explanation.
_HANDED_ON = frozenset({"pull_request_opened", "pull_request_updated", "reviewed", "merged", "pr_closed",
                        "issue_closed"})


@dataclass
class VerbRegistry:
    """What the verb families registered with the door: an executor per offered verb, the verbs that answer a
    finished request from its record first, the readers of their own preconditions' facts, the worktree
    bootstrap, what runs when a release frees an author and what queues an allocation when a hand-over does.
    Filled when the families and the loops are imported (``bot.catalog`` imports every one)."""

    executors: dict[str, Executor] = field(default_factory=dict)
    replayers: dict[str, Replayer] = field(default_factory=dict)
    fact_readers: dict[Precondition[GatewayContext], FactReader] = field(default_factory=dict)
    bootstrap: BootstrapFactory | None = None
    author_freed: AuthorFreed | None = None
    queue_allocation: QueueAllocation | None = None

    def missing(self) -> list[str]:
        """The offered verbs without an executor (an executor of a verb the table no longer offers is never run:
        the door refuses that verb first)."""
        return sorted(name for name, verb in VERBS.items() if verb.executable and name not in self.executors)


_REGISTRY = VerbRegistry()


def registry() -> VerbRegistry:
    return _REGISTRY


def _register(table: dict[Any, Any], kind: str, names: tuple[object, ...]) -> Callable[[_E], _E]:
    def register(function: _E) -> _E:
        for name in names:
            if name in table and table[name] is not function:
                raise RuntimeError(f"two {kind} registered for {name}")
            table[name] = function
        return function

    return register


#: What one verb call read once (``call_scoped``), for the length of the call (``VerbRuntime.call``).
_CALL_FACTS: ContextVar[dict[Hashable, Any] | None] = ContextVar("foreman_call_facts", default=None)
_T = TypeVar("_T")


async def call_scoped(key: Hashable, read: Callable[[], Awaitable[_T]]) -> _T:
    """``read()`` once per verb call: the precondition that checked a fact and the verb that acts on it see the same
    observation, taken once (a read of Gitea moments apart twice otherwise). Outside a call (a loop, the CLI's own
    reads), every call reads. Only for facts read before the call writes anything: a value is never read again."""
    scope = _CALL_FACTS.get()
    if scope is None:
        return await read()
    if key not in scope:
        scope[key] = await read()
    value: _T = scope[key]
    return value


def executes(*verb_names: str) -> Callable[[_E], _E]:
    """Registers the decorated function as the executor of ``verb_names`` (each a name in ``VERBS``)."""
    unknown = [name for name in verb_names if name not in VERBS]
    if unknown:
        raise RuntimeError(f"not verbs of the table: {unknown}")
    return _register(_REGISTRY.executors, "executors", verb_names)


def replays(*verb_names: str) -> Callable[[_E], _E]:
    """Registers the decorated function as the replayer of ``verb_names``: run after the role gate and before the
    preconditions, it answers a finished request from its record (None: a new request, decided as usual)."""
    return _register(_REGISTRY.replayers, "replayers", verb_names)


def reads_facts(precondition: Precondition[GatewayContext]) -> Callable[[_E], _E]:
    """Registers the decorated function as the reader of ``precondition``'s facts for the gateway."""
    return _register(_REGISTRY.fact_readers, "fact readers", (precondition,))


def provides_bootstrap(factory: BootstrapFactory) -> BootstrapFactory:
    """Registers the worktree bootstrap every door uses unless it is given another (``bootstrap_factory``)."""
    _REGISTRY.bootstrap = factory
    return factory


def when_author_freed(hook: AuthorFreed) -> AuthorFreed:
    """Registers what runs after a release freed an author (auto-allocation's next allocation)."""
    _REGISTRY.author_freed = hook
    return hook


def queues_allocation(hook: QueueAllocation) -> QueueAllocation:
    """Registers what queues one auto-allocation when a verb freed an author off its caller's path (the queued
    triggers': the PR-open hand-over's caller never waits for another author's allocation)."""
    _REGISTRY.queue_allocation = hook
    return hook


def issue_of(values: Mapping[str, object]) -> int:
    issue = values["issue_number"]
    assert isinstance(issue, int)
    return issue
