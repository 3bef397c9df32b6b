"""The open-pull-request verb (one PR per issue, adopted on a replay) and the commits-ahead fact its gateway reads."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

from bot.core.canonical import CanonicalState
from bot.core.evidence import render_evidence
from bot.core.gateway import GatewayContext
from bot.core.verbs import PRECONDITION_COMMITS, Verb
from bot.core.vocabulary import label_for_state
from bot.core.work_in_progress import without_work_in_progress
from bot.gitea import Branch, GiteaConflict, GiteaError, GiteaNotFound, Issue, PullRequest, Repository, client_as
from bot.gitea.endpoint import IssueState
from bot.verbs.bootstrap.context import BootstrapContext, BootstrapGitea
from bot.verbs.bootstrap.faults import FAULT_STEP_ENV, crash_seam
from bot.verbs.gitea_refusals import GiteaAsk, gitea_refusal
from bot.verbs.runtime import (
    Caller,
    CallOptions,
    VerbResult,
    VerbRuntime,
    envelope,
    executes,
    issue_of,
    reads_facts,
    refused,
    registry,
    replays,
)
from state.journal import JournalStore
from state.leases import Lease, LeaseRefused
from state.outbox import OutboxIntent, enqueue
from state.publications import PublicationStore
from state.sql import Connection

#: The end reason of the authoring lease the PR's opening ends (the issue is handed to review).
HANDOVER_REASON = "pull_request_opened"
#: The end reason of the authoring lease the PR's update from its base ends (bot/verbs/update.py).
UPDATE_REASON = "pull_request_updated"
#: Every end of an authoring lease that hands its issue to review.
HANDOVER_REASONS = (HANDOVER_REASON, UPDATE_REASON)


@runtime_checkable
class PullsGitea(Protocol):
    """The Gitea calls of opening a pull request (``bot.gitea.GiteaClient`` has them; a door whose Gitea lacks
    them answers ``unavailable``)."""

    async def get_repo(self) -> Repository: ...
    async def get_branch(self, name: str) -> Branch: ...
    async def get_issue(self, number: int) -> Issue: ...
    async def get_pull(self, number: int) -> PullRequest: ...
    async def list_pulls(
        self, *, state: IssueState = ..., base_branch: str | None = ..., limit: int = ...
    ) -> list[PullRequest]: ...
    async def create_pull(
        self, head: str, *, title: str, base: str, body: str = ..., assignees: Any = ..., labels: Any = ...
    ) -> PullRequest: ...


def pulls_gitea(rt: VerbRuntime[BootstrapGitea]) -> PullsGitea | None:
    return rt.gitea if isinstance(rt.gitea, PullsGitea) else None


def closing_body(issue: int, branch: str, login: str) -> str:
    """The PR body: a closing keyword Gitea (and the emulator) parse, then where it came from."""
    return f"Closes #{issue}\n\nOpened by foreman for {login} from `{branch}`."


async def commits_ahead(rt: VerbRuntime[BootstrapGitea], issue: int) -> int:
    """How many commits the issue branch on Gitea has beyond the default branch (0: absent or not ahead).

    Counted in the control checkout (it pushed the branch, so it has its commits); a default-branch commit it
    has not fetched yet counts the branch as one ahead when the two differ."""
    gitea = pulls_gitea(rt)
    registration = await JournalStore(rt.db).live_registration(rt.repo, issue)
    if gitea is None or registration is None:
        return 0
    try:
        repo = await gitea.get_repo()
        head = (await gitea.get_branch(registration.branch)).commit_id
        base = (await gitea.get_branch(repo.default_branch)).commit_id
    except GiteaError:
        return 0
    if head == base:
        return 0
    checkout = BootstrapContext.from_service(rt).checkout()
    count = await asyncio.to_thread(checkout.commits_between, base, head)
    return 1 if count is None else count


async def open_pull(gitea: PullsGitea, branch: str) -> PullRequest | None:
    """The open PR whose head is ``branch``, if any."""
    return next((pr for pr in await gitea.list_pulls(state="open") if pr.head_ref == branch), None)


@executes("open_pull_request")
async def open_pull_request(
    rt: VerbRuntime[BootstrapGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    issue = issue_of(values)
    gitea = pulls_gitea(rt)
    registration = await JournalStore(rt.db).live_registration(rt.repo, issue)
    if gitea is None or registration is None:
        return refused(verb.name, envelope(
            "unavailable", f"{verb.tool} needs foreman's Gitea connection and the issue's registered worktree",
            "An operator must run foreman with gitea.token.", f"call gitea_get_issue_state with issue_number={issue}"))
    branch = registration.branch
    store = PublicationStore(rt.db)
    try:
        repo = await gitea.get_repo()
        pr, adopted = await _adopt(gitea, store, rt.repo, issue, branch)
        if pr is None:
            # Never a draft: Gitea refuses to merge a PR whose title starts with WIP: or [WIP] (the issue's may).
            title = without_work_in_progress((await gitea.get_issue(issue)).title, fallback=f"Resolve #{issue}")
            poster = client_as(gitea, rt.settings, caller.login, bot_login=rt.bot_login).client
            try:
                pr = await poster.create_pull(branch, title=title, base=repo.default_branch,
                                              body=closing_body(issue, branch, caller.login))
            except GiteaConflict:  # Gitea's "pull request already exists": adopt it, never a second one
                pr, adopted = await open_pull(gitea, branch), True
            else:
                # Gitea holds the PR, foreman has no record of it yet: a process that dies here is answered by the
                # next call's adoption (tests/test_crash_open_pr.py kills `foreman serve` at this seam).
                crash_seam(FAULT_STEP_ENV, "pull_created")
    except GiteaError as exc:
        return refused(verb.name, gitea_refusal(exc, GiteaAsk(
            what=f"open the PR of #{issue}",
            refused_because="Gitea refuses a pull request whose branch or base it cannot compare (the branch is not "
            "pushed, or has no commit beyond the base).",
            after_failure="Nothing is recorded until the PR is read back.",
            retry=f"call {verb.tool} again with issue_number={issue}",
            read_state=f"call gitea_get_issue_state with issue_number={issue}")))
    if pr is None:
        return refused(verb.name, envelope(
            "conflict", f"Gitea says a PR from {branch} exists but none is open", "Read the issue's PRs.",
            f"call gitea_assess_work_issue_duplicate with issue_number={issue} and phase pre_pr"))
    key = values.get("idempotency_key")
    doc = await _record(rt, caller, issue, pr, branch, repo.default_branch, adopted, delivery_id, lease,
                        key if isinstance(key, str) else None)
    return rt.done(verb, caller, await queue_after_hand_over(rt, doc))


async def queue_after_hand_over(rt: VerbRuntime[Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The author is free after a hand-over to review (``doc["handed_over"]``): the next ready issue goes to the next
    idle author, as after a release, run by the service from the inbox (never inside this call: the caller does not
    wait for another bootstrap). ``doc`` with ``auto_allocation`` when a trigger was queued."""
    ended, reason = doc["handed_over"]["lease_id"], doc["handed_over"]["reason"]
    if ended is None:
        return doc
    queue = registry().queue_allocation  # the queued triggers' (bot/loops/triggers.py)
    queued = await queue(rt, reason, ended) if queue is not None else None
    return {**doc, "auto_allocation": {"trigger": reason, "queued": queued}} if queued is not None else doc


