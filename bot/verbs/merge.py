"""The merge verb: merge an approved pull request pinned to exactly the approved commit, with read-back evidence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope
from bot.core.evidence import render_evidence
from bot.core.verbs import Verb
from bot.gitea import GiteaError, client_as
from bot.gitea.errors import GiteaConflict, GiteaInvalid
from bot.gitea.values import PullRequest
from bot.verbs.review import PullsGitea, latest_verdict, pull_for_issue
from bot.verbs.runtime import Caller, CallOptions, VerbResult, VerbRuntime, envelope, issue_of, refused
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
    rt: VerbRuntime, caller: Caller, number: int, pull: PullRequest, approved: str | None, cause: str | None
) -> str:
    """The merge's evidence comment (one key per PR: a replay queues nothing new)."""
    key = f"merge:{number}:{pull.number}"
    state = CanonicalState(
        state="review",
        who_is_next="controller",
        next_action=f"foreman tears #{number} down (leases, worktree, status:done) on the merged pull request",
        next_prompt="",
        what_happened=f"{caller.login} merged PR #{pull.number} at {approved} as {pull.merge_commit_sha}",
        why="the PR's latest official review approved exactly this commit",
        related_prs=(pull.number,),
        blockers="none",
        validation=f"read back from Gitea: merged, merge commit {pull.merge_commit_sha}",
        last_updated_by=rt.bot_login or "foreman",
    )
    body = render_evidence(
        key=key, summary=f"Merged PR #{pull.number} ({pull.merge_commit_sha}).", state=state,
        evidence={"action": "merge_pull_request", "merger": caller.login, "pull": pull.number,
                  "approved_commit": approved, "merge_commit_sha": pull.merge_commit_sha,
                  "style": rt.settings.merge.style},
    )
    async with rt.db.transaction() as conn:
        await enqueue(conn, OutboxIntent(key, number, "comment", {"body": body}, cause))
    rt.woken()
    return key


async def merge_pull_request(
    rt: VerbRuntime, verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    number = issue_of(values)
    gitea: MergeGitea | None = rt.gitea
    if gitea is None:
        return refused(verb.name, envelope("unavailable", "foreman runs without a Gitea client",
                                           "An operator must configure gitea.token.", "call gitea_get_runtime_context"))
    issue = await gitea.get_issue(number)
    pull = await pull_for_issue(gitea, rt.db, rt.repo, issue, slug_length=rt.settings.bootstrap.slug_length)
    verdict = latest_verdict(await gitea.list_reviews(pull.number)) if pull is not None else None
    if pull is None or verdict is None or verdict.state != "APPROVED":
        return refused(verb.name, envelope(
            "invalid_state", f"#{number} has no approved open pull request now", "Read the issue's state.",
            f"call gitea_get_issue_state with issue_number={number}"))
    approved = verdict.commit_id
    if verdict.stale or pull.head_sha != approved:  # never hand Gitea a merge of unreviewed code
        return refused(verb.name, _stale(number, pull, approved, "checked before merging"))
    merger = client_as(gitea, rt.settings, caller.login, bot_login=rt.bot_login).client
    try:
        await merger.merge_pull(pull.number, style=rt.settings.merge.style, head_commit_id=approved)
    except GiteaConflict as exc:
        return refused(verb.name, _stale(number, await gitea.get_pull(pull.number), approved, exc.message))
    except GiteaInvalid as exc:
        again = await gitea.get_pull(pull.number)
        if not again.merged:
            return refused(verb.name, envelope(
                "invalid_state", f"Gitea refused to merge PR #{pull.number}: {exc.message}",
                "Gitea answers so for a conflicting PR, a disallowed merge style or missing write access.",
                f"call gitea_get_issue_state with issue_number={number}", gitea_status=exc.status))
    except GiteaError as exc:
        return refused(verb.name, envelope(
            "unavailable", f"Gitea could not merge PR #{pull.number}: {exc}",
            "A retry adopts a merge Gitea did make.", f"call {verb.tool} again"))
    merged = await gitea.get_pull(pull.number)
    if not merged.merged or not merged.merge_commit_sha:
        return refused(verb.name, envelope(
            "unavailable", f"Gitea accepted the merge of PR #{pull.number} but does not show it merged",
            "Read it again shortly.", f"call {verb.tool} again"))
    key = await _evidence(rt, caller, number, merged, approved, delivery_id)
    return rt.done(verb, caller, {**_merged_doc(number, merged, approved), "outbox": [key]})


async def merge_replay(
    rt: VerbRuntime, verb: Verb, caller: Caller, values: Mapping[str, object]
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
    verdict = latest_verdict(await rt.gitea.list_reviews(pull.number))
    approved = verdict.commit_id if verdict is not None else None
    key = await _evidence(rt, caller, number, pull, approved, None)
    return rt.done(verb, caller, {**_merged_doc(number, pull, approved), "adopted": True, "outbox": [key]})
