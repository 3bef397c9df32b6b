"""The review verbs: find an issue's pull request, gather review candidates, claim a review and submit a verdict."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal, Protocol

from bot.core.bootstrap import branch_for
from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope
from bot.core.evidence import render_evidence
from bot.core.gateway import GatewayContext
from bot.core.verbs import PRECONDITION_PR_EXISTS, Verb
from bot.core.vocabulary import label_for_state, state_for_label
from bot.gitea import GiteaError, GiteaNotFound, Issue, IssueState, IssueType, client_as
from bot.gitea.values import PullRequest, Review
from bot.verbs.gitea_refusals import GiteaAsk, gitea_refusal
from bot.verbs.handback import AWAITING, HAND_BACK_SOURCES, busy_leases, lease_back
from bot.verbs.leases import lease_changed
from bot.verbs.leasing import LeaseGrant, grant_lease
from bot.verbs.runtime import (
    Caller,
    CallOptions,
    VerbResult,
    VerbRuntime,
    call_scoped,
    envelope,
    executes,
    issue_of,
    reads_facts,
    refused,
    registry,
    replays,
)
from bot.verbs.stranded import release_stranded
from state.db import Database
from state.leases import Lease, LeaseRefused, LeaseStore, LeaseTaken
from state.outbox import OutboxIntent, enqueue
from state.publications import PublicationStore
from state.sql import Connection

Verdict = Literal["approve", "request_changes"]
_EVENTS: Mapping[str, Literal["APPROVED", "REQUEST_CHANGES"]] = {
    "approve": "APPROVED", "request_changes": "REQUEST_CHANGES",
}
_MARKER = re.compile(r"<!-- foreman:review (lease-[0-9a-f]+) -->")


class PullsGitea(Protocol):
    """The Gitea reads that find an issue's pull request and its reviews."""

    async def get_issue(self, number: int) -> Issue: ...

    async def get_pull(self, number: int) -> PullRequest: ...

    async def list_pulls(
        self, *, state: IssueState = ..., base_branch: str | None = ..., limit: int = ...
    ) -> list[PullRequest]: ...

    async def list_reviews(self, number: int) -> list[Review]: ...


class ReviewGitea(PullsGitea, Protocol):
    """What the review verbs use: the pull-request reads, the issue listing and the review API."""

    async def list_issues(
        self, *, state: IssueState = ..., labels: Sequence[str] = ..., type_: IssueType | None = ..., limit: int = ...
    ) -> list[Issue]: ...

    async def submit_review(
        self, number: int, event: Literal["APPROVED", "REQUEST_CHANGES", "COMMENT"], *, body: str = ...,
        commit_id: str = ...,
    ) -> Review: ...


# --- the pull request of an issue -------------------------------------------------------------------------------------


async def pull_for_issue(
    gitea: PullsGitea, db: Database, repo: str, issue: Issue, *, slug_length: int, include_merged: bool = False
) -> PullRequest | None:
    """The issue's pull request: the one foreman recorded opening for it (``PublicationStore.pull_for_issue``, so a
    retitled issue keeps its PR), else the open PR whose head is the issue's canonical branch (``branch_for``: a
    PR opened outside foreman); with ``include_merged`` a merged one too (a replayed merge). The one place that
    answers "which PR is this issue's"."""
    recorded = await PublicationStore(db).pull_for_issue(repo, issue.number)
    if recorded is not None:
        try:
            pull = await gitea.get_pull(recorded.pr_number)
        except GiteaNotFound:
            pull = None
        if pull is not None and (pull.state == "open" or (include_merged and pull.merged)):
            return pull
    branch = branch_for(issue.number, issue.title, slug_length=slug_length)
    state: IssueState = "all" if include_merged else "open"
    found = [p for p in await gitea.list_pulls(state=state) if p.head_ref == branch and (p.state == "open" or p.merged)]
    if not found:
        return None
    return min(found, key=lambda p: (p.state != "open", -p.number))  # an open one first, then the newest


def standing_approvals(reviews: Sequence[Review]) -> list[Review]:
    """The approvals Gitea still shows on the PR (not dismissed), whoever posted them: what the door's
    ``pr_approved`` asks for. Which one counts is the merge gate's decision (``merge_gate`` in merge.py)."""
    return [r for r in reviews if r.state == "APPROVED" and not r.dismissed]


