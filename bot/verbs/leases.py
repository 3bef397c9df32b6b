"""The lease verbs: heartbeat and release, and the hand-on to auto-allocation after a release."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from bot.core.errors import Envelope
from bot.core.verbs import Verb
from bot.verbs.runtime import Caller, CallOptions, VerbResult, VerbRuntime, envelope, executes, refused, registry
from bot.verbs.stranded import release_stranded, still_in_progress
from state.leases import Lease, LeaseRefused

log = logging.getLogger("foreman.verbs")


@executes("heartbeat_lease")
async def heartbeat(
    rt: VerbRuntime[Any], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    assert lease is not None  # the live_lease precondition held
    ttl = timedelta(seconds=rt.settings.allocator.lease_ttl_s)
    try:
        beat = await rt.leases.heartbeat(lease.lease_id, owner=lease.owner, ttl=ttl, now=rt.clock())
    except LeaseRefused:
        return refused(verb.name, lease_changed(verb, lease))
    return rt.done(verb, caller, {"issue_number": lease.issue_number, "lease": beat.to_dict()})


@executes("release_lease")
async def release(
    rt: VerbRuntime[Any], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    assert lease is not None  # the live_lease precondition held
    reason = str(values["reason"])
    now = rt.clock()
    key = f"{lease.lease_id}:release"
    requeue = await still_in_progress(rt.db, lease)
    try:
        async with rt.db.transaction() as conn:
            # Released without a hand-over: the issue goes back to its queue (an implement lease's to status:ready,
            # unassigned), with evidence saying where the work is (bot/verbs/stranded.py).
            await release_stranded(conn, rt.db, lease, by=caller.login, reason=reason, now=now,
                                   bot_login=rt.bot_login, delivery_id=delivery_id, key=key, requeue=requeue,
                                   channel=caller.channel)
    except LeaseRefused:
        return refused(verb.name, lease_changed(verb, lease))
    released = await rt.leases.get(lease.lease_id)
    # The owner is free now: the next ready issue goes to the next idle author, once.
    auto = await _auto_allocate_after_release(rt, delivery_id)
    return rt.done(
        verb,
        caller,
        {
            "issue_number": lease.issue_number,
            "lease": released.to_dict() if released is not None else None,
            "outbox": [key],
            **({"auto_allocation": auto} if auto is not None else {}),
        },
    )


async def _auto_allocate_after_release(rt: VerbRuntime[Any], delivery_id: str | None) -> dict[str, Any] | None:
    hook = registry().author_freed
    return None if hook is None else await hook(rt, delivery_id)


def lease_changed(verb: Verb, lease: Lease) -> Envelope:
    return envelope(
        "conflict",
        f"the lease on #{lease.issue_number} changed while {verb.tool} ran (released, expired or taken over)",
        "Read the issue's lease again before acting on it.",
        f"call gitea_get_issue_state with issue_number={lease.issue_number}",
    )
