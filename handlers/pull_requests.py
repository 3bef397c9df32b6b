"""The end of an issue's life: a pull request closed (merged or not) or an issue closed by a person tears it down."""

from __future__ import annotations

from typing import Any

from gidgethub import sansio

from bot.core.dispatch import OrderedRouter
from bot.core.reconcile import is_synthetic
from bot.gitea import GiteaNotFound, PullRequest
from bot.loops.auto_allocate import auto_allocate_after
from bot.loops.teardown import TeardownReport, teardown_for_closed_issue, teardown_for_pull
from bot.worker import HandlerContext

router = OrderedRouter()


def _trigger(event: sansio.Event) -> str:
    return "catch_up" if is_synthetic(event.delivery_id or "") else "webhook"


async def _pull(ctx: HandlerContext, number: int) -> PullRequest | None:
    """The PR as Gitea holds it now; None when it is gone (nothing to retry: a deleted PR has nothing to end)."""
    assert ctx.deps.gitea is not None
    try:
        return await ctx.deps.gitea.get_pull(number)
    except GiteaNotFound:
        ctx.log.warning("teardown: pull request #%d is not on Gitea any more", number)
        return None


#: The auto-allocation trigger of a teardown that ended leases, by its reason.
_TRIGGERS = {"merged": "merge", "pr_closed": "pr_closed", "issue_closed": "issue_closed"}


async def _after(ctx: HandlerContext, event: sansio.Event, report: TeardownReport | None) -> None:
    """Log the teardown, wake the outbox; when it ended leases, their owners are free: auto-allocation runs (as
    after a release; its failure never undoes the teardown, the next trigger or catch-up allocates instead)."""
    if report is None:
        ctx.log.info("teardown: not an issue foreman governed")
        return
    ctx.log.info("teardown %s: %s", report.key, report.status)
    if report.status == "done" and report.ended:
        deps = ctx.deps
        trigger = _TRIGGERS.get(str(report.outcome.get("reason")), "teardown")
        auto = await auto_allocate_after(deps.door, trigger=trigger, delivery_id=event.delivery_id)
        if auto is not None:
            ctx.log.info("auto-allocation after the teardown (%s): %s", trigger, auto)


@router.register("pull_request", action="closed")
async def on_pull_closed(event: sansio.Event, ctx: HandlerContext) -> None:
    """A pull request closed: merged, it ends the issue it closes as ``merged``, else as ``pr_closed``. The PR is
    read back from Gitea (the payload may be a catch-up view or stale); a replay finds the teardown recorded."""
    deps = ctx.deps
    data: dict[str, Any] = event.data
    number = (data.get("pull_request") or {}).get("number") or data.get("number")
    if deps.gitea is None or not isinstance(number, int):
        return
    pull = await _pull(ctx, number)
    if pull is None:
        return
    report = await teardown_for_pull(deps.db, deps.settings, deps.gitea, pull, bot_login=deps.bot_login(),
                                     trigger=_trigger(event), delivery_id=event.delivery_id)
    await _after(ctx, event, report)


@router.register("issues", action="closed")
async def on_issue_closed(event: sansio.Event, ctx: HandlerContext) -> None:
    """An issue closed on Gitea (the bot's own events never reach here: they are ignored_self). A pull request
    closed through the issue API is a pull request's close."""
    deps = ctx.deps
    data: dict[str, Any] = event.data
    issue = data.get("issue") or {}
    number = issue.get("number")
    if deps.gitea is None or not isinstance(number, int) or issue.get("state") != "closed":
        return
    if issue.get("pull_request"):
        pull = await _pull(ctx, number)
        if pull is None:
            return
        report = await teardown_for_pull(deps.db, deps.settings, deps.gitea, pull, bot_login=deps.bot_login(),
                                         trigger=_trigger(event), delivery_id=event.delivery_id)
    else:
        closed_at = str(issue.get("closed_at") or issue.get("updated_at") or "")
        report = await teardown_for_closed_issue(
            deps.db, deps.settings, deps.gitea, number, closed_at, bot_login=deps.bot_login(),
            trigger=_trigger(event), delivery_id=event.delivery_id,
        )
    await _after(ctx, event, report)
