"""/metrics: Prometheus' content type, build info, lease, journal and outbox gauges read at each scrape."""

from __future__ import annotations

import platform
from datetime import timedelta
from importlib import metadata
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from state.db import utcnow
from state.leases import LeaseStore
from state.outbox import OutboxIntent
from tests.support import Started, make_settings


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_metrics_carry_build_info_and_state_gauges(tmp_path: Path, start: Started) -> None:
    service, client = await start(make_settings(tmp_path, repository={"owner": "org", "name": "repo"}))
    store = LeaseStore(service.db)
    now = utcnow()
    async with service.db.transaction() as conn:
        await store.acquire(conn, repo="org/repo", issue_number=1, owner="a", role="author", action="implement",
                            ttl=timedelta(hours=1), now=now, actor="t", fingerprint=None, request={})
        await store.acquire(conn, repo="org/repo", issue_number=2, owner="b", role="author", action="implement",
                            ttl=timedelta(hours=1), now=now - timedelta(hours=2), actor="t", fingerprint=None,
                            request={})
    await service.outbox.add(OutboxIntent("m:labels", 1, "labels", {"add": ["x"], "remove": []}), repo="org/repo")
    resp = await client.get("/metrics")
    assert resp.status == 200
    # The exposition format generate_latest writes, named with its version (as prometheus_client serves it).
    assert resp.headers["Content-Type"] == CONTENT_TYPE_LATEST
    assert CONTENT_TYPE_LATEST.startswith("text/plain; version=")
    got = _samples(await resp.text())
    build = [labels for (name, labels) in got if name == "foreman_build_info"]
    assert build == [(("python", platform.python_version()), ("version", metadata.version("gitea-foreman")))]
    assert got[("foreman_leases", (("state", "live"),))] == 1
    assert got[("foreman_leases", (("state", "live_expired"),))] == 1
    assert got[("foreman_leases", (("state", "released"),))] == 0
    for outcome in ("open", "completed", "compensated"):
        assert got[("foreman_bootstrap_transitions", (("outcome", outcome),))] == 0
    assert got[("foreman_bootstrap_oldest_open_age_seconds", ())] == 0
    assert got[("foreman_outbox_depth", (("status", "pending"),))] == 1
    # The next scrape sees the release.
    lease = await store.live_for_issue("org/repo", 1)
    assert lease is not None
    async with service.db.transaction() as conn:
        await store.release(conn, lease.lease_id, actor="a", reason="done", now=utcnow())
    got = _samples(await (await client.get("/metrics")).text())
    assert got[("foreman_leases", (("state", "live"),))] == 0
    assert got[("foreman_leases", (("state", "released"),))] == 1


def test_every_metric_is_declared_as_an_attribute_of_its_kind() -> None:
    """bot/metrics.py's table and the attributes it declares for the type checker name the same metrics."""
    from bot.metrics import _SPECS, Metrics

    declared = {name: kind for name, kind in Metrics.__annotations__.items() if name != "registry"}
    assert {spec.attr: spec.kind.__name__ for spec in _SPECS} == declared
    assert len({spec.name for spec in _SPECS}) == len(_SPECS)
    assert all(spec.buckets is not None for spec in _SPECS if spec.kind.__name__ == "Histogram")
