"""Auto-allocation: when an issue gains `status:ready` (or a verb queued a run), stranded work comes back, the ready
issues go to the next idle authors and the review and merge queues hand out what waits."""

from __future__ import annotations

from typing import Any

from gidgethub import sansio

from bot.core.dispatch import OrderedRouter
from bot.core.vocabulary import label_for_state
from bot.loops.auto_allocate import auto_allocate
from bot.loops.triggers import TRIGGER_ACTION, TRIGGER_EVENT
from bot.worker import HandlerContext

router = OrderedRouter()


@router.register("issues", action="label_updated")
async def on_ready_label(event: sansio.Event, ctx: HandlerContext) -> None:
    """Run one auto-allocation when a ready issue appears (on by default when the roster has an author).

    It ranks every ready issue, not just this one, and every idle author; a repeated event finds the issues leased
    or the authors busy and leases nothing twice. Without a Gitea client there are no candidates to read, so
    nothing happens. When Gitea cannot serve it, AutoUnavailable fails the handler and the worker retries it.
    """
    deps = ctx.deps
    data: dict[str, Any] = event.data
    issue = data.get("issue") or {}
    if not deps.settings.auto_allocation() or issue.get("pull_request") or deps.gitea is None:
        return
    names = {label.get("name") for label in issue.get("labels") or [] if isinstance(label, dict)}
    if label_for_state("ready") not in names:
        return
    report = await auto_allocate(deps.door, trigger="ready_label", delivery_id=event.delivery_id)
    ctx.log.info("auto-allocation: %s", report.summary())


@router.register(TRIGGER_EVENT, action=TRIGGER_ACTION)
async def on_queued_trigger(event: sansio.Event, ctx: HandlerContext) -> None:
    """Run an auto-allocation a verb queued in the inbox (the PR-open hand-over freed its author); a failure fails
    the handler and the worker retries it, as for a webhook's."""
    deps = ctx.deps
    data: dict[str, Any] = event.data
    if not deps.settings.auto_allocation() or deps.gitea is None:
        return
    trigger = str(data.get("trigger") or "queued")[:40]
    report = await auto_allocate(deps.door, trigger=trigger, delivery_id=event.delivery_id)
    ctx.log.info("auto-allocation (%s): %s", trigger, report.summary())


@router.register("status")
async def on_commit_status(event: sansio.Event, ctx: HandlerContext) -> None:
    """A commit status changed (CI reported on a head): the merge queue waits for the required statuses and a
    failing one sends the issue back to its author, so the queues run on the news (catch-up runs them too, for a
    status whose webhook was lost). Gitea's ``status`` event has no action; which head it names is read again from
    Gitea by the run, never taken from the payload."""
    deps = ctx.deps
    if not deps.settings.auto_allocation() or deps.gitea is None:
        return
    report = await auto_allocate(deps.door, trigger="status", delivery_id=event.delivery_id)
    ctx.log.info("auto-allocation (status): %s", report.summary())
