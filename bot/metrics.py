"""Prometheus metrics, one registry per running app (so tests can run several side by side)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.deliveries = Counter(
            "foreman_deliveries_total",
            "Webhook deliveries by event and outcome (queued, duplicate, ignored_self, rejected_*,"
            " done, retry, failed)",
            ["event", "outcome"],
            registry=self.registry,
        )
        self.handler_errors = Counter(
            "foreman_handler_errors_total", "Handler failures by handler", ["handler"], registry=self.registry
        )
        self.inbox_depth = Gauge(
            "foreman_inbox_depth", "Stored deliveries by status", ["status"], registry=self.registry
        )
        self.processing_seconds = Histogram(
            "foreman_processing_seconds",
            "Time from claim to settle of one delivery",
            ["event"],
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.intake_seconds = Histogram(
            "foreman_intake_seconds",
            "Time to verify, store and answer one webhook request",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5),
        )
        self.gitea_reachable = Gauge(
            "foreman_gitea_reachable", "1 if the last Gitea probe succeeded", registry=self.registry
        )

        self.outbox_depth = Gauge(
            "foreman_outbox_depth", "Outbox entries by status", ["status"], registry=self.registry
        )
        self.outbox_send_seconds = Histogram(
            "foreman_outbox_send_seconds",
            "Time to send and verify one outbox entry",
            ["kind"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.outbox_retries = Counter(
            "foreman_outbox_retries_total", "Outbox sends retried after a failure", ["kind"], registry=self.registry
        )
        self.outbox_verification_failures = Counter(
            "foreman_outbox_verification_failures_total",
            "Outbox entries whose read-back did not match",
            ["kind"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