@reads_facts(PRECONDITION_COMMITS)
async def commits_fact(rt: VerbRuntime[Any], context: GatewayContext, lease: Lease | None, issue: int) -> (
    GatewayContext
):
    """The gateway's commits-ahead fact: counted only for an issue with a live lease (else 0)."""
    return replace(context, commits_ahead=await commits_ahead(rt, issue)) if lease is not None else context


@replays("open_pull_request")
async def open_pull_request_replay(
    rt: VerbRuntime[BootstrapGitea], verb: Verb, caller: Caller, values: Mapping[str, object]
) -> VerbResult | None:
    """The caller's own finished call, answered from its record before the preconditions (the hand-over ended the
    lease they check): the caller's latest lease on the issue ended ``pull_request_opened`` by a call with the same
    idempotency key (none matches none), and the caller holds no live lease on it (then it is a new round)."""
    issue = issue_of(values)
    detail = await handed_over_detail(rt, issue, caller.login, HANDOVER_REASON)
    key = values.get("idempotency_key")
    if detail is None or detail.get("idempotency_key") != (key if isinstance(key, str) else None):
        return None
    return rt.done(verb, caller, {**detail["result"], "replayed": True})


async def handed_over_detail(
    rt: VerbRuntime[Any], issue: int, login: str, reason: str
) -> dict[str, Any] | None:
    """The ``released`` event's detail of ``login``'s latest lease on the issue when a hand-over to review with
    ``reason`` ended it and kept its answer (``result``); None otherwise (live, none, ended otherwise)."""
    ended = await _handed_over(rt, issue, login, (reason,))
    if ended is None:
        return None
    released = [e for e in await rt.leases.events(ended.lease_id) if e["kind"] == "released"]
    detail = released[-1]["detail"] if released else {}
    return detail if isinstance(detail.get("result"), dict) else None


