"""Gitea-style webhook deliveries: Go-compatible JSON bodies, signature headers, event names and a sender."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

from bot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Fine event type (``X-Gitea-Event-Type``) → coarse event (``X-Gitea-Event``); FACTS §2.
EVENT_OF_TYPE: Final[Mapping[str, str]] = {
    "issues": "issues",
    "issue_assign": "issues",
    "issue_label": "issues",
    "issue_milestone": "issues",
    "issue_comment": "issue_comment",
    "pull_request_comment": "issue_comment",
    "pull_request": "pull_request",
    "pull_request_assign": "pull_request",
    "pull_request_label": "pull_request",
    "pull_request_milestone": "pull_request",
    "pull_request_sync": "pull_request",
    "pull_request_review_request": "pull_request",
    "pull_request_review_approved": "pull_request_approved",
    "pull_request_review_rejected": "pull_request_rejected",
    "pull_request_review_comment": "pull_request_comment",
    **{
        name: name
        for name in (
            "push",
            "create",
            "delete",
            "fork",
            "release",
            "wiki",
            "repository",
            "package",
            "status",
            "workflow_job",
            "workflow_run",
        )
    },
}

ISSUE_EVENT_GROUP: Final = ("issues", "issue_assign", "issue_label", "issue_milestone", "issue_comment")
PULL_EVENT_GROUP: Final = (
    "pull_request",
    "pull_request_assign",
    "pull_request_label",
    "pull_request_milestone",
    "pull_request_comment",
    "pull_request_review_approved",
    "pull_request_review_rejected",
    "pull_request_review_comment",
    "pull_request_sync",
    "pull_request_review_request",
)

_REVIEW_TYPES: Final = frozenset(
    {"pull_request_review_approved", "pull_request_review_rejected", "pull_request_review_comment"}
)

#: What Gitea's own delivery client sends when the hook sets no User-Agent (Go's default).
GO_USER_AGENT: Final = "Go-http-client/1.1"
_GO_HTML_ESCAPES: Final = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def expand_hook_events(events: Iterable[str]) -> frozenset[str]:
    """The fine event types a hook created through the API listens to (``updateHookEvents``, FACTS §2).

    ``issues`` turns on every issue event including ``issue_comment``; ``issues_only`` only the bare
    issue events; ``pull_request``/``pull_request_only`` likewise. Matching is case-insensitive and an
    empty list means ``push``, as in Gitea.
    """
    wanted = {e.lower() for e in events} or {"push"}
    enabled: set[str] = set()
    for fine in ISSUE_EVENT_GROUP:
        own = "issues_only" if fine == "issues" else fine
        if own in wanted or "issues" in wanted:
            enabled.add(fine)
    for fine in PULL_EVENT_GROUP:
        own = "pull_request_only" if fine == "pull_request" else fine
        if fine in _REVIEW_TYPES:
            # routers/api/v1/utils/hook.go updateHookEvents knows only "pull_request_review"; Webhook.HasEvent
            # maps the three review types onto it (audit #20): the fine names themselves do nothing.
            own = "pull_request_review"
        if own in wanted or "pull_request" in wanted:
            enabled.add(fine)
    for name in wanted:
        if EVENT_OF_TYPE.get(name) == name and name not in ("issues", "pull_request"):
            enabled.add(name)
    return frozenset(enabled)


def go_json(payload: Any) -> bytes:
    """Serialise like Go's ``json.MarshalIndent(p, "", "  ")``: 2-space indent, HTML-escaped, no final newline."""
    text = json.dumps(payload, indent=2, ensure_ascii=False, separators=(",", ": "))
    for raw, escaped in _GO_HTML_ESCAPES:
        text = text.replace(raw, escaped)
    return text.encode("utf-8")


def sign_body(secret: bytes, body: bytes) -> dict[str, str]:
    """The four signature headers Gitea puts on a delivery of ``body`` signed with ``secret`` (FACTS §1).

    An empty secret gives an empty ``X-Gitea-Signature`` and the bare prefixes ``sha256=``/``sha1=``.
    """
    sha256 = hmac.new(secret, body, hashlib.sha256).hexdigest() if secret else ""
    sha1 = hmac.new(secret, body, hashlib.sha1).hexdigest() if secret else ""
    return {
        "X-Gitea-Signature": sha256,
        "X-Gogs-Signature": sha256,
        "X-Hub-Signature": f"sha1={sha1}",
        "X-Hub-Signature-256": f"sha256={sha256}",
    }


def delivery_headers(
    *,
    delivery_id: str,
    event_type: str,
    json_body: bytes,
    secret: bytes,
    content_type: str = "json",
    target_type: str | None = "repository",
    authorization: str = "",
) -> dict[str, str]:
    """The full v1.26 header set of one delivery of a ``gitea`` hook (``addDefaultHeaders``).

    ``target_type=None`` leaves out the ``*-Hook-Installation-Target-Type`` headers (added in 1.24.0, #33752)."""
    event = EVENT_OF_TYPE.get(event_type, event_type)
    headers = {
        "Content-Type": "application/json" if content_type == "json" else "application/x-www-form-urlencoded",
        "User-Agent": GO_USER_AGENT,
        "X-Gitea-Delivery": delivery_id,
        "X-Gitea-Event": event,
        "X-Gitea-Event-Type": event_type,
        "X-Gogs-Delivery": delivery_id,
        "X-Gogs-Event": event,
        "X-Gogs-Event-Type": event_type,
        "X-GitHub-Delivery": delivery_id,
        "X-GitHub-Event": event,
        "X-GitHub-Event-Type": event_type,
    }
    if target_type is not None:
        headers["X-Gitea-Hook-Installation-Target-Type"] = target_type
        headers["X-GitHub-Hook-Installation-Target-Type"] = target_type
    headers.update(sign_body(secret, json_body))
    if authorization:
        headers["Authorization"] = authorization
    return headers


