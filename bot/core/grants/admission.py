"""The broker's admission state machine (pure): admit, complete, abort and reconcile over a run's state."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final, Literal, get_args

from bot.core.digest import CanonicalError, canonical_json
from bot.core.grants.contracts import CONTRACT_DIGEST, TOOL_CONTRACTS
from bot.core.grants.grant import Grant, GrantCall, format_time, parse_time

#: The only categories a broker refusal ever exposes (docs/grants.md, "The broker's decisions").
Category = Literal["grant_denied", "grant_expired", "host_mismatch", "inflight_unresolved", "broker_error"]
CATEGORIES: Final[tuple[Category, ...]] = get_args(Category)

#: Why a decision went the way it did: a closed set, recorded with every decision and safe to show.
Reason = Literal[
    "admitted",
    "accepted",
    "aborted",
    "reconciled",
    "run_mismatch",
    "grant_digest_mismatch",
    "policy_changed",
    "contract_changed",
    "run_closed",
    "host_mismatch",
    "host_changed",
    "inflight",
    "wrong_worktree",
    "unknown_tool",
    "invalid_arguments",
    "expired",
    "late_result",
    "changed_arguments",
    "repeated",
    "skipped",
    "out_of_order",
    "after_failure",
    "after_abort",
    "teardown_done",
    "plan_unfinished",
    "unknown_call",
    "broker_error",
]
REASONS: Final[tuple[Reason, ...]] = get_args(Reason)

RunOutcome = Literal["completed", "failed", "aborted", "expired"]
TeardownStatus = Literal["pending", "admitted", "done", "failed", "unresolved"]


@dataclass(frozen=True, slots=True)
class InFlight:
    """A call admitted and not settled yet. ``host_changed``: its completion arrived on another host identity,
    so its result was refused and it stays unresolved until independently reconciled."""

    call_id: str
    position: int
    admitted_at: datetime
    host_id: str
    host_changed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "position": self.position,
            "admitted_at": format_time(self.admitted_at),
            "host_id": self.host_id,
            "host_changed": self.host_changed,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> InFlight:
        return cls(
            call_id=doc["call_id"],
            position=doc["position"],
            admitted_at=parse_time(doc["admitted_at"]),
            host_id=doc["host_id"],
            host_changed=bool(doc.get("host_changed", False)),
        )


@dataclass(frozen=True, slots=True)
class RunState:
    """Where a run's plan stands. ``version`` is the stored row's version (conditional writes compare it)."""

    run_id: str
    next_position: int = 0
    inflight: InFlight | None = None
    outcome: RunOutcome | None = None
    teardown: TeardownStatus = "pending"
    version: int = 0

    @property
    def closed(self) -> bool:
        """The teardown ran (or is known never to run here again): nothing is admitted any more."""
        return self.teardown in ("done", "failed", "unresolved")

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "next_position": self.next_position,
            "inflight": self.inflight.to_dict() if self.inflight else None,
            "outcome": self.outcome,
            "teardown": self.teardown,
            "closed": self.closed,
            "version": self.version,
        }


@dataclass(frozen=True, slots=True)
class ProposedCall:
    """A call as proposed (by the model), snapshotted: canonical argument text, or None when it has none.

    ``worktree_uuid`` is the UUID the edge resolved, just now, for the run's worktree (None: none registered).
    """

    tool: str
    arguments_json: str | None
    worktree_uuid: str | None

    @classmethod
    def of(cls, tool: object, arguments: object, *, worktree_uuid: str | None) -> ProposedCall:
        try:
            text = canonical_json(arguments if arguments is not None else {})
        except CanonicalError:
            text = None
        return cls(tool=tool if isinstance(tool, str) else repr(tool), arguments_json=text, worktree_uuid=worktree_uuid)


@dataclass(frozen=True, slots=True)
class Pins:
    """What the edge knows independently of the stored grant: the run its token names, the grant digest
    recorded for that run, the policy digest of the template in force (None: not checked) and this code's
    contract digest."""

    run_id: str
    grant_digest: str
    policy_digest: str | None
    contract_digest: str = CONTRACT_DIGEST


VerdictKind = Literal["admit", "complete", "abort", "reconcile"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One broker decision. ``state`` is the run state after it (the same object when nothing changed).

    ``call``: the grant entry concerned (admitted, completed, or matched); ``expected``: the entry that would be
    admitted next (for the refusal's next action). ``settles``: the in-flight call was settled by this decision.
    ``unresolved_uuid``: a worktree this host must not clean up (teardown refused on a foreign host).
    """

    kind: VerdictKind
    ok: bool
    reason: Reason
    state: RunState
    category: Category | None = None
    call: GrantCall | None = None
    expected: GrantCall | None = None
    call_id: str | None = None
    inert: bool = False
    settles: bool = False
    unresolved_uuid: str | None = None

    def __post_init__(self) -> None:
        if self.ok != (self.category is None):
            raise ValueError("a verdict has a category exactly when it refuses")
        if self.reason not in REASONS:
            raise ValueError(f"unknown reason {self.reason!r}")


