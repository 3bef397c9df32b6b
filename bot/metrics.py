"""Prometheus metrics, one registry per running app (so tests can run several side by side)."""

from __future__ import annotations

import asyncio
import logging
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from bot.tasks import cancel_and_wait

if TYPE_CHECKING:
    from state.db import Database

#: What /metrics is served as (Prometheus' text exposition format, with its version parameter).
CONTENT_TYPE = CONTENT_TYPE_LATEST
LEASE_STATES = ("live", "live_expired", "released", "expired")
JOURNAL_OUTCOMES = ("open", "completed", "compensated")

log = logging.getLogger("foreman.metrics")


#: Why a request to /mcp was refused before MCP saw it (the label set of foreman_mcp_auth_failures_total).
MCP_AUTH_REASONS = ("missing", "unknown", "throttled", "origin")


@dataclass(frozen=True, slots=True)
class _Spec:
    """One metric as data: the attribute of :class:`Metrics` that holds it, its kind, name, help text, label names
    and (a histogram's) buckets."""

    attr: str
    kind: type[Counter] | type[Gauge] | type[Histogram]
    name: str
    documentation: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def build(self, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
        if self.buckets is not None:
            return Histogram(self.name, self.documentation, self.labels, registry=registry, buckets=self.buckets)
        return self.kind(self.name, self.documentation, self.labels, registry=registry)


#: Every metric, in the order /metrics lists them.
_SPECS: tuple[_Spec, ...] = (
    _Spec("deliveries", Counter, "foreman_deliveries_total",
          "Webhook deliveries by event and outcome (queued, duplicate, ignored_self, rejected_*, done, retry, failed)",
          ("event", "outcome")),
    _Spec("handler_errors", Counter, "foreman_handler_errors_total", "Handler failures by handler", ("handler",)),
    _Spec("inbox_depth", Gauge, "foreman_inbox_depth", "Stored deliveries by status", ("status",)),
    _Spec("processing_seconds", Histogram, "foreman_processing_seconds", "Time from claim to settle of one delivery",
          ("event",), buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)),
    _Spec("intake_seconds", Histogram, "foreman_intake_seconds", "Time to verify, store and answer one webhook request",
          buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)),
    _Spec("gitea_reachable", Gauge, "foreman_gitea_reachable", "1 if the last Gitea probe succeeded"),
    # The outbox.
    _Spec("outbox_depth", Gauge, "foreman_outbox_depth", "Outbox entries by status", ("status",)),
    _Spec("outbox_send_seconds", Histogram, "foreman_outbox_send_seconds", "Time to send and verify one outbox entry",
          ("kind",), buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)),
    _Spec("outbox_retries", Counter, "foreman_outbox_retries_total", "Outbox sends retried after a failure",
          ("kind",)),
    _Spec("outbox_verification_failures", Counter, "foreman_outbox_verification_failures_total",
          "Outbox entries whose read-back did not match", ("kind",)),
    # The worker and the event loop.
    _Spec("worker_loop_errors", Counter, "foreman_worker_loop_errors_total",
          "Failures a worker loop survived (a claim, a pass or a settling commit that raised)"),
    _Spec("worker_loops_alive", Gauge, "foreman_worker_loops_alive",
          "Worker drain loops running (worker.concurrency when healthy)"),
    _Spec("worker_loops_configured", Gauge, "foreman_worker_loops_configured",
          "Worker drain loops the configuration asks for (worker.concurrency): fewer alive is a dead loop"),
    _Spec("worker_settles_retrying", Gauge, "foreman_worker_settles_retrying",
          "Deliveries whose settling commit failed and is being retried (a loop stuck on the database)"),
    _Spec("worker_stood_aside", Counter, "foreman_worker_stood_aside_seconds_total",
          "Seconds the worker's drain loops waited before a claim while the webhook door answered a burst"
          " (worker.intake_burst_per_s; each wait at most worker.max_stand_aside_s)"),
    _Spec("event_loop_lag", Histogram, "foreman_event_loop_lag_seconds",
          "How late the event loop ran a timer: time one callback held the loop",
          buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)),
    _Spec("event_loop_lag_max", Gauge, "foreman_event_loop_lag_max_seconds",
          "The largest event loop lag seen since start"),
    # MCP over HTTP (bot/mcp_http.py); every label from a closed set, never from the request.
    _Spec("mcp_auth_failures", Counter, "foreman_mcp_auth_failures_total",
          "Requests to /mcp refused before any MCP processing, by reason (missing, unknown, throttled, origin)",
          ("reason",)),
    _Spec("mcp_requests", Counter, "foreman_mcp_requests_total", "Authenticated requests to /mcp, by HTTP method",
          ("method",)),
    _Spec("mcp_sessions", Gauge, "foreman_mcp_sessions", "Open MCP sessions over HTTP (every identity and run)"),
    # Catch-up (bot/reconcile.py).
    _Spec("reconcile_last_success", Gauge, "foreman_reconcile_last_success_timestamp_seconds",
          "When the last catch-up pass finished reading Gitea (unix seconds; 0: none in this process)"),
    _Spec("reconcile_found", Counter, "foreman_reconcile_found_total",
          "Events catch-up found in Gitea that no webhook had brought, by kind (issue, comment)", ("kind",)),
    _Spec("reconcile_errors", Counter, "foreman_reconcile_errors_total",
          "Catch-up passes that could not read Gitea (the watermark stayed)"),
    _Spec("reconcile_calls", Counter, "foreman_reconcile_api_calls_total", "Gitea API calls made by catch-up passes"),
    _Spec("reconcile_seconds", Histogram, "foreman_reconcile_seconds", "Time of one catch-up pass",
          buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)),
    # The same per served repository; the label is a configured repository's key, never a payload's.
    _Spec("reconcile_repository_last_success", Gauge, "foreman_reconcile_repository_last_success_timestamp_seconds",
          "When a repository's last catch-up pass finished reading Gitea (unix seconds; 0: none in this process)",
          ("repository",)),
    _Spec("reconcile_repository_found", Counter, "foreman_reconcile_repository_found_total",
          "Events catch-up found in a repository that no webhook had brought, by kind (issue, comment)",
          ("repository", "kind")),
    _Spec("reconcile_repository_errors", Counter, "foreman_reconcile_repository_errors_total",
          "Catch-up passes that could not read a repository (its watermark stayed)", ("repository",)),
    _Spec("reconcile_down_seconds", Gauge, "foreman_reconcile_down_seconds",
          "The window without the service found at start: from the last heartbeat to the start (seconds)"),
    # The build, and the state read from the database at each scrape (refresh_state).
    _Spec("build_info", Gauge, "foreman_build_info", "Always 1; the labels name the running build",
          ("version", "python")),
    _Spec("leases", Gauge, "foreman_leases", "Leases by state (live_expired: still marked live but past its expiry)",
          ("state",)),
    _Spec("leases_stranded", Gauge, "foreman_leases_stranded",
          "Leases still marked live past their expiry plus allocator.lease_grace_s: the stranded-work sweep should"
          " have returned them (it runs with auto-allocation, on each trigger and catch-up pass)"),
    _Spec("review_queue_waiting", Gauge, "foreman_review_queue_waiting",
          "Pull requests the latest queue run of each served repository left waiting for a reviewer (summed)"),
    _Spec("merge_queue_waiting", Gauge, "foreman_merge_queue_waiting",
          "Approved pull requests the latest queue run of each served repository left waiting to be merged (summed;"
          " waiting throughout a long window: the merge queue is stalled)"),
    _Spec("bootstrap_transitions", Gauge, "foreman_bootstrap_transitions", "Bootstrap journal transitions by outcome",
          ("outcome",)),
    _Spec("bootstrap_oldest_open_age", Gauge, "foreman_bootstrap_oldest_open_age_seconds",
          "Age of the oldest open bootstrap transition (0: none)"),
)