@replays("release_lease")
async def release_after_handover_replay(
    rt: VerbRuntime[BootstrapGitea], verb: Verb, caller: Caller, values: Mapping[str, object]
) -> VerbResult | None:
    """``gitea_release_lease`` by an author whose lease a hand-over to review already ended (the PR's opening or its
    update: a run's reserved teardown after ``gitea_open_pull_request`` or ``gitea_update_pull_request``, an agent
    releasing out of habit): answered with that ended lease, changing nothing. None (the door decides as always: the
    ownership gate refuses another identity's live lease) when the issue has a live lease, whoever holds it, or the
    caller's latest lease on it did not end so."""
    issue = issue_of(values)
    if await rt.leases.live_for_issue(rt.repo, issue) is not None:
        return None
    ended = await _handed_over(rt, issue, caller.login, HANDOVER_REASONS)
    if ended is None:
        return None
    return rt.done(verb, caller, {"issue_number": issue, "lease": ended.to_dict(), "already_ended": ended.end_reason,
                                  "outbox": []})


async def _handed_over(rt: VerbRuntime[Any], issue: int, login: str, reasons: tuple[str, ...]) -> Lease | None:
    """``login``'s latest lease on the issue, when a hand-over with one of ``reasons`` ended it (None: live, none, or
    ended otherwise)."""
    mine = [lease for lease in await rt.leases.history(rt.repo, issue) if lease.owner == login]
    if not mine or mine[-1].status == "live" or mine[-1].end_reason not in reasons:
        return None
    return mine[-1]


async def _adopt(
    gitea: PullsGitea, store: PublicationStore, repo: str, issue: int, branch: str
) -> tuple[PullRequest | None, bool]:
    """The issue's open PR already there: the one recorded, else one Gitea lists with the issue branch as head."""
    recorded = await store.pull_for_issue(repo, issue)
    if recorded is not None:
        try:
            pr = await gitea.get_pull(recorded.pr_number)
        except GiteaNotFound:
            pr = None
        if pr is not None and pr.state == "open" and pr.head_ref == branch:
            return pr, True
    found = await open_pull(gitea, branch)
    return found, found is not None


