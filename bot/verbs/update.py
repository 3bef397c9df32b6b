"""The update verb: bring an issue's pull request up to date with its base on Gitea, as its author, and hand the issue
back to review (the approvals on the old head no longer count)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from bot import gitops
from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope
from bot.core.verbs import Verb
from bot.core.vocabulary import label_for_state
from bot.gitea import Branch, GiteaError, client_as
from bot.gitea.errors import GiteaConflict, GiteaUnavailable
from bot.gitea.values import PullRequest
from bot.verbs.bootstrap.context import BootstrapContext
from bot.verbs.gitea_refusals import GiteaAsk, gitea_refusal
from bot.verbs.pulls import UPDATE_REASON, HandOver, hand_to_review, handed_over_detail, queue_after_hand_over
from bot.verbs.review import PullsGitea, pull_for_issue
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

log = logging.getLogger("foreman.verbs")

UpdateStyle = Literal["merge", "rebase"]


class UpdateGitea(PullsGitea, Protocol):
    """What the update verb uses: the pull-request reads, the base branch and Gitea's update of the PR."""

    async def get_branch(self, name: str) -> Branch: ...

    async def update_pull(self, number: int, *, style: UpdateStyle = ...) -> None: ...


def _contains(rt: VerbRuntime[Any], base_sha: str, head: PullRequest) -> bool | None:
    """Whether ``head``'s branch already contains the base commit (Gitea's "behind" is 0), asked of the control
    checkout after fetching both branches from Gitea (run in a thread). None when git cannot tell (no checkout, a
    fetch failed): the caller then asks Gitea anyway."""
    ctx = BootstrapContext.from_service(rt)
    checkout = ctx.checkout()
    if not checkout.exists():
        return None
    auth = gitops.auth_env(checkout.origin_url() or "", ctx.settings.gitea_token())
    try:
        for branch in (head.base_ref, head.head_ref):
            checkout.fetch(branch, auth=auth)
    except gitops.GitFailure as exc:
        log.warning("update of #%s: fetching from Gitea failed: %s", head.number, exc)
        return None
    if checkout.rev(base_sha) is None or checkout.rev(head.head_sha) is None:
        return None
    return checkout.is_ancestor(base_sha, head.head_sha)


def _conflict(number: int, pull: PullRequest, base_sha: str, style: str, exc: GiteaConflict) -> Envelope:
    base = pull.base_ref
    return envelope(
        "conflict",
        f"Gitea could not update PR #{pull.number} from {base} at {base_sha[:12]} by {style}: {exc.message}; nothing "
        f"changed (the branch {pull.head_ref} is still at {pull.head_sha[:12]} and your lease is kept)",
        f"The changes on {base} conflict with the branch's: merge {base} in your worktree and resolve the conflicts "
        f"there. foreman fetched {base} at {base_sha[:12]} into the repository your worktree shares, so no fetch (and "
        "no credential) is needed; leave the merge uncommitted: gitea_publish_worktree commits it, with both parents.",
        f"in your worktree run `git merge --no-ff --no-commit {base_sha}` ({base} as foreman fetched it), resolve the "
        f"conflicts and `git add` the files, then call gitea_publish_worktree and gitea_open_pull_request with "
        f"issue_number={number}",
        reason="update_conflict", pull_number=pull.number, base=base, base_sha=base_sha, head=pull.head_ref,
        head_sha=pull.head_sha, style=style, gitea_status=exc.status)


def _not_behind(number: int, pull: PullRequest, base_sha: str) -> Envelope:
    return envelope(
        "invalid_state",
        f"PR #{pull.number} is not behind {pull.base_ref}: its head {pull.head_sha[:12]} already contains "
        f"{pull.base_ref} at {base_sha[:12]}; nothing was sent to Gitea (it answers such an update with an error)",
        "There is nothing to bring in from the base. If the PR still needs review, hand it over by opening it again "
        "(the same PR is adopted).",
        f"call gitea_open_pull_request with issue_number={number} (publish your changes first with "
        "gitea_publish_worktree if you made any)",
        reason="pull_not_behind", pull_number=pull.number, base=pull.base_ref, base_sha=base_sha,
        head_sha=pull.head_sha)


