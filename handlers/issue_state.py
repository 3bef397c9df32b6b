"""Issue state feature: comment and label events drive each issue's Canonical Issue State, trust and label sync."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from gidgethub import routing, sansio

from bot.config import Settings
from bot.core.canonical import parse_comment
from bot.core.vocabulary import is_status_label
from bot.worker import HandlerContext
from state.db import to_db_time
from state.issues import (
    CONFLICTING_STATUS_LABELS,
    NO_BLOCK,
    CommentAction,
    CommentObservation,
    IssueLabel,
    IssueObservation,
    IssueSnapshot,
    IssueStore,
    SyncPlan,
    Trust,
    gitea_time,
    plan_label_sync,
    sorted_labels,
)

router = routing.Router()

#: Gitea permissions that may set an issue's state (besides the bot and roster identities).
WRITE_PERMISSIONS: frozenset[str] = frozenset({"write", "admin", "owner"})
PERMISSION_TTL_S = 60.0
_CACHE_DEP = "issue_state.permissions"
_COMMENT_ACTIONS: tuple[CommentAction, ...] = ("created", "edited", "deleted")


class LabelLike(Protocol):
    """A label as the Gitea client returns it."""

    @property
    def id(self) -> int: ...
    @property
    def name(self) -> str: ...


class IssueLike(Protocol):
    """An issue as the Gitea client returns it."""

    @property
    def number(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def labels(self) -> Sequence[LabelLike]: ...
    @property
    def updated_at(self) -> datetime | None: ...


class IssueStateGitea(Protocol):
    """The Gitea calls this feature makes (bot.gitea.GiteaClient provides them)."""

    async def get_user_permission(self, login: str) -> str: ...
    async def add_labels(self, number: int, labels: Sequence[int] | Sequence[str]) -> Sequence[LabelLike]: ...
    async def remove_label(self, number: int, label_id: int) -> None: ...
    async def get_issue(self, number: int) -> IssueLike: ...


class PermissionCache:
    """Gitea permissions per login for a short while (in-process); only answers are cached, never failures."""

    def __init__(self, ttl_s: float = PERMISSION_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: dict[str, tuple[float, str]] = {}

    async def permission(self, gitea: IssueStateGitea, login: str) -> str:
        key = login.lower()
        now = self._clock()
        held = self._entries.get(key)
        if held is not None and now - held[0] < self.ttl_s:
            return held[1]
        permission = await gitea.get_user_permission(login)
        self._entries[key] = (now, permission)
        return permission


def _is_not_found(exc: Exception) -> bool:
    return getattr(exc, "status", None) == 404


async def author_trust(author: str, ctx: HandlerContext) -> Trust:
    """Whether ``author`` may set the state: the bot, a roster identity, or write permission per Gitea.

    Payload fields such as ``sender.is_admin`` are never consulted. When Gitea cannot answer, the error
    propagates so the worker retries (fail closed: nothing is recorded as trusted meanwhile).
    """
    settings: Settings = ctx.deps["settings"]
    service = ctx.deps.get("service")
    bot_login = getattr(service, "bot_login", None) or settings.gitea.bot_login
    login = author.lower()
    if bot_login and login == bot_login.lower():
        return Trust(True, "bot")
    if login in {name.lower() for name in settings.roster}:
        return Trust(True, "roster")
    gitea: IssueStateGitea | None = ctx.deps.get("gitea")
    if gitea is None:
        return Trust(False, "no_gitea_client: write permission cannot be checked without gitea.token")
    cache = ctx.deps.setdefault(_CACHE_DEP, PermissionCache())
    try:
        permission = await cache.permission(gitea, author)
    except Exception as exc:
        if _is_not_found(exc):
            return Trust(False, f"unknown_user: {exc}"[:300])
        raise
    return Trust(permission in WRITE_PERMISSIONS, f"permission:{permission}")


# --------------------------------------------------------------------------- payload reading


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
    wanted = f"{settings.repository.owner}/{settings.repository.name}"
    if full_name.lower() != wanted.lower():
        return None
    if data.get("is_pull") or issue.get("pull_request") is not None:
        return None
    return _Where(full_name, issue)


def _comment_observation(
    data: Mapping[str, Any], where: _Where, action: CommentAction, delivery_id: str, trust: Trust
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
        parsed=None if action == "deleted" else parse_comment(body),
        trust=trust,
    )


# --------------------------------------------------------------------------- handlers


@router.register("issue_comment", action="created")
@router.register("issue_comment", action="edited")
@router.register("issue_comment", action="deleted")
async def on_issue_comment(event: sansio.Event, ctx: HandlerContext) -> None:
    """Record the comment revision (trusted or not, block or not) and recompute the issue's state."""
    settings: Settings = ctx.deps["settings"]
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
    trust = NO_BLOCK
    if action != "deleted" and parse_comment(body).block_count:
        trust = await author_trust(author, ctx)
    try:
        observation = _comment_observation(data, where, action, event.delivery_id, trust)
        issue = IssueObservation.from_payload(where.issue)
    except (KeyError, TypeError, ValueError) as exc:
        ctx.log.warning("issue_comment payload skipped: %s", exc)
        return
    store = IssueStore(ctx.deps["db"])
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
    await sync_labels(store, snapshot, ctx, delivery_id=event.delivery_id)


