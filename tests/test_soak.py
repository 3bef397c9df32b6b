"""A bounded soak: a real `foreman serve` takes 2,000 deliveries, 5% malformed, and 48 KB hostile comments."""

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
import pytest

from tests.serve_support import ServeProcess
from tests.support import PROBE_S, payload, raw_post, signed_headers
from tests.test_fuzz_intake import LONG_HOLD_S, lag_buckets, long_holds, worst_lag

pytestmark = [pytest.mark.process, pytest.mark.slow]

DELIVERIES = 2_000
MALFORMED_SHARE = 0.05
SEED = 1212
ROUNDS = 5


def _hostile_comment(round_: int) -> bytes:
    doc = json.loads(payload())
    comment = {"id": 77 + round_, "body": "# a" + " " * 48_000 + "x", "user": {"login": "reader"},
               "created_at": "2026-12-01T10:00:00Z", "updated_at": "2026-12-01T10:00:00Z"}
    doc.update(action="created", comment=comment)
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


async def test_a_soak_of_2000_deliveries_with_malformed_ones_loses_nothing_and_keeps_answering(tmp_path: Path) -> None:
    """Every valid delivery is stored once and processed, the malformed ones are refused or parked, /healthz answers
    all the while (each probe within PROBE_S, a frozen loop never answers), and every worker loop is alive at the end.

    No time is asserted. The deliveries go in ``ROUNDS`` pairs of windows: one of valid deliveries only, then one
    as large with the malformed ones (twice ``MALFORMED_SHARE``, so 5% overall) and a 48 KB hostile comment. The
    service's lag histogram (holds of its loop over ``LONG_HOLD_S`` per window) and the probes slower than that are
    printed as figures: how long a loop is held depends on the machine. That a hostile body costs no more work than a
    benign one is asserted where it is counted (tests/test_fuzz_intake.py, tests/test_fail_closed_input.py)."""
    proc = ServeProcess(tmp_path)
    rng = random.Random(SEED)
    valid: dict[str, bytes] = {}
    size = DELIVERIES // (2 * ROUNDS)
    windows: list[list[tuple[str, list[tuple[bytes, bytes]], bytes]]] = []
    for round_ in range(ROUNDS):
        for hostile in (False, True):
            plan: list[tuple[str, list[tuple[bytes, bytes]], bytes]] = []
            for i in range(len(windows) * size, (len(windows) + 1) * size):
                if hostile and rng.random() < 2 * MALFORMED_SHARE:
                    plan.append(_malformed(rng, i))
                else:
                    body = payload(rng.choice(["opened", "label_updated", "closed", "reopened"]), number=i + 1)
                    plan.append(("valid", signed_headers(body, delivery=f"ok-{i}"), body))
                    valid[f"ok-{i}"] = body
            if hostile:
                comment = _hostile_comment(round_)
                plan.insert(size // 2, ("valid", signed_headers(comment, delivery=f"hostile-{round_}",
                                                                event=b"issue_comment"), comment))
                valid[f"hostile-{round_}"] = comment
            windows.append(plan)

    health: list[tuple[int, float]] = []  # (window, seconds)
    current = [0]
    stop = threading.Event()

    def probe() -> None:
        """In a thread of its own, so that this test's own client loop (2,000 sends) never delays a probe."""
        while not stop.is_set():
            window = current[0]
            began = time.perf_counter()
            with urllib.request.urlopen(f"{proc.url}/healthz", timeout=PROBE_S) as resp:  # noqa: S310 (loopback)
                assert resp.status == 200
            health.append((window, time.perf_counter() - began))
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

    def settled() -> bool:
        with sqlite3.connect(proc.db) as conn:
            open_rows: int = conn.execute(
                "SELECT COUNT(*) FROM deliveries WHERE status IN ('queued', 'processing')"
            ).fetchone()[0]
        return open_rows == 0

    lag: list[tuple[float, int]] = []  # per window: (worst loop lag, long holds)
    try:
        await proc.serve()
        async with aiohttp.ClientSession() as session:

            async def metrics() -> str:
                async with session.get(f"{proc.url}/metrics") as resp:
                    assert resp.status == 200
                    return await resp.text()

            prober = threading.Thread(target=probe, name="healthz-probe")
            prober.start()
            for index, plan in enumerate(windows):
                current[0] = index
                before = lag_buckets(await metrics())
                await asyncio.gather(*(send(*item) for item in plan))
                await proc.wait_for(settled, "the inbox drained")
                await asyncio.sleep(0.05)  # the lag monitor's next tick sees a hold that ended just now
                after = lag_buckets(await metrics())
                lag.append((worst_lag(before, after), long_holds(before, after)))
            stop.set()
            await asyncio.to_thread(prober.join)
            async with session.get(f"{proc.url}/readyz") as resp:
                ready = await resp.json()
    finally:
        stop.set()  # never leave the probe thread running if the test failed before its end
        await proc.stop()

    with sqlite3.connect(proc.db) as conn:
        rows = {d: (s, b) for d, s, b in conn.execute("SELECT delivery_id, status, body FROM deliveries")}
    assert {d for d in valid} <= set(rows)
    assert all(rows[d] == ("done", body) for d, body in valid.items()), [d for d in valid if rows[d][0] != "done"]
    stored_bad = {d: s for d, (s, _b) in rows.items() if d.startswith("bad-")}
    assert set(stored_bad.values()) <= {"failed", "ignored"}, stored_bad
    assert ready["ready"] is True and ready["checks"]["worker"]["loops_alive"] == ready["checks"]["worker"]["loops"]
    # Seen from outside: probes answered all the while (each within PROBE_S). The slow ones per window, and
    # the service's own holds of its loop, are figures (printed), not pass/fail.
    slow = [sum(1 for w, s in health if w == index and s > LONG_HOLD_S) for index in range(len(windows))]
    assert len(health) > 20, len(health)
    slowest = max(s for _, s in health)
    print(f"soak: {sum(map(len, windows))} deliveries ({sum(map(len, windows)) - len(valid)} malformed), "
          f"{len(valid)} valid all done once, /healthz {len(health)} probes (slowest {slowest * 1000:.1f} ms, over "
          f"{LONG_HOLD_S} s per window {slow}); per window (worst loop lag s, holds over {LONG_HOLD_S} s): {lag}")