@dataclass(frozen=True, slots=True)
class RecordedVerdict:
    """A verdict foreman's review verb recorded: the review lease that made it (its owner the reviewer), the Gitea
    review it posted (its id, the account it was posted as) and the commit it judged. Kept on the review lease's
    ``released`` event (``reviewed``), so only a lease holder's verdict through the verb is ever one."""

    lease_id: str
    reviewer: str
    verdict: Verdict
    review_id: int
    commit_id: str
    pull_number: int
    posted_as: str


def _verdict_detail(review: Review, verdict: str, pull_number: int) -> dict[str, Any]:
    """What the review lease's ``released`` event keeps of the verdict (read back by ``recorded_verdicts``)."""
    return {"verdict": verdict, "review_id": review.id, "commit_id": review.commit_id, "pull_request": pull_number,
            "posted_as": review.user.login if review.user is not None else ""}


async def recorded_verdicts(leases: LeaseStore, repo: str, issue: int) -> list[RecordedVerdict]:
    """The verdicts foreman's review verb recorded on the issue, oldest first: one per review lease that ended
    ``reviewed`` with the verdict on its ``released`` event (a release that carries none is no verdict)."""
    reviewed = [lease for lease in await leases.history(repo, issue)
                if lease.action == "review" and lease.role == "reviewer" and lease.end_reason == "reviewed"]
    released = {e["lease_id"]: e["detail"] for e in await leases.events_of(lease.lease_id for lease in reviewed)
                if e["kind"] == "released"}
    out: list[RecordedVerdict] = []
    for lease in reviewed:
        detail = released.get(lease.lease_id, {})
        verdict, review_id, commit, pull = (detail.get(k) for k in ("verdict", "review_id", "commit_id",
                                                                   "pull_request"))
        if verdict not in _EVENTS or not isinstance(review_id, int) or not isinstance(pull, int) or not commit:
            continue
        out.append(RecordedVerdict(lease.lease_id, lease.owner, verdict, review_id, str(commit), pull,
                                   str(detail.get("posted_as") or "")))
    return out


async def implementer_of(leases: LeaseStore, repo: str, issue: int) -> Lease | None:
    """The issue's last ``implement`` lease (its owner is the implementer the self-review block names)."""
    implements = [lease for lease in await leases.history(repo, issue) if lease.action == "implement"]
    return implements[-1] if implements else None


@dataclass(frozen=True, slots=True)
class PullFacts:
    """What the review and merge gates read: the issue, its PR, the reviews on it, the implementer, the state."""

    issue: Issue | None
    pull: PullRequest | None
    reviews: tuple[Review, ...]
    implementer: str | None
    issue_state: str | None

    @property
    def approved(self) -> bool:
        """An approval stands on the PR on Gitea (the door's ``pr_approved``); the merge verb decides whether one
        counts (foreman's recorded verdict), and names the others."""
        return bool(standing_approvals(self.reviews))


def issue_state_of(issue: Issue) -> str | None:
    states = sorted(s for s in (state_for_label(name) for name in issue.label_names) if s is not None)
    return states[0] if len(states) == 1 else None


async def pull_facts(rt: VerbRuntime[PullsGitea], number: int) -> PullFacts:
    """The PR facts of issue ``number`` (no Gitea, or Gitea cannot answer: no PR, which the gates refuse), read once
    per verb call: the door's precondition (``pull_fact``) and the verb decide on the same read."""
    return await call_scoped(("pull_facts", rt.repo, number), lambda: _read_pull_facts(rt, number))


async def _read_pull_facts(rt: VerbRuntime[PullsGitea], number: int) -> PullFacts:
    implementer = await implementer_of(rt.leases, rt.repo, number)
    owner = implementer.owner if implementer is not None else None
    if rt.gitea is None:
        return PullFacts(None, None, (), owner, None)
    try:
        issue = await rt.gitea.get_issue(number)
        pull = await pull_for_issue(rt.gitea, rt.db, rt.repo, issue, slug_length=rt.settings.bootstrap.slug_length)
        reviews = tuple(await rt.gitea.list_reviews(pull.number)) if pull is not None else ()
    except GiteaNotFound:
        return PullFacts(None, None, (), owner, None)
    return PullFacts(issue, pull, reviews, owner, issue_state_of(issue))