class Metrics:
    """The service's metrics, one attribute each, created from :data:`_SPECS` (declared here for the type
    checker; tests/test_metrics_state.py checks the two name the same metrics)."""

    registry: CollectorRegistry
    deliveries: Counter
    handler_errors: Counter
    inbox_depth: Gauge
    processing_seconds: Histogram
    intake_seconds: Histogram
    gitea_reachable: Gauge
    outbox_depth: Gauge
    outbox_send_seconds: Histogram
    outbox_retries: Counter
    outbox_verification_failures: Counter
    worker_loop_errors: Counter
    worker_loops_alive: Gauge
    worker_loops_configured: Gauge
    worker_settles_retrying: Gauge
    worker_stood_aside: Counter
    event_loop_lag: Histogram
    event_loop_lag_max: Gauge
    mcp_auth_failures: Counter
    mcp_requests: Counter
    mcp_sessions: Gauge
    reconcile_last_success: Gauge
    reconcile_found: Counter
    reconcile_errors: Counter
    reconcile_calls: Counter
    reconcile_seconds: Histogram
    reconcile_repository_last_success: Gauge
    reconcile_repository_found: Counter
    reconcile_repository_errors: Counter
    reconcile_down_seconds: Gauge
    build_info: Gauge
    leases: Gauge
    leases_stranded: Gauge
    review_queue_waiting: Gauge
    merge_queue_waiting: Gauge
    bootstrap_transitions: Gauge
    bootstrap_oldest_open_age: Gauge

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for spec in _SPECS:
            setattr(self, spec.attr, spec.build(self.registry))
        # The series that exist from the start, at zero (or, for the build, at 1).
        for reason in MCP_AUTH_REASONS:
            self.mcp_auth_failures.labels(reason)
        for kind in ("issue", "comment"):
            self.reconcile_found.labels(kind)
        self.build_info.labels(version(), platform.python_version()).set(1)

    def serve_repositories(self, keys: list[str]) -> None:
        """Create every served repository's catch-up series at zero (a repository never read still shows)."""
        for key in keys:
            self.reconcile_repository_last_success.labels(key)
            self.reconcile_repository_errors.labels(key)
            for kind in ("issue", "comment"):
                self.reconcile_repository_found.labels(key, kind)

    async def refresh_state(self, db: Database, *, lease_grace_s: float = 0.0,
                            repositories: Sequence[str] = ()) -> None:
        """Lease, queue and journal gauges from the database (read-only, a few queries); called on every scrape.
        ``repositories``: the served repositories whose latest queue run is read."""
        from datetime import timedelta

        from state.auto_allocations import AutoAllocationStore
        from state.db import from_db_time, utcnow
        from state.journal import JournalStore
        from state.leases import LeaseStore

        now = utcnow()
        leases = LeaseStore(db)
        found = await leases.count_by_state(now)
        for state in LEASE_STATES:
            self.leases.labels(state).set(found.get(state, 0))
        stranded = await leases.count_by_state(now - timedelta(seconds=lease_grace_s))
        self.leases_stranded.set(stranded.get("live_expired", 0))
        reviews = merges = 0
        store = AutoAllocationStore(db)
        for repo in repositories:
            latest = await store.recent(repo, limit=1)
            queues = (latest[0].doc.get("queues") or {}) if latest else {}
            reviews += len(queues.get("waiting_review") or [])
            merges += len(queues.get("waiting_merge") or [])
        self.review_queue_waiting.set(reviews)
        self.merge_queue_waiting.set(merges)
        outcomes, oldest = await JournalStore(db).outcome_counts()
        for outcome in JOURNAL_OUTCOMES:
            self.bootstrap_transitions.labels(outcome).set(outcomes.get(outcome, 0))
        self.bootstrap_oldest_open_age.set(max(0.0, (now - from_db_time(oldest)).total_seconds()) if oldest else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def version() -> str:
    """The installed distribution's version (the source tree's pyproject.toml when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("gitea-foreman")
    except metadata.PackageNotFoundError:
        import re
        from pathlib import Path

        text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
        found = re.search(r'^version = "([^"]+)"', text, re.MULTILINE)
        return found.group(1) if found else "unknown"


class LoopLagMonitor:
    """Measures how long the event loop is held: a timer due every ``interval_s`` runs late by exactly the
    time some callback kept the loop. Exported as a histogram and a maximum; a long hold is logged, at most once
    per ``warn_every_s`` (the holds in between are counted into the next line, so a busy machine's log stays
    readable: 834 of 905 lines in 21 minutes were this warning before it was limited)."""

    def __init__(self, metrics: Metrics, *, interval_s: float = 0.02, warn_s: float = 0.05,
                 warn_every_s: float = 60.0) -> None:
        self._metrics = metrics
        self._interval_s = interval_s
        self.max_lag_s = 0.0
        self._task: asyncio.Task[None] | None = None
        self.warnings = HeldWarnings(warn_s=warn_s, every_s=warn_every_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag-monitor")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self.warnings.flush(time.monotonic())

    async def _run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self._interval_s)
            lag = max(0.0, time.perf_counter() - before - self._interval_s)
            self._metrics.event_loop_lag.observe(lag)
            if lag > self.max_lag_s:
                self.max_lag_s = lag
                self._metrics.event_loop_lag_max.set(lag)
            self.warnings.held(lag, time.monotonic())


class HeldWarnings:
    """The "event loop was held" warning, rate-limited: the first hold over ``warn_s`` is logged at once; the
    next ones within ``every_s`` of that line are only counted (with the longest), and the first hold after the
    window logs them all in one line. :meth:`flush` logs what is still counted (at stop)."""

    def __init__(self, *, warn_s: float, every_s: float) -> None:
        self.warn_s = warn_s
        self.every_s = every_s
        self._last_logged: float | None = None
        self._count = 0
        self._longest_s = 0.0

    def held(self, lag_s: float, now: float) -> None:
        if lag_s <= self.warn_s:
            return
        if self._last_logged is not None and now - self._last_logged < self.every_s:
            self._count += 1
            self._longest_s = max(self._longest_s, lag_s)
            return
        if self._count:
            log.warning("the event loop was held for %.0f ms (and %d more time(s) over %.0f ms in the %.0f s before,"
                        " the longest %.0f ms)", lag_s * 1000, self._count, self.warn_s * 1000,
                        now - self._last_logged if self._last_logged is not None else 0.0, self._longest_s * 1000)
        else:
            log.warning("the event loop was held for %.0f ms", lag_s * 1000)
        self._last_logged, self._count, self._longest_s = now, 0, 0.0

    def flush(self, now: float) -> None:
        if self._count:
            log.warning("the event loop was held %d more time(s) over %.0f ms in the last %.0f s, the longest %.0f ms",
                        self._count, self.warn_s * 1000,
                        now - self._last_logged if self._last_logged is not None else 0.0, self._longest_s * 1000)
        self._count, self._longest_s = 0, 0.0
