"""Auto-allocation: ready issues go to the next idle roster author, proven and bootstrapped (docs/allocator.md)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from bot.config import Settings
from bot.core.allocator import AllocationRequest, Candidate, SelectDecision, decide
from bot.core.canonical import CanonicalState
from bot.core.evidence import render_evidence
from bot.core.intents import StateChange
from bot.gitea import GiteaError
from bot.loops.queues import run_queues
from bot.verbs.allocate import AllocationOutcome, Allocator, AllocatorGitea, author_pick
from bot.verbs.bootstrap.preflight import PREFLIGHT_FAILED, Check
from bot.verbs.handback import resume_hand_backs
from bot.verbs.runtime import CallOptions, VerbRuntime, operator_caller, when_author_freed
from bot.verbs.stranded import expire_stranded
from state.auto_allocations import AutoAllocationStore
from state.db import Database, utcnow
from state.exclusions import ExclusionStore
from state.journal import JournalStore
from state.leases import LeaseStore
from state.outbox import OutboxIntent, OutboxStore, enqueue

log = logging.getLogger("foreman.auto_allocate")

ACTOR = "foreman:auto-allocate"
CALLER = operator_caller(ACTOR, "auto")
#: Preflight checks that fail because of the issue itself (its canonical path, a foreign lease): the issue is
#: marked blocked and the run goes on with the others.
_ISSUE_CHECKS: frozenset[Check] = frozenset({"path_free", "no_foreign_lease"})
_LOCKS: dict[tuple[int, str], asyncio.Lock] = {}


class AutoUnavailable(RuntimeError):
    """Gitea could not serve the allocation or its bootstrap now: the trigger is retried."""


@dataclass
class AutoReport:
    """One automatic decision: who was picked, what was leased, resumed, blocked and what waits."""

    trigger: str
    enabled: bool
    named_owner: str | None = None
    leased: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    blocked: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    applies: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    pick: dict[str, Any] | None = None
    standing_exclusions: dict[str, list[int]] = field(default_factory=dict)
    #: Leases that expired past their grace in this run: their issues went back to their queues.
    expired: list[int] = field(default_factory=list)
    #: The review and merge queues' run (bot/loops/queues.py).
    queues: dict[str, Any] | None = None
    #: Why a phase that leased nothing leased nothing (the run says so instead of staying silent).
    silence: dict[str, str] = field(default_factory=dict)
    note: str | None = None
    outbox: bool = False  # whether anything was enqueued (the caller wakes the sender)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trigger": self.trigger, "enabled": self.enabled, "named_owner": self.named_owner,
            "leased": self.leased, "resumed": self.resumed, "blocked": self.blocked, "waiting": self.waiting,
            "applies": self.applies, "skipped": self.skipped, "pick": self.pick, "note": self.note,
            "standing_exclusions": self.standing_exclusions, "expired": self.expired, "queues": self.queues,
            "silence": self.silence,
        }

    def summary(self) -> str:
        """One log line: what was done, and why a phase did nothing."""
        queues = self.queues or {}
        text = (f"leased {self.leased}, resumed {self.resumed}, blocked {self.blocked}, waiting {self.waiting}, "
                f"expired {self.expired}, reviews {queues.get('reviews', [])}, merges {queues.get('merges', [])}, "
                f"merged {queues.get('merged', [])}"
                + (f", handed back {queues['handed_back']}" if queues.get("handed_back") else ""))
        if self.silence:
            text += "; " + "; ".join(f"{phase}: {why}" for phase, why in sorted(self.silence.items()))
        return text


async def recent_decisions(db: Database, repo: str, *, limit: int = 10) -> list[dict[str, Any]]:
    """The latest automatic decisions, newest first, as recorded."""
    return [{**d.doc, "decided_at": d.decided_at, "delivery": d.delivery_id}
            for d in await AutoAllocationStore(db).recent(repo, limit=limit)]


async def auto_allocate(
    door: VerbRuntime[AllocatorGitea], *, trigger: str, delivery_id: str | None = None, now: datetime | None = None,
) -> AutoReport:
    """Allocate every ready issue an idle author can take now, through ``door`` (its repository's, built by the
    composition root: its database, settings view, Gitea client, bot login and outbox wakeup); record the decision.

    Raises AutoUnavailable when Gitea could not serve it (nothing half-done is left: a lease whose bootstrap could
    not run is resumed by the retry).
    """
    db, settings, gitea = door.db, door.settings, door.gitea
    report = AutoReport(trigger=trigger, enabled=settings.auto_allocation(),
                        named_owner=settings.allocator.auto_allocate_owner or None)
    if not report.enabled:
        report.note = "auto-allocation is off ([allocator] auto = false, or no author in [roster])"
        return report
    if gitea is None:
        report.note = "no Gitea client: there are no candidates to read"
        return report
    lock = _LOCKS.setdefault((id(db), settings.repo_key), asyncio.Lock())
    async with lock:
        try:
            await _run(door, gitea, report, delivery_id, now)
        finally:
            await _record(db, settings, report, delivery_id, now)
    return report


@dataclass
class _Apply:
    """One apply of the allocator through the door for an owner, as auto-allocation makes it: its exclusions (the
    controllers' standing ones per action, and the issues whose proof failed in this run), its report entry, and
    ``AutoUnavailable`` when Gitea could not answer."""

    door: VerbRuntime[AllocatorGitea]
    report: AutoReport
    delivery_id: str | None
    now: datetime | None
    #: implement: the standing exclusions, then the issues whose proof failed in this run; review, merge: standing.
    excluded: dict[str, set[int]]

    @classmethod
    async def open(cls, door: VerbRuntime[AllocatorGitea], report: AutoReport, delivery_id: str | None,
                   now: datetime | None) -> _Apply:
        """The controllers' standing exclusions, per action, as in their own calls (docs/allocator.md)."""
        store, repo = ExclusionStore(door.db), door.repo
        report.standing_exclusions = await store.standing(repo, action="implement")
        excluded = {"implement": {n for numbers in report.standing_exclusions.values() for n in numbers}}
        for action in ("review", "merge"):
            stated = await store.standing(repo, action=action)
            excluded[action] = {n for numbers in stated.values() for n in numbers}
        return cls(door, report, delivery_id, now, excluded)

    async def __call__(self, owner: str, *, resume: bool, action: str = "implement",
                       candidates: tuple[Candidate, ...] | None = None,
                       history: Mapping[int, str | None] | None = None) -> AllocationOutcome:
        # The exclusions in-process: their union is not bounded by what one call's exclude_issue_numbers may state.
        cfg, now, report = self.door.settings.allocator, self.now, self.report
        if action == "implement":
            options = CallOptions(resume_own=resume, max_live=None if resume else cfg.max_leases_per_author,
                                  now=now, exclusions=frozenset(self.excluded[action]))
        else:  # a queue's: its candidates as the queues' run read them once
            cap = cfg.max_leases_per_reviewer if action == "review" else cfg.max_leases_per_merger
            options = CallOptions(resume_own=False, max_live=cap, now=now,
                                  exclusions=frozenset(self.excluded[action]), candidates=candidates,
                                  lease_history=history)
        result = await self.door.call("allocate_next_work", CALLER,
                                      {"owner": owner, "dry_run": False, "action": action},
                                      delivery_id=self.delivery_id, options=options)
        outcome = result.outcome
        if not isinstance(outcome, AllocationOutcome):  # the door refused before the allocator ran
            outcome = AllocationOutcome(decision=None, refusal=result.refusal, dry_run=False)
        doc = outcome.to_dict()
        report.applies.append({
            "owner": owner, "action": action, "decision": doc.get("decision"),
            "issue_number": doc.get("issue_number"), "applied": outcome.applied, "error": doc.get("error"),
            "skipped": doc.get("skipped", []), "bootstrap": (outcome.bootstrap or {}).get("status"),
            **({"refusal": outcome.refusal.to_dict()} if outcome.refusal is not None else {}),
        })
        if outcome.applied or outcome.outbox_keys or outcome.bootstrap is not None:
            report.outbox = True  # the lease's (and its bootstrap's) evidence went out with each commit
        if outcome.refusal is not None and outcome.refusal.error == "unavailable":
            raise AutoUnavailable(outcome.refusal.message)
        return outcome


def _bootstrap_unavailable(outcome: AllocationOutcome) -> None:
    bootstrap = outcome.bootstrap or {}
    if bootstrap.get("error") == "unavailable":
        # The lease stands; the retry resumes it and its bootstrap (the implement phase's step 1).
        raise AutoUnavailable(f"#{bootstrap.get('issue_number')}: {bootstrap.get('message')}")


async def _run(door: VerbRuntime[AllocatorGitea], gitea: AllocatorGitea, report: AutoReport,
               delivery_id: str | None, now: datetime | None) -> None:
    """One run's phases in order: stranded work back to its queue, then ready issues to authors, then the review
    and merge queues; and why each phase that leased nothing leased nothing."""
    moment = now or utcnow()
    apply = await _Apply.open(door, report, delivery_id, now)
    expired = await expire_stranded(door.db, door.repo, grace=timedelta(seconds=door.settings.allocator.lease_grace_s),
                                    now=moment, bot_login=door.bot_login, delivery_id=delivery_id)
    if expired:
        report.expired = [lease.issue_number for lease in expired]
        report.outbox = True
    await _implement(door, gitea, apply, report, delivery_id, now)
    try:
        queues = await run_queues(door, lambda owner, action, found, seen: apply(
                                      owner, resume=False, action=action, candidates=found, history=seen),
                                  now=moment, delivery_id=delivery_id)
    except GiteaError as exc:
        raise AutoUnavailable(f"the review and merge queues could not be read: {exc}") from exc
    report.queues = queues.to_dict()
    if queues.reviews or queues.merges or queues.merged:
        report.outbox = True
    _explain_silence(door.settings, report)


async def _implement(door: VerbRuntime[AllocatorGitea], gitea: AllocatorGitea, apply: _Apply, report: AutoReport,
                     delivery_id: str | None, now: datetime | None) -> None:
    # Over 60 lines: the implement phase's steps in order (hand-backs, a named owner, unstarted leases, idle authors)
    # share the run's state.
    db, settings, bot_login = door.db, door.settings, door.bot_login
    allocator = Allocator(db, settings, gitea, bot_login=bot_login)  # its candidates and policy, for what waits
    repo = settings.repo_key
    named = settings.allocator.auto_allocate_owner or None
    excluded = apply.excluded["implement"]  # the standing exclusions, then issues whose proof failed in this run
    done: set[str] = set()
    moment = now or utcnow()
    # 0. Issues whose requested changes wait for their implementer (max_leases_per_author was reached): leased back
    # to the implementer with room now, before any new work (step 1 then finishes their bootstrap).
    back = await resume_hand_backs(db, settings, actor=ACTOR, now=moment, bot_login=bot_login,
                                   delivery_id=delivery_id)
    if back:
        report.resumed.extend(back)
        report.outbox = True
    if named:
        # One named owner: the allocator as before (its live lease is resumed, its bootstrap finished).
        outcome = await apply(named, resume=True)
        kind = outcome.decision.kind if outcome.decision is not None else None
        if outcome.applied and outcome.lease is not None:
            report.leased.append(outcome.lease.issue_number)
        elif kind == "resume" and outcome.lease is not None:
            report.resumed.append(outcome.lease.issue_number)
        else:
            await _maybe_block(db, allocator, outcome, report, excluded, delivery_id)
        _bootstrap_unavailable(outcome)
    else:
        # 1. Live leases of roster authors without a completed bootstrap: resumed for their owners.
        if settings.bootstrap.on_allocate == "run":
            journal = JournalStore(db)
            for lease in await LeaseStore(db).open_leases(repo):
                if lease.owner in done or not lease.is_live(moment) or lease.owner not in settings.authors():
                    continue
                transitions = await journal.history(repo, lease.issue_number)
                if any(t.lease_id == lease.lease_id and t.phase == "completed" for t in transitions):
                    continue
                done.add(lease.owner)
                outcome = await apply(lease.owner, resume=True)
                if outcome.lease is not None and outcome.decision is not None and outcome.decision.kind == "resume":
                    report.resumed.append(outcome.lease.issue_number)
                _bootstrap_unavailable(outcome)
        # 2. The next idle author, one apply at a time (the loads change with every lease).
        for _ in range(4 * len(settings.authors()) + 20):
            pick = await author_pick(db, settings, moment)
            order = [login for login in pick.order if login not in done]
            if not order:
                break
            owner = order[0]
            outcome = await apply(owner, resume=False)
            if outcome.applied and outcome.lease is not None:
                report.leased.append(outcome.lease.issue_number)
                _bootstrap_unavailable(outcome)
                if outcome.lease.status != "live":
                    excluded.add(outcome.lease.issue_number)  # its bootstrap failed and released it
                continue
            if await _maybe_block(db, allocator, outcome, report, excluded, delivery_id):
                continue
            refusal = outcome.refusal
            if refusal is not None and refusal.error == "conflict":
                continue  # another allocation won a race: decide again on the fresh leases
            kind = outcome.decision.kind if outcome.decision is not None else None
            if kind == "wait" and refusal is None:
                break  # no eligible ready issue for anyone
            done.add(owner)  # refused for this owner (e.g. not_authorized, blocked): the next author
    await _waiting(db, settings, allocator, report, excluded, now)


async def _maybe_block(db: Database, allocator: Allocator, outcome: AllocationOutcome, report: AutoReport,
                       excluded: set[int], delivery_id: str | None) -> bool:
    """A failed proof of the issue itself: the issue is marked blocked with evidence, leased to no one."""
    refusal = outcome.refusal
    if refusal is None or refusal.reason != PREFLIGHT_FAILED:
        return False
    failed = set(refusal.details.get("failed_checks") or ())
    if not failed & _ISSUE_CHECKS:
        return False
    number = int(refusal.details["issue_number"])
    excluded.add(number)
    report.blocked.append(number)
    prefix = f"auto-proof:{number}:"
    statuses = await OutboxStore(db).comment_statuses(prefix, repo=allocator.repo)
    if any(status in ("pending", "sending") for status in statuses):
        return True  # the same refusal is already on its way
    key = f"{prefix}{len(statuses)}"
    state = CanonicalState(
        state="blocked",
        who_is_next="human",
        next_action=f"an operator frees {refusal.details['preflight'].get('worktree_path')} (moves it aside), "
        f"then labels #{number} status:ready again",
        next_prompt=f"{refusal.message}\n{refusal.remediate}",
        what_happened=f"auto-allocation could not prove that {refusal.details.get('owner')} can bootstrap "
        f"#{number}; nothing was leased",
        why=f"{refusal.error}: failed checks {', '.join(sorted(failed))}",
        related_prs=(),
        blockers=refusal.message.replace("\n", " "),
        validation="the bootstrap preflight ran before any lease; no lease row, branch or worktree was made",
        last_updated_by=allocator.bot_login or "foreman",
    )
    change = StateChange(
        repo=allocator.repo, issue_number=number, state=state, cause=delivery_id,
        summary=f"Not allocated: #{number} failed the bootstrap proof ({', '.join(sorted(failed))}).",
        evidence={"action": "auto_allocate_proof_failed", "refusal": refusal.to_dict()},
        comment_key=key, labels_key=f"{key}:labels", leaving=("ready",),
    )
    async with db.transaction() as conn:
        for intent in change.intents():
            await enqueue(conn, intent)
    report.outbox = True
    return True


async def _waiting(db: Database, settings: Settings, allocator: Allocator, report: AutoReport, excluded: set[int],
                   now: datetime | None) -> None:
    """What is still eligible after the run; when every author is busy, each waiting issue says so once."""
    moment = now or utcnow()
    standing = {n for numbers in report.standing_exclusions.values() for n in numbers}
    try:
        candidates, open_numbers = await allocator.gather_candidates()
    except GiteaError as exc:
        report.note = f"could not list the waiting issues: {exc}"
        return
    repo = settings.repo_key
    leases = [lease.as_live_lease() for lease in await LeaseStore(db).open_leases(repo)]
    view = decide(AllocationRequest(owner=ACTOR, candidates=candidates, exclude_issue_numbers=sorted(excluded) or None,
                                    open_issue_numbers=open_numbers), allocator.policy, leases, moment)
    leased_now = set(report.leased) | set(report.resumed)
    report.skipped = [s.to_dict() for s in view.skipped if s.issue_number not in leased_now | set(report.blocked)]
    for entry in report.skipped:
        if entry["reason"] == "excluded_by_controller" and entry["issue_number"] not in standing:
            entry["detail"] = f"#{entry['issue_number']} failed its bootstrap proof in this run"
    report.waiting = [r.issue_number for r in view.ranked] if isinstance(view, SelectDecision) else []
    pick = await author_pick(db, settings, moment)
    report.pick = pick.to_dict()
    if not report.waiting or pick.order:
        return
    cap = settings.allocator.max_leases_per_author
    store = LeaseStore(db)
    async with db.transaction() as conn:
        for number in report.waiting:
            key = f"auto-wait:{number}:{len(await store.history(repo, number))}"
            busy = ", ".join(s.login for s in pick.skipped)
            state = CanonicalState(
                state="ready",
                who_is_next="controller",
                next_action=f"wait: every author is busy ({busy}: {cap} live lease(s) each); foreman allocates "
                f"#{number} to the next author who frees up",
                next_prompt=f"#{number} is ready and waits for an idle author. A release, an expiry or a merge frees"
                " one;\nforeman then allocates it automatically, once.",
                what_happened=f"auto-allocation found #{number} ready and every author busy",
                why=f"policy: {pick.to_dict()['policy']['order']}; max_leases_per_author = {cap}",
                related_prs=(),
                blockers="none",
                validation="live leases counted in the database when this comment was enqueued",
                last_updated_by=allocator.bot_login or "foreman",
            )
            body = render_evidence(
                key=key,
                summary=f"#{number} waits: every author is busy.",
                state=state,
                evidence={"action": "auto_allocate_wait", "waiting": report.waiting, "authors": pick.to_dict()},
            )
            if await enqueue(conn, OutboxIntent(key, number, "comment", {"body": body}, None, repo=repo)):
                report.outbox = True


def _explain_silence(settings: Settings, report: AutoReport) -> None:
    """Why each phase that leased nothing leased nothing, in words an operator can act on."""
    if not (report.leased or report.resumed):
        skipped = {entry.get("reason") for entry in report.skipped}
        excluded = sorted(n for numbers in report.standing_exclusions.values() for n in numbers)
        if report.blocked:
            why = f"the bootstrap proof failed for {report.blocked}"
        elif report.waiting:
            why = f"every author is busy (max_leases_per_author = {settings.allocator.max_leases_per_author})"
        elif "excluded_by_controller" in skipped:
            why = f"the ready issues are excluded by a controller's standing exclusions {excluded}"
        elif report.skipped:
            why = "no ready issue is eligible: " + ", ".join(sorted(str(r) for r in skipped))
        else:
            why = "no issue is status:ready"
        report.silence["implement"] = why
    queues = report.queues or {}
    if not queues.get("reviews"):
        report.silence["review"] = (
            "no pull request waits for review" if not queues.get("waiting_review") else
            f"every reviewer is busy or barred (max_leases_per_reviewer = {settings.allocator.max_leases_per_reviewer})"
            f"; waiting: {queues.get('waiting_review')}")
    if not (queues.get("merges") or queues.get("merged")):
        checks = queues.get("waiting_checks") or []
        report.silence["merge"] = (
            (f"approved pull requests wait for required status checks: {checks}" if checks else
             "no approved pull request waits to merge") if not queues.get("waiting_merge") else
            f"waiting: {queues.get('waiting_merge')}; " + ("; ".join(queues.get("notes") or []) or
                                                         "every merger is busy or barred"))


async def _record(db: Database, settings: Settings, report: AutoReport, delivery_id: str | None,
                  now: datetime | None) -> None:
    await AutoAllocationStore(db).record(settings.repo_key, decided_at=now or utcnow(), trigger=report.trigger,
                                         delivery_id=delivery_id, doc=report.to_dict())


async def auto_allocate_after(
    door: VerbRuntime[AllocatorGitea], *, trigger: str, delivery_id: str | None,
) -> dict[str, Any] | None:
    """Auto-allocation after something freed an author (a release, the PR-open hand-over, a merge's teardown).

    Its failure never undoes or fails what freed the author: it is reported (and logged), and the next trigger or
    catch-up allocates instead. None when auto-allocation is off or there is no Gitea client."""
    if not door.settings.auto_allocation() or door.gitea is None:
        return None
    try:
        report = await auto_allocate(door, trigger=trigger, delivery_id=delivery_id)
    except Exception as exc:  # reported in the result and the log; what freed the author stands
        log.warning("auto-allocation after %s failed: %s: %s", trigger, type(exc).__name__, exc)
        return {"error": "unavailable", "message": f"{type(exc).__name__}: {exc}"}
    return {"trigger": trigger, "leased": report.leased, "waiting": report.waiting, "blocked": report.blocked}


@when_author_freed
async def allocate_after_release(rt: VerbRuntime[AllocatorGitea], delivery_id: str | None) -> dict[str, Any] | None:
    """A release freed its owner: auto-allocation runs for the release's repository at once."""
    return await auto_allocate_after(rt, trigger="release", delivery_id=delivery_id)


