"""Which handlers a stored delivery reaches, in what order: served repository, routable shape, declared order. Pure."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gidgethub import routing, sansio

# The payload fields gidgethub's Router matches on: each must be a string (or absent), since the router
# looks the value up in a dict and a list or object there raises instead of matching nothing.
_ROUTED_FIELDS = ("action",)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a delivery does not reach any handler. ``ignored``: not ours (recorded, never retried);
    ``failed``: ours but not dispatchable (parked for an operator, with the reason)."""

    outcome: Literal["ignored", "failed"]
    reason: str


def served_names(pairs: Iterable[tuple[str, str]]) -> frozenset[str]:
    """``owner/name`` keys, case-folded: Gitea owner and repository names are case-insensitive."""
    return frozenset(f"{owner}/{name}".casefold() for owner, name in pairs)


def _shown(value: object) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


def refuse_dispatch(payload: object, served: frozenset[str]) -> Refusal | None:
    """None when the delivery belongs to a served repository and can be routed; else why not.

    Org- and system-level hooks send every repository's events: the repository is checked here, once,
    before any handler runs, so no handler has to (and none can forget to).
    """
    if not isinstance(payload, Mapping):
        return Refusal("failed", "undispatchable: the body is not a JSON object")
    for name in _ROUTED_FIELDS:
        value = payload.get(name)
        if value is not None and not isinstance(value, str):
            return Refusal("failed", f"undispatchable: {name!r} is {type(value).__name__}, not a string")
    repository: Any = payload.get("repository")
    full_name = repository.get("full_name") if isinstance(repository, Mapping) else None
    if not isinstance(full_name, str) or not full_name:
        return Refusal("ignored", "no_repository: the payload names no repository")
    if full_name.casefold() not in served:
        return Refusal("ignored", f"foreign_repository: {_shown(full_name)} is not served here (not in "
                                  "[repository] or [[repositories]])")
    return None


Handler = Callable[..., Awaitable[None]]


class OrderedRouter(routing.Router):
    """A gidgethub Router that keeps the order handlers were declared in; ``handlers_for`` returns them so.

    Composed from feature routers (``OrderedRouter(records, acts)``), a delivery's handlers run feature by
    feature in the order given, and within one feature in the order it registered them (gidgethub's ``fetch``
    answers an unordered set). A plain Router among the parts keeps gidgethub's own composition order.
    """

    def __init__(self, *other_routers: routing.Router) -> None:
        super().__init__()
        self._rank: dict[Handler, int] = {}
        self._declared: list[tuple[Handler, str, dict[str, Any]]] = []
        for other in other_routers:
            if isinstance(other, OrderedRouter):
                for func, event_type, detail in other._declared:
                    self.add(func, event_type, **detail)
            else:
                self._add_plain(other)

    def _add_plain(self, other: routing.Router) -> None:
        for event_type, callbacks in other._shallow_routes.items():
            for callback in callbacks:
                self.add(callback, event_type)
        for event_type, data_details in other._deep_routes.items():
            for data_key, data_specifics in data_details.items():
                for data_value, callbacks in data_specifics.items():
                    for callback in callbacks:
                        self.add(callback, event_type, **{data_key: data_value})

    def add(self, func: Handler, event_type: str, **data_detail: Any) -> None:
        self._rank.setdefault(func, len(self._rank))
        self._declared.append((func, event_type, dict(data_detail)))
        super().add(func, event_type, **data_detail)

    def handlers_for(self, event: sansio.Event) -> tuple[Handler, ...]:
        """The handlers the event reaches, in declaration order (raises as ``fetch`` does on unroutable data)."""
        return tuple(sorted(self.fetch(event), key=self._rank.__getitem__))
