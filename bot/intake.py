"""The webhook door: a delivery's body read within its bounds, admitted (``bot/core/intake.py``, pure), stored by the
group commit, and only then answered ``202`` (``200`` for a duplicate) and the worker woken."""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from bot.config import Settings
from bot.core.intake import Delivery, Rejection, admit, content_encoding_refusal, is_self_event, metric_event
from bot.core.intake_burst import ArrivalWindow
from bot.group_commit import GroupCommitWriter
from bot.http_server import read_body
from bot.metrics import Metrics

log = logging.getLogger("foreman.app")


@dataclass(frozen=True, slots=True)
class RefusedDelivery:
    """One request the webhook door refused: when, the answer's status and error, its message (the door's own words,
    never the request's body or headers) and the peer's address."""

    at: float
    status: int
    error: str
    message: str
    remote: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "status": self.status, "error": self.error, "message": self.message,
                "remote": self.remote}


class RefusedDeliveries:
    """The webhook door's refusals (401 bad signature, 400, 413, 415, ...) since the process started, for the
    dashboard: nothing of an unverified request is stored (no body, no header), only the door's verdict, in memory;
    the recent ones in a ring of ``keep`` and a count per (status, error), both from closed sets, so a flood of bad
    requests costs a bounded amount of memory and mints nothing."""

    def __init__(self, keep: int = 50) -> None:
        self.started = time.time()
        self._recent: deque[RefusedDelivery] = deque(maxlen=keep)
        self._counts: Counter[tuple[int, str]] = Counter()

    def record(self, status: int, error: str, message: str, remote: str | None) -> None:
        self._recent.append(RefusedDelivery(time.time(), status, error, message[:300], (remote or "")[:64] or None))
        self._counts[(status, error)] += 1

    def to_dict(self) -> dict[str, Any]:
        """The counts and the recent refusals, newest first (times as Unix seconds)."""
        return {"since": self.started,
                "counts": [{"status": status, "error": error, "count": count}
                           for (status, error), count in sorted(self._counts.items())],
                "recent": [r.to_dict() for r in reversed(self._recent)]}


class WebhookIntake:
    """``POST`` on ``[webhook] path``: every answer JSON, nothing from an unverified request a metric label."""

    def __init__(
        self, settings: Settings, metrics: Metrics, writer: GroupCommitWriter, window: ArrivalWindow, *,
        wakeup: Callable[[], None], bot_login: Callable[[], str | None],
    ) -> None:
        #: Only its ``[webhook]`` section is read (an organization's discovery never changes it).
        self.settings = settings
        self.metrics = metrics
        self.writer = writer
        #: The admissions the worker's loops stand aside for while they come in a burst.
        self.window = window
        self._wakeup = wakeup
        self._bot_login = bot_login
        self._delivery_counters: dict[tuple[str, str], Any] = {}
        #: What the door refused, for the dashboard (bounded, in memory).
        self.refused = RefusedDeliveries()

    async def handle(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            return await self._intake(request)
        except Exception:
            # A bug, never an answer to bad input (the fuzz tests hold it to that): still JSON, still logged.
            log.exception("webhook intake failed")
            return web.json_response(
                {"error": "internal_error", "message": "the delivery was not stored; see the service log"},
                status=500,
            )
        finally:
            self.metrics.intake_seconds.observe(time.perf_counter() - started)

    async def _read_body(self, request: web.Request) -> bytes | Rejection:
        webhook = self.settings.webhook
        # Before reading: aiohttp would try to decompress a body that claims a Content-Encoding.
        declared = request.content_length
        refused = content_encoding_refusal(request.headers) if declared is None or declared <= \
            webhook.max_body_bytes else None
        if refused is not None:
            return refused
        return await read_body(request, limit=webhook.max_body_bytes, timeout_s=webhook.read_timeout_s,
                               setting="[webhook] read_timeout_s", read_declared=True)

    async def _intake(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        if isinstance(body, Rejection):
            verdict: Delivery | Rejection = body
        else:
            verdict = admit(
                request.headers,
                body,
                secrets=self.settings.webhook_secrets(),
                max_body_bytes=self.settings.webhook.max_body_bytes,
            )
        if isinstance(verdict, Rejection):
            # Nothing from an unverified request becomes a label: its event header is not trusted.
            self.metrics.deliveries.labels("unverified", f"rejected_{verdict.status}").inc()
            log.info("webhook refused %d %s: %s", verdict.status, verdict.error, verdict.message)
            self.refused.record(verdict.status, verdict.error, verdict.message, request.remote)
            refusal = web.json_response(verdict.body(), status=verdict.status)
            if verdict.error in ("request_timeout", "bad_body"):
                refusal.force_close()  # what is left of that body is not read as the next request
            return refusal
        self.window.arrived(time.monotonic())
        is_self = is_self_event(verdict, self._bot_login())
        event_label = metric_event(verdict.event)
        try:
            result = await self.writer.submit(verdict, is_self)
        except Exception:
            self.metrics.deliveries.labels(event_label, "store_error").inc()
            return web.json_response(
                {
                    "error": "storage_unavailable",
                    "message": "the delivery could not be stored; it was not accepted",
                    "remediate": "check /readyz and the service log (disk space, database permissions)",
                    "exact_next_action": "resend the delivery from Gitea's webhook page (Replay) once /readyz is 200",
                },
                status=503,
            )
        self._delivery_counter(event_label, result.outcome).inc()
        if result.outcome == "queued":
            self._wakeup()
        status = 200 if result.outcome == "duplicate" else 202
        return _json_answer({"delivery": verdict.delivery_id, "status": result.outcome}, status)

    def _delivery_counter(self, event: str, outcome: str) -> Any:
        """The ``foreman_deliveries_total`` child of (event, outcome), looked up once (labels() takes a lock and
        builds a key on every call; both labels come from closed sets, so the cache is bounded)."""
        key = (event, outcome)
        child = self._delivery_counters.get(key)
        if child is None:
            child = self._delivery_counters[key] = self.metrics.deliveries.labels(event, outcome)
        return child


def _json_answer(doc: Mapping[str, Any], status: int) -> web.Response:
    """A JSON answer as ``web.json_response`` gives it (same Content-Type), encoded by orjson: the webhook door's
    every answer, where json.dumps cost ~5 us of the event loop per delivery."""
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json", charset="utf-8")
