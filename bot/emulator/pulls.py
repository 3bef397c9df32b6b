"""Emulated pull requests: create, review, merge, pushes and branch deletion, with the webhooks Gitea sends."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Any, Final

from bot.emulator import pullgit
from bot.emulator.model import EmuIssue, EmuLabel, EmuRepo, EmuUser
from bot.emulator.protection import RULE_OPTIONS, ProtectionRule, first_match, is_official_reviewer, repo_rules
from bot.emulator.pull_payloads import EmulatorPullWebhooks
from bot.emulator.pullgit import ZERO_SHA, Identity
from bot.emulator.pullstate import (
    REVIEW_HOOK_TYPE,
    EmuPull,
    EmuReview,
    ReviewState,
    next_id,
    pull_record,
)
from bot.emulator.state import ApiError

#: ``[repository.pull-request] CLOSE_KEYWORDS`` / ``REOPEN_KEYWORDS`` defaults (modules/setting/repository.go).
CLOSE_KEYWORDS: Final = ("close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved")
REOPEN_KEYWORDS: Final = ("reopen", "reopens", "reopened")
#: modules/references/references.go ``issueNumericPattern`` and ``crossReferenceIssueNumericPattern``.
_ISSUE_REF: Final = re.compile(
    r"(?:\s|^|\(|\[|'|\")((?:([0-9a-zA-Z_.-]+)/([0-9a-zA-Z_.-]+))?[#!]([0-9]+))(?=\s|$|\)|\]|'|\"|[:;,.?!]\s|[:;,.?!]$)"
)
#: ``makeKeywordsPat``: the keyword, an optional colon and exactly one space right before the reference.
_CLOSE_BEFORE: Final = re.compile(r"(?i)(?:\s|^|\(|\[)(" + "|".join(CLOSE_KEYWORDS) + r"):? $")
_REOPEN_BEFORE: Final = re.compile(r"(?i)(?:\s|^|\(|\[)(" + "|".join(REOPEN_KEYWORDS) + r"):? $")
MERGE_STYLES: Final = ("merge", "rebase", "rebase-merge", "squash", "fast-forward-only")
#: services/pull/review.go ``DismissApprovalReviews``: the timeline comment of an approval dismissed by a push.
STALE_DISMISS_MESSAGE: Final = (
    "New commits pushed, approval review dismissed automatically according to repository settings"
)


def closing_refs(repo: EmuRepo, text: str) -> list[tuple[str, int]]:
    """``(action, number)`` for each ``close``/``reopen`` keyword reference to an issue of ``repo`` in ``text``
    (modules/references/references.go ``FindAllIssueReferences`` + ``findActionKeywords``)."""
    found: list[tuple[str, int]] = []
    for match in _ISSUE_REF.finditer(text):
        owner, name = match[2], match[3]
        if owner and f"{owner}/{name}".lower() != repo.full_name.lower():
            continue
        before = text[: match.start(1)]
        action = "close" if _CLOSE_BEFORE.search(before) else "reopen" if _REOPEN_BEFORE.search(before) else ""
        if action:
            found.append((action, int(match[4])))
    return found


#: ``protect_branch`` keywords naming users or teams → the rule's id lists.
_WHITELIST_OPTIONS: Final = {
    "push_whitelist_usernames": "push_whitelist_user_ids",
    "push_whitelist_teams": "push_whitelist_team_ids",
    "force_push_allowlist_usernames": "force_push_allowlist_user_ids",
    "force_push_allowlist_teams": "force_push_allowlist_team_ids",
    "merge_whitelist_usernames": "merge_whitelist_user_ids",
    "merge_whitelist_teams": "merge_whitelist_team_ids",
    "approvals_whitelist_username": "approvals_whitelist_user_ids",
    "approvals_whitelist_teams": "approvals_whitelist_team_ids",
}


class EmulatorPulls(EmulatorPullWebhooks):
    """Pull requests on top of issues: the pull_request row, reviews, merges, and the pushes that move heads.

    Conflict checks after pushes are asynchronous as in Gitea (services/pull/check.go's queue): a push puts the
    open PRs on the branch into ``checking``; the check finishes ``mergeability_delay_s`` seconds later on the
    event loop (0: at once), or only after ``release_mergeability_checks()`` while ``hold_mergeability_checks()``
    is in force."""

    #: Seconds between a push and the end of the conflict check it queues (real time, on the running loop).
    mergeability_delay_s: float = 0.0
    _checks_held: bool = False
    #: Per repository id: a one-shot callback run right before the next merge pushes to the base.
    _merge_races: dict[int, Callable[[], None]] | None = None

    def pull_of(self, issue: EmuIssue) -> EmuPull:
        """The pull-request row of a PR issue."""
        return pull_record(self, issue)

    def open_pull(self, repo: EmuRepo, head: str, base: str) -> EmuIssue | None:
        """``GetUnmergedPullRequest``: an open, unmerged PR from ``head`` into ``base``."""
        for issue in repo.issues.values():
            if issue.is_pull and issue.closed is None and (issue.head_branch, issue.base_branch) == (head, base):
                if self.pull_of(issue).merged is None:
                    return issue
        return None

    # --- create, review, merge ----------------------------------------------------------------------------------------

    def _op_create_pull(
        self,
        repo: EmuRepo,
        doer: EmuUser,
        *,
        head: str,
        base: str,
        title: str,
        body: str,
        labels: list[EmuLabel],
        assignees: list[EmuUser],
        notify: bool,
    ) -> EmuIssue:
        """services/pull/pull.go ``NewPullRequest``: the issue with its labels and assignees, ``refs/pull/N/head``,
        the merge base and conflict check; then ``opened``, ``label_updated``, one ``assigned`` per assignee."""
        issue = self._op_create_issue(
            repo,
            doer,
            title=title,
            body=body,
            labels=labels,
            assignees=[],
            closed=False,
            pull=True,
            head=head,
            base=base,
            notify=False,
        )
        for user in assignees:
            if user not in issue.assignees:
                issue.assignees.append(user)
                self._timeline(issue, doer, "assignees")
        pull = self.pull_of(issue)
        self._refresh_pull(pull)
        if notify:
            self._emit_pull(
                issue, "pull_request", "opened", doer, viewer=self._viewer(doer), perm=self.perm_of(repo, doer)
            )
            if issue.label_ids:
                self._emit_issue(issue, "label_updated", doer)
            for _ in issue.assignees:
                self._emit_issue(issue, "assigned", doer)
        return issue

    def _refresh_pull(self, pull: EmuPull) -> None:
        """Copy the head into ``refs/pull/N/head``, recompute the merge base and the conflict check
        (services/pull/pull.go ``UpdateRef`` and services/pull/check.go / patch.go ``TestPatch``)."""
        self._update_head_ref(pull)
        self._test_patch(pull)

    def _update_head_ref(self, pull: EmuPull) -> None:
        """services/pull/pull.go ``PushToBaseRepo``: ``refs/pull/N/head`` follows the head branch."""
        issue = pull.issue
        head = pullgit.branch_sha(issue.repo.path, issue.head_branch)
        if head is not None:
            pullgit.set_ref(issue.repo.path, pull.head_ref, head)

    def _test_patch(self, pull: EmuPull) -> None:
        """services/pull/patch.go ``TestPatch``: the merge base and whether the head merges without conflicts."""
        issue = pull.issue
        path = issue.repo.path
        head = pullgit.branch_sha(path, issue.head_branch) or pullgit.rev(path, pull.head_ref)
        base = pullgit.branch_sha(path, issue.base_branch)
        pull.checking = False
        if head is None or base is None or pull.merged is not None:
            return
        pull.merge_base = pullgit.merge_base(path, base, head)
        pull.mergeable = pullgit.can_merge(path, base, head)

    # --- the conflict-check queue -------------------------------------------------------------------------------------

    def _start_check(self, pull: EmuPull) -> None:
        """services/pull/check.go ``StartPullRequestCheckImmediately``/``Delayable``: status ``checking`` until the
        queued ``TestPatch`` ran (``mergeability_delay_s`` later, or on release while checks are held)."""
        pull.checking = True
        token = pull.check_token = pull.check_token + 1
        if self._checks_held:
            return
        delay = self.mergeability_delay_s
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if delay <= 0 or loop is None:
            self._test_patch(pull)
            return
        loop.call_later(delay, self._finish_check, pull, token)

    def _finish_check(self, pull: EmuPull, token: int) -> None:
        if pull.check_token == token and pull.checking and not self._checks_held:
            self._test_patch(pull)

    def hold_mergeability_checks(self) -> None:
        """Keep PRs whose checks are queued in ``checking`` until ``release_mergeability_checks()``."""
        self._checks_held = True

    def release_mergeability_checks(self) -> None:
        """Run every held check now (PRs leave ``checking``)."""
        self._checks_held = False
        for repo in list(self._repos.values()):
            for issue in list(repo.issues.values()):
                if issue.is_pull and self.pull_of(issue).checking:
                    self._test_patch(self.pull_of(issue))

    def current_review(self, pull: EmuPull, doer: EmuUser) -> EmuReview | None:
        """models/issues/review.go ``GetCurrentReview``: the reviewer's pending review on the PR, if any."""
        return next((r for r in pull.reviews if r.reviewer is doer and r.state == "PENDING"), None)

    def _op_submit_review(
        self, issue: EmuIssue, doer: EmuUser, *, state: ReviewState, body: str, commit_id: str, notify: bool
    ) -> EmuReview:
        """services/pull/review.go ``SubmitReview`` + models/issues/review.go ``SubmitReview``: approve/reject on a
        closed PR is refused; the review is stale when ``commit_id`` is not the head. With a pending review of the
        reviewer (``GetCurrentReview``) that review is updated and keeps its id; otherwise a new one is made.
        Approve/reject first ends the reviewer's earlier official reviews, and is ``official`` per
        ``IsOfficialReviewer`` (the base branch's protection rule: its approvals whitelist when enabled, else write
        on code; without a rule, write on code)."""
        pull = self.pull_of(issue)
        head = pull.head_sha()
        official = False
        if state in ("APPROVED", "REQUEST_CHANGES"):
            if issue.closed is not None:
                raise ApiError(422, "can't submit review for a closed or merged PR")
            for old in pull.reviews:
                if old.reviewer is doer:
                    old.official = False
            official = is_official_reviewer(self, issue.repo, issue.base_branch, doer)
        now = self.now()
        review = self.current_review(pull, doer)
        if review is None:
            review = EmuReview(
                id=next_id(self, "review"),
                reviewer=doer,
                state=state,
                body=body,
                commit_id=commit_id or head,
                official=official,
                submitted=now,
                updated=now,
                comment_id=next(self._ids.comment),
                stale=bool(commit_id) and commit_id != head,
            )
            pull.reviews.append(review)
        else:
            review.state, review.body, review.official = state, body, official
            review.commit_id = commit_id or head
            review.stale = bool(commit_id) and commit_id != head
            review.updated = now
            review.comment_id = next(self._ids.comment)
        issue.updated = now
        if notify and state in REVIEW_HOOK_TYPE:
            event_type = REVIEW_HOOK_TYPE[state]
            self._emit_pull(
                issue,
                event_type,
                "reviewed",
                doer,
                viewer=self._viewer(doer),
                perm=self.perm_of(issue.repo, issue.poster),
                # PullRequestPayload.RequestedReviewer on review events: 1.23.0 (#26178); null before.
                requested_reviewer=doer if self.at_least("1.23") else None,
                review={"type": event_type, "content": body},
            )
        return review

    def _op_merge_pull(
        self, issue: EmuIssue, doer: EmuUser, *, style: str, head_commit_id: str, message: str, notify: bool
    ) -> str:
        """services/pull/merge.go ``Merge``: check the head pin, merge in git, record the merge, close the PR,
        then the push to the base, ``pull_request``/``closed``, and the issues the PR closes or reopens.

        The git refusals pass through as pullgit's exceptions (``MergeConflict``, ``RebaseConflict``,
        ``DivergingFastForward``, ``PushOutOfDate``) for the route to answer as Gitea does."""
        pull = self.pull_of(issue)
        repo = issue.repo
        head = pull.head_sha()
        if head_commit_id and head_commit_id != head:
            raise ApiError(409, "head out of date")  # merge_prepare.go ErrSHADoesNotMatch
        base_before = pullgit.branch_sha(repo.path, issue.base_branch) or ZERO_SHA
        text = message or self.default_merge_message(issue, style)
        poster = Identity(issue.poster.full_name or issue.poster.login, issue.poster.email)
        committer = Identity(doer.full_name or doer.login, doer.email)
        race = (self._merge_races or {}).pop(repo.id, None)
        new = pullgit.merge(repo.path, style, issue.base_branch, head, text, committer, poster, before_push=race)
        now = self.now()
        pull.merged, pull.merged_by, pull.merge_commit_sha, pull.mergeable = now, doer, new, False
        pull.checking = False
        issue.closed = now
        self._timeline(issue, doer, "close")
        if notify:
            self._emit_push(repo, doer, issue.base_branch, base_before, new)
            self._emit_pull(
                issue, "pull_request", "closed", doer, viewer=self._viewer(doer), perm=self.perm_of(repo, doer)
            )
        self._close_references(issue, doer, new, notify=notify)
        return new

    def default_merge_message(self, issue: EmuIssue, style: str) -> str:
        """services/pull/merge.go ``GetDefaultMergeMessage`` (same-repository PR, default templates)."""
        if style in ("rebase", "fast-forward-only"):
            return ""
        if style == "squash":
            return f"{issue.title} (#{issue.number})"
        return f"Merge pull request '{issue.title}' (#{issue.number}) from {issue.head_branch} into {issue.base_branch}"

    def _close_references(self, pr: EmuIssue, doer: EmuUser, commit: str, *, notify: bool) -> None:
        """``handleCloseCrossReferences``: the keyword references of the PR's body (and title) to issues of the
        repository close (or reopen) them, with ``commit_id`` the merge commit (issue_service.CloseIssue)."""
        for action, number in closing_refs(pr.repo, f"{pr.title}\n{pr.body}"):
            target = pr.repo.issues.get(number)
            if target is None or target is pr:
                continue
            closing = action == "close"
            if closing == (target.closed is not None):
                continue
            target.closed = self.now() if closing else None
            self._timeline(target, doer, "close" if closing else "reopen")
            if notify:
                self._emit_state_by_commit(target, doer, "closed" if closing else "reopened", commit)

    # --- pushes and branches ------------------------------------------------------------------------------------------

    def on_push(self, repo: EmuRepo, doer: EmuUser, before: dict[str, str], after: dict[str, str]) -> None:
        """What a receive-pack did, as services/repository/push.go ``pushUpdates`` handles it: per branch a
        ``create`` (new) and ``push`` event, or a ``delete`` and the closing of its PRs; an updated branch
        re-tests its PRs (services/pull/pull.go ``AddTestPullRequestTask``): ``synchronized`` for PRs whose head
        it is, stale reviews, and a new conflict check for PRs on it as base."""
        for branch in sorted(set(before) | set(after)):
            old, new = before.get(branch, ZERO_SHA), after.get(branch, ZERO_SHA)
            if old == new:
                continue
            if new == ZERO_SHA:
                self._branch_deleted(repo, doer, branch)
                continue
            if old == ZERO_SHA:
                self._emit_ref(repo, doer, "create", branch, new)
            self._emit_push(repo, doer, branch, old, new)
            if old != ZERO_SHA:
                self._sync_pulls(repo, doer, branch, old, new)

    def _sync_pulls(self, repo: EmuRepo, doer: EmuUser, branch: str, old: str, new: str) -> None:
        """services/pull/pull.go ``AddTestPullRequestTask`` for a pushed branch. PRs with it as head: the head ref
        follows, then (``checkIfPRContentChanged``: the diff against the merge base changed) every review goes
        stale and, with the rule's ``dismiss_stale_approvals``, the approvals are dismissed (``DismissApprovalReviews``:
        a timeline comment each, no webhook); reviews of the new head are not stale (``MarkReviewsAsNotStale``);
        a conflict check is queued; ``synchronized``. PRs with it as base: a conflict check is queued."""
        for issue in list(repo.issues.values()):
            if not issue.is_pull or issue.closed is not None:
                continue
            pull = self.pull_of(issue)
            if pull.merged is not None:
                continue
            if issue.head_branch == branch:
                self._update_head_ref(pull)
                base = pullgit.branch_sha(repo.path, issue.base_branch)
                merge_base = pullgit.merge_base(repo.path, base, new) if base else ""
                if merge_base and pullgit.content_changed(repo.path, old, new, merge_base):
                    self._stale_reviews(pull, doer)
                for review in pull.reviews:
                    if review.commit_id == new:
                        review.stale = False
                self._start_check(pull)
                issue.updated = self.now()
                viewer = self._viewer(doer)
                self._emit_pull(issue, "pull_request_sync", "synchronized", doer, viewer=viewer, perm="owner")
            elif issue.base_branch == branch:
                self._start_check(pull)

    def _stale_reviews(self, pull: EmuPull, doer: EmuUser) -> None:
        """``MarkReviewsAsStale``, then with ``dismiss_stale_approvals`` ``DismissApprovalReviews`` (approvals only,
        in every version; ``DismissReview`` on each, a ``dismiss_review`` timeline comment, no webhook)."""
        issue = pull.issue
        for review in pull.reviews:
            review.stale = True
        rule = first_match(self, issue.repo, issue.base_branch)
        if rule is None or not rule.dismiss_stale_approvals:
            return
        for review in pull.reviews:
            if review.state == "APPROVED" and not review.dismissed:
                review.dismissed = True
                self._timeline(issue, doer, "dismiss_review", STALE_DISMISS_MESSAGE)

    def _branch_deleted(self, repo: EmuRepo, doer: EmuUser, branch: str) -> None:
        """``pushDeleteBranch``: ``delete`` event, then ``AdjustPullsCausedByBranchDeleted`` closes the open
        unmerged PRs with the branch as head or base (``pull_request``/``closed`` each)."""
        self._emit_ref(repo, doer, "delete", branch, "")
        for issue in list(repo.issues.values()):
            if not issue.is_pull or issue.closed is not None or self.pull_of(issue).merged is not None:
                continue
            if branch in (issue.head_branch, issue.base_branch):
                self._op_set_state(issue, doer, closed=True, notify=True)

    def _op_delete_branch(self, repo: EmuRepo, doer: EmuUser, branch: str) -> None:
        """services/repository/branch.go ``DeleteBranch``: never the default branch; 404 when missing."""
        if branch == repo.default_branch:
            message = "can not delete default or pull request target branch"
            raise ApiError(403, message if self.at_least("1.23") else "can not delete default branch")
        if first_match(self, repo, branch) is not None:
            raise ApiError(403, "branch protected")
        old = pullgit.branch_sha(repo.path, branch)
        if old is None:
            raise ApiError(404, f"branch does not exist [repo_id: {repo.id} name: {branch}]")
        pullgit.delete_branch(repo.path, branch, old)
        # deleteBranchSuccessPostProcess → PushUpdate: a deleted branch sends no ``push``, only what follows.
        self._branch_deleted(repo, doer, branch)

    def protect_branch(self, owner: str, name: str, branch: str, **options: Any) -> ProtectionRule:
        """A protection rule named ``branch`` (a branch name or a glob such as ``release/*``), as
        ``POST /repos/{owner}/{repo}/branch_protections`` makes it: the branch cannot be deleted, and ``options``
        set any rule field (``required_approvals=2``, ``block_on_rejected_reviews=True``,
        ``enable_status_check=True``, ``status_check_contexts=["ci/*"]``, ``dismiss_stale_approvals=True``,
        ``enable_merge_whitelist=True``, ``merge_whitelist_usernames=["alice"]``, ``priority=1``, ...). Whitelists
        take logins (``*_usernames``/``approvals_whitelist_username``) or team names (``*_teams``)."""
        repo = self.repo(owner, name)
        now = self.now()
        rule_id = next_id(self, "protected_branch")
        rule = ProtectionRule(id=rule_id, repo=repo, rule_name=branch, created=now, updated=now)
        for key, value in options.items():
            if key in RULE_OPTIONS:
                setattr(rule, key, list(value) if isinstance(value, list | tuple) else value)
                continue
            target = _WHITELIST_OPTIONS.get(key)
            if target is None:
                raise TypeError(f"protect_branch() got an unexpected keyword argument {key!r}")
            if key.endswith("_teams"):
                ids = [t.id for t in self.teams_of(repo.owner) if t.name.lower() in {str(v).lower() for v in value}]
            else:
                ids = [self.user(str(v)).id for v in value]
            setattr(rule, target, ids)
        repo_rules(repo).append(rule)
        return rule

    # --- seeding ------------------------------------------------------------------------------------------------------

    def create_pull(
        self,
        owner: str,
        name: str,
        *,
        head: str,
        title: str,
        author: str,
        base: str | None = None,
        body: str = "",
        labels: Sequence[int | str] = (),
        assignees: Sequence[str] = (),
        notify: bool = False,
    ) -> EmuIssue:
        """Open a PR from the existing branch ``head`` as ``author`` (no permission checks)."""
        repo = self.repo(owner, name)
        return self._op_create_pull(
            repo,
            self.user(author),
            head=head,
            base=base or repo.default_branch,
            title=title,
            body=body,
            labels=self._labels_by_ref(repo, labels),
            assignees=[self.user(a) for a in assignees],
            notify=notify,
        )

    def dismiss_review(self, owner: str, name: str, number: int, review_id: int, *, message: str = "") -> None:
        """A maintainer (the repository's owner) dismisses review ``review_id`` of PR ``number`` (services/pull/
        review.go ``DismissReview``: an approval or a request-changes on an open PR; it stays, marked ``dismissed``)."""
        issue = self.issue(owner, name, number)
        review = next(r for r in self.pull_of(issue).reviews if r.id == review_id)
        if review.state not in ("APPROVED", "REQUEST_CHANGES") or issue.closed is not None:
            raise ValueError(f"review {review_id} cannot be dismissed")
        self._op_dismiss_review(issue, review, issue.repo.owner, message=message, dismiss=True, priors=False)

    def _op_dismiss_review(
        self, issue: EmuIssue, review: EmuReview, doer: EmuUser, *, message: str, dismiss: bool, priors: bool
    ) -> None:
        """services/pull/review.go ``DismissReview``: refused on a closed or merged PR (403 through the API);
        models ``DismissReview`` flips ``dismissed`` of an approval or request-changes; ``priors`` dismisses the
        reviewer's other undismissed reviews; a dismissal leaves a ``dismiss_review`` timeline comment. Gitea's
        webhook notifier has no ``PullReviewDismiss``: no webhook."""
        if issue.closed is not None or self.pull_of(issue).merged is not None:
            raise ApiError(403, "can't dismiss a review associated to a closed or merged PR")
        now = self.now()
        targets = [review]
        if priors:
            targets += [r for r in self.pull_of(issue).reviews if r.reviewer is review.reviewer and not r.dismissed]
        for target in targets:
            wanted = dismiss or target is not review
            if target.state in ("APPROVED", "REQUEST_CHANGES") and target.dismissed != wanted:
                target.dismissed = wanted
                target.updated = now
        if dismiss:
            self._timeline(issue, doer, "dismiss_review", message)

    def push_commit(
        self, owner: str, name: str, branch: str, files: dict[str, str], *, pusher: str, message: str = "Update"
    ) -> str:
        """Commit ``files`` on ``branch`` and handle it as a push by ``pusher`` (webhooks included)."""
        repo = self.repo(owner, name)
        before = pullgit.all_branches(repo.path)
        sha = self.create_branch(owner, name, branch, files=files, message=message)
        self.on_push(repo, self.user(pusher), before, pullgit.all_branches(repo.path))
        return sha