@router.register("issues", action="opened")
@router.register("issues", action="closed")
@router.register("issues", action="reopened")
@router.register("issues", action="label_updated")
@router.register("issues", action="label_cleared")
async def on_issue_event(event: sansio.Event, ctx: HandlerContext) -> None:
    """Record the status and the label set (diffed against the stored one), candidates and conflicts."""
    settings: Settings = ctx.deps["settings"]
    data = event.data
    try:
        where = _where(data, settings)
        if where is None:
            return
        issue = IssueObservation.from_payload(where.issue)
        sender = str((data.get("sender") or {}).get("login") or "")
    except (PayloadError, KeyError, TypeError, ValueError) as exc:
        ctx.log.warning("issues payload skipped: %s", exc)
        return
    store = IssueStore(ctx.deps["db"])
    result = await store.record_issue_event(
        issue, repo=where.repo, action=str(data["action"]), sender=sender, delivery_id=event.delivery_id
    )
    if result.duplicate:
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
    await sync_labels(store, result.snapshot, ctx, delivery_id=event.delivery_id)


# --------------------------------------------------------------------------- label sync


async def sync_labels(store: IssueStore, snapshot: IssueSnapshot, ctx: HandlerContext, *, delivery_id: str) -> None:
    """Make the issue carry exactly the status label its current STATE mirrors, keeping other labels.

    Idempotent: nothing happens when the labels already agree. Two status labels hold the sync (a blocker
    for the controller). Without a Gitea client the needed change is recorded as pending.
    """
    conflict = CONFLICTING_STATUS_LABELS in snapshot.open_blockers
    plan = plan_label_sync(snapshot.state, snapshot.label_names, conflict=conflict)
    if plan.status == "held":
        await store.record_sync(
            snapshot, plan=plan, outcome="held", reason="two status labels at once", delivery_id=delivery_id
        )
        return
    if not plan.needs_change:
        return
    gitea: IssueStateGitea | None = ctx.deps.get("gitea")
    if gitea is None:
        await store.record_sync(
            snapshot, plan=plan, outcome="pending", reason="no gitea client configured", delivery_id=delivery_id
        )
        ctx.log.warning("issue #%d needs label %s; no Gitea client, recorded as pending", snapshot.number, plan.target)
        return
    await _apply_sync(store, snapshot, plan, gitea, ctx, delivery_id=delivery_id)


async def _apply_sync(
    store: IssueStore,
    snapshot: IssueSnapshot,
    plan: SyncPlan,
    gitea: IssueStateGitea,
    ctx: HandlerContext,
    *,
    delivery_id: str,
) -> None:
    assert plan.target is not None
    # Add first, then remove by id what the answer shows: both are deltas, so labels that someone
    # added meanwhile are kept (a PUT of our stored set could drop them).
    labels = await gitea.add_labels(snapshot.number, [plan.target])
    if plan.target not in {label.name for label in labels}:
        await store.record_sync(
            snapshot,
            plan=plan,
            outcome="label_missing",
            reason=f"the repository has no label {plan.target}",
            delivery_id=delivery_id,
        )
        ctx.log.warning("issue #%d: label %s does not exist in the repository", snapshot.number, plan.target)
        return
    for label in labels:
        if is_status_label(label.name) and label.name != plan.target:
            await gitea.remove_label(snapshot.number, label.id)
    issue = await gitea.get_issue(snapshot.number)
    after = IssueObservation(
        number=issue.number,
        is_open=issue.state != "closed",
        labels=sorted_labels(IssueLabel(label.id, label.name) for label in issue.labels),
        updated_at=None if issue.updated_at is None else to_db_time(issue.updated_at),
    )
    await store.record_sync(
        snapshot,
        plan=plan,
        outcome="applied",
        reason=f"STATE {snapshot.state.state if snapshot.state else '?'} is mirrored by {plan.target}",
        delivery_id=delivery_id,
        after=after,
    )
    ctx.log.info("issue #%d status label set to %s (removed %s)", snapshot.number, plan.target, list(plan.remove))
