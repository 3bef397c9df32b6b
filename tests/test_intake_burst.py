"""The worker stands aside while the webhook door answers a burst of signed deliveries, and never for longer than
its bound; a steady stream never makes it wait (bot/core/intake_burst.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bot.core.intake_burst import ArrivalWindow, BurstPolicy, stand_aside_for
from tests.support import Started, make_settings, payload, wait_status, webhook_headers

POLICY = BurstPolicy(burst_per_s=200.0, window_s=0.1, max_stand_aside_s=0.2)


def _window(times: list[float], policy: BurstPolicy = POLICY) -> ArrivalWindow:
    window = ArrivalWindow(policy)
    for moment in times:
        window.arrived(moment)
    return window


def test_a_burst_is_the_policy_s_count_of_arrivals_within_one_window() -> None:
    assert POLICY.burst_count == 20
    burst = [10.0 + i * 0.004 for i in range(20)]  # 20 in 76 ms: 263/s
    assert _window(burst).in_burst(burst[-1])
    assert _window(burst).in_burst(burst[0] + 0.1)  # the oldest of the 20 still within the window
    assert not _window(burst).in_burst(burst[0] + 0.1001)  # ... and now it is not
    assert not _window(burst[:19]).in_burst(burst[18])  # one short of the count
    steady = [10.0 + i * 0.02 for i in range(200)]  # 50/s for 4 s: Gitea's steady traffic
    assert not any(_window(steady[: i + 1]).in_burst(t) for i, t in enumerate(steady))


def test_standing_aside_is_bounded_and_short_steps() -> None:
    burst = [10.0 + i * 0.001 for i in range(20)]
    window = _window(burst)
    now = burst[-1]
    assert stand_aside_for(window, now=now, since=now) == POLICY.window_s / 4
    assert stand_aside_for(window, now=now, since=now - 0.19) == stand_aside_for(window, now=now, since=now - 0.19)
    assert 0 < stand_aside_for(window, now=now, since=now - 0.19) <= 0.01 + 1e-9
    assert stand_aside_for(window, now=now, since=now - POLICY.max_stand_aside_s) == 0.0  # the bound: claim now
    assert stand_aside_for(_window(burst[:5]), now=now, since=now) == 0.0  # no burst: claim now


def test_a_zero_rate_or_zero_bound_never_stands_aside() -> None:
    burst = [10.0 + i * 0.0001 for i in range(50)]
    for policy in (BurstPolicy(burst_per_s=0.0), BurstPolicy(max_stand_aside_s=0.0)):
        window = _window(burst, policy)
        assert not window.in_burst(burst[-1])
        assert stand_aside_for(window, now=burst[-1], since=burst[-1]) == 0.0


async def _keep_bursting(window: ArrivalWindow, stop: asyncio.Event, started: asyncio.Event) -> None:
    """Admissions at ~1,000/s (as a burst of signed webhooks would record them) until told to stop."""
    while not stop.is_set():
        for _ in range(5):
            window.arrived(time.monotonic())
        if window.in_burst(time.monotonic()):
            started.set()
        await asyncio.sleep(0.005)


async def _burst(window: ArrivalWindow, stop: asyncio.Event) -> asyncio.Task[None]:
    """The burst's task, once the window says it is one."""
    started = asyncio.Event()
    task = asyncio.create_task(_keep_bursting(window, stop, started))
    await started.wait()
    return task


async def test_the_worker_waits_out_a_burst_then_takes_what_was_stored(tmp_path: Path, start: Started) -> None:
    service, client = await start(make_settings(tmp_path))
    # A one-second window (20 arrivals in it make a burst), so that a loaded machine's pauses never end the burst.
    window = ArrivalWindow(BurstPolicy(burst_per_s=20.0, window_s=1.0, max_stand_aside_s=5.0))
    service.intake_window = service.worker.intake = window
    stop = asyncio.Event()
    burst = await _burst(service.intake_window, stop)
    try:
        body = payload()
        resp = await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="d-burst"))
        assert resp.status == 202  # stored and answered during the burst
        await asyncio.sleep(0.4)  # several of the worker's polls (0.05 s) while the burst lasts
        row = await service.store.get("d-burst")
        assert row is not None and row.status == "queued"
    finally:
        stop.set()
        await burst
    await wait_status(service, "d-burst", "done")
    stood = service.metrics.registry.get_sample_value("foreman_worker_stood_aside_seconds_total")
    assert stood is not None and stood > 0.3


async def test_a_burst_that_never_ends_still_lets_the_worker_claim(tmp_path: Path, start: Started) -> None:
    """The bound: each loop claims at least once per max_stand_aside_s, however long the flood lasts."""
    settings = make_settings(tmp_path, worker={"intake_burst_per_s": 200.0, "max_stand_aside_s": 0.05})
    service, client = await start(settings)
    stop = asyncio.Event()
    burst = await _burst(service.intake_window, stop)
    try:
        for n in range(3):
            body = payload(number=n + 1)
            resp = await client.post("/webhook", data=body, headers=webhook_headers(body, delivery=f"d-flood-{n}"))
            assert resp.status == 202
        for n in range(3):
            await wait_status(service, f"d-flood-{n}", "done")
    finally:
        stop.set()
        await burst


async def test_a_steady_stream_never_makes_the_worker_wait(tmp_path: Path, start: Started) -> None:
    service, client = await start(make_settings(tmp_path))
    for n in range(8):  # one at a time, each answered before the next: far below 200/s of admissions
        body = payload(number=n + 1)
        resp = await client.post("/webhook", data=body, headers=webhook_headers(body, delivery=f"d-steady-{n}"))
        assert resp.status == 202
        await wait_status(service, f"d-steady-{n}", "done")
        await asyncio.sleep(0.02)
    assert service.metrics.registry.get_sample_value("foreman_worker_stood_aside_seconds_total") == 0.0


async def test_only_signed_deliveries_count_towards_a_burst(tmp_path: Path, start: Started) -> None:
    """A flood of requests without the webhook secret is refused and never makes the worker stand aside."""
    service, client = await start(make_settings(tmp_path))
    bodies = [payload(number=n + 1) for n in range(30)]

    async def post(n: int, signed: bool) -> int:
        headers = webhook_headers(bodies[n], delivery=f"d-{signed}-{n}")
        if not signed:
            headers["X-Gitea-Signature"] = "0" * 64
        resp = await client.post("/webhook", data=bodies[n], headers=headers)
        return resp.status

    before = time.monotonic()
    assert set(await asyncio.gather(*(post(n, False) for n in range(30)))) == {401}
    assert service.intake_window.recent == ()
    assert set(await asyncio.gather(*(post(n, True) for n in range(30)))) == {202}
    recent = service.intake_window.recent
    assert len(recent) == service.intake_window.policy.burst_count and min(recent) > before
