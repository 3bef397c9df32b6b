"""The review and merge queues run by themselves (docs/allocator.md, "The queues"): a pull request waiting for review
goes to an idle roster reviewer, an approved one whose gate passes to an idle roster merger, or, with
``[merge] by = "foreman"``, foreman merges it itself, one pull request at a time per base branch.

Both run inside auto-allocation's run (bot/loops/auto_allocate.py), after the implement phase, through the same door
and the allocator (its exclusions, its lease transaction, its evidence); ``work_queues`` is the read every surface
shows (bot/verbs/queue_view.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from bot.core.allocator import Candidate, normalize_candidates
from bot.core.canonical import CanonicalState, as_line, as_prompt
from bot.core.evidence import render_evidence
from bot.verbs.allocate import AllocationOutcome, AllocatorGitea, role_pick
from bot.verbs.handback import HandBackSource, hand_back
from bot.verbs.queue_facts import QueuedPull, candidates_of, latest_leases, queued_pulls
from bot.verbs.queue_view import work_queues
from bot.verbs.runtime import Caller, VerbRuntime
from state.leases import LeaseStore
from state.outbox import OutboxIntent, enqueue

log = logging.getLogger("foreman.queues")

Role = Literal["reviewer", "merger"]
#: The merger of record when foreman merges what passes the gate itself (``[merge] by = "foreman"``): it posts with
#: the bot's token (it has no identity token of its own).
MERGE_QUEUE = "foreman:merge-queue"
QUEUE_MERGER = Caller(login=MERGE_QUEUE, roles=frozenset({"merger"}), channel="auto", operator=True)
#: One apply of the allocator for an owner, an action and the queue's candidates as read once for the whole run
#: (auto-allocation's, with its exclusions and report).
Apply = Callable[[str, Literal["review", "merge"], tuple[Candidate, ...], Mapping[int, str | None]],
                 Awaitable[AllocationOutcome]]


@dataclass
class QueueReport:
    """What one run of the queues did: reviews and merges leased, merges foreman made, and what still waits."""

    reviews: list[int]
    merges: list[int]
    merged: list[int]
    waiting_review: list[int]
    waiting_merge: list[int]
    notes: list[str]
    #: Pull requests handed back to their authors (a required status failing, a head behind its base).
    handed_back: list[int] = field(default_factory=list)
    #: Approved pull requests waiting for a required status (nobody's turn: CI's).
    waiting_checks: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"reviews": self.reviews, "merges": self.merges, "merged": self.merged,
                "waiting_review": self.waiting_review, "waiting_merge": self.waiting_merge, "notes": self.notes,
                "handed_back": self.handed_back, "waiting_checks": self.waiting_checks}


async def run_queues(door: VerbRuntime[AllocatorGitea], apply: Apply, *, now: datetime,
                     delivery_id: str | None) -> QueueReport:
    """Hand each waiting review to an idle reviewer, then each approved pull request to an idle merger (or merge
    it, ``[merge] by = "foreman"``); what still waits with nobody idle says so once, with evidence."""
    report = QueueReport([], [], [], [], [], [])
    running = door.settings.allocator.queues
    assert door.gitea is not None
    # Gitea's pull requests and reviews, read once: every apply of this run decides on them (the leases it makes are
    # read fresh inside each apply's transaction).
    pulls = await queued_pulls(door.gitea, door.db, door.settings)
    report.notes.extend(await end_merges_the_gate_withdrew(door, now, pulls))
    report.handed_back = await hand_back_to_authors(door, now, delivery_id, pulls)
    report.waiting_checks = [q.issue.number for q in pulls if q.stage == "checks"]
    if report.handed_back:
        pulls = [q for q in pulls if q.issue.number not in report.handed_back]
    if "review" in running:
        report.reviews = await _hand_out(door, apply, "reviewer", now, pulls)
    else:
        report.notes.append("the review queue is off ([allocator] queues)")
    if "merge" not in running:
        report.notes.append("the merge queue is off ([allocator] queues)")
    elif door.settings.merge.by == "foreman":
        report.merged = await _merge_by_foreman(door, report, now, delivery_id, pulls)
    else:
        report.merges = await _hand_out(door, apply, "merger", now, pulls)
    # What still waits (a merge foreman made changed Gitea: read again then).
    queues = await work_queues(door, now, pulls=None if report.merged else pulls)
    report.waiting_review = [q.issue.number for q in queues.reviews]
    report.waiting_merge = [q.issue.number for q in queues.merges]
    if "review" in running and queues.reviews and not queues.idle_reviewers:
        await _say_waiting(door, queues.reviews, "reviewer", delivery_id)
    if "merge" in running and queues.merges and door.settings.merge.by != "foreman" and not queues.idle_mergers:
        await _say_waiting(door, queues.merges, "merger", delivery_id)
    return report


async def end_merges_the_gate_withdrew(door: VerbRuntime[AllocatorGitea], now: datetime,
                                      pulls: Sequence[QueuedPull]) -> list[str]:
    """A merge lease whose pull request no longer passes the gate (a push dismissed or outdated its approvals, a
    rejection or a failing status arrived) ends (``gate_withdrawn``, with what is missing), so the pull request goes
    back to the queue it now waits in, never to a merger who can only be refused. Checked against the read's lease
    history: a lease granted after the read stays."""
    store = LeaseStore(door.db)
    notes: list[str] = []
    for queued in pulls:
        if queued.stage == "merge":
            continue
        async with door.db.transaction() as conn:
            if await store.latest_mark(conn, door.repo, queued.issue.number) != queued.latest_lease:
                continue
            for held in await store.open_leases(door.repo, conn):
                if held.issue_number == queued.issue.number and held.status == "live" and held.action == "merge":
                    await store.release(conn, held.lease_id, actor="foreman", reason="gate_withdrawn", now=now,
                                        missing=queued.gate.missing(), stage=queued.stage)
                    notes.append(f"#{queued.issue.number}: {held.owner}'s merge lease ended ({queued.gate.missing()})")
    return notes


async def hand_back_to_authors(door: VerbRuntime[AllocatorGitea], now: datetime, delivery_id: str | None,
                               pulls: Sequence[QueuedPull]) -> list[int]:
    """Each pull request whose required status fails, or whose head is behind its base under the branch protection's
    ``block_on_outdated_branch``, goes back to its implementer (``hand_back``: an implement lease, the labels back to
    `status:in-progress`, the failing context and its target URL, or the update verb, in the state's prompt). One
    whose implementer is at ``max_leases_per_author`` waits for the next run."""
    handed: list[int] = []
    for queued in pulls:
        if queued.stage != "author" or queued.implementer is None:
            continue
        state, source, detail = _author_turn(door, queued)
        back = await hand_back(door.db, door.settings, issue=queued.issue.number, implementer=queued.implementer,
                               source=source, state=state, actor="foreman", now=now, delivery_id=delivery_id,
                               key=f"hand-back:{queued.issue.number}:{queued.pull.head_sha[:12]}:{source}",
                               detail=detail, expect_history=queued.latest_lease)
        if back is not None:
            handed.append(queued.issue.number)
    return handed


def _author_turn(door: VerbRuntime[AllocatorGitea], queued: QueuedPull) -> tuple[CanonicalState, HandBackSource,
                                                                                  dict[str, Any]]:
    """Why a pull request goes back to its author, as its Canonical Issue State says it."""
    gate, pull, number, who = queued.gate, queued.pull, queued.issue.number, queued.implementer
    if gate.block == "status_failed" and gate.checks is not None:
        failing = gate.checks.failing
        # The CI's words (context, description, URL) are anyone-with-write's text: each made one line.
        lines = [as_line(f"- {c}: {s}" + (f" ({d})" if d else "") + (f" {u}" if u else ""), limit=400)
                 for c, s, u, d in failing]
        state = CanonicalState(
            state="in-progress", who_is_next="author",
            next_action=f"{who}: call gitea_bootstrap_issue_worktree for #{number}, fix what the failing check "
            "reports, publish, then gitea_open_pull_request (it is reviewed again)",
            next_prompt=as_prompt(f"A required status check failed on PR #{pull.number} at {pull.head_sha}:\n"
                                  + "\n".join(lines)),
            what_happened=as_line(f"{gate.missing()} on PR #{pull.number}"),
            why=as_line(f"required statuses from {gate.rules.contexts_from}: "
                        f"{', '.join(gate.rules.required_contexts)}"),
            related_prs=(pull.number,), blockers=as_line(gate.missing()),
            validation=f"Gitea's combined status of {pull.head_sha}", last_updated_by=door.bot_login or "foreman")
        return state, "status_failed", {"pull_request": pull.number, "head": pull.head_sha,
                                        "failing": gate.checks.to_dict()["failing"]}
    state = CanonicalState(
        state="in-progress", who_is_next="author",
        next_action=f"{who}: call gitea_update_pull_request with issue_number={number} (Gitea merges "
        f"{pull.base_ref} into the branch; it is reviewed again)",
        next_prompt=f"PR #{pull.number} is behind {pull.base_ref}, and branch protection {gate.rules.rule!r} blocks "
        "an outdated branch: update it from the base.",
        what_happened=f"PR #{pull.number}'s base {pull.base_ref} moved to {pull.base_sha}",
        why="block_on_outdated_branch", related_prs=(pull.number,), blockers="the branch is behind its base",
        validation=f"merge base {pull.merge_base} is not the base's head {pull.base_sha}",
        last_updated_by=door.bot_login or "foreman")
    return state, "branch_outdated", {"pull_request": pull.number, "head": pull.head_sha, "base": pull.base_sha}


async def _hand_out(door: VerbRuntime[AllocatorGitea], apply: Apply, role: Role, now: datetime,
                    pulls: Sequence[QueuedPull]) -> list[int]:
    """One apply at a time for the next idle reviewer (merger): the allocator picks the first candidate that owner
    may take (never one it wrote or implemented); an owner with nothing it may take is passed over."""
    action: Literal["review", "merge"] = "review" if role == "reviewer" else "merge"
    leased: list[int] = []
    passed: set[str] = set()
    logins = [login for login, roles in door.settings.roster.items() if role in roles]
    for _ in range(4 * len(logins) + 4):
        records, _ = candidates_of(pulls, action)
        if not records:
            break
        pick = await role_pick(door.db, door.settings, role, now)
        order = [login for login in pick.order if login not in passed]
        if not order:
            break
        outcome = await apply(order[0], action, tuple(normalize_candidates(records)), latest_leases(pulls))
        if outcome.applied and outcome.lease is not None:
            leased.append(outcome.lease.issue_number)
            continue
        refusal = outcome.refusal
        if refusal is not None and refusal.error == "conflict":
            # Another allocation won a race, or the read went stale (a verdict recorded since): read Gitea again.
            assert door.gitea is not None
            pulls = await queued_pulls(door.gitea, door.db, door.settings)
            continue
        passed.add(order[0])  # nothing it may take now (or refused for it): the next one
    return leased


async def _merge_by_foreman(door: VerbRuntime[AllocatorGitea], report: QueueReport, now: datetime,
                            delivery_id: str | None, pulls: Sequence[QueuedPull]) -> list[int]:
    """The first approved pull request of each base branch, merged by foreman through the merge verb (its gate, its
    pin to the approved commit, its evidence); the next one waits for this merge's teardown to run the queue."""
    queues = await work_queues(door, now, pulls=pulls)
    busy: set[str] = set()
    merged: list[int] = []
    for queued in queues.merges:
        base = queued.pull.base_ref
        if base in busy:
            continue
        busy.add(base)
        number = queued.issue.number
        result = await door.call("merge_pull_request", QUEUE_MERGER, {"issue_number": number},
                                 delivery_id=delivery_id)
        if result.ok:
            merged.append(number)
        else:
            refusal = result.refusal
            report.notes.append(f"#{number}: the merge queue's merge was refused "
                                f"({refusal.error if refusal else '?'}: {refusal.message if refusal else ''})")
            log.warning("merge queue: #%d not merged: %s", number, result.doc.get("message"))
    return merged


async def _say_waiting(door: VerbRuntime[AllocatorGitea], waiting: tuple[QueuedPull, ...], role: Role,
                       delivery_id: str | None) -> None:
    """Every reviewer (merger) is busy: each waiting pull request says so once (one comment per issue until its
    next lease, keyed by its lease history)."""
    store = LeaseStore(door.db)
    what = "review" if role == "reviewer" else "merge"
    cfg = door.settings.allocator
    cap = cfg.max_leases_per_reviewer if role == "reviewer" else cfg.max_leases_per_merger
    async with door.db.transaction() as conn:
        for queued in waiting:
            number = queued.issue.number
            key = f"{what}-wait:{number}:{len(await store.history(door.repo, number))}"
            state = CanonicalState(
                state="review",
                who_is_next=role,
                next_action=f"wait: every {role} is busy ({cap} live lease(s) each); foreman hands the {what} of "
                f"#{number} to the next {role} who frees up",
                next_prompt=f"PR #{queued.pull.number} waits for a {what}; foreman hands it out automatically, once.",
                what_happened=f"the {what} queue found PR #{queued.pull.number} waiting and every {role} busy",
                why=f"max_leases_per_{role} = {cap}",
                related_prs=(queued.pull.number,),
                blockers="none",
                validation="live leases counted in the database when this comment was enqueued",
                last_updated_by=door.bot_login or "foreman",
            )
            body = render_evidence(key=key, summary=f"#{number} waits: every {role} is busy.", state=state,
                                   evidence={"action": f"{what}_wait", "pull": queued.pull.number})
            await enqueue(conn, OutboxIntent(key, number, "comment", {"body": body}, delivery_id, repo=door.repo))