def _deny(
    kind: VerdictKind,
    state: RunState,
    category: Category,
    reason: Reason,
    *,
    call: GrantCall | None = None,
    expected: GrantCall | None = None,
    call_id: str | None = None,
    unresolved_uuid: str | None = None,
) -> Verdict:
    return Verdict(
        kind=kind,
        ok=False,
        reason=reason,
        state=state,
        category=category,
        call=call,
        expected=expected,
        call_id=call_id,
        unresolved_uuid=unresolved_uuid,
    )


def _settles(kind: VerdictKind, state: RunState, reason: Reason, call: GrantCall, call_id: str, *,
             category: Category | None = None, inert: bool = False, unresolved_uuid: str | None = None) -> Verdict:
    """A decision that settles the in-flight call ``call_id`` (``call``): accepted, or refused with ``category``."""
    return Verdict(
        kind=kind,
        ok=category is None,
        reason=reason,
        state=state,
        category=category,
        call=call,
        call_id=call_id,
        inert=inert,
        settles=True,
        unresolved_uuid=unresolved_uuid,
    )


def expected_call(grant: Grant, state: RunState, now: datetime) -> GrantCall | None:
    """The one entry admissible next (ignoring in-flight and host): the next plan step while the run goes on;
    the reserved teardown once the plan is done, failed, aborted or expired; nothing once the teardown ran."""
    if state.teardown != "pending":
        return None
    if closing_outcome(grant, state, now) is not None:
        return grant.teardown
    return grant.calls[state.next_position]


def closing_outcome(grant: Grant, state: RunState, now: datetime) -> RunOutcome | None:
    """The recorded outcome, or ``expired`` when the grant ran out before the plan finished."""
    if state.outcome is not None:
        return state.outcome
    return "expired" if now >= grant.expires_at else None


def teardown_due(grant: Grant, state: RunState, now: datetime) -> bool:
    """The trusted side runs the reserved teardown by itself now: it never ran, nothing is in flight (an in-flight
    call blocks it until it settles or is reconciled), and the run was aborted, failed or its grant expired (a
    plan that reached its teardown runs it itself until the grant expires)."""
    if state.teardown != "pending" or state.inflight is not None:
        return False
    return state.outcome in ("aborted", "failed") or now >= grant.expires_at


def _pin_problem(grant: Grant, state: RunState, pins: Pins | None) -> Reason | None:
    if state.run_id != grant.run_id:
        return "run_mismatch"
    if pins is None:
        return None
    if pins.run_id != grant.run_id:
        return "run_mismatch"
    if pins.grant_digest != grant.digest:
        return "grant_digest_mismatch"
    if pins.policy_digest is not None and pins.policy_digest != grant.policy_digest:
        return "policy_changed"
    if pins.contract_digest != grant.contract_digest:
        return "contract_changed"
    return None


