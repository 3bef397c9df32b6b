"""Whether a stored delivery may reach the handlers at all: served repository, routable shape. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

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
        return Refusal("ignored", f"foreign_repository: {_shown(full_name)} is not served here")
    return None
