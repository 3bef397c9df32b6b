"""Issue state: comment and label events drive each issue's Canonical Issue State, trust and label sync."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from gidgethub import sansio

from bot.author_trust import TrustGitea, trust_of
from bot.config import Settings
from bot.core.canonical import ParseResult, parse_comment
from bot.core.dispatch import OrderedRouter
from bot.core.issue_state import (
    NO_BLOCK,
    CommentAction,
    CommentObservation,
    IssueObservation,
    IssueSnapshot,
    Trust,
    gitea_time,
)
from bot.core.vocabulary import label_for_state
from bot.loops.triggers import queue_auto_allocation
from bot.outbox import OutboxHooks
from bot.worker import HandlerContext
from state.db import Database, to_db_time, utcnow
from state.issues import IssueStore
from state.outbox import OutboxEntry

if TYPE_CHECKING:
    pass

log = logging.getLogger("foreman.issue_state")

router = OrderedRouter()

#: Gitea permissions that may set an issue's state (besides the bot and roster identities).
WRITE_PERMISSIONS: frozenset[str] = frozenset({"write", "admin", "owner"})
Read = TypeVar("Read")
_COMMENT_ACTIONS: tuple[CommentAction, ...] = ("created", "edited", "deleted")


IssueStateGitea = TrustGitea


def _is_not_found(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404


async def author_trust(author: str, ctx: HandlerContext) -> Trust:
    """Whether ``author`` may set the state: the bot, a roster identity, or write permission per Gitea.

    Payload fields such as ``sender.is_admin`` are never consulted. When Gitea cannot answer, the error
    propagates so the worker retries (fail closed: nothing is recorded as trusted meanwhile).
    """
    return await trust_of(author, ctx.deps.settings, ctx.deps.gitea, ctx.deps.bot_login(), ctx.deps.permissions)


# --- payload reading --------------------------------------------------------------------------------------------------


class PayloadError(ValueError):
    """The payload lacks what this feature needs (not a Gitea issue payload): skipped, not retried."""


@dataclass(frozen=True, slots=True)
class _Where:
    repo: str
    issue: dict[str, Any]


def _where(data: Mapping[str, Any], settings: Settings) -> _Where | None:
    """The issue of a payload from the configured repository, or None (another repository, or a PR)."""
    try:
        full_name = str(data["repository"]["full_name"])
        issue = data["issue"]
        if not isinstance(issue, dict) or "number" not in issue:
            raise PayloadError("no issue object")
    except (KeyError, TypeError) as exc:
        raise PayloadError(f"no {exc} in the payload") from None
    if full_name.lower() != settings.repo_key:
        return None
    if data.get("is_pull") or issue.get("pull_request") is not None:
        return None
    return _Where(full_name, issue)


def _issues_event(event: sansio.Event, ctx: HandlerContext, what: str, read: Callable[[_Where], Read]) -> (
    tuple[_Where, Read, str] | None
):
    """An ``issues`` event of the served repository: (where, what ``read`` took from its issue, the sender), or
    None when it is another repository's or a PR's, or a payload without what ``read`` needs (logged, skipped)."""
    try:
        where = _where(event.data, ctx.deps.settings)
        if where is None:
            return None
        found = read(where)
        sender = str((event.data.get("sender") or {}).get("login") or "")
    except (PayloadError, KeyError, TypeError, ValueError) as exc:
        ctx.log.warning("%s payload skipped: %s", what, exc)
        return None
    return where, found, sender


def _comment_observation(
    data: Mapping[str, Any],
    where: _Where,
    action: CommentAction,
    delivery_id: str,
    trust: Trust,
    parsed: ParseResult | None,
) -> CommentObservation:
    comment = data["comment"]
    body = str(comment.get("body") or "")
    created = gitea_time(str(comment["created_at"]))
    return CommentObservation(
        repo=where.repo,
        number=int(where.issue["number"]),
        comment_id=int(comment["id"]),
        action=action,
        author=str(comment["user"]["login"]),
        created_at=created,
        updated_at=gitea_time(str(comment["updated_at"])) if comment.get("updated_at") else created,
        delivery_id=delivery_id,
        body_sha256=CommentObservation.body_hash(body),
        parsed=parsed,
        trust=trust,
    )


# --- handlers ---------------------------------------------------------------------------------------------------------


@router.register("issue_comment", action="created")
@router.register("issue_comment", action="edited")
@router.register("issue_comment", action="deleted")
async def on_issue_comment(event: sansio.Event, ctx: HandlerContext) -> None:
    """Record the comment revision (trusted or not, block or not) and recompute the issue's state."""
    settings = ctx.deps.settings
    data = event.data
    action = data.get("action")
    assert action in _COMMENT_ACTIONS
    try:
        where = _where(data, settings)
        if where is None:
            return
        comment = data["comment"]
        author = str(comment["user"]["login"])
        body = str(comment.get("body") or "")
    except (PayloadError, KeyError, TypeError) as exc:
        ctx.log.warning("issue_comment payload skipped: %s", exc)
        return
    # Parsed once, in time linear in the body (a hostile comment must not hold the event loop).
    parsed = None if action == "deleted" else parse_comment(body)
    trust = NO_BLOCK
    if parsed is not None and parsed.block_count:
        trust = await author_trust(author, ctx)
    try:
        observation = _comment_observation(data, where, action, event.delivery_id, trust, parsed)
        issue = IssueObservation.from_payload(where.issue)
    except (KeyError, TypeError, ValueError) as exc:
        ctx.log.warning("issue_comment payload skipped: %s", exc)
        return
    store = IssueStore(ctx.deps.db)
    snapshot = await store.record_comment(observation, issue)
    ctx.log.info(
        "issue #%d comment %d %s: %s (%s); state %s from comment %s",
        observation.number,
        observation.comment_id,
        action,
        "no block" if trust.trusted is None else ("trusted" if trust.trusted else "untrusted"),
        trust.reason,
        snapshot.state.state if snapshot.state else "none",
        snapshot.state_comment_id,
    )
    wake_label_sync(snapshot, ctx)


