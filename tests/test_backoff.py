"""The one backoff helper: exponential growth, its two jitter styles, the cap, and the Gitea transport on it."""

from __future__ import annotations

import math
import random

import aiohttp
import pytest

from bot.core.backoff import Jitter, delay
from bot.gitea.transport import RetryingAPI


def test_equal_jitter_is_half_fixed_half_random_and_doubles_per_attempt() -> None:
    """The Gitea transport's style: the delay lies in [ceiling/2, ceiling] with ceiling = base * 2**(attempt-1)."""
    rng = random.Random(3)
    for attempt in range(1, 10):
        ceiling = 0.2 * 2.0 ** (attempt - 1)
        delays = [delay(attempt, base=0.2, jitter="equal", rng=rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 8, "no jitter"


def test_equal_jitter_draws_exactly_like_the_old_gitea_formula() -> None:
    """Same random stream, same delays: ``ceiling / 2 + uniform(0, ceiling / 2)``."""
    for attempt in range(1, 8):
        ceiling = 0.5 * (2.0 ** (attempt - 1))
        expected = ceiling / 2 + random.Random(attempt).uniform(0, ceiling / 2)
        assert delay(attempt, base=0.5, jitter="equal", rng=random.Random(attempt)) == expected


def test_full_jitter_is_uniform_up_to_the_capped_ceiling_with_a_floor_of_half_the_base() -> None:
    """The worker's style: ``max(base/2, uniform(0, min(cap, base * 2**(attempt-1))))``."""
    for attempt in range(1, 12):
        ceiling = min(30.0, 1.0 * 2 ** (attempt - 1))
        expected = max(0.5, random.Random(attempt).uniform(0, ceiling))
        assert delay(attempt, base=1.0, cap=30.0, jitter="full", rng=random.Random(attempt)) == expected
    rng = random.Random(7)
    assert all(0.5 <= delay(9, base=1.0, cap=30.0, jitter="full", rng=rng) <= 30.0 for _ in range(200))


@pytest.mark.parametrize("jitter", ["equal", "full"])
def test_the_cap_bounds_every_delay_and_huge_attempts_stay_finite(jitter: Jitter) -> None:
    """A retry counted for days must not overflow a float (2**1024 does)."""
    for attempt in (50, 1_100, 10**6):
        value = delay(attempt, base=0.5, cap=300.0, jitter=jitter, rng=random.Random(1))
        assert math.isfinite(value)
        assert 0 < value <= 300.0
    assert math.isfinite(delay(10**6, base=0.5, jitter=jitter))


def test_attempt_zero_or_below_counts_as_the_first() -> None:
    assert delay(0, base=1.0, jitter="equal", rng=random.Random(5)) == delay(
        1, base=1.0, jitter="equal", rng=random.Random(5)
    )


async def test_the_gitea_transport_backs_off_through_the_helper() -> None:
    """``RetryingAPI.backoff`` is ``delay(..., jitter="equal")`` on the module's random stream."""
    async with aiohttp.ClientSession() as session:
        api = RetryingAPI(
            session,
            "t",
            oauth_token="x",
            base_url="http://127.0.0.1:1",
            timeout_s=1.0,
            max_attempts=4,
            backoff_base_s=0.2,
        )
        for attempt in range(1, 5):
            random.seed(attempt)
            got = api.backoff(attempt)
            random.seed(attempt)
            ceiling = 0.2 * (2.0 ** (attempt - 1))
            assert got == ceiling / 2 + random.uniform(0, ceiling / 2)
