"""What the review and merge queues hold now, as every surface shows it: ``foreman queue``, the runtime context of
reviewers and mergers, the dashboard and ``foreman invariants`` (the queues' runs: bot/loops/queues.py)."""

from __future__ import annotations

from collections.abc import Sequence
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
    #: When each waiting pull request entered its queue (``entered_queue``), by issue.
    since: dict[int, datetime | None]

    def to_dict(self) -> dict[str, Any]:
        def waiting(q: QueuedPull) -> dict[str, Any]:
            since = self.since.get(q.issue.number)
            return {**q.to_dict(), "waiting_since": since.isoformat() if since is not None else None}

        return {
            "reviews_waiting": [waiting(q) for q in self.reviews],
            "merges_waiting": [waiting(q) for q in self.merges],
            "in_hand": [{"issue_number": n, "owner": lease.owner, "action": lease.action,
                         "expires_at": lease.expires_at.isoformat()} for n, lease in sorted(self.leased.items())],
            "idle_reviewers": list(self.idle_reviewers), "idle_mergers": list(self.idle_mergers),
            "merge_by": self.merge_by,
        }


async def work_queues(door: VerbRuntime[ReviewGitea], now: datetime, *,
                      pulls: Sequence[QueuedPull] | None = None) -> WorkQueues:
    """The queues as they stand now (Gitea's pull requests and reviews, the lease store's leases); ``pulls``: Gitea's
    side as the caller already read it (``queued_pulls``). Raises GiteaError when Gitea cannot answer; needs the
    door's Gitea client."""
    if door.gitea is None:
        raise LookupError("the queues are read from Gitea: configure gitea.token")
    if pulls is None:
        pulls = await queued_pulls(door.gitea, door.db, door.settings)
    live = {lease.issue_number: lease for lease in await door.leases.open_leases(door.repo) if lease.is_live(now)}
    free = [q for q in pulls if q.issue.number not in live]
    reviewers = await role_pick(door.db, door.settings, "reviewer", now)
    mergers = await role_pick(door.db, door.settings, "merger", now)
    merges = sorted((q for q in free if q.stage == "merge"), key=_approval_order)
    reviews = [q for q in free if q.stage == "review"]
    since = {q.issue.number: entered_queue(await door.leases.history(door.repo, q.issue.number))
             for q in (*reviews, *merges)}
    return WorkQueues(tuple(reviews), tuple(merges),
                      {q.issue.number: live[q.issue.number] for q in pulls if q.issue.number in live},
                      tuple(reviewers.order), tuple(mergers.order), door.settings.merge.by, since)


def entered_queue(history: Sequence[Lease]) -> datetime | None:
    """When an issue's pull request entered the review or merge queue: the end of its issue's last lease (the
    author's hand-over, a reviewer's verdict, a lease that expired or was released), else, for one still marked live,
    its expiry; None when foreman never leased the issue."""
    ends = [lease.ended_at if lease.ended_at is not None else lease.expires_at for lease in history]
    return max(ends) if ends else None


def _approval_order(q: QueuedPull) -> tuple[str, int]:
    return (q.approved_at.isoformat() if q.approved_at is not None else "", q.issue.number)