# --- the lease's evidence ---------------------------------------------------------------------------------------------


def review_lease_effects(lease: Lease, bot_login: str, cause: str | None) -> tuple[OutboxIntent, ...]:
    """The Gitea side of a review or merge lease: its evidence comment (the issue stays in `status:review`)."""
    number, key = lease.issue_number, f"{lease.lease_id}:evidence"
    merge = lease.action == "merge"
    what = "merge" if merge else "review"
    tool = "gitea_merge_pull_request" if merge else "gitea_submit_review"
    state = CanonicalState(
        state="review",
        who_is_next="merger" if merge else "reviewer",
        next_action=f"{lease.owner}: {'merge' if merge else 'review'} the pull request and call {tool} for #{number}",
        next_prompt=(
            f"You hold {what} lease {lease.lease_id} on #{number} until {lease.expires_at.isoformat()}.\n"
            + (f"Call gitea_merge_pull_request with issue_number={number}: it merges exactly the approved commit."
               if merge else
               "Read the pull request, then call gitea_submit_review with verdict approve or request_changes.")
        ),
        what_happened=f"leased the {what} of #{number} to {lease.owner}",
        why=("its pull request's approval counts on exactly its head, and the merger neither wrote nor implemented it"
             if merge else
             "the issue is in status:review and the reviewer neither wrote nor implemented its pull request"),
        related_prs=(),
        blockers="none",
        validation="lease row committed; this comment is read back by foreman",
        last_updated_by=bot_login or "foreman",
    )
    body = render_evidence(key=key, summary=f"Leased the {what} of #{number} to {lease.owner}.", state=state,
                           evidence={"action": f"{what}_lease", "lease": lease.to_dict()})
    return (OutboxIntent(key, number, "comment", {"body": body}, cause, repo=lease.repo),)


# --- claim_review -----------------------------------------------------------------------------------------------------


@reads_facts(PRECONDITION_PR_EXISTS)
async def pull_fact(rt: VerbRuntime[Any], context: GatewayContext, lease: Lease | None, issue: int) -> GatewayContext:
    """The review and merge facts: the issue's PR (its author), the verdict on it, the implementer, the state."""
    facts = await pull_facts(rt, issue)
    pull = facts.pull
    return replace(context, pr_number=pull.number if pull is not None else None,
                   pr_author=pull.user.login if pull is not None else None, pr_approved=facts.approved,
                   implementer=facts.implementer, issue_state=facts.issue_state)


