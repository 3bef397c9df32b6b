"""The pull-request side of an emulated PR issue (models/issues/pull.go, review.go): head, merge, reviews."""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final, Literal

from bot.emulator import pullgit
from bot.emulator.model import EmuIssue, EmuUser

ReviewState = Literal["APPROVED", "REQUEST_CHANGES", "COMMENT", "PENDING"]
#: ``ReviewStateType`` → the fine webhook type (services/webhook/notifier.go ``PullRequestReview``).
REVIEW_HOOK_TYPE: Final[dict[str, str]] = {
    "APPROVED": "pull_request_review_approved",
    "REQUEST_CHANGES": "pull_request_review_rejected",
    "COMMENT": "pull_request_review_comment",
}


@dataclass(eq=False)
class EmuReviewComment:
    """A code comment of a review (models/issues/comment.go, ``CommentTypeCode``): on ``path`` at ``line`` (new side;
    negative: the old side's line, as ``CreateCodeComment`` stores it), on the head ``commit_id`` it was made on."""

    id: int
    poster: EmuUser
    path: str
    line: int
    body: str
    commit_id: str
    created: int


@dataclass(eq=False)
class EmuReview:
    """A submitted review (models/issues/review.go ``Review``); ``comment_id`` is its timeline comment."""

    id: int
    reviewer: EmuUser
    state: ReviewState
    body: str
    commit_id: str
    official: bool
    submitted: int
    updated: int
    comment_id: int
    stale: bool = False
    dismissed: bool = False
    #: Its code comments (``Review.CodeComments``), in the order they were made.
    comments: list[EmuReviewComment] = field(default_factory=list)


@dataclass(eq=False)
class EmuPull:
    """The ``pull_request`` row of a PR issue: its own id, the merge state and the reviews."""

    id: int
    issue: EmuIssue
    merge_base: str = ""
    #: ``Status == Mergeable`` after the conflict check (services/pull/check.go); recomputed on pushes.
    mergeable: bool = True
    #: ``Status == PullRequestStatusChecking``: a push queued a conflict check that has not finished
    #: (services/pull/check.go); the API's ``mergeable`` is false meanwhile and merging is "try again later".
    checking: bool = False
    #: Bumped by every queued check, so a delayed check that was overtaken does nothing.
    check_token: int = 0
    merged: int | None = None
    merged_by: EmuUser | None = None
    merge_commit_sha: str | None = None
    reviews: list[EmuReview] = field(default_factory=list)

    @property
    def head_ref(self) -> str:
        """``PullRequest.GetGitHeadRefName``: the base repository's copy of the head."""
        return f"refs/pull/{self.issue.number}/head"

    def head_sha(self) -> str:
        """The PR's head commit: the head branch's tip, else ``refs/pull/N/head`` (services/convert/pull.go)."""
        path = self.issue.repo.path
        return pullgit.branch_sha(path, self.issue.head_branch) or pullgit.rev(path, self.head_ref) or ""


# Beside the emulator's tables, weakly keyed: the PR side needs no new field on EmuIssue or EmulatorState, and
# goes away with the issue, repository or emulator it belongs to.
_RECORDS: weakref.WeakKeyDictionary[EmuIssue, EmuPull] = weakref.WeakKeyDictionary()
_IDS: weakref.WeakKeyDictionary[object, dict[str, Iterator[int]]] = weakref.WeakKeyDictionary()


def next_id(owner: object, table: str) -> int:
    """The next id of ``table`` (``pull_request``, ``review``) in the emulator ``owner`` (dies with it)."""
    counters = _IDS.setdefault(owner, {})
    return next(counters.setdefault(table, itertools.count(1)))


def pull_record(owner: object, issue: EmuIssue) -> EmuPull:
    """The pull-request row of ``issue`` (made on first use for PRs seeded as plain issues with ``pull=True``)."""
    record = _RECORDS.get(issue)
    if record is None:
        record = _RECORDS[issue] = EmuPull(id=next_id(owner, "pull_request"), issue=issue)
    return record