def admit(
    grant: Grant,
    state: RunState,
    call: ProposedCall,
    *,
    now: datetime,
    host_id: str,
    call_id: str,
    pins: Pins | None = None,
) -> Verdict:
    """Admit ``call`` only if it is exactly the grant's next entry; every check runs before the tool would.

    Checks, in order (the first failing one decides): pins (run id, grant/policy/contract digests); run closed;
    host identity; an unresolved in-flight call; the bound worktree UUID; tool and closed-schema arguments;
    expiry (not for the teardown); then the sequence: a call equal to the expected entry is admitted, anything
    else is refused as changed, repeated, skipped or out of order (or after a failure or abort).
    An admission moves the run to "in flight" for ``call_id``; a refusal leaves the state untouched.
    """
    expected = expected_call(grant, state, now)
    pin = _pin_problem(grant, state, pins)
    if pin is not None:
        return _deny("admit", state, "grant_denied", pin)
    if state.closed:
        return _deny("admit", state, "grant_denied", "run_closed")
    matches = _matches(grant, call)
    is_teardown = expected is not None and expected.effect == "teardown" and expected in matches
    if host_id != grant.host_id:
        unresolved = grant.worktree.uuid if (is_teardown or grant.teardown in matches) else None
        return _deny("admit", state, "host_mismatch", "host_mismatch", expected=expected, unresolved_uuid=unresolved)
    if state.inflight is not None:
        return _deny("admit", state, "inflight_unresolved", "inflight", expected=expected)
    if call.worktree_uuid != grant.worktree.uuid:
        unresolved = grant.worktree.uuid if grant.teardown in matches else None
        return _deny("admit", state, "grant_denied", "wrong_worktree", expected=expected, unresolved_uuid=unresolved)
    contract = TOOL_CONTRACTS.get(call.tool)
    if contract is None or all(c.tool != call.tool for c in grant.calls):
        return _deny("admit", state, "grant_denied", "unknown_tool", expected=expected)
    if call.arguments_json is None or contract.check(json.loads(call.arguments_json)):
        return _deny("admit", state, "grant_denied", "invalid_arguments", expected=expected)
    if expected is None:
        return _deny("admit", state, "grant_denied", "teardown_done")
    outcome = closing_outcome(grant, state, now)
    if outcome == "expired" and not is_teardown:
        return _deny("admit", state, "grant_expired", "expired", expected=expected)
    if expected in matches:
        admitted_state = replace(
            state,
            inflight=InFlight(call_id=call_id, position=expected.position, admitted_at=now, host_id=host_id),
            teardown="admitted" if expected.effect == "teardown" else state.teardown,
            outcome=outcome if expected.effect == "teardown" else state.outcome,
        )
        return Verdict(
            kind="admit",
            ok=True,
            reason="admitted",
            state=admitted_state,
            call=expected,
            expected=expected,
            call_id=call_id,
            inert=expected.effect == "plan_only",
        )
    return _deny(
        "admit",
        state,
        "grant_denied",
        _sequence_reason(grant, state, call, matches, expected, outcome),
        expected=expected,
        call=matches[0] if matches else None,
    )


def _matches(grant: Grant, call: ProposedCall) -> list[GrantCall]:
    return [c for c in grant.calls if c.tool == call.tool and c.arguments_json == call.arguments_json]


def _sequence_reason(
    grant: Grant,
    state: RunState,
    call: ProposedCall,
    matches: list[GrantCall],
    expected: GrantCall,
    outcome: RunOutcome | None,
) -> Reason:
    if outcome == "failed":
        return "after_failure"
    if outcome == "aborted":
        return "after_abort"
    if outcome == "completed" and matches and matches[0].position < grant.teardown_position:
        return "repeated"
    if matches:
        # Ahead of the plan: skipping (the teardown too, while the plan is unfinished); behind it: repeating.
        if any(m.position < state.next_position for m in matches):
            return "repeated"
        return "skipped"
    if call.tool == expected.tool:
        return "changed_arguments"
    return "out_of_order"


