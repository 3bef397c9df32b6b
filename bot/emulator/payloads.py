"""The webhooks an emulator change sends: Gitea's payloads (FACTS §3), queued to each active hook."""

from __future__ import annotations

from collections.abc import Sequence

from bot.emulator import convert
from bot.emulator.model import (
    EmuComment,
    EmuHook,
    EmuIssue,
    EmuLabel,
    EmuOrgHook,
    EmuRepo,
    EmuSystemHook,
    EmuUser,
)
from bot.emulator.state import JSON, EmulatorState
from bot.emulator.webhooks import HookTarget


class EmulatorWebhooks(EmulatorState):
    """Builds the issue and comment payloads Gitea's notifier sends, and queues them to the hooks."""

    def _emit(self, repo: EmuRepo, event_type: str, payload: JSON) -> None:
        for hook in repo.hooks:
            if hook.active and event_type in hook.events:
                self._sender.enqueue(hook_target(hook, self), event_type, payload)
        for org_hook in self._org_hooks:
            if org_hook.org is repo.owner and org_hook.active and event_type in org_hook.events:
                self._sender.enqueue(org_hook_target(org_hook, self), event_type, payload)
        for system_hook in self._system_hooks:
            if system_hook.active and event_type in system_hook.events:
                self._sender.enqueue(system_hook_target(system_hook, self), event_type, payload)

    def _emit_issue(
        self,
        issue: EmuIssue,
        action: str,
        doer: EmuUser,
        *,
        changes: JSON | None = None,
        labels_as: Sequence[EmuLabel] | None = None,
        rendered: JSON | None = None,
    ) -> None:
        """Queue an issue (or PR) event; ``labels_as`` renders these labels instead of the current ones."""
        repo = issue.repo
        if action in ("assigned", "unassigned"):
            kind, perm_user = "assign", doer
        elif action in ("label_updated", "label_cleared"):
            kind, perm_user = "label", issue.poster
        else:
            kind, perm_user = "", issue.poster
        payload: JSON = {"action": action, "number": issue.number}
        if changes is not None:
            payload["changes"] = {**changes, "added_labels": None, "removed_labels": None}
        repository = convert.repo_json(self, repo, self.perm_of(repo, perm_user))
        sender = convert.user_json(self, doer, None)
        if issue.is_pull:
            payload |= {
                # notifier.go: ToAPIPullRequest(ctx, issue.PullRequest, doer) from 1.23 (#26178); nil before.
                "pull_request": convert.pull_json(self, issue, doer if self.at_least("1.23") else None),
                "requested_reviewer": None,
                "repository": repository,
                "sender": sender,
                "commit_id": "",
                "review": None,
            }
            event_type = f"pull_request_{kind}" if kind else "pull_request"
        else:
            payload |= {
                "issue": rendered if rendered is not None else convert.issue_json(self, issue, doer),
                "repository": repository,
                "sender": sender,
                "commit_id": "",
            }
            event_type = f"issue_{kind}" if kind else "issues"
        if labels_as is not None:
            stale = [convert.label_json(self, label) for label in labels_as]
            payload["pull_request" if issue.is_pull else "issue"]["labels"] = stale
        self._emit(repo, event_type, payload)

    def _emit_comment(
        self,
        comment: EmuComment,
        action: str,
        doer: EmuUser,
        *,
        changes: JSON | None = None,
        rendered: JSON | None = None,
    ) -> None:
        issue = comment.issue
        payload: JSON = {"action": action, "issue": convert.issue_json(self, issue, doer)}
        if issue.is_pull and self.at_least("1.23"):  # IssueCommentPayload.PullRequest: 1.23.0 (#26178)
            payload["pull_request"] = convert.pull_json(self, issue, doer)
        payload["comment"] = rendered if rendered is not None else convert.comment_json(self, comment)
        if changes is not None:
            payload["changes"] = {**changes, "added_labels": None, "removed_labels": None}
        payload |= {
            "repository": convert.repo_json(self, issue.repo, self.perm_of(issue.repo, doer)),
            "sender": convert.user_json(self, doer, None),
            "is_pull": issue.is_pull,
        }
        self._emit(issue.repo, "pull_request_comment" if issue.is_pull else "issue_comment", payload)


def org_hook_target(hook: EmuOrgHook, emu: EmulatorState) -> HookTarget:
    return HookTarget(target_headers=emu.at_least("1.24"), hook_id=hook.id, url=hook.url,
                      secret=hook.secret.encode("utf-8"), content_type=hook.content_type, target_type="organization")


def system_hook_target(hook: EmuSystemHook, emu: EmulatorState) -> HookTarget:
    return HookTarget(target_headers=emu.at_least("1.24"), hook_id=hook.id, url=hook.url,
                      secret=hook.secret.encode("utf-8"), content_type=hook.content_type, target_type="system")


def hook_target(hook: EmuHook, emu: EmulatorState) -> HookTarget:
    return HookTarget(
        target_headers=emu.at_least("1.24"),
        hook_id=hook.id,
        url=hook.url,
        secret=hook.secret.encode("utf-8"),
        content_type=hook.content_type,
        authorization=hook.authorization_header,
    )
