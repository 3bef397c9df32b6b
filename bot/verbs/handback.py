"""Requested changes hand the issue back to its implementer: at once when the implementer has room for another
lease (``max_leases_per_author``), else later, when auto-allocation finds the implementer free (docs/mcp.md)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal, get_args

from bot.config import Settings
from bot.core.canonical import CanonicalState
from bot.core.evidence import render_evidence
from bot.core.vocabulary import label_for_state
from bot.verbs.leasing import LeaseGrant, grant_lease
from state.db import Database
from state.leases import Lease, LeaseRefused, LeaseStore, LeaseTaken
from state.outbox import OutboxIntent, enqueue
from state.sql import Connection

#: The detail a review lease's ``released`` event carries when its request_changes verdict could not lease the
#: issue back at once: the implementer it waits for.
AWAITING = "awaiting_author"


async def busy_leases(store: LeaseStore, repo: str, owner: str, now: datetime,
                      conn: Connection | None = None) -> list[Lease]:
    """``owner``'s live leases (the ones ``max_leases_per_author`` counts)."""
    return [lease for lease in await store.open_leases(repo, conn) if lease.owner == owner and lease.is_live(now)]


#: Why an issue goes back to its implementer (a lease's ``request.source``): changes requested by a review, a
#: required status failing on the head, the head behind its base under ``block_on_outdated_branch``, a merge
#: conflict, a fast-forward-only merge on a diverged base. A hand-back is never preempted by another.
HandBackSource = Literal["request_changes", "status_failed", "branch_outdated", "merge_conflict", "base_diverged"]
HAND_BACK_SOURCES: Final[frozenset[str]] = frozenset(get_args(HandBackSource))
_WHY: Final[dict[str, str]] = {
    "request_changes": "to address the review", "status_failed": "to fix the failing status check",
    "branch_outdated": "to update the branch from its base", "merge_conflict": "to resolve the merge conflict",
    "base_diverged": "to update the branch from its base",
}


async def lease_back(
    store: LeaseStore, conn: Connection, settings: Settings, *, issue: int, implementer: str,
    review_id: int | None, actor: str, now: datetime, state: CanonicalState, delivery_id: str | None,
    source: HandBackSource = "request_changes", detail: Mapping[str, Any] | None = None,
) -> tuple[Lease, OutboxIntent]:
    """Inside the caller's transaction: a new implement lease of ``issue`` for its implementer, and its evidence
    comment (every lease has one) for the caller to queue. Raises LeaseTaken when the issue is leased meanwhile."""
    grant = LeaseGrant(issue_number=issue, owner=implementer, action="implement", actor=actor,
                       request={"source": source, "review": review_id, **(detail or {})})
    back = await grant_lease(conn, store, settings, grant, now)
    key = f"{back.lease_id}:evidence"
    body = render_evidence(key=key, summary=f"Leased #{issue} back to {back.owner} {_WHY[source]}.",
                           state=state, evidence={"action": f"{source}_lease", "lease": back.to_dict(),
                                                  "review_id": review_id, **(detail or {})})
    return back, OutboxIntent(key, issue, "comment", {"body": body}, delivery_id, repo=settings.repo_key)


