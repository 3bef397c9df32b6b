"""Exponential retry backoff with jitter, as one pure function."""

from __future__ import annotations

import math
import random
from typing import Final, Literal

#: ``equal``: half of the ceiling fixed, half random; ``full``: uniform up to the ceiling, at least ``base / 2``.
Jitter = Literal["equal", "full"]

#: 2**1024 overflows a float: past this many doublings the ceiling stops growing (the cap has long won).
_MAX_DOUBLINGS: Final = 40


def delay(
    attempt: int,
    *,
    base: float,
    cap: float = math.inf,
    jitter: Jitter = "equal",
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1-based; 0 or less counts as 1).

    The ceiling is ``min(cap, base * 2**(attempt - 1))``. ``equal`` jitter waits ``ceiling/2 +
    uniform(0, ceiling/2)``; ``full`` waits ``max(base/2, uniform(0, ceiling))``, so it never spins even
    when the draw is near zero. ``rng`` defaults to the ``random`` module's shared stream.
    """
    ceiling = min(cap, base * (2.0 ** min(max(0, attempt - 1), _MAX_DOUBLINGS)))
    source = rng if rng is not None else random
    if jitter == "equal":
        return ceiling / 2 + source.uniform(0, ceiling / 2)
    return max(base / 2, source.uniform(0, ceiling))
