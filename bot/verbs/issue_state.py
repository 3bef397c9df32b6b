"""The issue-state verbs: read the issue's Canonical Issue State, and post a new one through the outbox."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from bot.core.canonical import CanonicalState
from bot.core.evidence import render_evidence
from bot.core.verbs import Verb
from bot.verbs.runtime import Caller, CallOptions, VerbResult, VerbRuntime, envelope, executes, issue_of, refused
from state.leases import Lease
from state.outbox import OutboxIntent, enqueue


@executes("get_issue_state")
async def get_state(
    rt: VerbRuntime[Any], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    return rt.done(verb, caller, await state_document(rt, issue_of(values), lease))


async def state_document(rt: VerbRuntime[Any], issue: int, lease: Lease | None) -> dict[str, Any]:
    """What foreman holds for the issue: its Canonical Issue State, its lease, labels and blockers (the answer of
    ``gitea_get_issue_state``, and the ``canonical_state`` of ``gitea_read_issue``)."""
    snapshot = await rt.issues.snapshot(rt.repo, issue)
    doc: dict[str, Any] = {
        "issue_number": issue,
        "state": snapshot.state.to_dict() if snapshot is not None and snapshot.state is not None else None,
        "lease": lease.to_dict() if lease is not None else None,
        "lease_live": lease is not None and lease.is_live(rt.clock()),
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
    return doc


@executes("post_issue_state")
async def post_state(
    rt: VerbRuntime[Any], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    issue = issue_of(values)
    raw = values["state"]
    assert isinstance(raw, dict)
    try:
        state = CanonicalState.from_dict({"extra": {}, **raw, "last_updated_by": caller.login})
    except (ValueError, TypeError) as exc:
        return refused(
            verb.name,
            envelope(
                "invalid_input",
                f"state is not a valid Canonical Issue State: {exc}",
                "Send every field in snake_case, as gitea_get_issue_state returns them.",
                f"call gitea_get_issue_state for #{issue}, edit its state and call {verb.tool} with it",
            ),
        )
    snapshot = await rt.issues.snapshot(rt.repo, issue)
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
    async with rt.db.transaction() as conn:
        queued = await enqueue(conn, OutboxIntent(key, issue, "comment", {"body": body}, delivery_id, repo=rt.repo))
    return rt.done(
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
