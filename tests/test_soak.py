"""A bounded soak: a real `foreman serve` takes 2,000 deliveries, 5% malformed, and a 48 KB hostile comment."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp

from tests.support import payload, raw_post, signed_headers
from tests.test_process import ServeProcess

DELIVERIES = 2_000
MALFORMED_SHARE = 0.05
SEED = 1212


def _hostile_comment() -> bytes:
    doc = json.loads(payload())
    doc.update(action="created", comment={"id": 77, "body": "# a" + " " * 48_000 + "x", "user": {"login": "reader"},
                                          "created_at": "2026-12-01T10:00:00Z", "updated_at": "2026-12-01T10:00:00Z"})
    return json.dumps(doc, indent=2).encode()


def _malformed(rng: random.Random, i: int) -> tuple[str, list[tuple[bytes, bytes]], bytes]:
    """One malformed delivery: (its kind, raw headers, body). Each kind once broke a neighbour or a loop."""
    body = payload(number=10_000 + i)
    kind = rng.choice(["unroutable", "bad_header", "surrogate", "deep", "bad_signature", "foreign"])
    delivery = f"bad-{i}"
    if kind == "unroutable":
        doc = json.loads(body)
        doc["action"] = []
        body = json.dumps(doc, indent=2).encode()
    elif kind == "surrogate":
        body = body.replace(b'"opened"', b'"op\\ud800ened"')
    elif kind == "deep":
        body = b"[" * 2000 + b"]" * 2000
    elif kind == "foreign":
        doc = json.loads(body)
        doc["repository"]["full_name"] = "elsewhere/other"
        body = json.dumps(doc, indent=2).encode()
    headers = signed_headers(body, delivery=delivery, event=b"issu\xffes" if kind == "bad_header" else b"issues")
    if kind == "bad_signature":
        headers = [(k, b"0" * 64 if k == b"X-Gitea-Signature" else v) for k, v in headers]
    return kind, headers, body


async def test_a_soak_of_2000_deliveries_with_malformed_ones_loses_nothing_and_freezes_nothing(tmp_path: Path) -> None:
    """Every valid delivery is stored once and processed, /healthz answers within 100 ms all the while, and every
    worker loop is alive at the end."""
    proc = ServeProcess(tmp_path, module="bot")
    await proc.start("serve", "--config", str(proc.config))
    rng = random.Random(SEED)
    valid: dict[str, bytes] = {}
    plan: list[tuple[str, list[tuple[bytes, bytes]], bytes]] = []
    for i in range(DELIVERIES):
        if rng.random() < MALFORMED_SHARE:
            plan.append(_malformed(rng, i))
        else:
            body = payload(rng.choice(["opened", "label_updated", "closed", "reopened"]), number=i + 1)
            plan.append(("valid", signed_headers(body, delivery=f"ok-{i}"), body))
            valid[f"ok-{i}"] = body
    hostile = _hostile_comment()
    hostile_headers = signed_headers(hostile, delivery="hostile", event=b"issue_comment")
    plan.insert(DELIVERIES // 2, ("valid", hostile_headers, hostile))
    valid["hostile"] = hostile

    health: list[float] = []
    stop = threading.Event()

    def probe() -> None:
        """In a thread of its own, so that this test's own client loop (2,000 sends) never delays a probe."""
        while not stop.is_set():
            began = time.perf_counter()
            with urllib.request.urlopen(f"{proc.url}/healthz", timeout=5) as resp:  # noqa: S310 (loopback)
                assert resp.status == 200
            health.append(time.perf_counter() - began)
            time.sleep(0.02)

    semaphore = asyncio.Semaphore(16)
    answers: dict[str, int] = {}

    async def send(kind: str, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        async with semaphore:
            status, doc = await raw_post(proc.port, headers, body)
        delivery = dict(headers)[b"X-Gitea-Delivery"].decode()
        answers[delivery] = status
        if kind == "valid" or kind in ("unroutable", "foreign"):
            assert status == 202, (kind, status, doc)
        else:
            assert status in (400, 401), (kind, status, doc)

    try:
        async with aiohttp.ClientSession() as session:
            prober = threading.Thread(target=probe, name="healthz-probe")
            prober.start()
            await asyncio.gather(*(send(*item) for item in plan))

            def settled() -> bool:
                with sqlite3.connect(proc.db) as conn:
                    open_rows: int = conn.execute(
                        "SELECT COUNT(*) FROM deliveries WHERE status IN ('queued', 'processing')"
                    ).fetchone()[0]
                return open_rows == 0

            await proc.wait_for(settled, "the inbox drained", timeout=120)
            stop.set()
            await asyncio.to_thread(prober.join)
            async with session.get(f"{proc.url}/readyz") as resp:
                ready = await resp.json()
    finally:
        stop.set()  # never leave the probe thread running if the test failed before its end
        await proc.kill()

    with sqlite3.connect(proc.db) as conn:
        rows = {d: (s, b) for d, s, b in conn.execute("SELECT delivery_id, status, body FROM deliveries")}
    assert {d for d in valid} <= set(rows)
    assert all(rows[d] == ("done", body) for d, body in valid.items()), [d for d in valid if rows[d][0] != "done"]
    stored_bad = {d: s for d, (s, _b) in rows.items() if d.startswith("bad-")}
    assert set(stored_bad.values()) <= {"failed", "ignored"}, stored_bad
    assert ready["ready"] is True and ready["checks"]["worker"]["loops_alive"] == ready["checks"]["worker"]["loops"]
    # The service's own measure of how long anything held its loop, over the whole soak: under 100 ms.
    lag_max = float(ready["checks"]["event_loop"]["lag_max_s"])
    assert lag_max < 0.1, lag_max
    # Seen from outside, every /healthz answered within 100 ms but for rare outliers of a machine that CI shares
    # with other processes (a probe's own connect, the scheduler): the 99th percentile is held to 100 ms, and no
    # probe may reach a second (a frozen service would fail both).
    ordered = sorted(health)
    p99 = ordered[int(0.99 * (len(ordered) - 1))]
    assert len(health) > 20 and p99 < 0.1 and ordered[-1] < 1.0, (len(health), p99, ordered[-1])
    print(f"soak: {len(plan)} deliveries ({len(plan) - len(valid)} malformed), {len(valid)} valid all done once, "
          f"/healthz {len(health)} probes, p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms; "
          f"service loop lag max {lag_max * 1000:.1f} ms")