@router.register("issues", action="opened")
@router.register("issues", action="closed")
@router.register("issues", action="reopened")
@router.register("issues", action="label_updated")
@router.register("issues", action="label_cleared")
async def on_issue_event(event: sansio.Event, ctx: HandlerContext) -> None:
    """Record the status and the label set (diffed against the stored one), candidates and conflicts."""
    data = event.data
    read = _issues_event(event, ctx, "issues",
                         lambda where: IssueObservation.from_event(str(data.get("action") or ""), where.issue))
    if read is None:
        return
    where, issue, sender = read
    store = IssueStore(ctx.deps.db)
    result = await store.record_issue_event(
        issue, repo=where.repo, action=str(data["action"]), sender=sender, delivery_id=event.delivery_id
    )
    if result.duplicate:
        wake_label_sync(result.snapshot, ctx)
        return
    if result.added or result.removed:
        ctx.log.info("issue #%d labels +%s -%s by %s", issue.number, list(result.added), list(result.removed), sender)
    if not result.applied:
        ctx.log.info(
            "issue #%d: %s payload is older than the stored labels; kept in history only", issue.number, data["action"]
        )
    if result.made_candidate:
        ctx.log.info("issue #%d is a candidate (status:ready by %s)", issue.number, sender)
    if result.snapshot.open_blockers:
        ctx.log.warning("issue #%d blockers for the controller: %s", issue.number, list(result.snapshot.open_blockers))
    wake_label_sync(result.snapshot, ctx)


@router.register("issues", action="deleted")
async def on_issue_deleted(event: sansio.Event, ctx: HandlerContext) -> None:
    """Gitea 1.25+ (services/webhook/notifier.go DeleteIssue): end the issue's leases, cancel its outbox."""
    read = _issues_event(event, ctx, "issues/deleted", lambda where: int(where.issue["number"]))
    if read is None:
        return
    where, number, sender = read
    ended, cancelled, duplicate = await IssueStore(ctx.deps.db).record_issue_deleted(
        where.repo, number, sender=sender, delivery_id=event.delivery_id
    )
    if not duplicate:
        ctx.log.warning(
            "issue #%d deleted by %s: %d lease(s) ended, %d outbox entr(y/ies) cancelled",
            number,
            sender,
            ended,
            cancelled,
        )


# --- label sync -------------------------------------------------------------------------------------------------------


def wake_label_sync(snapshot: IssueSnapshot, ctx: HandlerContext) -> None:
    """After the store planned the label sync (inside its transaction): wake the outbox sender, and log.

    ``pending`` means the labels do not mirror the STATE yet and the change sits in the outbox: the sender
    sends and verifies it, or, without a Gitea token, it waits there (``foreman outbox``).
    """
    if snapshot.label_sync == "pending":
        if ctx.deps.gitea is None:
            ctx.log.warning(
                "issue #%d needs label %s; no Gitea client, the change waits in the outbox",
                snapshot.number,
                label_for_state(snapshot.state.state) if snapshot.state else "?",
            )
    elif snapshot.label_sync == "held":
        ctx.log.warning("issue #%d label sync held: two status labels at once", snapshot.number)


