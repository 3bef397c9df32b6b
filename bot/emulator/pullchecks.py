"""What decides whether a PR may merge (services/pull/check.go, merge.go, commit_status.go), commit statuses, and
updating a PR from its base (services/pull/update.go)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from bot.emulator import convert, pullgit
from bot.emulator.model import PERM_LEVEL, EmuIssue, EmuRepo, EmuUser
from bot.emulator.protection import (
    ProtectionRule,
    can_user_force_push,
    can_user_push,
    can_write_code,
    first_match,
    is_user_allowed_to_merge,
)
from bot.emulator.pulls import EmulatorPulls
from bot.emulator.pullstate import next_id
from bot.emulator.state import JSON, ApiError
from bot.emulator.statuses import EmuCommitStatus, latest_per_context, repo_statuses, required_contexts_state


class EmulatorPullChecks(EmulatorPulls):
    """Branch-protection checks before a merge, commit statuses with their webhook, and update-by-merge/rebase."""

    # --- CheckPullBranchProtections -----------------------------------------------------------------------------------

    def protection_refusal(self, issue: EmuIssue) -> str | None:
        """services/pull/merge.go ``CheckPullBranchProtections`` (protected files not modelled): the reason the
        base branch's rule refuses the merge, in Gitea's order, or None (also without a rule)."""
        rule = first_match(self, issue.repo, issue.base_branch)
        if rule is None:
            return None
        pull = self.pull_of(issue)
        if not self.statuses_pass(issue, rule):
            return "Not all required status checks successful"
        reviews = [r for r in pull.reviews if r.official and not r.dismissed]
        if rule.required_approvals:
            approvals = [r for r in reviews if r.state == "APPROVED" and not (rule.ignore_stale_approvals and r.stale)]
            if len(approvals) < rule.required_approvals:  # HasEnoughApprovals / GetGrantedApprovalsCount
                return "Does not have enough approvals"
        if rule.block_on_rejected_reviews and any(r.state == "REQUEST_CHANGES" for r in reviews):
            return "There are requested changes"  # MergeBlockedByRejectedReview
        # MergeBlockedByOfficialReviewRequests: the emulator has no review requests, so it never blocks.
        if rule.block_on_outdated_branch:  # MergeBlockedByOutdatedBranch: CommitsBehind > 0
            base = pullgit.branch_sha(issue.repo.path, issue.base_branch)
            if base and pullgit.commits_behind(issue.repo.path, base, pull.head_sha()) > 0:
                return "The head branch is behind the base branch"
        return None

    def statuses_pass(self, issue: EmuIssue, rule: ProtectionRule) -> bool:
        """services/pull/commit_status.go ``IsPullCommitStatusPass``: without ``enable_status_check`` it passes;
        otherwise ``MergeRequiredContextsCommitStatus`` over the head's latest statuses must be ``success``."""
        if not rule.enable_status_check:
            return True
        latest = latest_per_context(issue.repo, self.pull_of(issue).head_sha())
        return required_contexts_state(self, latest, list(rule.status_check_contexts or [])) == "success"

    def protection_message(self, reason: str) -> str:
        """How the merge API words a refusal: 1.23+ ``util.ErrorWrap(ErrNotReadyToMerge, reason)`` is the reason
        alone; 1.22 ``models.ErrDisallowedToMerge`` is ``not allowed to merge [reason: ...]``."""
        return reason if self.at_least("1.23") else f"not allowed to merge [reason: {reason}]"

    def admin_may_force(self, repo: EmuRepo, doer: EmuUser, branch: str) -> bool:
        """``CheckPullMergeable``'s ``force_merge``: a repo admin (``IsUserRepoAdmin``) skips a failed protection
        check; from 1.23 not when the rule has ``block_admin_merge_override`` (#32248)."""
        if PERM_LEVEL[self.perm_of(repo, doer)] < PERM_LEVEL["admin"]:
            return False
        if not self.at_least("1.23"):
            return True
        rule = first_match(self, repo, branch)
        return rule is None or not rule.block_admin_merge_override

    def race_next_merge_push(
        self, owner: str, name: str, *, files: Mapping[str, str], pusher: str, branch: str | None = None
    ) -> None:
        """Arm a concurrent push: the next merge into ``owner/name`` finds the base moved (``files`` committed on
        ``branch``, default the default branch, by ``pusher``) right before its own push, so Gitea answers
        409 "merge push out of date" (``git.ErrPushOutOfDate``)."""
        repo = self.repo(owner, name)
        target = branch or repo.default_branch

        def race() -> None:
            self.push_commit(owner, name, target, dict(files), pusher=pusher, message="Concurrent push")

        if self._merge_races is None:
            self._merge_races = {}
        self._merge_races[repo.id] = race

    # --- commit statuses ----------------------------------------------------------------------------------------------

    def _op_create_status(
        self,
        repo: EmuRepo,
        creator: EmuUser,
        sha: str,
        *,
        state: str,
        context: str,
        target_url: str,
        description: str,
        notify: bool,
    ) -> EmuCommitStatus:
        """services/repository/commitstatus ``CreateCommitStatus`` → models ``NewCommitStatus``: the full sha,
        the next per-commit index, trimmed fields; then notify ``CreateCommitStatus`` (the ``status`` webhook,
        1.23+, #27151; 1.22 sends none)."""
        now = self.now()
        existing = [s for s in repo_statuses(repo) if s.sha == sha]
        status = EmuCommitStatus(
            id=next_id(self, "commit_status"),
            index=len(existing) + 1,
            repo=repo,
            sha=sha,
            state=state,
            target_url=target_url.strip(),
            description=description.strip(),
            context=context.strip(),
            creator=creator,
            created=now,
            updated=now,
        )
        repo_statuses(repo).append(status)
        if notify and self.at_least("1.23"):
            self._emit(repo, "status", self.status_payload(status))
        return status

    def status_payload(self, status: EmuCommitStatus) -> JSON:
        """services/webhook/notifier.go ``CreateCommitStatus`` → ``api.CommitStatusPayload`` (field order of the
        struct; times in UTC; ``id`` the row id; ``target_url`` made absolute, empty → the app URL; the repository
        as its owner sees it; the sender as an anonymous viewer)."""
        repo = status.repo
        [fact] = pullgit.commit_facts(repo.path, [status.sha])
        target = status.target_url
        if not target:
            target = self.app_url
        elif "://" not in target:
            target = self.app_url.rstrip("/") + "/" + target.lstrip("/")
        created = convert.rfc3339(_utc(status.created))
        return {
            "commit": convert.payload_commit(self, repo, fact),
            "context": status.context,
            "created_at": created,
            "description": status.description,
            "id": status.id,
            "repository": convert.repo_json(self, repo, "owner"),
            "sender": convert.user_json(self, status.creator, None),
            "sha": status.sha,
            "state": status.state,
            "target_url": target,
            "updated_at": convert.rfc3339(_utc(status.updated)),
        }

    def set_commit_status(
        self,
        owner: str,
        name: str,
        sha: str,
        *,
        context: str,
        state: str,
        target_url: str = "",
        description: str = "",
        creator: str | None = None,
        notify: bool = False,
    ) -> EmuCommitStatus:
        """Record a commit status on ``sha`` (a full sha, or a branch name for its tip) as ``creator`` (default: the
        repository's owner) would through ``POST /repos/{owner}/{repo}/statuses/{sha}``."""
        repo = self.repo(owner, name)
        full = pullgit.branch_sha(repo.path, sha) or pullgit.rev(repo.path, sha)
        if full is None:
            raise KeyError(f"no commit {sha!r} in {repo.full_name}")
        who = self.user(creator) if creator else repo.owner
        return self._op_create_status(
            repo, who, full, state=state, context=context, target_url=target_url, description=description,
            notify=notify,
        )

    # --- update a PR from its base ------------------------------------------------------------------------------------

    def update_allowed(self, issue: EmuIssue, doer: EmuUser) -> tuple[bool, bool]:
        """services/pull/update.go ``IsUserAllowedToUpdate``: (by merge, by rebase). 1.23+: write on code, or the
        head branch's rule (``CanUserPush`` / ``CanUserForcePush``). 1.22: the head branch's rule must let the
        user push; merging is ``IsUserAllowedToMerge`` on the reversed PR; rebasing is allowed (the unit's
        ``AllowRebaseUpdate``, on by default) only when the head branch has no rule."""
        repo = issue.repo
        rule = first_match(self, repo, issue.head_branch)
        if self.at_least("1.23"):
            if rule is None:
                allowed = can_write_code(self, repo, doer)
                return allowed, allowed
            return can_user_push(self, rule, doer), can_user_force_push(self, rule, doer)
        if rule is not None and not can_user_push(self, rule, doer):
            return False, False
        return is_user_allowed_to_merge(self, repo, issue.head_branch, doer), rule is None

    def _op_update_pull(self, issue: EmuIssue, doer: EmuUser, *, rebase: bool) -> str:
        """services/pull/update.go ``Update``: refused (a 500) when the head is not behind; by merge, a commit
        ``Merge branch '<base>' into <head>`` on the head branch (``MergeConflict`` on conflicts); by rebase, the
        head's commits replayed onto the base (``RebaseConflict``) and the head branch force-moved. Either is a
        push to the head branch: ``push`` and the PR's ``synchronized``, reviews staled as on any push."""
        repo = issue.repo
        path = repo.path
        base = pullgit.branch_sha(path, issue.base_branch) or ""
        head = pullgit.branch_sha(path, issue.head_branch) or ""
        if not base or not head or pullgit.commits_behind(path, base, head) == 0:
            raise ApiError(500, f"HeadBranch of PR {issue.number} is up to date")
        committer = pullgit.Identity(doer.full_name or doer.login, doer.email)
        if rebase:
            new = pullgit.rebase_onto(path, base, pullgit.merge_base(path, base, head), head, committer)
        else:
            message = f"Merge branch '{issue.base_branch}' into {issue.head_branch}"
            env = {"GIT_AUTHOR_NAME": committer.name, "GIT_AUTHOR_EMAIL": committer.email}
            env |= {"GIT_COMMITTER_NAME": committer.name, "GIT_COMMITTER_EMAIL": committer.email}
            new = pullgit.commit_tree(path, pullgit.merged_tree(path, head, base), [head, base], message, env)
        pullgit.move_branch(path, issue.head_branch, new, head)
        self.on_push(repo, doer, {issue.head_branch: head}, {issue.head_branch: new})
        return new


def _utc(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
