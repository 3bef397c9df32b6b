"""When the worker stands aside for the webhook door. Pure: arrival times in, a decision out.

Gitea sends each webhook once and waits for the answer (its deliver timeout); an answer that comes late is a
delivery lost until catch-up. So while signed deliveries arrive in a burst (many at once: a bulk label change, a
push of many branches, a Replay of a whole page), the webhook door has the CPU first and the worker's drain loops
wait; the deliveries are stored (a 202 means committed), and the worker takes the backlog the moment the burst
ends. Two bounds keep this from ever starving the worker:

- a burst is a *rate* (``burst_per_s`` signed deliveries per second, counted over the last ``window_s``), far above
  Gitea's steady traffic, so a steady stream (tens a second) never makes a loop wait at all;
- a loop never waits more than ``max_stand_aside_s`` before a claim, however long the burst lasts, so each loop
  still claims at least one delivery per ``max_stand_aside_s`` even under a flood.

Only admitted (signature-verified) deliveries count: nobody without the webhook secret can make the worker wait.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BurstPolicy:
    """``burst_per_s`` = 0 turns standing aside off."""

    burst_per_s: float = 200.0
    window_s: float = 0.1
    max_stand_aside_s: float = 0.2

    @property
    def enabled(self) -> bool:
        return self.burst_per_s > 0 and self.max_stand_aside_s > 0

    @property
    def burst_count(self) -> int:
        """Arrivals within one window that make a burst (at least 2: one delivery alone is never a burst)."""
        return max(2, round(self.burst_per_s * self.window_s))


class ArrivalWindow:
    """The monotonic times of the admitted deliveries of the last window, at most ``burst_count`` of them kept."""

    def __init__(self, policy: BurstPolicy) -> None:
        self.policy = policy
        self._times: deque[float] = deque(maxlen=policy.burst_count)

    def arrived(self, now: float) -> None:
        self._times.append(now)

    @property
    def recent(self) -> tuple[float, ...]:
        """The kept arrival times, oldest first (at most ``burst_count``)."""
        return tuple(self._times)

    def in_burst(self, now: float) -> bool:
        """True while the last ``burst_count`` arrivals all fall within the window ending ``now``."""
        times = self._times
        return (
            self.policy.enabled
            and len(times) == times.maxlen
            and now - times[0] <= self.policy.window_s
        )


def stand_aside_for(window: ArrivalWindow, *, now: float, since: float) -> float:
    """How long a drain loop that began waiting at ``since`` should wait now before its next look (0: claim now).

    It waits while a burst lasts, a fraction of the window at a time, and never past ``since`` +
    ``max_stand_aside_s``.
    """
    if not window.in_burst(now):
        return 0.0
    left = since + window.policy.max_stand_aside_s - now
    return max(0.0, min(left, window.policy.window_s / 4))