def outbox_hooks(db: Database, settings: Settings) -> OutboxHooks:
    """The outbox sender's hooks that bring its verified results back into the issue state.

    Label sync never calls Gitea from a handler: the store queues the change as an outbox entry in the
    transaction that changed the state or the labels, and the sender sends and verifies it. These hooks make the
    verified label set the stored snapshot and the bot's own Canonical Issue State comments comment records,
    because the bot's own webhooks are recorded as ``ignored_self`` and never dispatched (docs/canonical-state.md).
    """
    store = IssueStore(db)

    async def completed(entry: OutboxEntry, result: dict[str, Any]) -> None:
        await on_outbox_complete(store, settings, entry, result)
        await queue_after_queue_label(db, settings, entry)

    async def failed(entry: OutboxEntry) -> None:
        await on_outbox_failure(store, settings, entry)

    return OutboxHooks(on_complete=completed, on_failure=failed)


#: The status labels whose arrival on Gitea puts an issue in a queue: ready (the authors'), review (the reviewers'
#: and mergers').
_QUEUE_LABELS = frozenset({label_for_state("ready"), label_for_state("review")})


async def queue_after_queue_label(db: Database, settings: Settings, entry: OutboxEntry) -> str | None:
    """foreman itself put an issue in a queue (a stranded lease's issue back to `status:ready`, a hand-over to
    `status:review`): one auto-allocation queued now that Gitea holds the label, as a person's labelling would
    have triggered (the bot's own webhooks are ``ignored_self``). Keyed by the entry: a rerun queues nothing twice."""
    if entry.kind != "labels" or not _QUEUE_LABELS & set(entry.payload.get("add") or ()):
        return None
    return await queue_auto_allocation(db, settings, trigger="queue_label", key=entry.key)


async def on_outbox_complete(store: IssueStore, settings: Settings, entry: OutboxEntry, result: dict[str, Any]) -> None:
    """The outbox sender's completion hook: bring a verified mutation back into the issue state.

    - ``labels``: the label set read back becomes the issue's snapshot (a label sync is recorded ``applied``).
    - ``comment`` / ``edit_comment`` with a Canonical Issue State block (or any edit, which may withdraw one):
      recorded as a comment revision by the bot (trusted, reason ``bot``) with the comment id and Gitea's
      times from the read-back, so the bot's own state posts take their place in comment order.
    """
    repo = settings.repo_key
    if entry.kind == "labels":
        snapshot = await store.record_outbox_labels(repo, entry, result)
        log.info(
            "issue #%d labels after outbox %s: %s (%s)",
            entry.issue_number,
            entry.key,
            list(snapshot.label_names),
            snapshot.label_sync,
        )
        return
    if entry.kind not in ("comment", "edit_comment"):
        return
    body = str(entry.payload.get("body") or "")
    parsed = parse_comment(body)
    if not parsed.block_count and entry.kind == "comment":
        return
    now = to_db_time(utcnow())
    created = gitea_time(str(result["created_at"])) if result.get("created_at") else now
    observation = CommentObservation(
        repo=repo,
        number=entry.issue_number,
        comment_id=int(result["comment_id"]),
        action="created" if entry.kind == "comment" else "edited",
        author=str(result.get("author") or settings.gitea.bot_login or "bot"),
        created_at=created,
        updated_at=gitea_time(str(result["updated_at"])) if result.get("updated_at") else created,
        delivery_id=f"outbox:{entry.key}",
        body_sha256=CommentObservation.body_hash(body),
        parsed=parsed,
        trust=Trust(True, "bot") if parsed.block_count else NO_BLOCK,
    )
    snapshot = await store.record_comment(observation)
    log.info(
        "issue #%d: the bot's comment %d (outbox %s) recorded; state %s from comment %s",
        entry.issue_number,
        observation.comment_id,
        entry.key,
        snapshot.state.state if snapshot.state else "none",
        snapshot.state_comment_id,
    )


async def on_outbox_failure(store: IssueStore, settings: Settings, entry: OutboxEntry) -> None:
    """The outbox sender's failure hook: a label sync that ended verification_failed or parked is recorded;
    an entry parked because its issue is gone (GiteaIssueGone: Gitea 1.22-1.24 send no ``issues``/``deleted``)
    ends the issue's leases and cancels its other entries, as the deleted event would."""
    if entry.status == "parked" and (entry.last_error or "").startswith("GiteaIssueGone"):
        ended, cancelled, duplicate = await store.record_issue_deleted(
            settings.repo_key, entry.issue_number, sender="", delivery_id=f"outbox:{entry.key}:issue_gone"
        )
        if not duplicate:
            log.warning(
                "issue #%d is gone (outbox %s): %d lease(s) ended, %d outbox entr(y/ies) cancelled",
                entry.issue_number,
                entry.key,
                ended,
                cancelled,
            )
    if entry.kind != "labels":
        return
    snapshot = await store.record_outbox_failure(settings.repo_key, entry)
    if snapshot is not None:
        log.warning(
            "issue #%d label sync %s: outbox %s %s", entry.issue_number, snapshot.label_sync, entry.key, entry.status
        )