@executes("claim_review")
async def claim_review(
    rt: VerbRuntime[ReviewGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    number = issue_of(values)
    now = rt.clock()
    if lease is not None and lease.is_live(now):
        return refused(verb.name, envelope(
            "conflict", f"#{number} is leased to {lease.owner} for {lease.action}; nobody else may claim it now",
            "Wait until the lease ends, or review another issue.",
            "call gitea_get_runtime_context to find other work", reason="leased", lease=lease.to_dict()))
    try:
        async with rt.db.transaction() as conn:
            grant = LeaseGrant(issue_number=number, owner=caller.login, action="review", actor=caller.login,
                               request={"source": "claim_review"}, reclaim=lease)
            review_lease = await grant_lease(conn, rt.leases, rt.settings, grant, now)
            intents = review_lease_effects(review_lease, rt.bot_login, delivery_id)
            for intent in intents:
                await enqueue(conn, intent)
    except LeaseTaken as exc:
        return refused(verb.name, envelope(
            "conflict", f"{exc}; nothing was claimed", "Another lease won the race for this issue.",
            f"call gitea_get_issue_state with issue_number={number}"))
    return rt.done(verb, caller, {"issue_number": number, "lease": review_lease.to_dict(),
                                  "outbox": [i.key for i in intents]})


# --- submit_review ----------------------------------------------------------------------------------------------------


def _marker(lease_id: str) -> str:
    return f"<!-- foreman:review {lease_id} -->"


def _found(reviews: Sequence[Review], lease_id: str) -> Review | None:
    """The review this lease already submitted (its body carries the lease's marker), if any."""
    for review in reviews:
        match = _MARKER.search(review.body)
        if match is not None and match.group(1) == lease_id:
            return review
    return None


def _review_doc(number: int, pull: PullRequest, review: Review, verdict: str) -> dict[str, Any]:
    return {"issue_number": number, "pull_number": pull.number, "verdict": verdict,
            "review": {"id": review.id, "state": review.state, "commit_id": review.commit_id}}


def _own_pull(number: int, pull: PullRequest, reviewer: str, own_token: bool) -> Envelope:
    """Gitea refuses a verdict from the PR's poster: refused before asking it, the review lease kept."""
    poster = pull.user.login
    fix = (f"An operator sets gitea.identity_tokens.{reviewer} (or gitea.identity_token_files.{reviewer}) to "
           f"{reviewer}'s own Gitea token, so the review is posted as {reviewer}, not as {poster}."
           if not own_token else f"{reviewer}'s configured Gitea token is {poster}'s account, which posted the PR.")
    return envelope(
        "invalid_state",
        f"the verdict on PR #{pull.number} would be posted by {poster}, the Gitea account that posted the PR, and "
        "Gitea refuses a verdict from a PR's poster; nothing was sent and your review lease is kept",
        fix, f"ask an operator to set gitea.identity_tokens.{reviewer} to {reviewer}'s own Gitea token, then call "
        f"gitea_submit_review again with issue_number={number}",
        reason="review_by_pr_poster", poster=poster, reviewer=reviewer, pull_number=pull.number)


@executes("submit_review")
async def submit_review(
    rt: VerbRuntime[ReviewGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    assert lease is not None  # the ownership precondition held
    number = issue_of(values)
    verdict = str(values["verdict"])
    text = str(values.get("body") or "").strip()
    if lease.action != "review":
        return refused(verb.name, envelope(
            "not_authorized", f"your lease on #{number} is for {lease.action}, not a review",
            "Only the holder of a review lease submits a verdict.", f"call gitea_claim_review for #{number}"))
    if verdict == "request_changes" and not text:
        return refused(verb.name, envelope(
            "invalid_input", "request_changes needs a body saying what must change",
            "Say what must change in body.", f"call {verb.tool} again with body set", problems=[
                {"argument": "body", "problem": "required for request_changes"}]))
    facts = await pull_facts(rt, number)
    pull = facts.pull
    if pull is None or rt.gitea is None:
        return refused(verb.name, envelope(
            "invalid_state", f"#{number} has no open pull request any more", "Read the issue's state.",
            f"call gitea_get_issue_state with issue_number={number}"))
    acting = client_as(rt.gitea, rt.settings, caller.login, bot_login=rt.bot_login)
    try:
        review = _found(facts.reviews, lease.lease_id)  # the PR's reviews as this call read them
        if review is None:
            if acting.login.lower() == pull.user.login.lower():
                return refused(verb.name, _own_pull(number, pull, caller.login, acting.own_token))
            body = f"{text}\n\n{_marker(lease.lease_id)}" if text else _marker(lease.lease_id)
            review = await acting.client.submit_review(pull.number, _EVENTS[verdict], body=body,
                                                       commit_id=pull.head_sha)
    except GiteaError as exc:
        return refused(verb.name, gitea_refusal(exc, GiteaAsk(
            what=f"take the review of PR #{pull.number}",
            refused_because="Gitea refuses a verdict on a closed PR and by the PR's own poster.",
            after_failure="Nothing was recorded; a retry finds a review Gitea did take.",
            retry=f"call {verb.tool} again", read_state=f"call gitea_get_issue_state with issue_number={number}")))
    return await _record_verdict(rt, verb, caller, lease, facts, pull, review, verdict, text, delivery_id)


async def _record_verdict(
    rt: VerbRuntime[ReviewGitea], verb: Verb, caller: Caller, lease: Lease, facts: PullFacts, pull: PullRequest,
    review: Review,
    verdict: str, text: str, delivery_id: str | None,
) -> VerbResult:
    """In one transaction: the review lease ends (reviewed), the evidence comment, and for request_changes the
    issue back to `status:in-progress` with a new implement lease for its implementer."""
    number, now = lease.issue_number, rt.clock()
    key = f"{lease.lease_id}:review"
    implementer = facts.implementer
    approve = verdict == "approve"
    cap = rt.settings.allocator.max_leases_per_author
    # The implementer at max_leases_per_author (the hand-over freed them for other work): no second lease; the
    # issue waits for them, and auto-allocation leases it back once one of their leases ends.
    busy = [] if approve or implementer is None else await busy_leases(rt.leases, rt.repo, implementer, now)
    # A hand-back preempts new work: the implementer's newest unstarted implement lease (nothing published from
    # it) goes back to status:ready so the requested changes come first.
    preempted = await _preemptible(rt, busy) if len(busy) >= cap else None
    if preempted is not None:
        busy = [held for held in busy if held.lease_id != preempted.lease_id]
    waiting = len(busy) >= cap
    others = ", ".join(f"#{held.issue_number}" for held in busy)
    state = CanonicalState(
        state="review" if approve else "in-progress",
        who_is_next="merger" if approve else "author",
        next_action=(f"a merger calls gitea_merge_pull_request for #{number}" if approve else
                     f"{implementer}: finish or release your other work ({others}) first (max_leases_per_author = "
                     f"{cap}); then auto-allocation leases #{number} back to you" if waiting else
                     f"{implementer or 'the author'}: call gitea_bootstrap_issue_worktree for #{number} (the same "
                     "worktree and branch come back), address the review and push again"),
        next_prompt=(f"PR #{pull.number} is approved at {review.commit_id}; merge exactly that commit." if approve
                     else f"Changes requested on PR #{pull.number}:\n{text}"),
        what_happened=f"{caller.login} {'approved' if approve else 'requested changes on'} PR #{pull.number} "
        f"at {review.commit_id}",
        why="the verdict of the review lease's holder, through Gitea's review API",
        related_prs=(pull.number,),
        blockers="none" if approve else (f"{implementer} holds {others} (max_leases_per_author = {cap}); "
                                         if waiting else "") + text.replace("\n", " ")[:200],
        validation=f"Gitea review {review.id} ({review.state}) on commit {review.commit_id}",
        last_updated_by=rt.bot_login or "foreman",
    )
    intents: list[OutboxIntent] = []
    preempt_keys: list[str] = []
    try:
        async with rt.db.transaction() as conn:
            if preempted is not None:  # its release queues its own effects (back to status:ready)
                preempt_keys = [i.key for i in await release_stranded(
                    conn, rt.db, preempted, by="foreman", reason="preempted_by_hand_back", now=now,
                    bot_login=rt.bot_login, delivery_id=delivery_id, key=f"{preempted.lease_id}:preempted",
                    hand_back=number)]
            back, back_evidence = await _end_review(rt, conn, caller, lease, review, verdict, implementer, now,
                                                    state, waiting=waiting, pull_number=pull.number,
                                                    delivery_id=delivery_id)
            if not approve:
                labels = {"add": [label_for_state("in-progress")],
                          "remove": [label_for_state("review"), label_for_state("pr-open")]}
                intents.append(OutboxIntent(f"{key}:labels", number, "labels", labels, delivery_id, repo=rt.repo))
            evidence = {"action": "submit_review", "verdict": verdict, "reviewer": caller.login,
                        "review_id": review.id, "commit_id": review.commit_id, "pull": pull.number,
                        "review_lease": lease.lease_id, "author_lease": back.lease_id if back is not None else None,
                        **({"awaiting_author": implementer, "author_busy_with": [b.issue_number for b in busy]}
                           if waiting else {})}
            body = render_evidence(key=key, summary=f"{caller.login}: {verdict} on PR #{pull.number}.", state=state,
                                   evidence=evidence)
            intents.append(OutboxIntent(key, number, "comment", {"body": body}, delivery_id, repo=rt.repo))
            if back_evidence is not None:  # every lease has its evidence comment, the author's handed-back one too
                intents.append(back_evidence)
            for intent in intents:
                await enqueue(conn, intent)
    except LeaseRefused:
        # Gitea holds the review (with this lease's marker): a retry by the new holder of a review lease finds it.
        return refused(verb.name, lease_changed(verb, lease))
    doc = _review_doc(number, pull, review, verdict)
    doc.update(outbox=[i.key for i in intents] + preempt_keys,
               lease=(await rt.leases.get(lease.lease_id) or lease).to_dict(),
               author_lease=back.to_dict() if back is not None else None,
               preempted=preempted.to_dict() if preempted is not None else None)
    # The reviewer is free and an approved PR waits to merge: the queues run, off this call's path (the service's
    # worker runs the queued trigger: bot/loops/triggers.py).
    queue = registry().queue_allocation
    queued = await queue(rt, "review", lease.lease_id) if queue is not None else None
    if queued is not None:
        doc["auto_allocation"] = {"trigger": "review", "queued": queued}
    return rt.done(verb, caller, doc)


async def _preemptible(rt: VerbRuntime[ReviewGitea], busy: Sequence[Lease]) -> Lease | None:
    """The implementer's newest implement lease that is not itself a hand-back and from which nothing was
    published (unstarted: its worktree, if any, stays for its owner), or None."""
    for held in sorted(busy, key=lambda lease: lease.acquired_at, reverse=True):
        if held.action != "implement" or held.request.get("source") in HAND_BACK_SOURCES:
            continue
        published = [p for p in await PublicationStore(rt.db).for_issue(rt.repo, held.issue_number)
                     if p.lease_id == held.lease_id]
        if not published:
            return held
    return None


async def _end_review(
    rt: VerbRuntime[ReviewGitea], conn: Connection, caller: Caller, lease: Lease, review: Review, verdict: str,
    implementer: str | None, now: datetime, state: CanonicalState, *, waiting: bool, pull_number: int,
    delivery_id: str | None,
) -> tuple[Lease | None, OutboxIntent | None]:
    """The review lease ends (``reviewed``); for request_changes the implementer gets a new implement lease (and
    its evidence comment to queue), unless they hold ``max_leases_per_author`` live leases: then the release
    records whom the issue waits for (``awaiting_author``) and auto-allocation leases it back later
    (bot/verbs/handback.py)."""
    wait = {AWAITING: implementer} if waiting and verdict != "approve" else {}
    # The verdict on the release is the record the merge gate trusts (recorded_verdicts), Gitea's review only
    # its cross-check.
    await rt.leases.release(conn, lease.lease_id, actor=caller.login, reason="reviewed", now=now,
                            **_verdict_detail(review, verdict, pull_number), **wait)
    if verdict == "approve" or implementer is None or waiting:
        return None, None
    # The author's work resumes: the issue's only live lease was the review lease just ended, so this one cannot
    # race; the implementer's bootstrap then recovers its registered worktree and branch.
    return await lease_back(rt.leases, conn, rt.settings, issue=lease.issue_number, implementer=implementer,
                            review_id=review.id, actor=caller.login, now=now, state=state, delivery_id=delivery_id)


@replays("submit_review")
async def submit_review_replay(
    rt: VerbRuntime[ReviewGitea], verb: Verb, caller: Caller, values: Mapping[str, object]
) -> VerbResult | None:
    """A verdict the caller already recorded (its review lease ended ``reviewed``, Gitea holds the review with the
    lease's marker), answered as it was; None for anything else (the preconditions then decide)."""
    number = issue_of(values)
    mine = [lease for lease in await rt.leases.history(rt.repo, number)
            if lease.owner == caller.login and lease.action == "review"]
    if not mine or mine[-1].status == "live" or mine[-1].end_reason != "reviewed" or rt.gitea is None:
        return None
    last = mine[-1]
    facts = await pull_facts(rt, number)
    if facts.pull is None:
        return None
    review = _found(await rt.gitea.list_reviews(facts.pull.number), last.lease_id)
    if review is None or review.state != _EVENTS.get(str(values["verdict"])):
        return None
    doc = _review_doc(number, facts.pull, review, str(values["verdict"]))
    doc.update(adopted=True, outbox=[f"{last.lease_id}:review"], lease=last.to_dict())
    return replace(rt.done(verb, caller, doc))
