"""Stranded work comes back (docs/operating.md, "Stranded work"): a lease that expired past its grace, or that its
owner (or a controller) released without handing the issue on, gives its issue back to the queues with evidence
saying what happened and where the work is.

An implement lease's issue returns to `status:ready`, unassigned; auto-allocation then leases it to the next idle
author (the same author resumes its registered worktree; another starts from the pushed branch, or from the base,
and the old worktree is kept for its owner until the issue's teardown). A review or merge lease's issue stays in
`status:review`: the review (or the merge) goes to the next idle reviewer (merger). Nothing of the worktree is
touched here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from bot.core.canonical import CanonicalState
from bot.core.evidence import render_evidence
from bot.core.intents import StateChange
from bot.core.vocabulary import STATES, label_for_state
from state.db import Database
from state.issues import IssueStore
from state.journal import JournalStore
from state.leases import Lease, LeaseStore
from state.outbox import OutboxIntent, enqueue
from state.publications import PublicationStore
from state.sql import Connection

How = Literal["expired", "released"]
_WHY = "stranded work returns to its queue (docs/operating.md, \"Stranded work and the queues\")"


@dataclass(frozen=True, slots=True)
class WorkPlace:
    """Where a stranded implement lease's work is: its registered worktree and the last commit pushed to Gitea."""

    worktree_path: str | None
    branch: str | None
    pushed_sha: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"worktree_path": self.worktree_path, "branch": self.branch, "pushed_sha": self.pushed_sha}

    def says(self, owner: str) -> str:
        kept = (f"{owner}'s worktree {self.worktree_path} is kept" if self.worktree_path else
                f"{owner} had no registered worktree")
        pushed = (f"{self.branch} was pushed at {self.pushed_sha}" if self.pushed_sha else
                  "nothing was pushed")
        return f"{kept}; {pushed}"


async def work_place(db: Database, lease: Lease) -> WorkPlace:
    """The stranded lease's worktree (the issue's registration of its owner) and the last verified push; nothing for
    a review or merge lease (it has no worktree)."""
    if lease.action != "implement":
        return WorkPlace(None, None, None)
    registration = await JournalStore(db).live_registration(lease.repo, lease.issue_number)
    mine = registration if registration is not None and registration.owner == lease.owner else None
    pushed = [p for p in await PublicationStore(db).for_issue(lease.repo, lease.issue_number)
              if p.phase in ("pushed", "verified") and p.commit_sha]
    last = pushed[-1] if pushed else None
    return WorkPlace(mine.worktree_path if mine is not None else None,
                     mine.branch if mine is not None else (last.branch if last is not None else None),
                     last.commit_sha if last is not None else None)


