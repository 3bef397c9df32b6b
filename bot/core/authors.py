"""Auto-allocation's pure author pick: which roster author receives the next ready issue (docs/allocator.md)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

AuthorSkipReason = Literal["busy", "not_the_named_owner"]
POLICY: Final[str] = "least live leases, then longest idle, then login"
_NEVER: Final[datetime] = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class AuthorLoad:
    """One roster author as the lease store sees it now."""

    login: str
    live_leases: int
    idle_since: datetime | None  # when the author's last lease ended (or its newest live one began); None: never

    def to_dict(self) -> dict[str, Any]:
        return {"login": self.login, "live_leases": self.live_leases,
                "idle_since": self.idle_since.isoformat() if self.idle_since else None}


@dataclass(frozen=True, slots=True)
class SkippedAuthor:
    login: str
    reason: AuthorSkipReason
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"login": self.login, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class AuthorPick:
    """The eligible authors in the order they receive work, and every other author with its reason."""

    order: tuple[str, ...]
    skipped: tuple[SkippedAuthor, ...]
    loads: tuple[AuthorLoad, ...]
    max_leases_per_author: int

    def to_dict(self) -> dict[str, Any]:
        why = {s.login: s.reason for s in self.skipped}
        return {
            "policy": {"order": POLICY, "max_leases_per_author": self.max_leases_per_author},
            "order": list(self.order),
            "authors": [{**load.to_dict(), "skipped": why.get(load.login)} for load in self.loads],
            "skipped": [s.to_dict() for s in self.skipped],
        }


def rank_authors(
    loads: Iterable[AuthorLoad], *, max_leases_per_author: int, named_owner: str | None = None
) -> AuthorPick:
    """Order the authors by the policy above; pure and independent of the input order."""
    if max_leases_per_author < 1:
        raise ValueError("max_leases_per_author must be at least 1")
    ordered: Sequence[AuthorLoad] = sorted(loads, key=lambda load: load.login)
    skipped: list[SkippedAuthor] = []
    eligible: list[AuthorLoad] = []
    for load in ordered:
        if named_owner and load.login != named_owner:
            skipped.append(SkippedAuthor(load.login, "not_the_named_owner",
                                         f"[allocator] auto_allocate_owner names {named_owner}"))
        elif load.live_leases >= max_leases_per_author:
            skipped.append(SkippedAuthor(load.login, "busy", f"{load.login} holds {load.live_leases} live lease(s); "
                                         f"max_leases_per_author is {max_leases_per_author}"))
        else:
            eligible.append(load)
    eligible.sort(key=lambda load: (load.live_leases, load.idle_since or _NEVER, load.login))
    return AuthorPick(order=tuple(load.login for load in eligible), skipped=tuple(skipped), loads=tuple(ordered),
                      max_leases_per_author=max_leases_per_author)


def author_loads(
    authors: Iterable[str], leases: Iterable[tuple[str, bool, datetime, datetime | None]]
) -> list[AuthorLoad]:
    """Each author's load from its leases, given as (owner, live now, acquired_at, ended_at or expiry)."""
    live: dict[str, int] = {}
    idle: dict[str, datetime] = {}
    for owner, is_live, acquired_at, ended_at in leases:
        if is_live:
            live[owner] = live.get(owner, 0) + 1
        moment = acquired_at if is_live or ended_at is None else ended_at
        if owner not in idle or moment > idle[owner]:
            idle[owner] = moment
    return [AuthorLoad(login, live.get(login, 0), idle.get(login)) for login in authors]
