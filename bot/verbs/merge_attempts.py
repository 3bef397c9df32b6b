"""One merge call to Gitea as Gitea decides it: retried while Gitea still checks the PR's mergeability (405 "Please
try again later", bounded by ``[merge] checking_wait_s``) and while another merge moved the base under it (409
"merge push out of date", ``[merge] push_retries`` times); every other answer is classified for the verb
(routers/api/v1/repo/pull.go ``MergePullRequest``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from bot import gitops
from bot.gitea import GiteaError
from bot.gitea.errors import GiteaConflict, GiteaInvalid
from bot.gitea.values import PullRequest
from bot.gitops.conflicts import conflicting_files
from bot.verbs.bootstrap.context import BootstrapContext
from bot.verbs.runtime import VerbRuntime

#: How a merge call ended when it did not merge: Gitea still checking after the bound; a conflict (merging or
#: rebasing); the head moved; the merge whitelist; Gitea's own protection check; a pre-receive hook's rejection; a
#: fast-forward-only merge on a base the head does not contain; anything else Gitea answered.
Failure = Literal["checking", "conflict", "head_moved", "not_allowed", "protection", "push_rejected", "diverged",
                  "other"]


class Merging(Protocol):
    """The merge call itself, as the merger's Gitea account."""

    async def merge_pull(
        self, number: int, *, style: Literal["merge", "rebase", "rebase-merge", "squash", "fast-forward-only"] = ...,
        head_commit_id: str = ..., message: str = ..., delete_branch_after_merge: bool = ...,
    ) -> None: ...


class Reading(Protocol):
    async def get_pull(self, number: int) -> PullRequest: ...


@dataclass(frozen=True, slots=True)
class MergeOutcome:
    """What the merge call came to: merged (``refusal`` None), or why not with Gitea's last answer."""

    refusal: Failure | None
    error: GiteaError | None = None
    attempts: int = 1
    #: What each retry waited for (``checking 0.25s``, ``push out of date``), in order.
    waited: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = field(default=())


def classify(exc: GiteaError, style: str) -> Failure:
    """What Gitea's refusal of a merge means (its words are the only signal: the statuses overlap)."""
    text = (exc.message or "").lower()
    if isinstance(exc, GiteaConflict) or exc.status == 409:
        if "head out of date" in text:
            return "head_moved"
        if "merge push out of date" in text:
            return "checking"  # retried as a moved base: the caller counts it apart
        if "pushrejected" in text:
            return "push_rejected"
        return "conflict"  # ErrMergeConflicts / ErrRebaseConflicts / unrelated histories: a JSON body, no message
    if isinstance(exc, GiteaInvalid) or exc.status == 405:
        if "try again later" in text:
            return "checking"
        if "not allowed to merge" in text:
            return "not_allowed"
        if "approvals" in text or "requested changes" in text or "status check" in text or "behind" in text \
                or "review requests" in text or "protected files" in text:
            return "protection"
        return "other"
    if exc.status == 500 and style == "fast-forward-only":
        return "diverged"  # Gitea answers a non-admin's ff-only merge on a diverged base with an empty 500
    return "other"


async def merge_with_retries(
    rt: VerbRuntime[Any], merger: Merging, reader: Reading, pull: PullRequest, approved: str,
) -> MergeOutcome:
    """Merge ``pull`` pinned to ``approved``: retry Gitea's "Please try again later" with backoff (0.25 s doubling to
    4 s) until ``checking_wait_s`` has passed, and "merge push out of date" up to ``push_retries`` times; a merge
    Gitea did make meanwhile (an answer lost, a retry's 405 "already merged") counts as merged."""
    settings = rt.settings.merge
    deadline = time.monotonic() + settings.checking_wait_s
    delay, attempts, pushes = 0.25, 0, 0
    waited: list[str] = []
    while True:
        attempts += 1
        try:
            await merger.merge_pull(pull.number, style=settings.style, head_commit_id=approved)
            return MergeOutcome(None, attempts=attempts, waited=tuple(waited))
        except GiteaError as exc:
            failure = classify(exc, settings.style)
            if isinstance(exc, GiteaInvalid | GiteaConflict) and await _merged(reader, pull.number):
                return MergeOutcome(None, attempts=attempts, waited=tuple(waited))
            push_moved = failure == "checking" and "push out of date" in (exc.message or "").lower()
            if push_moved and pushes < settings.push_retries:
                pushes += 1
                waited.append("merge push out of date")
                continue
            if failure == "checking" and not push_moved and time.monotonic() + delay <= deadline:
                waited.append(f"checking {delay:g}s")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 4.0)
                continue
            if failure == "checking" and push_moved:
                failure = "other"
            if failure in ("checking", "conflict", "diverged"):
                files = await _conflicts(rt, pull)
                if failure == "checking" and files:
                    failure = "conflict"
                return MergeOutcome(failure, exc, attempts, tuple(waited), tuple(files or ()))
            return MergeOutcome(failure, exc, attempts, tuple(waited))


async def _merged(reader: Reading, number: int) -> bool:
    try:
        return (await reader.get_pull(number)).merged
    except GiteaError:
        return False


async def _conflicts(rt: VerbRuntime[Any], pull: PullRequest) -> list[str] | None:
    """The files that conflict merging the PR's head into its base, as the control checkout's git sees it after
    fetching both (None: it cannot tell)."""
    checkout = BootstrapContext.from_service(rt).checkout()
    reported = ""
    get_repo = getattr(rt.gitea, "get_repo", None)
    if get_repo is not None:
        try:
            reported = (await get_repo()).clone_url
        except GiteaError:
            return None
    url = rt.settings.repository.effective_clone_url(reported)
    auth = gitops.auth_env(url, rt.settings.gitea_token()) if url else {}
    return await asyncio.to_thread(_conflicts_in, checkout, pull, auth)


def _conflicts_in(checkout: gitops.ControlCheckout, pull: PullRequest, auth: Mapping[str, str]) -> list[str] | None:
    if not Path(checkout.path).is_dir():
        return None
    try:
        checkout.fetch(pull.base_ref, auth=auth)
    except gitops.GitFailure:
        return None
    head = gitops.fetch_pull_head(checkout, pull.number, auth=auth)
    base = checkout.rev(f"refs/remotes/origin/{pull.base_ref}")
    if head is None or base is None:
        return None
    return conflicting_files(checkout, base, head)