@dataclass(frozen=True, slots=True)
class HookTarget:
    """Where and how one hook delivers: the subset of a hook that the sender needs."""

    hook_id: int
    url: str
    secret: bytes
    content_type: str = "json"
    authorization: str = ""
    #: False for Gitea before 1.24 (no installation-target headers).
    target_headers: bool = True
    #: What the installation-target headers name: ``repository``, ``organization`` or ``system`` (whose hook it is).
    target_type: str = "repository"


@dataclass(slots=True)
class SentWebhook:
    """One delivery attempt as sent, and what came back (``status`` is None until it finishes)."""

    delivery_id: str
    hook_id: int
    url: str
    event: str
    event_type: str
    headers: dict[str, str]
    body: bytes
    json_body: bytes
    status: int | None = None
    response_body: bytes = b""
    error: str | None = None
    started_at: float = 0.0
    finished_at: float | None = None
    replay_of: str | None = None

    @property
    def payload(self) -> Any:
        """The decoded JSON payload (the signed JSON, also for form hooks)."""
        return json.loads(self.json_body)

    @property
    def action(self) -> str | None:
        """The payload's ``action``, if it has one."""
        value = self.payload.get("action") if isinstance(self.payload, dict) else None
        return value if isinstance(value, str) else None

    @property
    def ok(self) -> bool:
        """Gitea counts any 2xx as delivered."""
        return self.status is not None and self.status // 100 == 2


@dataclass
class WebhookSender:
    """Background delivery of signed payloads, a few at a time, recording every attempt.

    Like Gitea: no retry, any 2xx is success, each delivery is bounded by ``timeout_s`` (DELIVER_TIMEOUT),
    and deliveries run on a small worker pool, so they may arrive concurrently and out of order
    (``workers=1`` gives in-order delivery).
    """

    workers: int = 4
    timeout_s: float = 5.0
    deliveries: list[SentWebhook] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _backlog: list[SentWebhook] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None
    _semaphore: asyncio.Semaphore | None = None

    def enqueue(self, target: HookTarget, event_type: str, payload: Any) -> SentWebhook:
        """Build, sign and schedule one delivery of ``payload`` to ``target``; returns its record."""
        json_body = go_json(payload)
        return self._schedule(target, event_type, json_body, replay_of=None)

    def replay(self, delivery: SentWebhook, target: HookTarget) -> SentWebhook:
        """Gitea's UI "Replay": a new task with a NEW uuid and the same body (so the same signature)."""
        return self._schedule(target, delivery.event_type, delivery.json_body, replay_of=delivery.delivery_id)

    def _schedule(self, target: HookTarget, event_type: str, json_body: bytes, *, replay_of: str | None) -> SentWebhook:
        delivery_id = str(uuid.uuid4())
        if target.content_type == "form":
            body = urllib.parse.urlencode({"payload": json_body.decode("utf-8")}).encode("ascii")
        else:
            body = json_body
        delivery = SentWebhook(
            delivery_id=delivery_id,
            hook_id=target.hook_id,
            url=target.url,
            event=EVENT_OF_TYPE.get(event_type, event_type),
            event_type=event_type,
            headers=delivery_headers(
                delivery_id=delivery_id,
                event_type=event_type,
                json_body=json_body,
                secret=target.secret,
                content_type=target.content_type,
                authorization=target.authorization,
                target_type=target.target_type if target.target_headers else None,
            ),
            body=body,
            json_body=json_body,
            replay_of=replay_of,
        )
        self.deliveries.append(delivery)
        self._backlog.append(delivery)
        self.kick()
        return delivery

    def kick(self) -> None:
        """Start tasks for queued deliveries if an event loop is running (setup helpers may run without one)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        backlog, self._backlog = self._backlog, []
        for delivery in backlog:
            task = loop.create_task(self._send(delivery), name=f"webhook-{delivery.delivery_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait until every queued or running delivery has finished."""
        self.kick()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
            self.kick()

    async def close(self) -> None:
        """Cancel what is still running and close the HTTP session."""
        await cancel_and_wait(*self._tasks, also_suppress=(Exception,))
        self._backlog.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _send(self, delivery: SentWebhook) -> None:
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(max(1, self.workers))
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                skip_auto_headers=("Accept",),
            )
        async with self._semaphore:
            delivery.started_at = time.monotonic()
            try:
                async with self._session.post(delivery.url, data=delivery.body, headers=delivery.headers) as resp:
                    delivery.response_body = await resp.content.read(1 << 20)
                    delivery.status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                delivery.error = f"{type(exc).__name__}: {exc}"
                log.info("webhook delivery %s to %s failed: %s", delivery.delivery_id, delivery.url, delivery.error)
            finally:
                delivery.finished_at = time.monotonic()
