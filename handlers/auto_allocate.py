"""Auto-allocation (off by default): when an issue gains `status:ready`, allocate for the configured owner."""

from __future__ import annotations

from typing import Any

from gidgethub import routing, sansio

from bot.allocation import AllocationCall, Allocator
from bot.config import Settings
from bot.core.vocabulary import label_for_state
from bot.worker import HandlerContext

router = routing.Router()


class BootstrapUnavailable(RuntimeError):
    """Gitea could not serve the allocation or its bootstrap now: the delivery is retried."""


@router.register("issues", action="label_updated")
async def on_ready_label(event: sansio.Event, ctx: HandlerContext) -> None:
    """Apply one allocation for ``[allocator] auto_allocate_owner`` when a ready issue appears.

    The allocator ranks every ready issue, not just this one; a repeated event resumes the owner's live lease
    instead of leasing twice. Without a Gitea client there are no candidates to read, so nothing happens.
    """
    settings: Settings = ctx.deps["settings"]
    owner = settings.allocator.auto_allocate_owner
    data: dict[str, Any] = event.data
    issue = data.get("issue") or {}
    if not owner or issue.get("pull_request") or ctx.deps.get("gitea") is None:
        return
    names = {label.get("name") for label in issue.get("labels") or [] if isinstance(label, dict)}
    if label_for_state("ready") not in names:
        return
    service = ctx.deps.get("service")
    allocator = Allocator(
        ctx.deps["db"], settings, ctx.deps["gitea"], bot_login=getattr(service, "bot_login", "") or ""
    )
    outcome = await allocator.run(
        AllocationCall(
            actor="foreman:auto-allocate",
            actor_is_operator=True,
            owner=owner,
            dry_run=False,
            delivery_id=event.delivery_id,
        )
    )
    doc = outcome.to_dict()
    if outcome.refusal is not None and outcome.refusal.error == "unavailable":
        # Gitea could not list the candidates: nothing was leased; the worker retries the delivery with backoff.
        raise BootstrapUnavailable(outcome.refusal.message)
    ctx.log.info("auto-allocation for %s: %s #%s", owner, doc.get("decision"), doc.get("issue_number"))
    if outcome.applied and service is not None:
        service.outbox_wakeup()
    bootstrap = outcome.bootstrap or {}
    if bootstrap.get("error") == "unavailable":
        # The lease stands, but its server-side bootstrap could not reach Gitea (or the control checkout) now.
        # Failing this handler makes the worker retry it with backoff; the retry resumes the lease, and the
        # allocator runs the bootstrap again for a resumed lease, which resumes the open transition.
        raise BootstrapUnavailable(f"#{doc.get('issue_number')}: {bootstrap.get('message')}")