async def _record(
    rt: VerbRuntime[BootstrapGitea], caller: Caller, issue: int, pr: PullRequest, branch: str, base: str, adopted: bool,
    delivery_id: str | None, lease: Lease | None, key: str | None,
) -> dict[str, Any]:
    """Record the PR on the issue and hand the issue to review (``hand_to_review``: the authoring lease ends
    ``pull_request_opened``), queueing ``status:pr-open``, ``status:review`` and the evidence (keys per PR and head:
    a replay queues nothing new, a round after requested changes moves the labels again)."""
    prefix = f"pr:{issue}:{pr.number}:{pr.head_sha[:12]}"
    in_progress, pr_open, review = (label_for_state(s) for s in ("in-progress", "pr-open", "review"))
    doc: dict[str, Any] = {
        "issue_number": issue, "pull_request": pr.number, "head": pr.head_ref, "head_sha": pr.head_sha,
        "base": pr.base_ref, "url": pr.html_url, "adopted": adopted,
        "outbox": [f"{prefix}:pr-open", f"{prefix}:review", f"{prefix}:evidence"],
    }
    state = CanonicalState(
        state="review",
        who_is_next="reviewer",
        next_action=f"a reviewer is allocated the review of pull request #{pr.number} (the author's lease ended)",
        next_prompt=f"Pull request #{pr.number} ({branch} into {base}) closes #{issue}.\n"
                    "Review it: approve, or request changes with a body.",
        what_happened=f"{'adopted' if adopted else 'opened'} pull request #{pr.number} from {branch} into {base}",
        why=f"{caller.login} holds the lease of #{issue} and published its branch",
        related_prs=(pr.number,),
        blockers="none",
        validation=f"pull request #{pr.number} read back from Gitea with head {pr.head_ref} at {pr.head_sha[:12]}",
        last_updated_by=rt.bot_login or rt.settings.gitea.bot_login or "foreman",
    )

    async def record(conn: Connection) -> None:
        await PublicationStore(rt.db).record_pull(conn, repo=rt.repo, issue_number=issue, pr_number=pr.number,
                                                  head=branch, base=base, opened_by=caller.login, adopted=adopted,
                                                  now=rt.clock())

    return await hand_to_review(rt, caller, lease, HandOver(
        issue=issue, pull=pr, reason=HANDOVER_REASON, action="open_pull_request", prefix=prefix, state=state,
        summary=f"Pull request #{pr.number} is open for #{issue}.",
        labels=({"add": [pr_open], "remove": [in_progress]}, {"add": [review], "remove": [pr_open]}),
        label_keys=(f"{prefix}:pr-open", f"{prefix}:review"), idempotency_key=key, also=record,
    ), doc, delivery_id)


@dataclass(frozen=True, slots=True)
class HandOver:
    """How a verb hands its issue to review: the authoring lease's end ``reason``, the evidence (``action``,
    ``summary``, the Canonical Issue State; key ``<prefix>:evidence``), the label changes in order (each under its
    key), the call's idempotency key kept on the release, and ``also``: the verb's own record in the same
    transaction."""

    issue: int
    pull: PullRequest
    reason: str
    action: str
    prefix: str
    state: CanonicalState
    summary: str
    labels: tuple[dict[str, list[str]], ...]
    label_keys: tuple[str, ...]
    idempotency_key: str | None = None
    also: Callable[[Connection], Awaitable[None]] | None = None


async def hand_to_review(
    rt: VerbRuntime[Any], caller: Caller, lease: Lease | None, hand: HandOver, doc: dict[str, Any],
    delivery_id: str | None,
) -> dict[str, Any]:
    """In one transaction: end the authoring lease (``hand.reason``, with the PR, its head, the idempotency key and
    the answer ``doc`` kept on its release for a replay), the verb's own record, the label changes and the evidence.
    The lease ends first and the evidence is rendered after it, so it says what really happened: a lease that ended
    meanwhile (expired, released) is no hand-over, named by neither the answer nor the evidence
    (``handed_over.lease_id: null``), never an error (the PR is what it is on Gitea either way). ``doc`` gains
    ``handed_over``."""
    pr = hand.pull
    doc["handed_over"] = {"lease_id": lease.lease_id if lease is not None else None, "reason": hand.reason,
                          "who_is_next": "reviewer"}
    async with rt.db.transaction() as conn:
        if lease is not None:
            try:
                await rt.leases.release(conn, lease.lease_id, actor=caller.login, reason=hand.reason,
                                        now=rt.clock(), pull_request=pr.number, head_sha=pr.head_sha,
                                        idempotency_key=hand.idempotency_key, result=doc)
            except LeaseRefused:
                doc["handed_over"]["lease_id"] = None  # it ended meanwhile (expired, swept): nothing to end
        body = render_evidence(key=f"{hand.prefix}:evidence", summary=hand.summary, state=hand.state,
                               evidence={"action": hand.action, "channel": caller.channel, "delivery": delivery_id,
                                         **doc})
        if hand.also is not None:
            await hand.also(conn)
        for key, labels in zip(hand.label_keys, hand.labels, strict=True):
            await enqueue(conn, OutboxIntent(key, hand.issue, "labels", labels, delivery_id, repo=rt.repo))
        await enqueue(conn, OutboxIntent(f"{hand.prefix}:evidence", hand.issue, "comment", {"body": body},
                                         delivery_id, repo=rt.repo))
    return doc
