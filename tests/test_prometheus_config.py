"""config/foreman-alerts.yml and config/foreman-grafana.json (issue 34 item 2) name only what foreman exports: every
metric of every alert expression and dashboard query is in a real /metrics scrape, every label matcher, grouping and
legend names one of its labels, and every matched value is one the service exports. `promtool check rules` runs too
where promtool is installed (it is not a dependency)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.metrics import _SPECS
from state.auto_allocations import AutoAllocationStore
from state.db import utcnow
from state.leases import LeaseStore
from tests.conftest import REPO_ROOT
from tests.support import Started, make_settings

ALERTS = REPO_ROOT / "config" / "foreman-alerts.yml"
BOARD = REPO_ROOT / "config" / "foreman-grafana.json"
#: The alerts issue 34 asks for, by what they watch.
WANTED = {"ForemanGiteaUnreachable", "ForemanCatchUpStale", "ForemanOutboxParked", "ForemanWorkerLoopDead",
          "ForemanLeaseStranded", "ForemanMergeQueueStalled"}
#: Labels Prometheus itself puts on every scraped series (a board may group or name them).
TARGET_LABELS = {"instance", "job"}
_SELECTOR = re.compile(r"\b(foreman_[a-zA-Z0-9_:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_TEMPLATE = re.compile(r"\{\{\s*\$?(?:labels\.)?(\w+)\s*\}\}")


def alert_rules() -> list[dict[str, Any]]:
    text = "".join(line for line in ALERTS.read_text(encoding="utf-8").splitlines(keepends=True)
                   if not line.startswith("#"))
    doc = json.loads(text)  # JSON is YAML: what Prometheus reads, read here without a YAML library
    return [rule for group in doc["groups"] for rule in group["rules"]]


def board_queries() -> list[tuple[str, str]]:
    """Every (expression, legend) of the dashboard's panels."""
    board = json.loads(BOARD.read_text(encoding="utf-8"))
    return [(t["expr"], t.get("legendFormat", "")) for p in board["panels"] for t in p.get("targets", [])]


