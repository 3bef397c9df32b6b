"""What the review and merge queues hold now, as every surface shows it: ``foreman queue``, the runtime context of
reviewers and mergers, the dashboard and ``foreman invariants`` (the queues' runs: bot/loops/queues.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.verbs.allocate import role_pick
from bot.verbs.queue_facts import QueuedPull, queued_pulls
from bot.verbs.review import ReviewGitea
from bot.verbs.runtime import VerbRuntime
from state.leases import Lease


@dataclass(frozen=True, slots=True)
class WorkQueues:
    """What waits now: pull requests for review and to merge (none leased), the busy ones, and the idle roster."""

    reviews: tuple[QueuedPull, ...]
    merges: tuple[QueuedPull, ...]
    leased: dict[int, Lease]
    idle_reviewers: tuple[str, ...]
    idle_mergers: tuple[str, ...]
    merge_by: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "reviews_waiting": [q.to_dict() for q in self.reviews],
            "merges_waiting": [q.to_dict() for q in self.merges],
            "in_hand": [{"issue_number": n, "owner": lease.owner, "action": lease.action,
                         "expires_at": lease.expires_at.isoformat()} for n, lease in sorted(self.leased.items())],
            "idle_reviewers": list(self.idle_reviewers), "idle_mergers": list(self.idle_mergers),
            "merge_by": self.merge_by,
        }


async def work_queues(door: VerbRuntime[ReviewGitea], now: datetime) -> WorkQueues:
    """The queues as they stand now (Gitea's pull requests and reviews, the lease store's leases). Raises GiteaError
    when Gitea cannot answer; needs the door's Gitea client."""
    if door.gitea is None:
        raise LookupError("the queues are read from Gitea: configure gitea.token")
    pulls = await queued_pulls(door.gitea, door.db, door.settings)
    live = {lease.issue_number: lease for lease in await door.leases.open_leases(door.repo) if lease.is_live(now)}
    free = [q for q in pulls if q.issue.number not in live]
    reviewers = await role_pick(door.db, door.settings, "reviewer", now)
    mergers = await role_pick(door.db, door.settings, "merger", now)
    merges = sorted((q for q in free if q.stage == "merge"), key=_approval_order)
    return WorkQueues(tuple(q for q in free if q.stage == "review"), tuple(merges),
                      {q.issue.number: live[q.issue.number] for q in pulls if q.issue.number in live},
                      tuple(reviewers.order), tuple(mergers.order), door.settings.merge.by)


def _approval_order(q: QueuedPull) -> tuple[str, int]:
    return (q.approved_at.isoformat() if q.approved_at is not None else "", q.issue.number)
