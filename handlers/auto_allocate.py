"""Auto-allocation (issue 20; on by default when the roster has an author): when an issue gains `status:ready`, the
ready issues go to the next idle authors (``bot/verbs/auto_allocate.py``)."""

from __future__ import annotations

from typing import Any

from gidgethub import routing, sansio

from bot.config import Settings
from bot.core.vocabulary import label_for_state
from bot.verbs.auto_allocate import AutoUnavailable, auto_allocate
from bot.worker import HandlerContext

router = routing.Router()

#: Kept for callers that caught the old name: the delivery is retried with backoff.
BootstrapUnavailable = AutoUnavailable


@router.register("issues", action="label_updated")
async def on_ready_label(event: sansio.Event, ctx: HandlerContext) -> None:
    """Run one auto-allocation when a ready issue appears.

    It ranks every ready issue, not just this one, and every idle author; a repeated event finds the issues leased
    or the authors busy and leases nothing twice. Without a Gitea client there are no candidates to read, so
    nothing happens. When Gitea cannot serve it, AutoUnavailable fails the handler and the worker retries it.
    """
    settings: Settings = ctx.deps["settings"]
    data: dict[str, Any] = event.data
    issue = data.get("issue") or {}
    if not settings.auto_allocation() or issue.get("pull_request") or ctx.deps.get("gitea") is None:
        return
    names = {label.get("name") for label in issue.get("labels") or [] if isinstance(label, dict)}
    if label_for_state("ready") not in names:
        return
    service = ctx.deps.get("service")
    report = await auto_allocate(
        ctx.deps["db"], settings, ctx.deps["gitea"], bot_login=getattr(service, "bot_login", "") or "",
        trigger="ready_label", delivery_id=event.delivery_id,
        wakeup=service.outbox_wakeup if service is not None else None,
    )
    ctx.log.info("auto-allocation: leased %s, resumed %s, blocked %s, waiting %s",
                 report.leased, report.resumed, report.blocked, report.waiting)
    if report.outbox and service is not None:
        service.outbox_wakeup()