def stranded_effects(
    lease: Lease, *, how: How, by: str, reason: str, at: datetime, place: WorkPlace, key: str, bot_login: str,
    cause: str | None, requeue: bool = True,
) -> tuple[OutboxIntent, ...]:
    """The Gitea side of a stranded lease: for an implement lease `status:ready`, nobody assigned, and the evidence;
    for a review or merge lease the evidence only (the issue stays in `status:review`). With ``requeue`` False (the
    issue moved on before its lease ended: a hand-over) the evidence only, its state left as it is."""
    n, owner = lease.issue_number, lease.owner
    happened = (f"{owner}'s {lease.action} lease expired at {lease.expires_at.isoformat()} and was not renewed "
                f"within the grace period" if how == "expired" else
                f"{by} released {owner}'s {lease.action} lease ({reason})")
    evidence = {"action": f"lease_{how}", "lease": lease.to_dict(), "by": by, "reason": reason,
                "at": at.isoformat(), "work": place.to_dict(), "requeued": requeue}
    if not requeue:
        body = render_evidence(key=key, summary=f"Lease on #{n} ended: {happened}; the issue had moved on, so its "
                               "state stays as it is.", state=None, evidence=evidence)
        return (OutboxIntent(key, n, "comment", {"body": body}, cause, repo=lease.repo),)
    if lease.action == "implement":
        state = CanonicalState(
            state="ready",
            who_is_next="controller",
            next_action=f"foreman leases #{n} to the next idle author (the same author resumes its worktree)",
            next_prompt=(f"#{n} is ready again: {happened}.\n{place.says(owner)}.\n"
                         "The same author re-allocated resumes its worktree; another author starts from the pushed "
                         "branch, or from the base if nothing was pushed."),
            what_happened=happened,
            why=_WHY,
            related_prs=(),
            blockers="none",
            validation="lease ended in the same transaction as this comment; read back by foreman",
            last_updated_by=bot_login or "foreman",
        )
        return StateChange(
            repo=lease.repo, issue_number=n, state=state, cause=cause, evidence=evidence,
            summary=f"#{n} is ready again: {happened}.", comment_key=key, labels_key=f"{key}:labels",
            leaving=("in-progress",), assignees_key=f"{key}:assignees", assignees=(),
        ).intents()
    merge = lease.action == "merge"
    state = CanonicalState(
        state="review",
        who_is_next="merger" if merge else "reviewer",
        next_action=f"foreman hands the {lease.action} of #{n} to the next idle {'merger' if merge else 'reviewer'}",
        next_prompt=f"The {lease.action} of #{n} waits again: {happened}.",
        what_happened=happened,
        why=_WHY,
        related_prs=(),
        blockers="none",
        validation="lease ended in the same transaction as this comment; read back by foreman",
        last_updated_by=bot_login or "foreman",
    )
    body = render_evidence(key=key, summary=f"The {lease.action} of #{n} waits again: {happened}.", state=state,
                           evidence=evidence)
    return (OutboxIntent(key, n, "comment", {"body": body}, cause, repo=lease.repo),)


async def still_in_progress(db: Database, lease: Lease) -> bool:
    """Whether the issue is still where its implement lease left it (`status:in-progress`, or unknown to the stored
    state): only then does its lease's end send it back to `status:ready`; an issue that moved on (in review,
    blocked, done) keeps its state. A review or merge lease's issue always goes back to its queue."""
    if lease.action != "implement":
        return True
    snapshot = await IssueStore(db).snapshot(lease.repo, lease.issue_number)
    if snapshot is None or snapshot.labels is None:
        return True
    states = {label.name for label in snapshot.labels} & {row.label for row in STATES}
    return not states or states == {label_for_state("in-progress")}


async def expire_stranded(
    db: Database, repo: str, *, grace: timedelta, now: datetime, bot_login: str, delivery_id: str | None,
) -> list[Lease]:
    """Every live lease of ``repo`` past its expiry and grace: recorded expired with its stranded effects, one
    transaction each (a lease renewed or ended meanwhile is left alone). The leases expired."""
    store = LeaseStore(db)
    ended: list[Lease] = []
    for lease in await store.open_leases(repo):
        if lease.status != "live" or lease.expires_at > now - grace:
            continue
        place = await work_place(db, lease)
        requeue = await still_in_progress(db, lease)
        async with db.transaction() as conn:
            if not await store.expire(conn, lease.lease_id, now=now, grace=grace):
                continue
            for intent in stranded_effects(lease, how="expired", by="foreman", reason="expired", at=now,
                                           place=place, key=f"{lease.lease_id}:expired", bot_login=bot_login,
                                           cause=delivery_id, requeue=requeue):
                await enqueue(conn, intent)
        ended.append(lease)
    return ended


async def release_stranded(
    conn: Connection, db: Database, lease: Lease, *, by: str, reason: str, now: datetime, bot_login: str,
    delivery_id: str | None, key: str, requeue: bool = True, **detail: Any,
) -> tuple[OutboxIntent, ...]:
    """Inside the caller's transaction: end ``lease`` as released (``reason``) and queue its stranded effects (where
    its work is read beside, from committed state). Raises LeaseRefused when it is no longer live."""
    place = await work_place(db, lease)
    await LeaseStore(db).release(conn, lease.lease_id, actor=by, reason=reason, now=now, **detail)
    intents = stranded_effects(lease, how="released", by=by, reason=reason, at=now, place=place, key=key,
                               bot_login=bot_login, cause=delivery_id, requeue=requeue)
    for intent in intents:
        await enqueue(conn, intent)
    return intents

