"""Requested changes hand the issue back to its implementer: at once when the implementer has room for another
lease (``max_leases_per_author``), else later, when auto-allocation finds the implementer free (docs/mcp.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from bot.config import Settings
from bot.core.canonical import CanonicalState
from bot.core.evidence import render_evidence
from bot.verbs.leasing import LeaseGrant, grant_lease
from state.db import Database
from state.leases import Lease, LeaseStore, LeaseTaken
from state.outbox import OutboxIntent, enqueue
from state.sql import Connection

#: The detail a review lease's ``released`` event carries when its request_changes verdict could not lease the
#: issue back at once: the implementer it waits for.
AWAITING = "awaiting_author"


async def busy_leases(store: LeaseStore, repo: str, owner: str, now: datetime,
                      conn: Connection | None = None) -> list[Lease]:
    """``owner``'s live leases (the ones ``max_leases_per_author`` counts)."""
    return [lease for lease in await store.open_leases(repo, conn) if lease.owner == owner and lease.is_live(now)]


async def lease_back(
    store: LeaseStore, conn: Connection, settings: Settings, *, issue: int, implementer: str,
    review_id: int | None, actor: str, now: datetime, state: CanonicalState, delivery_id: str | None,
) -> tuple[Lease, OutboxIntent]:
    """Inside the caller's transaction: a new implement lease of ``issue`` for its implementer, and its evidence
    comment (every lease has one) for the caller to queue. Raises LeaseTaken when the issue is leased meanwhile."""
    grant = LeaseGrant(issue_number=issue, owner=implementer, action="implement", actor=actor,
                       request={"source": "request_changes", "review": review_id})
    back = await grant_lease(conn, store, settings, grant, now)
    key = f"{back.lease_id}:evidence"
    body = render_evidence(key=key, summary=f"Leased #{issue} back to {back.owner} to address the review.",
                           state=state, evidence={"action": "request_changes_lease", "lease": back.to_dict(),
                                                  "review_id": review_id})
    return back, OutboxIntent(key, issue, "comment", {"body": body}, delivery_id, repo=settings.repo_key)


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
