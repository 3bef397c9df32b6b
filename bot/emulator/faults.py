"""Fault injection for the Gitea emulator: error statuses, lost responses after a write, and latency."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FaultKind = Literal["status", "drop_after_store", "delay", "alter_stored"]
API_PREFIX = "/api/v1"


def _normalise_route(route: str) -> str:
    if route != "*" and route.startswith(API_PREFIX + "/"):
        return route[len(API_PREFIX) :]
    return route


@dataclass(slots=True)
class FaultRule:
    """One armed fault: which requests it matches, what it does, and how many more times it fires.

    ``remaining`` None means forever. ``hits`` counts how often it fired.
    """

    method: str
    route: str
    kind: FaultKind
    remaining: int | None
    status: int = 500
    message: str = "injected fault"
    delay_s: float = 0.0
    after_store: bool = False
    suffix: str = ""
    hits: int = 0

    def matches(self, method: str, route: str | None) -> bool:
        """Whether this rule applies to a request for ``method`` on the swagger ``route`` template."""
        if self.remaining is not None and self.remaining <= 0:
            return False
        if self.method != "*" and self.method != method.upper():
            return False
        return self.route == "*" or self.route == route

    def consume(self) -> None:
        """Count one firing."""
        self.hits += 1
        if self.remaining is not None:
            self.remaining -= 1


@dataclass
class Faults:
    """The emulator's fault table. Routes are swagger templates (``/repos/{owner}/{repo}/issues/{index}``,
    with or without ``/api/v1``); ``"*"`` matches any method or route.

    - ``fail``: the next ``times`` matching requests answer ``status`` without doing anything.
    - ``drop_after_store``: the next ``times`` matching requests are fully performed (state changed,
      webhooks queued), then the connection is aborted so the client never sees the answer.
    - ``delay``: matching requests wait ``seconds`` before (or, with ``after_store``, after) the work.
    - ``alter_stored``: the next ``times`` matching comment writes succeed and answer as usual, but the
      stored body then gains ``suffix`` (a concurrent edit, or a server that rewrote it): read-after-write
      must catch the difference.
    """

    rules: list[FaultRule] = field(default_factory=list)

    def fail(
        self, method: str, route: str, *, status: int = 500, times: int | None = 1, message: str = "injected fault"
    ) -> FaultRule:
        """Answer ``status`` to the next ``times`` matching requests, without performing them."""
        return self._add(FaultRule(method.upper(), _normalise_route(route), "status", times, status, message))

    def drop_after_store(self, method: str, route: str, *, times: int = 1) -> FaultRule:
        """Perform the next ``times`` matching requests, then abort the connection instead of answering."""
        return self._add(FaultRule(method.upper(), _normalise_route(route), "drop_after_store", times))

    def delay(
        self, method: str, route: str, seconds: float, *, times: int | None = None, after_store: bool = False
    ) -> FaultRule:
        """Add ``seconds`` of latency to matching requests (forever unless ``times`` is given)."""
        rule = FaultRule(method.upper(), _normalise_route(route), "delay", times, delay_s=seconds)
        rule.after_store = after_store
        return self._add(rule)

    def alter_stored(self, method: str, route: str, *, suffix: str = " (altered)", times: int = 1) -> FaultRule:
        """Perform the next ``times`` matching comment writes, then change the stored body behind the answer."""
        rule = FaultRule(method.upper(), _normalise_route(route), "alter_stored", times)
        rule.suffix = suffix
        return self._add(rule)

    def clear(self) -> None:
        """Disarm every fault."""
        self.rules.clear()

    def take(self, method: str, route: str | None) -> tuple[list[FaultRule], FaultRule | None]:
        """Consume what applies to one request: every matching delay, and the first status/drop rule."""
        delays: list[FaultRule] = []
        action: FaultRule | None = None
        for rule in self.rules:
            if not rule.matches(method, route):
                continue
            if rule.kind == "delay":
                rule.consume()
                delays.append(rule)
            elif action is None:
                rule.consume()
                action = rule
        return delays, action

    def _add(self, rule: FaultRule) -> FaultRule:
        self.rules.append(rule)
        return rule
