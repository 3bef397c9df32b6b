"""The merge verb: merge an approved pull request pinned to exactly the approved commit, with read-back evidence."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from bot.core.canonical import CanonicalState, as_line, as_prompt
from bot.core.errors import Envelope
from bot.core.evidence import render_evidence
from bot.core.verbs import Verb
from bot.core.work_in_progress import is_work_in_progress
from bot.gitea import client_as
from bot.gitea.values import PullRequest, Review
from bot.verbs.gitea_refusals import GiteaAsk, gitea_refusal
from bot.verbs.handback import HandBackSource, hand_back
from bot.verbs.merge_attempts import MergeOutcome, merge_with_retries
from bot.verbs.merge_gate import MergeChecks, MergeGate, merge_gate, reviewer_login, reviewers_of
from bot.verbs.review import PullsGitea, implementer_of, pull_facts, pull_for_issue, recorded_verdicts
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


class MergeGitea(PullsGitea, Protocol):
    """What the merge verb uses: the pull-request reads, the merge and its read-back."""

    async def get_pull(self, number: int) -> PullRequest: ...

    async def merge_pull(
        self, number: int, *, style: MergeStyle = ..., head_commit_id: str = ..., message: str = ...,
        delete_branch_after_merge: bool = ...,
    ) -> None: ...


def _blocked(number: int, pull: PullRequest, gate: MergeGate) -> Envelope:
    """The refusal of a merge the gate does not let through: what is missing, what counts, and every verdict it did
    not count."""
    details: dict[str, Any] = {"pull_number": pull.number, "head": pull.head_sha,
                               "not_counted": gate.not_counted_docs(), "gate": gate.to_dict()}
    state = f"call gitea_get_issue_state with issue_number={number} and follow it"
    if gate.block == "changes_requested":
        details["blocking"] = [{"review_id": r.id, "user": reviewer_login(r), "commit_id": r.commit_id}
                               for r in gate.blocking]
        who = ", ".join(f"review {r.id} by {reviewer_login(r)}" for r in gate.blocking)
        where = "on the pull request (block_on_rejected_reviews)" if gate.rules.block_on_rejected_reviews else \
            f"on its head {pull.head_sha}"
        return envelope(
            "invalid_state", f"PR #{pull.number}: {gate.missing()} ({who}) {where}; nothing was merged",
            "A request-changes verdict Gitea counts blocks the merge until the author pushes a change and a reviewer "
            "approves it, or a maintainer dismisses it on Gitea.",
            f"call gitea_get_issue_state with issue_number={number} and follow the review", reason="changes_requested",
            **details)
    if gate.block == "status_pending":
        return envelope(
            "invalid_state", f"PR #{pull.number}: {gate.missing()} on its head {pull.head_sha}; nothing was merged",
            f"The required statuses ({', '.join(gate.rules.required_contexts) or 'any'}, from "
            f"{gate.rules.contexts_from}) must pass first; the merge queue retries when a status changes.",
            f"wait for the status checks, then call gitea_merge_pull_request with issue_number={number} again",
            reason="status_pending", **details)
    if gate.block == "status_failed":
        return envelope(
            "invalid_state", f"PR #{pull.number}: {gate.missing()} on its head {pull.head_sha}; nothing was merged",
            "A failing required status sends the issue back to its author, who fixes it and pushes again.",
            state, reason="status_failed", **details)
    if gate.block == "branch_outdated":
        return envelope(
            "invalid_state", f"PR #{pull.number}: {gate.missing()}; nothing was merged",
            "The branch protection blocks a head that is behind its base: the author updates it "
            "(gitea_update_pull_request), then it is reviewed again.", state, reason="branch_outdated", **details)
    if gate.block == "approvals_missing":
        return envelope(
            "invalid_state", f"PR #{pull.number}: {gate.missing()} on its head {pull.head_sha} (branch protection "
            f"{gate.rules.rule!r} requires {gate.required}); nothing was merged",
            "Each approval must be recorded by a different roster reviewer through gitea_submit_review on exactly "
            "the head; the review queue hands the next review to another reviewer.",
            f"a reviewer who has not approved #{number} calls gitea_claim_review, then gitea_submit_review",
            reason="approvals_missing", **details)
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
    facts = await pull_facts(rt, number)  # the issue, its open PR and its reviews, as the door's gate read them
    pull = facts.pull
    if pull is None:
        return refused(verb.name, envelope(
            "invalid_state", f"#{number} has no open pull request now", "Read the issue's state.",
            f"call gitea_get_issue_state with issue_number={number}"))
    gate = await merge_gate_now(rt, gitea, number, pull, MergeChecks(gitea, rt.settings), reviews=facts.reviews)
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
    if gate.rules.may_merge(caller.login) is False:
        return refused(verb.name, _not_whitelisted(number, pull, caller.login, gate))
    merger = client_as(gitea, rt.settings, caller.login, bot_login=rt.bot_login).client
    outcome = await merge_with_retries(rt, merger, gitea, pull, approved)
    if outcome.refusal is not None:
        return await _refused_merge(rt, verb, caller, number, pull, gate, outcome, delivery_id)
    merged = await gitea.get_pull(pull.number)
    if not merged.merged or not merged.merge_commit_sha:
        return refused(verb.name, envelope(
            "unavailable", f"Gitea accepted the merge of PR #{pull.number} but does not show it merged",
            "Read it again shortly.", f"call {verb.tool} again"))
    key = await _evidence(rt, caller, number, merged, gate, delivery_id)
    doc = {**_merged_doc(number, merged, approved), "outbox": [key], "gate": gate.to_dict()}
    if outcome.attempts > 1:
        doc["attempts"] = outcome.attempts
        doc["waited"] = list(outcome.waited)
    return rt.done(verb, caller, doc)


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
    gate = await merge_gate_now(rt, rt.gitea, number, pull)
    key = await _evidence(rt, caller, number, pull, gate, None)
    approved = gate.counted.commit_id if gate.counted is not None else None
    return rt.done(verb, caller, {**_merged_doc(number, pull, approved), "adopted": True, "outbox": [key]})


async def merge_gate_now(rt: VerbRuntime[MergeGitea], gitea: PullsGitea, number: int, pull: PullRequest,
                checks: MergeChecks | None = None, *, reviews: Sequence[Review] | None = None) -> MergeGate:
    """The merge gate on ``pull`` now: foreman's recorded verdicts cross-checked against Gitea's reviews (``reviews``
    when the call read them with the PR already, else read now), under the base branch's protection and the head's
    required statuses (``checks``; None: one approval, no status)."""
    implementer = await implementer_of(rt.leases, rt.repo, number)
    rules = await checks.rules_for(pull.base_ref) if checks is not None else None
    status = await checks.checks_for(pull, rules) if checks is not None and rules is not None else None
    read = list(reviews) if reviews is not None else await gitea.list_reviews(pull.number)
    return merge_gate(await recorded_verdicts(rt.leases, rt.repo, number), read,
                      pull, implementer=implementer.owner if implementer is not None else None,
                      reviewers=reviewers_of(rt.settings), rules=rules, checks=status)


def _not_whitelisted(number: int, pull: PullRequest, login: str, gate: MergeGate) -> Envelope:
    allowed = ", ".join(sorted(gate.rules.merge_whitelist or ())) or "nobody"
    return envelope(
        "not_authorized", f"{login} is not on the merge whitelist of branch protection {gate.rules.rule!r} for "
        f"{pull.base_ref} (allowed: {allowed}); nothing was sent to Gitea",
        "Gitea refuses a merge by anyone off the whitelist; a whitelisted merger merges it.",
        f"leave #{number} to a merger on the whitelist ({allowed}), or ask an operator to add {login} to it",
        reason="merger_not_allowed", pull_number=pull.number, rule=gate.rules.rule)


async def _refused_merge(
    rt: VerbRuntime[MergeGitea], verb: Verb, caller: Caller, number: int, pull: PullRequest, gate: MergeGate,
    outcome: MergeOutcome, delivery_id: str | None,
) -> VerbResult:
    """The answer to a merge Gitea did not make, by what its refusal means: a moved head is a stale pin; a conflict
    or a diverged base hands the issue back to its author; still checking says when to call again; the whitelist,
    Gitea's own protection and a pre-receive hook are reported in Gitea's words."""
    exc = outcome.error
    said = (exc.message if exc is not None else "")[:300]
    tried = {"attempts": outcome.attempts, "waited": list(outcome.waited), "gitea_said": said}
    approved = gate.counted.commit_id if gate.counted is not None else pull.head_sha
    if outcome.refusal == "head_moved":
        now = await rt.gitea.get_pull(pull.number) if rt.gitea is not None else pull
        return refused(verb.name, _stale(number, now, approved, said or "head out of date"))
    if outcome.refusal in ("conflict", "diverged"):
        source: HandBackSource = "merge_conflict" if outcome.refusal == "conflict" else "base_diverged"
        back = await _hand_back_unmergeable(rt, caller, number, pull, source, outcome, delivery_id)
        files = ", ".join(outcome.conflicts) or "(git could not name them)"
        what = (f"PR #{pull.number} conflicts with {pull.base_ref} in {files}" if source == "merge_conflict" else
                f"PR #{pull.number}'s head does not contain {pull.base_ref} and [merge] style is fast-forward-only")
        holder = back.owner if back is not None else None
        return refused(verb.name, envelope(
            "invalid_state", f"{what}; nothing was merged" + (f"; #{number} is handed back to {holder}" if holder
                                                              else ""),
            "The author brings the branch up to date from its base (gitea_update_pull_request, or a merge in its "
            "worktree for a conflict Gitea cannot resolve), then the pull request is reviewed again.",
            f"{holder or 'the author'}: call gitea_bootstrap_issue_worktree for #{number}, resolve, publish and "
            "call gitea_open_pull_request" if source == "merge_conflict" else
            f"{holder or 'the author'}: call gitea_update_pull_request with issue_number={number}",
            reason="merge_conflict" if source == "merge_conflict" else "base_diverged", pull_number=pull.number,
            conflicting_files=list(outcome.conflicts), author_lease=back.lease_id if back is not None else None,
            **tried))
    if outcome.refusal == "checking":
        wait = rt.settings.merge.checking_wait_s
        return refused(verb.name, envelope(
            "unavailable", f"Gitea is still checking whether PR #{pull.number} can merge (405 \"Please try again "
            f"later\" for {wait:g} s, {outcome.attempts} attempts); nothing was merged",
            "Gitea re-tests every open pull request after a push or a merge into its base; the approval stands.",
            f"call {verb.tool} again with issue_number={number} in a minute", reason="mergeability_checking",
            pull_number=pull.number, **tried))
    if outcome.refusal == "not_allowed":
        return refused(verb.name, envelope(
            "not_authorized", f"Gitea refused {caller.login}'s merge of PR #{pull.number}: {said}",
            "Gitea lets only writers on the base branch's merge whitelist merge.",
            f"leave #{number} to another merger, or ask an operator for {caller.login}'s merge access",
            reason="merger_not_allowed", pull_number=pull.number, **tried))
    if outcome.refusal in ("protection", "push_rejected"):
        protection = outcome.refusal == "protection"
        return refused(verb.name, envelope(
            "invalid_state", f"Gitea refused the merge of PR #{pull.number}: {said}; nothing was merged",
            "Gitea's branch protection asks more than foreman read (a team whitelist, protected files, official "
            "review requests)." if protection else "A pre-receive hook on Gitea rejected the merge's push.",
            f"call gitea_get_issue_state with issue_number={number}; an operator checks the branch protection of "
            f"{pull.base_ref} on Gitea" if protection else
            f"ask an operator about the hook's message, then call {verb.tool} again with issue_number={number}",
            reason="protection_refused" if protection else "merge_push_rejected", pull_number=pull.number, **tried))
    assert exc is not None
    return refused(verb.name, gitea_refusal(exc, GiteaAsk(
        what=f"merge PR #{pull.number}",
        refused_because="Gitea answers so for a disallowed merge style or missing write access.",
        after_failure="A retry adopts a merge Gitea did make.", retry=f"call {verb.tool} again",
        read_state=f"call gitea_get_issue_state with issue_number={number}")))


async def _hand_back_unmergeable(
    rt: VerbRuntime[MergeGitea], caller: Caller, number: int, pull: PullRequest, source: HandBackSource,
    outcome: MergeOutcome, delivery_id: str | None,
) -> Lease | None:
    """A conflicting PR (or one a fast-forward-only merge cannot take) goes back to its implementer with the
    conflicting files and the verb that updates its branch (None: no implementer, or at max_leases_per_author)."""
    implementer = await implementer_of(rt.leases, rt.repo, number)
    if implementer is None:
        return None
    files = list(outcome.conflicts)
    update = f"call gitea_update_pull_request with issue_number={number}"
    state = CanonicalState(
        state="in-progress", who_is_next="author",
        next_action=(as_line(f"{implementer.owner}: call gitea_bootstrap_issue_worktree for #{number}, merge "
                             f"origin/{pull.base_ref} into the branch, resolve {', '.join(files) or 'the conflicts'}, "
                             "publish, then gitea_open_pull_request", limit=1000) if source == "merge_conflict" else
                     f"{implementer.owner}: {update} (Gitea updates the branch from {pull.base_ref})"),
        next_prompt=as_prompt(f"PR #{pull.number} conflicts with {pull.base_ref}" +
                              (f" in: {as_line(', '.join(files), limit=1000)}" if files else "") +
                              ". Merge the base into your branch, resolve, publish and open the pull request again "
                              "(it is reviewed again)." if source == "merge_conflict" else
                              f"PR #{pull.number} must contain {pull.base_ref} to merge fast-forward only: {update}."),
        # Gitea's message and the file names (an author names its files) are outside text: one line each.
        what_happened=as_line(f"{caller.login}'s merge of PR #{pull.number} was refused by Gitea: "
                              f"{(outcome.error.message if outcome.error else '')[:120] or source}"),
        why="a merge conflict" if source == "merge_conflict" else "the base moved past the head",
        related_prs=(pull.number,), blockers=as_line(", ".join(files)),
        validation=f"git merge-tree of {pull.base_ref} and the PR's head in foreman's control checkout",
        last_updated_by=rt.bot_login or "foreman",
    )
    return await hand_back(rt.db, rt.settings, issue=number, implementer=implementer.owner, source=source,
                           state=state, actor=caller.login, now=rt.clock(), delivery_id=delivery_id,
                           key=f"merge:{number}:{pull.number}:{pull.head_sha[:12]}:{source}",
                           detail={"pull_request": pull.number, "conflicting_files": files})