async def hand_back(
    db: Database, settings: Settings, *, issue: int, implementer: str, source: HandBackSource,
    state: CanonicalState, actor: str, now: datetime, delivery_id: str | None, key: str,
    detail: Mapping[str, Any], expect_history: str | None = None,
) -> Lease | None:
    """Hand ``issue`` (in review, its PR approved or waiting) back to its implementer, in one transaction: the
    issue's live review or merge lease ends (``handed_back``), the implementer gets a new implement lease with its
    evidence, the labels go from `status:review` back to `status:in-progress`, and the hand-back's own evidence
    comment (``key``) says why (``state``). None, changing nothing, when the implementer holds
    ``max_leases_per_author`` live leases (the caller says it waits), the issue's lease history moved past
    ``expect_history`` (another run acted on a newer read), or the issue is leased meanwhile."""
    store, repo = LeaseStore(db), settings.repo_key
    try:
        async with db.transaction() as conn:
            if expect_history is not None and await store.latest_mark(conn, repo, issue) != expect_history:
                return None
            if len(await busy_leases(store, repo, implementer, now, conn)) >= settings.allocator.max_leases_per_author:
                return None
            for held in await store.open_leases(repo, conn):
                if held.issue_number == issue and held.status == "live" and held.action in ("review", "merge"):
                    await store.release(conn, held.lease_id, actor=actor, reason="handed_back", now=now,
                                        hand_back=source)
            back, evidence = await lease_back(store, conn, settings, issue=issue, implementer=implementer,
                                              review_id=None, actor=actor, now=now, state=state,
                                              delivery_id=delivery_id, source=source, detail=detail)
            labels = {"add": [label_for_state("in-progress")],
                      "remove": [label_for_state("review"), label_for_state("pr-open")]}
            body = render_evidence(key=key, summary=f"#{issue} goes back to {implementer} {_WHY[source]}.",
                                   state=state, evidence={"action": "hand_back", "source": source,
                                                          "author_lease": back.lease_id, **detail})
            for intent in (OutboxIntent(f"{key}:labels", issue, "labels", labels, delivery_id, repo=repo),
                           OutboxIntent(key, issue, "comment", {"body": body}, delivery_id, repo=repo), evidence):
                await enqueue(conn, intent)
    except (LeaseTaken, LeaseRefused):
        return None
    return back


async def waiting_hand_backs(store: LeaseStore, repo: str) -> list[tuple[int, str, dict[str, Any]]]:
    """(issue, implementer, the verdict's release detail) of every issue whose latest lease is a review lease that
    ended ``reviewed`` waiting for its implementer, oldest issue first (the whole history: none is ever skipped)."""
    found: list[tuple[int, str, dict[str, Any]]] = []
    for _, issue, detail in await store.released_naming(repo, AWAITING):
        owner = detail.get(AWAITING)
        if isinstance(owner, str):
            found.append((issue, owner, detail))
    return sorted(found)


async def resume_hand_backs(db: Database, settings: Settings, *, actor: str, now: datetime,
                            bot_login: str, delivery_id: str | None) -> list[int]:
    """Lease each waiting hand-back to its implementer when the implementer has room now (auto-allocation's first
    step: work already under review goes back to its author before new work). The issues leased back."""
    store = LeaseStore(db)
    repo, cap = settings.repo_key, settings.allocator.max_leases_per_author
    leased: list[int] = []
    for issue, implementer, detail in await waiting_hand_backs(store, repo):
        pull = detail.get("pull_request")
        state = CanonicalState(
            state="in-progress",
            who_is_next="author",
            next_action=f"{implementer}: call gitea_bootstrap_issue_worktree for #{issue} (the same worktree and "
            "branch come back), address the review and push again",
            next_prompt=f"Changes were requested on PR #{pull}; read the review and address it.",
            what_happened=f"#{issue} leased back to {implementer}, whose other work ended",
            why=f"changes were requested while {implementer} held max_leases_per_author = {cap} live lease(s)",
            related_prs=(pull,) if isinstance(pull, int) else (),
            blockers="none",
            validation=f"{implementer} holds fewer than {cap} live lease(s) now",
            last_updated_by=bot_login or "foreman",
        )
        try:
            async with db.transaction() as conn:
                if len(await busy_leases(store, repo, implementer, now, conn)) >= cap:
                    continue
                _, evidence = await lease_back(store, conn, settings, issue=issue, implementer=implementer,
                                               review_id=detail.get("review_id"), actor=actor, now=now, state=state,
                                               delivery_id=delivery_id)
                await enqueue(conn, evidence)
        except LeaseTaken:
            continue  # leased meanwhile: no longer waiting
        leased.append(issue)
    return leased
