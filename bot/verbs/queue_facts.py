"""The review and merge queues' facts: of the open `status:review` issues with a pull request, which wait for a
review and which wait to be merged (the merge gate passes on exactly the head), each with who may not take it.

One read serves every consumer: the allocator's review and merge candidates, the queues' runs
(bot/loops/queues.py), ``foreman queue``, the runtime context and ``foreman invariants``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from bot.config import Settings
from bot.core.vocabulary import label_for_state
from bot.gitea import Issue
from bot.gitea.values import PullRequest
from bot.verbs.merge_gate import MergeChecks, MergeGate, merge_gate, reviewers_of
from bot.verbs.review import ReviewGitea, implementer_of, pull_for_issue, recorded_verdicts
from state.db import Database
from state.leases import LeaseStore, history_mark

#: Where a pull request in review stands: it waits for a (further) review; its approvals count on exactly its head,
#: so it waits to be merged; a request-changes verdict stands on it (its author's turn, or a maintainer's); its
#: approvals are there but a required status is still pending (``checks``: it waits for CI, nobody's turn); or it
#: goes back to its author (``author``: a required status fails, or the head is behind its base under
#: ``block_on_outdated_branch``).
Stage = Literal["review", "merge", "blocked", "checks", "author"]


@dataclass(frozen=True, slots=True)
class QueuedPull:
    """One open `status:review` issue with its pull request and the merge gate on it now."""

    issue: Issue
    pull: PullRequest
    implementer: str | None
    gate: MergeGate
    #: When the counted approval was recorded (its review lease ended): the merge queue's order.
    approved_at: datetime | None
    #: Where the issue's lease history stood when this was read (``history_mark``): a lease is granted on this read
    #: only while it still does (``LeaseGrant.check_history``), so a verdict recorded meanwhile makes the read stale,
    #: never a second review.
    latest_lease: str | None = None

    @property
    def stage(self) -> Stage:
        gate = self.gate
        if gate.block == "changes_requested":
            return "blocked"
        if gate.block in ("status_failed", "branch_outdated"):
            return "author"
        if gate.block == "status_pending":
            return "checks"
        counted = gate.counted
        if counted is not None and counted.commit_id == self.pull.head_sha and gate.approved:
            return "merge"
        return "review"

    @property
    def barred(self) -> list[str]:
        """Who may neither review nor merge it: the PR's poster and the issue's implementer; for a further review,
        also who already approved its head (each approval a branch protection requires is another reviewer's)."""
        barred = {self.pull.user.login} | ({self.implementer} if self.implementer else set())
        if self.stage == "review":
            barred |= {v.reviewer for v in self.gate.approvals}
        return sorted(barred)

    def candidate(self) -> dict[str, Any]:
        """The allocator's candidate record: a review in the issue's own order (its priority, then its age); a
        merge in approval order (labels left out, so priority does not overtake an earlier approval)."""
        record: dict[str, Any] = {"issue_number": self.issue.number, "title": self.issue.title,
                                  "barred_owners": self.barred}
        if self.stage == "merge":
            record["labels"] = []
            when = self.approved_at or self.issue.created_at
        else:
            record["labels"] = sorted(self.issue.label_names)
            when = self.issue.created_at
        if when is not None:
            record["created_at"] = when.isoformat()
        return record

    def to_dict(self) -> dict[str, Any]:
        counted = self.gate.counted
        return {"issue_number": self.issue.number, "title": self.issue.title, "pull_number": self.pull.number,
                "head": self.pull.head_sha, "base": self.pull.base_ref, "stage": self.stage,
                "block": self.gate.block, "missing": self.gate.missing(),
                "approvals": f"{len(self.gate.approvals)} of {self.gate.required}",
                "implementer": self.implementer, "barred_owners": self.barred,
                "approved_by": counted.reviewer if counted is not None else None,
                "approved_at": self.approved_at.isoformat() if self.approved_at is not None else None}


async def queued_pulls(gitea: ReviewGitea, db: Database, settings: Settings) -> list[QueuedPull]:
    """Every open `status:review` issue (not a PR) that has an open pull request, oldest issue first."""
    review = label_for_state("review")
    repo, leases = settings.repo_key, LeaseStore(db)
    checks = MergeChecks(gitea, settings)
    out: list[QueuedPull] = []
    for issue in await gitea.list_issues(state="open", labels=[review], type_="issues"):
        if issue.is_pull or review not in issue.label_names:
            continue
        pull = await pull_for_issue(gitea, db, repo, issue, slug_length=settings.bootstrap.slug_length)
        if pull is None:
            continue  # nothing to review yet
        history = await leases.history(repo, issue.number)  # read before the verdicts: a later one makes it stale
        implementer = await implementer_of(leases, repo, issue.number)
        owner = implementer.owner if implementer is not None else None
        verdicts = await recorded_verdicts(leases, repo, issue.number)
        rules = await checks.rules_for(pull.base_ref)
        gate = merge_gate(verdicts, await gitea.list_reviews(pull.number), pull, implementer=owner,
                          reviewers=reviewers_of(settings), rules=rules,
                          checks=await checks.checks_for(pull, rules))
        approved_at = None
        if gate.counted is not None:
            approved_at = {lease.lease_id: lease.ended_at for lease in history}.get(gate.counted.lease_id)
        out.append(QueuedPull(issue, pull, owner, gate, approved_at, history_mark(history)))
    return sorted(out, key=lambda q: q.issue.number)


def candidates_of(pulls: Sequence[QueuedPull], stage: Stage) -> tuple[list[dict[str, Any]], frozenset[int]]:
    """The allocator's candidates of one queue, and the open issues they came from (every queued one)."""
    return [q.candidate() for q in pulls if q.stage == stage], frozenset(q.issue.number for q in pulls)


def latest_leases(pulls: Sequence[QueuedPull]) -> dict[int, str | None]:
    """By issue, its latest lease when it was read: what a grant on this read checks (``CallOptions.lease_history``)."""
    return {q.issue.number: q.latest_lease for q in pulls}