@executes("update_pull_request")
async def update_pull_request(
    rt: VerbRuntime[UpdateGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    assert lease is not None  # the ownership precondition held
    number = issue_of(values)
    style: UpdateStyle = "rebase" if values.get("style") == "rebase" else "merge"
    if lease.action != "implement":
        return refused(verb.name, envelope(
            "not_authorized", f"your lease on #{number} is for {lease.action}, not implement",
            "Only the author holding the issue's implement lease updates its pull request.",
            "call gitea_get_runtime_context to see the work leased to you"))
    gitea: UpdateGitea | None = rt.gitea
    if gitea is None:
        return refused(verb.name, envelope("unavailable", "foreman runs without a Gitea client",
                                           "An operator must configure gitea.token.", "call gitea_get_runtime_context"))
    read_state = f"call gitea_get_issue_state with issue_number={number}"
    try:
        issue = await gitea.get_issue(number)
        pull = await pull_for_issue(gitea, rt.db, rt.repo, issue, slug_length=rt.settings.bootstrap.slug_length)
        base_sha = (await gitea.get_branch(pull.base_ref)).commit_id if pull is not None else ""
    except GiteaError as exc:
        return refused(verb.name, gitea_refusal(exc, GiteaAsk(
            what=f"read the pull request of #{number}", refused_because="Gitea refuses to read it.",
            after_failure="Nothing was sent.", retry=f"call {verb.tool} again with issue_number={number}",
            read_state=read_state)))
    if pull is None:
        return refused(verb.name, envelope(
            "invalid_state", f"#{number} has no open pull request now", "Read the issue's state.", read_state))
    if await asyncio.to_thread(_contains, rt, base_sha, pull):
        return refused(verb.name, _not_behind(number, pull, base_sha))
    acting = client_as(gitea, rt.settings, caller.login, bot_login=rt.bot_login)
    try:
        await acting.client.update_pull(pull.number, style=style)
    except GiteaConflict as exc:
        return refused(verb.name, _conflict(number, pull, base_sha, style, exc))
    except GiteaError as exc:
        # No usable answer (Gitea answers 500 for much, even a head already up to date): an update Gitea did make
        # meanwhile is adopted below, as a retry's replay would.
        moved = await _moved(rt, gitea, pull, base_sha) if isinstance(exc, GiteaUnavailable) else None
        if moved is None:
            return refused(verb.name, gitea_refusal(exc, GiteaAsk(
                what=f"update PR #{pull.number} from {pull.base_ref} by {style}",
                refused_because="Gitea refuses to update a merged or closed pull request.",
                after_failure="The update may have happened: a retry finds the PR up to date and says so.",
                retry=f"call {verb.tool} again with issue_number={number}", read_state=read_state)))
        return await _hand_over(rt, verb, caller, lease, number, pull, moved, base_sha, style, delivery_id,
                                adopted=True)
    try:
        updated = await gitea.get_pull(pull.number)
    except GiteaError as exc:
        return refused(verb.name, gitea_refusal(exc, GiteaAsk(
            what=f"read back PR #{pull.number} after its update", refused_because="Gitea refuses to read it.",
            after_failure="Gitea took the update; a retry finds the PR up to date and says so.",
            retry=read_state, read_state=read_state)))
    return await _hand_over(rt, verb, caller, lease, number, pull, updated, base_sha, style, delivery_id)


async def _moved(rt: VerbRuntime[UpdateGitea], gitea: UpdateGitea, before: PullRequest, base_sha: str) -> (
    PullRequest | None
):
    """The PR read back after an update without an answer, when Gitea did update it (its head moved and now contains
    the base commit); None otherwise."""
    try:
        now = await gitea.get_pull(before.number)
    except GiteaError:
        return None
    if now.head_sha == before.head_sha or not await asyncio.to_thread(_contains, rt, base_sha, now):
        return None
    return now


async def _hand_over(
    rt: VerbRuntime[UpdateGitea], verb: Verb, caller: Caller, lease: Lease, number: int, before: PullRequest,
    pull: PullRequest, base_sha: str, style: UpdateStyle, delivery_id: str | None, *, adopted: bool = False,
) -> VerbResult:
    """The issue back to review: the implement lease ends (``pull_request_updated``, the answer kept on its release
    for a replay), the labels go back to ``status:review`` and the evidence says what happened and that the PR needs a
    re-review (one key per PR and new head: a replay queues nothing new)."""
    contains = await asyncio.to_thread(_contains, rt, base_sha, pull)
    prefix = f"pr:{number}:{pull.number}:{pull.head_sha[:12]}:updated"
    base, head = pull.base_ref, pull.head_ref
    doc: dict[str, Any] = {
        "issue_number": number, "pull_request": pull.number, "style": style, "base": base, "base_sha": base_sha,
        "head": head, "head_before": before.head_sha, "head_sha": pull.head_sha, "contains_base": contains,
        "url": pull.html_url, "adopted": adopted, "re_review": True,
        "outbox": [f"{prefix}:review", f"{prefix}:evidence"],
    }
    how = "merging it in" if style == "merge" else "rebasing onto it"
    state = CanonicalState(
        state="review",
        who_is_next="reviewer",
        next_action=f"a reviewer is allocated the re-review of pull request #{pull.number} at {pull.head_sha[:12]} "
        f"(approvals on {before.head_sha[:12]} no longer count; the author's lease ended)",
        next_prompt=f"Pull request #{pull.number} ({head} into {base}) was brought up to date with {base} at "
                    f"{base_sha[:12]} by {how}.\nReview its new head {pull.head_sha}: approve, or request changes "
                    "with a body.",
        what_happened=f"{caller.login} updated pull request #{pull.number} from {base} at {base_sha[:12]} by {how}: "
        f"head {before.head_sha[:12]} -> {pull.head_sha[:12]}",
        why=f"pull request #{pull.number} was behind {base}; a review counts only on the commit it approved, and "
        "branch protection asks for an approval of the new head",
        related_prs=(pull.number,),
        blockers="none",
        validation=f"pull request #{pull.number} read back from Gitea with head {pull.head_sha[:12]}"
        + (f", which contains {base} at {base_sha[:12]}" if contains else ""),
        last_updated_by=rt.bot_login or rt.settings.gitea.bot_login or "foreman",
    )
    labels = {"add": [label_for_state("review")],
              "remove": [label_for_state("in-progress"), label_for_state("pr-open")]}
    doc = await hand_to_review(rt, caller, lease, HandOver(
        issue=number, pull=pull, reason=UPDATE_REASON, action="update_pull_request", prefix=prefix, state=state,
        summary=f"Pull request #{pull.number} of #{number} was updated from {base}; it needs a re-review.",
        labels=(labels,), label_keys=(f"{prefix}:review",),
    ), doc, delivery_id)
    return rt.done(verb, caller, await queue_after_hand_over(rt, doc))


@replays("update_pull_request")
async def update_pull_request_replay(
    rt: VerbRuntime[UpdateGitea], verb: Verb, caller: Caller, values: Mapping[str, object]
) -> VerbResult | None:
    """The caller's own finished update, answered from its record before the preconditions (the hand-over ended the
    lease they check), never sent to Gitea again: the caller's latest lease on the issue ended ``pull_request_updated``
    by an update of the same style. None for anything else (a new round holds a live lease: decided as usual)."""
    detail = await handed_over_detail(rt, issue_of(values), caller.login, UPDATE_REASON)
    if detail is None or detail["result"].get("style") != values.get("style", "merge"):
        return None
    return rt.done(verb, caller, {**detail["result"], "replayed": True})
