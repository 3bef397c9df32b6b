"""What the broker hands back: bounded refusals, inert plan results and the run's end summary."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from bot.core.digest import canonicalize
from bot.core.errors import Envelope
from bot.core.grants.admission import CATEGORIES, Category, Reason, RunState, Verdict
from bot.core.grants.grant import Grant, GrantCall

_MESSAGES: Final[Mapping[Category, str]] = MappingProxyType(
    {
        "grant_denied": "the run's sealed grant does not admit this call now",
        "grant_expired": "the run's grant has expired",
        "host_mismatch": "this host is not the host the run's grant is bound to",
        "inflight_unresolved": "an earlier call of this run has not settled yet",
        "broker_error": "the run broker could not decide; nothing was run and the run's outcome is unchanged",
    }
)


def refusal(verdict: Verdict, run_id: str) -> dict[str, Any]:
    """The error envelope of a refused verdict: the bounded category, a fixed message and a next action.

    Nothing from the proposed call or its result is echoed back. ``details`` carries the run id and the
    reason (both from closed sets or the grant), plus the unresolved worktree UUID when teardown was refused.
    """
    category = verdict.category
    if category is None:
        raise ValueError("an accepted verdict has no refusal")
    return broker_refusal(
        category, run_id, reason=verdict.reason, expected=verdict.expected, unresolved_uuid=verdict.unresolved_uuid
    )


def broker_refusal(
    category: Category,
    run_id: str,
    *,
    reason: Reason = "broker_error",
    expected: GrantCall | None = None,
    unresolved_uuid: str | None = None,
) -> dict[str, Any]:
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}")
    if category == "grant_denied" and expected is not None:
        remediate = "make exactly the next call of the grant; the grant cannot be changed, extended or replayed"
        next_action = f"call {expected.tool} with exactly {expected.arguments_json}"
    elif category == "inflight_unresolved":
        remediate = "wait for the earlier call to finish; an operator reconciles a call that never finishes"
        next_action = "wait for the pending call's result, then make the next call of the grant"
    elif category == "broker_error":
        remediate = "retry the same call later; an operator can inspect the run with `foreman grants`"
        next_action = "retry the same call once; if it is refused again, stop and report the run id"
    else:
        remediate = "this run cannot go on; an operator inspects it with `foreman grants`"
        next_action = "stop and report the run id to the operator"
    details: dict[str, Any] = {"run_id": run_id}
    if category != "broker_error":
        details["reason"] = reason
    if unresolved_uuid is not None:
        details["unresolved_worktree_uuid"] = unresolved_uuid
    envelope = Envelope(
        error=category, message=_MESSAGES[category], remediate=remediate, exact_next_action=next_action, details=details
    )
    return envelope.to_dict()


def mark_inert(result: Mapping[str, Any], *, run_id: str, position: int) -> dict[str, Any]:
    """A plan-only result as handed back: the result under ``plan``, flagged inert (never executed by anyone)."""
    return {
        "inert": True,
        "run_id": run_id,
        "position": position,
        "plan": canonicalize(result),
        "note": "plan-only result: recorded by the broker and never executed; commands in it are text",
    }


def summarize(grant: Grant, state: RunState) -> dict[str, Any]:
    """The run's grant and where it ended, for an evidence comment."""
    return {
        "run_id": grant.run_id,
        "policy": grant.policy_key,
        "grant_digest": grant.digest,
        "policy_digest": grant.policy_digest,
        "contract_digest": grant.contract_digest,
        "worktree_uuid": grant.worktree.uuid,
        "steps_done": min(state.next_position, grant.teardown_position),
        "steps": grant.teardown_position,
        "outcome": state.outcome,
        "teardown": state.teardown,
    }


def run_end_summary(grant: Grant, state: RunState, *, denied: int = 0) -> str:
    """One human paragraph for the evidence comment posted when a run closes (its teardown ran, failed or was
    reconciled). Built from the grant and the recorded state only; nothing a model or a tool returned."""
    done = min(state.next_position, grant.teardown_position)
    outcome = state.outcome or "ended"
    text = (
        f"Run {grant.run_id} ({grant.policy_key}) of {grant.owner} on #{grant.issue_number} ended {outcome}: "
        f"{done} of {grant.teardown_position} granted calls were accepted"
    )
    if denied:
        text += f", {denied} proposed call{'s were' if denied != 1 else ' was'} denied by the run broker"
    if state.teardown == "done":
        text += f", and the reserved teardown ({grant.teardown.tool}) ran once on worktree {grant.worktree.uuid}."
    else:
        text += (
            f"; the reserved teardown ({grant.teardown.tool}) is {state.teardown}, so worktree "
            f"{grant.worktree.uuid} is reported unresolved for an operator."
        )
    return text + " The sealed grant and every decision are listed by `foreman grants " + grant.run_id + "`."