def complete(grant: Grant, state: RunState, *, call_id: str, ok: bool, now: datetime, host_id: str) -> Verdict:
    """Settle the in-flight call ``call_id`` with its result (``ok``: the tool succeeded).

    Host identity and expiry are checked again: a result arriving on another host is refused and the call stays
    unresolved (``host_changed``); a result after expiry (or after an abort) settles the call but is refused and
    does not advance the plan. An accepted success advances one step (reaching the teardown completes the plan);
    an accepted failure records ``failed`` (only the teardown remains; the step is never retried). The teardown's
    own result closes the run either way: it ran once.
    """
    inflight = state.inflight
    if inflight is None or inflight.call_id != call_id:
        return _deny("complete", state, "grant_denied", "unknown_call", call_id=call_id)
    entry = grant.calls[inflight.position]
    if inflight.host_changed:
        return _deny("complete", state, "inflight_unresolved", "host_changed", call=entry, call_id=call_id)
    is_teardown = entry.effect == "teardown"
    if host_id != grant.host_id or host_id != inflight.host_id:
        kept = replace(state, inflight=replace(inflight, host_changed=True))
        return _deny(
            "complete",
            kept,
            "host_mismatch",
            "host_changed",
            call=entry,
            call_id=call_id,
            unresolved_uuid=grant.worktree.uuid,
        )
    settled = replace(state, inflight=None)
    if not is_teardown and now >= grant.expires_at:
        late = replace(settled, outcome=state.outcome or "expired")
        return _settles("complete", late, "late_result", entry, call_id, category="grant_expired")
    if not is_teardown and state.outcome is not None:
        return _settles("complete", settled, "after_abort", entry, call_id, category="grant_denied")
    if is_teardown:
        after = replace(settled, teardown="done" if ok else "failed")
        return _settles("complete", after, "accepted", entry, call_id,
                        unresolved_uuid=None if ok else grant.worktree.uuid)
    if ok:
        position = state.next_position + 1
        outcome: RunOutcome | None = "completed" if position == grant.teardown_position else None
        after = replace(settled, next_position=position, outcome=outcome)
    else:
        after = replace(settled, outcome="failed")
    return _settles("complete", after, "accepted", entry, call_id, inert=entry.effect == "plan_only")


def abort(grant: Grant, state: RunState, *, now: datetime) -> Verdict:
    """Abort (or cancel) the run: record ``aborted`` unless an outcome is already recorded, and keep any
    in-flight call. The teardown is then admissible once nothing is in flight (``inflight_unresolved`` until
    the call settles or is reconciled)."""
    if state.closed:
        return _deny("abort", state, "grant_denied", "run_closed")
    after = replace(state, outcome=state.outcome or closing_outcome(grant, state, now) or "aborted")
    if state.inflight is not None:
        return Verdict(
            kind="abort",
            ok=True,
            reason="aborted",
            state=after,
            call=grant.calls[state.inflight.position],
            call_id=state.inflight.call_id,
            expected=grant.teardown,
        )
    return Verdict(kind="abort", ok=True, reason="aborted", state=after, expected=grant.teardown)


def reconcile(grant: Grant, state: RunState, *, call_id: str, now: datetime) -> Verdict:
    """Independent reconciliation by an operator of an in-flight call whose result will never arrive here.

    Allowed only once the run is no longer going on (aborted, failed, expired) or the call's completion was seen
    on another host. The call is settled without a result: it never advances the plan. A reconciled teardown
    leaves the worktree ``unresolved`` (it is reported, and never torn down again by the broker).
    """
    inflight = state.inflight
    if inflight is None or inflight.call_id != call_id:
        return _deny("reconcile", state, "grant_denied", "unknown_call", call_id=call_id)
    if closing_outcome(grant, state, now) is None and not inflight.host_changed:
        return _deny("reconcile", state, "grant_denied", "plan_unfinished", call_id=call_id)
    entry = grant.calls[inflight.position]
    if entry.effect == "teardown":
        after = replace(state, inflight=None, teardown="unresolved")
        return _settles("reconcile", after, "reconciled", entry, call_id, unresolved_uuid=grant.worktree.uuid)
    after = replace(state, inflight=None, outcome=closing_outcome(grant, state, now) or "aborted")
    return _settles("reconcile", after, "reconciled", entry, call_id)