class Exported:
    """What a real /metrics answered: each sample name with its family's label names and the values seen."""

    def __init__(self, text: str) -> None:
        labels_of = {spec.name.removesuffix("_total"): set(spec.labels) for spec in _SPECS}
        self.labels: dict[str, set[str]] = {}
        self.values: dict[tuple[str, str], set[str]] = {}
        for family in text_string_to_metric_families(text):
            if family.name not in labels_of:  # prometheus_client's own *_created series
                assert family.name.endswith("_created"), family.name
                continue
            names = {family.name, f"{family.name}_total"} if family.type == "counter" else {family.name}
            if family.type == "histogram":
                names |= {f"{family.name}_bucket", f"{family.name}_count", f"{family.name}_sum"}
            for name in names:
                self.labels[name] = labels_of[family.name] | ({"le"} if name.endswith("_bucket") else set())
            for sample in family.samples:
                for label, value in sample.labels.items():
                    self.values.setdefault((sample.name, label), set()).add(value)

    def problems(self, expr: str, extra: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
        """What in ``expr`` (plus the names in ``extra``: legends, annotations) foreman does not export."""
        found: list[str] = []
        used: set[str] = set()
        for name, braces in _SELECTOR.findall(expr):
            if name not in self.labels:
                found.append(f"{name} is not exported")
                continue
            used |= self.labels[name]
            for label, op, value in _MATCHER.findall(braces or ""):
                if label not in self.labels[name]:
                    found.append(f"{name} has no label {label} (it has {sorted(self.labels[name])})")
                    continue
                seen = self.values.get((name, label), set())
                wanted = value.split("|") if op in ("=~", "!~") else [value]
                found += [f"{name}{{{label}}} never takes the value {v!r} (seen {sorted(seen)})"
                          for v in wanted if v not in seen]
        for grouping in _GROUPING.findall(expr):
            for label in filter(None, (part.strip() for part in grouping.split(","))):
                if label not in used | TARGET_LABELS:
                    found.append(f"grouping by {label}: none of {sorted(used)}")
        found += [f"{label} is not a label of the expression's series ({sorted(used)})"
                  for label in extra if label not in used | TARGET_LABELS | {"value"}]
        return found


@pytest.fixture
async def exported(tmp_path: Path, start: Started) -> Exported:
    """A started service's real /metrics, with a live lease, a stranded one, and a queue run that left a merge
    waiting (the series the rules watch, at values that are not zero)."""
    service, client = await start(make_settings(tmp_path, repository={"owner": "org", "name": "repo"}))
    now = utcnow()
    store = LeaseStore(service.db)
    async with service.db.transaction() as conn:
        await store.acquire(conn, repo="org/repo", issue_number=1, owner="a", role="author", action="implement",
                            ttl=timedelta(hours=1), now=now, actor="t", fingerprint=None, request={})
        await store.acquire(conn, repo="org/repo", issue_number=2, owner="b", role="author", action="implement",
                            ttl=timedelta(hours=1), now=now - timedelta(hours=2), actor="t", fingerprint=None,
                            request={})
    await AutoAllocationStore(service.db).record(
        "org/repo", decided_at=now, trigger="test", delivery_id=None,
        doc={"queues": {"waiting_review": [3], "waiting_merge": [4, 5]}})
    resp = await client.get("/metrics")
    assert resp.status == 200
    text = await resp.text()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    # The new series the rules need, at what the database holds.
    assert samples[("foreman_leases_stranded", ())] == 1
    assert samples[("foreman_merge_queue_waiting", ())] == 2 and samples[("foreman_review_queue_waiting", ())] == 1
    assert samples[("foreman_worker_loops_configured", ())] == service.settings.worker.concurrency
    assert samples[("foreman_worker_loops_alive", ())] == service.settings.worker.concurrency
    return Exported(text)


async def test_every_alert_names_only_what_foreman_exports(exported: Exported) -> None:
    """Issue 34 item 2: the six alerts, each with a duration, a severity, a summary and a description; every metric,
    label and value in its expression exported, every label its annotations name one of the expression's."""
    rules = alert_rules()
    assert {rule["alert"] for rule in rules} == WANTED
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"\d+[smh]", rule["for"]) and rule["labels"]["severity"] in ("page", "warning"), rule
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule
        named = set(_TEMPLATE.findall(rule["annotations"]["summary"] + rule["annotations"]["description"]))
        assert not exported.problems(rule["expr"], named), (rule["alert"], exported.problems(rule["expr"], named))
    # Prometheus' own check where it is installed (Debian's prometheus is ~100 MB: not installed by .ci/run, and not a
    # skip, which CI fails on).
    if shutil.which("promtool") is not None:
        done = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True,
                              check=False, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr


async def test_every_dashboard_query_names_only_what_foreman_exports(exported: Exported) -> None:
    """The Grafana board: unique panel ids and refIds, a datasource variable, and every query and legend checked as
    the alerts are; it shows each alert's signal."""
    board = json.loads(BOARD.read_text(encoding="utf-8"))
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)) and board["uid"] and board["schemaVersion"] >= 30
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    for panel in board["panels"]:
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)) and {"x", "y", "w", "h"} <= panel["gridPos"].keys(), panel
    queries = board_queries()
    for expr, legend in queries:
        named = set(_TEMPLATE.findall(legend))
        assert not exported.problems(expr, named), (expr, exported.problems(expr, named))
    shown = " ".join(expr for expr, _ in queries)
    for rule in alert_rules():
        assert all(name in shown for name, _ in _SELECTOR.findall(rule["expr"])), rule["alert"]


def test_the_checker_finds_what_is_not_exported() -> None:
    """The parser test fails on the mistakes it is there for: an unknown metric, label, value or grouping."""
    exported = Exported('# HELP foreman_outbox_depth x\n# TYPE foreman_outbox_depth gauge\n'
                        'foreman_outbox_depth{status="parked"} 1.0\n')
    assert exported.problems('foreman_outbox_depth{status="parked"} > 0') == []
    assert exported.problems("foreman_outbox_parked > 0") == ["foreman_outbox_parked is not exported"]
    assert "has no label kind" in exported.problems('foreman_outbox_depth{kind="x"}')[0]
    assert "never takes the value 'stuck'" in exported.problems('foreman_outbox_depth{status=~"parked|stuck"}')[0]
    assert exported.problems("sum by (repository) (foreman_outbox_depth)") == [
        "grouping by repository: none of ['status']"]
