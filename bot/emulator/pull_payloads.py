"""The webhooks of emulated pull requests, pushes and branches, built as services/webhook/notifier.go does."""

from __future__ import annotations

from typing import Final

from bot.emulator import convert, pullgit
from bot.emulator.model import EmuIssue, EmuRepo, EmuUser, Perm
from bot.emulator.pullgit import ZERO_SHA
from bot.emulator.seeding import EmulatorSeeding
from bot.emulator.state import JSON

#: ``setting.UI.FeedMaxCommitNum``: a push payload lists at most this many commits.
FEED_MAX_COMMITS: Final = 5


class EmulatorPullWebhooks(EmulatorSeeding):
    """``PullRequestPayload``, ``PushPayload``, ``CreatePayload``/``DeletePayload`` and closing-by-commit events."""

    def _viewer(self, doer: EmuUser) -> EmuUser | None:
        """Whom the notifier renders the PR for: the doer from 1.23 (#26178), nobody before (v1.22.3 notifier.go)."""
        return doer if self.at_least("1.23") else None

    def _emit_pull(
        self,
        issue: EmuIssue,
        event_type: str,
        action: str,
        sender: EmuUser,
        *,
        viewer: EmuUser | None,
        perm: Perm,
        requested_reviewer: EmuUser | None = None,
        review: JSON | None = None,
    ) -> None:
        """A ``PullRequestPayload`` as services/webhook/notifier.go builds it for NewPullRequest, MergePullRequest,
        PullRequestSynchronized and PullRequestReview (the repository seen with ``perm``)."""
        payload: JSON = {
            "action": action,
            "number": issue.number,
            "pull_request": convert.pull_json(self, issue, viewer),
            "requested_reviewer": (
                convert.user_json(self, requested_reviewer, None) if requested_reviewer is not None else None
            ),
            "repository": convert.repo_json(self, issue.repo, perm),
            "sender": convert.user_json(self, sender, None),
            "commit_id": "",
            "review": review,
        }
        self._emit(issue.repo, event_type, payload)

    def _emit_state_by_commit(self, issue: EmuIssue, doer: EmuUser, action: str, commit: str) -> None:
        """``IssueChangeStatus`` with the closing commit: ``issues``/``closed`` whose ``commit_id`` is set."""
        payload: JSON = {
            "action": action,
            "number": issue.number,
            "issue": convert.issue_json(self, issue, doer),
            "repository": convert.repo_json(self, issue.repo, self.perm_of(issue.repo, issue.poster)),
            "sender": convert.user_json(self, doer, None),
            "commit_id": commit,
        }
        self._emit(issue.repo, "issues", payload)

    def _emit_push(self, repo: EmuRepo, doer: EmuUser, branch: str, old: str, new: str) -> None:
        """``PushCommits`` (services/webhook/notifier.go): ``PushPayload``; the commits newest first, at most
        ``FEED_MAX_COMMITS``; a new branch lists the commits not on any other branch (CommitsBeforeLimit(10))."""
        path = repo.path
        if new == ZERO_SHA:
            shas: list[str] = []
        elif old == ZERO_SHA:
            others = [sha for name, sha in pullgit.all_branches(path).items() if name != branch]
            shas = pullgit.rev_list(path, new, exclude=others, limit=10)
        else:
            shas = list(reversed(pullgit.commits_between(path, old, new)))
        facts = pullgit.commit_facts(path, shas[:FEED_MAX_COMMITS])
        commits = [convert.payload_commit(self, repo, fact) for fact in facts]
        compare_from = old
        if old == ZERO_SHA and shas:
            compare_from = pullgit.rev(path, f"{shas[-1]}^") or ZERO_SHA
        compare = "" if compare_from == ZERO_SHA else f"{repo.full_name}/compare/{compare_from}...{new}"
        head = convert.payload_commit(self, repo, pullgit.commit_facts(path, [new])[0]) if new != ZERO_SHA else None
        pusher = convert.user_json(self, doer, None)
        payload: JSON = {
            "ref": f"refs/heads/{branch}",
            "before": old,
            "after": new,
            "compare_url": f"{self.app_url}{compare}",
            "commits": commits,
            "total_commits": len(shas),
            "head_commit": head,
            "repository": convert.repo_json(self, repo, "owner"),
            "pusher": pusher,
            "sender": pusher,
        }
        self._emit(repo, "push", payload)

    def _emit_ref(self, repo: EmuRepo, doer: EmuUser, event_type: str, branch: str, sha: str) -> None:
        """``CreateRef`` (``CreatePayload`` {sha, ref, ref_type}, the repository seen with no access) or
        ``DeleteRef`` (``DeletePayload`` {ref, ref_type, pusher_type}, seen as owner); ``ref`` is the short name."""
        sender = convert.user_json(self, doer, None)
        if event_type == "create":
            payload: JSON = {"sha": sha, "ref": branch, "ref_type": "branch"}
            repository = convert.repo_json(self, repo, "none")
        else:
            payload = {"ref": branch, "ref_type": "branch", "pusher_type": "user"}
            repository = convert.repo_json(self, repo, "owner")
        self._emit(repo, event_type, payload | {"repository": repository, "sender": sender})
