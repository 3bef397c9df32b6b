"""The worker also stands aside while several admitted deliveries wait for their commit at once (a flood whose
arrival rate dips whenever the door stalls), within the same bound; the door's count of them returns to zero whatever
each commit answers (bot/core/intake_burst.py, bot/intake.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bot.core.intake import Delivery
from bot.core.intake_burst import ArrivalWindow, BurstPolicy, stand_aside_for
from state.deliveries import InsertResult
from tests.support import Started, make_settings, payload, webhook_headers

POLICY = BurstPolicy(burst_per_s=200.0, window_s=0.1, max_stand_aside_s=0.2, storing_burst=4)


def _storing(count: int, policy: BurstPolicy = POLICY) -> ArrivalWindow:
    window = ArrivalWindow(policy)
    for _ in range(count):
        window.storing_began()
    return window


def test_several_deliveries_waiting_for_their_commit_are_a_burst_without_any_recent_arrival() -> None:
    assert not _storing(3).in_burst(100.0)  # fewer than storing_burst: Gitea's steady traffic
    window = _storing(4)
    assert window.in_burst(100.0)  # no arrival recorded in any window: the commits alone make it a burst
    assert stand_aside_for(window, now=100.0, since=100.0) == POLICY.window_s / 4
    assert stand_aside_for(window, now=100.0, since=100.0 - POLICY.max_stand_aside_s) == 0.0  # the same bound
    window.storing_ended()
    assert window.storing == 3 and not window.in_burst(100.0)
    for _ in range(5):
        window.storing_ended()
    assert window.storing == 0  # never below zero


def test_standing_aside_off_ignores_the_commits_too() -> None:
    for policy in (BurstPolicy(burst_per_s=0.0), BurstPolicy(max_stand_aside_s=0.0)):
        window = _storing(50, policy)
        assert not window.in_burst(1.0)
        assert stand_aside_for(window, now=1.0, since=1.0) == 0.0


async def test_the_door_counts_each_delivery_until_its_commit_answers(tmp_path: Path, start: Started) -> None:
    service, client = await start(make_settings(tmp_path))
    window = service.intake_window
    seen: list[int] = []
    submit = service.intake.writer.submit

    async def watched(delivery: Delivery, is_self: bool) -> InsertResult:
        seen.append(window.storing)
        return await submit(delivery, is_self)

    service.intake.writer.submit = watched  # type: ignore[method-assign]
    bodies = [payload(number=n + 1) for n in range(6)]
    answers = await asyncio.gather(*(client.post("/webhook", data=b, headers=webhook_headers(b, delivery=f"s-{n}"))
                                     for n, b in enumerate(bodies)))
    assert {a.status for a in answers} == {202}
    assert seen and min(seen) >= 1  # counted while its commit was awaited
    assert window.storing == 0  # and not after

    async def failing(delivery: Delivery, is_self: bool) -> InsertResult:
        raise OSError("disk full")

    service.intake.writer.submit = failing  # type: ignore[method-assign]
    body = payload(number=99)
    refused = await client.post("/webhook", data=body, headers=webhook_headers(body, delivery="s-fail"))
    assert refused.status == 503
    assert window.storing == 0  # a commit that failed is no longer waited for either
