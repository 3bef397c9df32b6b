"""The merge verb: merge an approved pull request pinned to exactly the approved commit, with read-back evidence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope
from bot.core.evidence import render_evidence
from bot.core.reasons import MergeBlock
from bot.core.verbs import Verb
from bot.core.work_in_progress import is_work_in_progress
from bot.gitea import GiteaError, client_as
from bot.gitea.errors import GiteaConflict, GiteaInvalid
from bot.gitea.values import PullRequest, Review
from bot.verbs.gitea_refusals import GiteaAsk, gitea_refusal
from bot.verbs.review import PullsGitea, RecordedVerdict, implementer_of, pull_for_issue, recorded_verdicts
from bot.verbs.runtime import (
    Caller,
    CallOptions,
    VerbResult,
    VerbRuntime,
    envelope,
    executes,
    issue_of,
    refused,
    replays,
)
from state.leases import Lease
from state.outbox import OutboxIntent, enqueue

MergeStyle = Literal["merge", "rebase", "rebase-merge", "squash", "fast-forward-only"]
#: Why a review on Gitea does not count.
NotCountedWhy = Literal["not_recorded", "dismissed", "superseded", "changed_on_gitea", "not_official",
                        "by_implementer", "by_pr_poster", "reviewer_not_allowed"]


class MergeGitea(PullsGitea, Protocol):
    """What the merge verb uses: the pull-request reads, the merge and its read-back."""

    async def get_pull(self, number: int) -> PullRequest: ...

    async def merge_pull(
        self, number: int, *, style: MergeStyle = ..., head_commit_id: str = ..., message: str = ...,
        delete_branch_after_merge: bool = ...,
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class NotCounted:
    """A review on Gitea the merge gate does not count, and why (shown in the refusal and the merge's evidence)."""

    review_id: int
    user: str
    state: str
    commit_id: str
    why: NotCountedWhy

    def to_dict(self) -> dict[str, Any]:
        return {"review_id": self.review_id, "user": self.user, "state": self.state, "commit_id": self.commit_id,
                "why": self.why}


@dataclass(frozen=True, slots=True)
class MergeGate:
    """The merge gate's decision: the approval that counts (None when ``block`` says why none does or why it is
    blocked), the request-changes verdicts standing on the head, and every other verdict on Gitea, not counted."""

    counted: RecordedVerdict | None
    block: MergeBlock | None
    blocking: tuple[Review, ...]
    not_counted: tuple[NotCounted, ...]

    def not_counted_docs(self) -> list[dict[str, Any]]:
        return [n.to_dict() for n in self.not_counted]


def _login(review: Review) -> str:
    return review.user.login if review.user is not None else ""


def _changed(recorded: RecordedVerdict, review: Review | None) -> NotCountedWhy | None:
    """Why Gitea's review no longer is the verdict foreman recorded (None when it still is)."""
    if review is None:
        return "changed_on_gitea"
    if review.dismissed:
        return "dismissed"
    state = "APPROVED" if recorded.verdict == "approve" else "REQUEST_CHANGES"
    if (review.state, review.commit_id) != (state, recorded.commit_id) or (
            recorded.posted_as and _login(review).lower() != recorded.posted_as.lower()):
        return "changed_on_gitea"
    if not review.official:
        return "not_official"
    return None


def merge_gate(
    recorded: Sequence[RecordedVerdict], reviews: Sequence[Review], pull: PullRequest, *, implementer: str | None,
    reviewers: frozenset[str],
) -> MergeGate:
    """Which approval lets ``pull`` merge. Only the latest verdict foreman's review verb recorded on this PR counts,
    and only while Gitea still shows that review as recorded (same id, verdict, commit and account, official, not
    dismissed) and its reviewer may approve the PR now (a roster reviewer (``reviewers``, lower case), neither the
    implementer nor the PR's poster). Any request-changes verdict Gitea counts (official, not dismissed) on exactly
    the head blocks, whoever posted it: a block only withholds a merge, and Gitea's own protection reads it so. Every
    other approval or request-changes on Gitea is listed as not counted."""
    mine = [v for v in recorded if v.pull_number == pull.number]
    latest = mine[-1] if mine else None
    by_id = {r.id: r for r in reviews}
    poster = pull.user.login.lower()
    barred = {poster} | ({implementer.lower()} if implementer else set())
    counted: RecordedVerdict | None = None
    block: MergeBlock | None = None
    why_latest: NotCountedWhy | None = None
    if latest is None:
        block = "approval_not_recorded"
    elif (why_latest := _changed(latest, by_id.get(latest.review_id))) is not None:
        block = "approval_withdrawn"
    elif latest.reviewer.lower() not in reviewers or latest.reviewer.lower() in barred:
        block, why_latest = "reviewer_not_allowed", "reviewer_not_allowed"
    elif latest.verdict != "approve":
        block = "approval_not_recorded"
    else:
        counted = latest
    blocking = tuple(r for r in reviews if r.state == "REQUEST_CHANGES" and r.official and not r.dismissed
                     and r.commit_id == pull.head_sha)
    if blocking:
        block, counted = "changes_requested", None
    earlier = {v.review_id for v in mine[:-1]}
    not_counted: list[NotCounted] = []
    for review in reviews:
        if review.state not in ("APPROVED", "REQUEST_CHANGES") or (counted and review.id == counted.review_id):
            continue
        user = _login(review)
        why: NotCountedWhy
        if latest is not None and review.id == latest.review_id and why_latest is not None:
            why = why_latest
        elif review.dismissed:
            why = "dismissed"
        elif review.id in earlier or (latest is not None and review.id == latest.review_id):
            why = "superseded"
        elif user.lower() == poster:
            why = "by_pr_poster"
        elif implementer and user.lower() == implementer.lower():
            why = "by_implementer"
        else:
            why = "not_recorded"
        not_counted.append(NotCounted(review.id, user, review.state, review.commit_id, why))
    return MergeGate(counted, block, blocking, tuple(not_counted))


def _blocked(number: int, pull: PullRequest, gate: MergeGate) -> Envelope:
    """The refusal of a merge the gate does not let through: what counts, and every verdict it did not count."""
    details: dict[str, Any] = {"pull_number": pull.number, "head": pull.head_sha,
                               "not_counted": gate.not_counted_docs()}
    if gate.block == "changes_requested":
        details["blocking"] = [{"review_id": r.id, "user": _login(r), "commit_id": r.commit_id} for r in gate.blocking]
        who = ", ".join(f"review {r.id} by {_login(r)}" for r in gate.blocking)
        return envelope(
            "invalid_state", f"PR #{pull.number} has changes requested on its head {pull.head_sha} ({who}); nothing "
            "was merged", "A request-changes verdict standing on the head blocks the merge until the author pushes "
            "a change and a reviewer approves it, or a maintainer dismisses it on Gitea.",
            f"call gitea_get_issue_state with issue_number={number} and follow the review", reason=gate.block,
            **details)
    others = "; ".join(f"review {n.review_id} by {n.user} ({n.why})" for n in gate.not_counted if n.state ==
                       "APPROVED")
    return Envelope(
        error="tracing_gap", missing=("approval",),
        message=f"PR #{pull.number} has no approval recorded by foreman's review verb that still holds ({gate.block})"
        + (f"; not counted: {others}" if others else "") + "; nothing was merged",
        remediate="Only a verdict a roster reviewer recorded with gitea_submit_review, holding that review's lease, "
        "counts; an approval posted on Gitea any other way never does.",
        exact_next_action=f"a reviewer calls gitea_claim_review for #{number}, then gitea_submit_review",
        details=details, reason=gate.block,
    )


def _stale(number: int, pull: PullRequest, approved: str, detail: str) -> Envelope:
    return envelope(
        "stale_pin",
        f"PR #{pull.number} moved after its approval ({detail}): its head is {pull.head_sha}, the approved commit "
        f"{approved}; nothing was merged",
        "Only the reviewed commit is merged: the new commits need a review of their own.",
        f"a reviewer calls gitea_claim_review for #{number}, then gitea_submit_review on the new head",
        reason="head_moved", approved_commit=approved, head=pull.head_sha, pull_number=pull.number,
    )


def _merged_doc(number: int, pull: PullRequest, approved: str | None) -> dict[str, Any]:
    return {"issue_number": number, "pull_number": pull.number, "merged": pull.merged,
            "merge_commit_sha": pull.merge_commit_sha, "approved_commit": approved}


async def _evidence(
    rt: VerbRuntime[MergeGitea], caller: Caller, number: int, pull: PullRequest, gate: MergeGate, cause: str | None
) -> str:
    """The merge's evidence comment (one key per PR: a replay queues nothing new)."""
    key = f"merge:{number}:{pull.number}"
    counted = gate.counted
    approved = counted.commit_id if counted is not None else None
    state = CanonicalState(
        state="review",
        who_is_next="controller",
        next_action=f"foreman tears #{number} down (leases, worktree, status:done) on the merged pull request",
        next_prompt="",
        what_happened=f"{caller.login} merged PR #{pull.number} at {approved} as {pull.merge_commit_sha}",
        why=(f"{counted.reviewer}'s approval recorded by foreman's review verb (review {counted.review_id}, lease "
             f"{counted.lease_id}) is on exactly this commit" if counted is not None else
             "the pull request was already merged; no recorded approval counts for it"),
        related_prs=(pull.number,),
        blockers="none",
        validation=f"read back from Gitea: merged, merge commit {pull.merge_commit_sha}",
        last_updated_by=rt.bot_login or "foreman",
    )
    body = render_evidence(
        key=key, summary=f"Merged PR #{pull.number} ({pull.merge_commit_sha}).", state=state,
        evidence={"action": "merge_pull_request", "merger": caller.login, "pull": pull.number,
                  "approved_commit": approved, "merge_commit_sha": pull.merge_commit_sha,
                  "style": rt.settings.merge.style,
                  "approval": ({"review_id": counted.review_id, "reviewer": counted.reviewer,
                                "review_lease": counted.lease_id} if counted is not None else None),
                  "not_counted": gate.not_counted_docs()},
    )
    async with rt.db.transaction() as conn:
        await enqueue(conn, OutboxIntent(key, number, "comment", {"body": body}, cause, repo=rt.repo))
    return key


@executes("merge_pull_request")
async def merge_pull_request(
    rt: VerbRuntime[MergeGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    number = issue_of(values)
    gitea: MergeGitea | None = rt.gitea
    if gitea is None:
        return refused(verb.name, envelope("unavailable", "foreman runs without a Gitea client",
                                           "An operator must configure gitea.token.", "call gitea_get_runtime_context"))
    issue = await gitea.get_issue(number)
    pull = await pull_for_issue(gitea, rt.db, rt.repo, issue, slug_length=rt.settings.bootstrap.slug_length)
    if pull is None:
        return refused(verb.name, envelope(
            "invalid_state", f"#{number} has no open pull request now", "Read the issue's state.",
            f"call gitea_get_issue_state with issue_number={number}"))
    gate = await _gate(rt, gitea, number, pull)
    if gate.counted is None:
        return refused(verb.name, _blocked(number, pull, gate))
    approved = gate.counted.commit_id
    if pull.head_sha != approved:  # never hand Gitea a merge of unreviewed code
        return refused(verb.name, _stale(number, pull, approved, "checked before merging"))
    if is_work_in_progress(pull.title):  # Gitea's 405 "Work in progress PRs cannot be merged", said first
        return refused(verb.name, envelope(
            "invalid_state", f"PR #{pull.number} is a draft: its title {pull.title[:80]!r} starts with a "
            "work-in-progress prefix (WIP: or [WIP]), and Gitea refuses to merge a draft; nothing was sent",
            "A person with write access removes the prefix from the pull request's title on Gitea (foreman never "
            "titles a PR so); the approval stands, the head is unchanged.",
            f"ask a maintainer to retitle PR #{pull.number} without the WIP prefix, then call {verb.tool} again "
            f"with issue_number={number}", reason="pull_request_draft", pull_number=pull.number))
    merger = client_as(gitea, rt.settings, caller.login, bot_login=rt.bot_login).client
    try:
        await merger.merge_pull(pull.number, style=rt.settings.merge.style, head_commit_id=approved)
    except GiteaConflict as exc:
        return refused(verb.name, _stale(number, await gitea.get_pull(pull.number), approved, exc.message))
    except GiteaError as exc:
        # Refused (a conflicting PR, a disallowed merge style, no write access) or no answer: a merge Gitea did make
        # meanwhile is adopted below, as a retry would.
        if not isinstance(exc, GiteaInvalid) or not (await gitea.get_pull(pull.number)).merged:
            return refused(verb.name, gitea_refusal(exc, GiteaAsk(
                what=f"merge PR #{pull.number}",
                refused_because="Gitea answers so for a conflicting PR, a disallowed merge style or missing write "
                "access.",
                after_failure="A retry adopts a merge Gitea did make.", retry=f"call {verb.tool} again",
                read_state=f"call gitea_get_issue_state with issue_number={number}")))
    merged = await gitea.get_pull(pull.number)
    if not merged.merged or not merged.merge_commit_sha:
        return refused(verb.name, envelope(
            "unavailable", f"Gitea accepted the merge of PR #{pull.number} but does not show it merged",
            "Read it again shortly.", f"call {verb.tool} again"))
    key = await _evidence(rt, caller, number, merged, gate, delivery_id)
    return rt.done(verb, caller, {**_merged_doc(number, merged, approved), "outbox": [key]})


@replays("merge_pull_request")
async def merge_replay(
    rt: VerbRuntime[MergeGitea], verb: Verb, caller: Caller, values: Mapping[str, object]
) -> VerbResult | None:
    """A merge that already happened (the issue's PR is merged), adopted with its evidence (queued once)."""
    number = issue_of(values)
    if rt.gitea is None:
        return None
    issue = await rt.gitea.get_issue(number)
    pull = await pull_for_issue(rt.gitea, rt.db, rt.repo, issue, slug_length=rt.settings.bootstrap.slug_length,
                                include_merged=True)
    if pull is None or not pull.merged:
        return None
    gate = await _gate(rt, rt.gitea, number, pull)
    key = await _evidence(rt, caller, number, pull, gate, None)
    approved = gate.counted.commit_id if gate.counted is not None else None
    return rt.done(verb, caller, {**_merged_doc(number, pull, approved), "adopted": True, "outbox": [key]})


async def _gate(rt: VerbRuntime[MergeGitea], gitea: PullsGitea, number: int, pull: PullRequest) -> MergeGate:
    """The merge gate on ``pull`` now: foreman's recorded verdicts cross-checked against Gitea's reviews."""
    implementer = await implementer_of(rt.leases, rt.repo, number)
    reviewers = frozenset(login.lower() for login, roles in rt.settings.roster.items() if "reviewer" in roles)
    return merge_gate(await recorded_verdicts(rt.leases, rt.repo, number), await gitea.list_reviews(pull.number),
                      pull, implementer=implementer.owner if implementer is not None else None, reviewers=reviewers)
