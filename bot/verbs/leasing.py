"""Every lease foreman grants is created here: by the allocation (implement or review), a reviewer's claim, and the
hand-back of requested changes to the implementer. One place decides the role of an action, the time to live and
the grace of a reclaimed lease from the repository's settings; the callers add the lease's Gitea effects."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from bot.config import Settings
from state.leases import Lease, LeaseStore, LeaseTaken
from state.sql import Connection

#: What a lease can be for, and the roster role its owner needs (the lease records it). A merge lease is the merge
#: queue's hand-out of an approved pull request to one merger (gitea_merge_pull_request stays one Gitea call pinned
#: to the approved commit).
ACTION_ROLES: dict[str, str] = {"implement": "author", "review": "reviewer", "merge": "merger"}

Action = Literal["implement", "review", "merge"]


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    """One lease to create: whose, on which issue, for what, who asked, and why (``request``, recorded with it).

    ``reclaim`` is the expired lease (past its grace) this one replaces; ``fingerprint`` the allocator's decision
    it applies, when an allocation grants it."""

    issue_number: int
    owner: str
    action: Action
    actor: str
    request: dict[str, Any] = field(default_factory=dict)
    fingerprint: str | None = None
    reclaim: Lease | None = None
    #: With ``check_history``, ``seen_latest`` is where the issue's lease history stood when the caller read it
    #: (``history_mark``): the grant is refused (``LeaseTaken``) if it moved since (a lease granted, ended or expired),
    #: so a decision taken on a stale read (a verdict recorded meanwhile) leases nothing.
    check_history: bool = False
    seen_latest: str | None = None


async def grant_lease(conn: Connection, store: LeaseStore, settings: Settings, grant: LeaseGrant, now: datetime) -> (
    Lease
):
    """Create ``grant``'s live lease inside the caller's transaction (its effects go in the same one). Raises
    ``LeaseTaken`` when the issue was leased meanwhile (or the reclaimed lease is no longer reclaimable)."""
    allocator = settings.allocator
    if grant.check_history:
        latest = await store.latest_mark(conn, settings.repo_key, grant.issue_number)
        if latest != grant.seen_latest:
            raise LeaseTaken(f"#{grant.issue_number}'s leases changed since its candidate was read ({grant.seen_latest}"
                             f" then, {latest} now)")
    return await store.acquire(
        conn, repo=settings.repo_key, issue_number=grant.issue_number, owner=grant.owner,
        role=ACTION_ROLES[grant.action], action=grant.action, ttl=timedelta(seconds=allocator.lease_ttl_s), now=now,
        actor=grant.actor, fingerprint=grant.fingerprint, request=grant.request, reclaim=grant.reclaim,
        grace=timedelta(seconds=allocator.lease_grace_s),
    )
