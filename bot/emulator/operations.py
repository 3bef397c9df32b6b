"""What each change the emulator's API makes does to its state, and which webhooks it sends."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bot.emulator import convert
from bot.emulator.model import (
    EmuComment,
    EmuHook,
    EmuIssue,
    EmuLabel,
    EmuRepo,
    EmuUser,
    TimelineKind,
)
from bot.emulator.payloads import EmulatorWebhooks
from bot.emulator.state import ApiError
from bot.emulator.webhooks import expand_hook_events


class EmulatorOperations(EmulatorWebhooks):
    """The operations behind the API's write routes (``notify`` sends their webhooks)."""

    def resolve_issue_labels(self, repo: EmuRepo, items: Sequence[object]) -> list[EmuLabel]:
        """``IssueLabelsOption`` elements: all ids or all names (a mix is 400); unknown ones are ignored."""
        ids = [int(x) for x in items if isinstance(x, int | float) and not isinstance(x, bool)]
        names = [x for x in items if isinstance(x, str)]
        if self.at_least("1.23") and len(ids) + len(names) != len(items):
            # prepareForReplaceOrAdd from 1.23 (audit #16); 1.22 skips such elements silently.
            raise ApiError(400, "a label must be an integer or a string")
        if ids and names:
            raise ApiError(400, "labels should be an array of strings or integers")
        if names:
            # routers/api/v1/repo/issue_label.go prepareForReplaceOrAdd: GetLabelIDsInRepoByNames, and from
            # 1.23 also GetLabelIDsInOrgByNames for an org-owned repository (1.22.3/1.22.6: repo labels only).
            wanted = set(names)
            found = [label for label in repo.labels.values() if label.name in wanted]
            if repo.owner.is_org and self.at_least("1.23"):
                found += [label for label in self.org_labels(repo.owner) if label.name in wanted]
            return found
        # By id (GetLabelsByIDs, then NewIssueLabels keeps the repo's and its org's labels): every version.
        return [label for i in ids if (label := self._labels.get(i)) is not None and self.usable_label(repo, label)]

    def usable_label(self, repo: EmuRepo, label: EmuLabel) -> bool:
        """A label of the repository, or of the organization that owns it."""
        return label.repo_id == repo.id or (label.org_id != 0 and label.org_id == repo.owner.id)

    def _labels_by_ref(self, repo: EmuRepo, refs: Iterable[int | str]) -> list[EmuLabel]:
        found: list[EmuLabel] = []
        for ref in refs:
            if isinstance(ref, str):
                matches = [label for label in repo.labels.values() if label.name == ref]
                matches = matches or [label for label in self.org_labels(repo.owner) if label.name == ref]
                if not matches:
                    raise KeyError(f"no label {ref!r} in {repo.full_name}")
                found.extend(matches)
            else:
                label = self._labels[ref]
                if not self.usable_label(repo, label):
                    raise KeyError(f"label {ref} is not usable in {repo.full_name}")
                found.append(label)
        return found

    def _op_create_label(
        self, repo: EmuRepo, name: str, color: str, description: str, exclusive: bool, is_archived: bool
    ) -> EmuLabel:
        label = EmuLabel(
            id=next(self._ids.label),
            repo_id=repo.id,
            name=name,
            color=color if color.startswith("#") else f"#{color}",
            description=description,
            exclusive=exclusive,
            is_archived=is_archived,
        )
        repo.labels[label.id] = label
        self._labels[label.id] = label
        return label

    def _op_create_hook(
        self,
        repo: EmuRepo,
        *,
        url: str,
        secret: str,
        events: Sequence[str],
        content_type: str,
        active: bool,
        authorization_header: str = "",
        branch_filter: str = "",
        name: str = "",
        hook_type: str = "gitea",
    ) -> EmuHook:
        now = self.now()
        hook = EmuHook(
            id=next(self._ids.hook),
            repo=repo,
            url=url,
            content_type=content_type,
            secret=secret,
            events=expand_hook_events(events),
            active=active,
            type=hook_type,
            branch_filter=branch_filter,
            authorization_header=authorization_header,
            name=name,
            created=now,
            updated=now,
        )
        repo.hooks.append(hook)
        return hook

    def _timeline(self, issue: EmuIssue, doer: EmuUser, kind: TimelineKind, body: str = "") -> EmuComment:
        now = self.now()
        item = EmuComment(
            id=next(self._ids.comment), issue=issue, poster=doer, body=body, created=now, updated=now, kind=kind
        )
        issue.timeline.append(item)
        self._comments[item.id] = item
        issue.updated = now
        return item

    def _op_create_issue(
        self,
        repo: EmuRepo,
        doer: EmuUser,
        *,
        title: str,
        body: str,
        labels: list[EmuLabel],
        assignees: list[EmuUser],
        closed: bool,
        pull: bool,
        head: str,
        base: str,
        notify: bool,
    ) -> EmuIssue:
        now = self.now()
        issue = EmuIssue(
            id=next(self._ids.issue),
            repo=repo,
            number=repo.next_number,
            title=title,
            body=body,
            poster=doer,
            is_pull=pull,
            created=now,
            updated=now,
            head_branch=head,
            base_branch=base,
        )
        repo.next_number += 1
        repo.issues[issue.number] = issue
        for label in _dedupe_exclusive(labels):
            if label.id not in issue.label_ids:
                issue.label_ids.append(label.id)
                self._timeline(issue, doer, "label", "1")
        # Gitea assigns inside the creating transaction, so these deliveries are queued before "opened".
        for user in assignees:
            if user not in issue.assignees:
                issue.assignees.append(user)
                self._timeline(issue, doer, "assignees")
                if notify:
                    self._emit_issue(issue, "assigned", doer)
        if notify:
            self._emit_issue(issue, "opened", doer)
            if issue.label_ids:
                self._emit_issue(issue, "label_updated", doer)
        if closed:
            self._op_set_state(issue, doer, closed=True, notify=notify)
        return issue

    def _op_edit_issue(
        self,
        issue: EmuIssue,
        doer: EmuUser,
        *,
        title: str | None,
        body: str | None,
        state: str | None,
        assignees: list[EmuUser] | None,
        content_version: int | None,
        notify: bool,
    ) -> None:
        if (
            body is not None
            and content_version is not None
            and self.at_least("1.26")  # content_version: 1.26.0; before, the field is unknown and ignored
            and content_version != issue.content_version
        ):
            raise ApiError(409, "the issue content was changed by someone else; reload and retry")
        if title and title != issue.title:
            old_title, issue.title = issue.title, title
            self._timeline(issue, doer, "change_title")
            if notify:
                self._emit_issue(issue, "edited", doer, changes={"title": {"from": old_title}})
        if body is not None:
            # ChangeContent notifies even when the body is unchanged (only comment edits check that).
            old_body, issue.body = issue.body, body
            issue.content_version += 1
            issue.updated = self.now()
            if notify:
                self._emit_issue(issue, "edited", doer, changes={"body": {"from": old_body}})
        if assignees is not None:
            wanted = list(dict.fromkeys(assignees))
            for user in [u for u in issue.assignees if u not in wanted]:
                issue.assignees.remove(user)
                self._timeline(issue, doer, "assignees")
                if notify:
                    self._emit_issue(issue, "unassigned", doer)
            for user in [u for u in wanted if u not in issue.assignees]:
                issue.assignees.append(user)
                self._timeline(issue, doer, "assignees")
                if notify:
                    self._emit_issue(issue, "assigned", doer)
        if state is not None:
            self._op_set_state(issue, doer, closed=state == "closed", notify=notify)

    def _op_set_state(self, issue: EmuIssue, doer: EmuUser, *, closed: bool, notify: bool) -> None:
        if closed == (issue.closed is not None):
            return
        issue.closed = self.now() if closed else None
        self._timeline(issue, doer, "close" if closed else "reopen")
        if notify:
            self._emit_issue(issue, "closed" if closed else "reopened", doer)

    def _add_label(self, issue: EmuIssue, doer: EmuUser, label: EmuLabel) -> None:
        if label.id in issue.label_ids or not self.usable_label(issue.repo, label):
            return
        scope = label.exclusive_scope
        if scope:
            for other_id in list(issue.label_ids):
                other = self._labels.get(other_id)
                if other is not None and other.exclusive_scope == scope:
                    self._remove_label(issue, doer, other)
        issue.label_ids.append(label.id)
        self._timeline(issue, doer, "label", "1")

    def _remove_label(self, issue: EmuIssue, doer: EmuUser, label: EmuLabel) -> None:
        if label.id in issue.label_ids:
            issue.label_ids.remove(label.id)
            self._timeline(issue, doer, "label", "")

    def _op_add_labels(self, issue: EmuIssue, doer: EmuUser, labels: list[EmuLabel], *, notify: bool) -> None:
        for label in labels:
            self._add_label(issue, doer, label)
        if notify:
            self._emit_issue(issue, "label_updated", doer)

    def _op_replace_labels(self, issue: EmuIssue, doer: EmuUser, labels: list[EmuLabel], *, notify: bool) -> None:
        wanted = _dedupe_exclusive(labels)
        wanted_ids = {label.id for label in wanted}
        for label_id in list(issue.label_ids):
            if label_id not in wanted_ids:
                self._remove_label(issue, doer, self._labels[label_id])
        for label in wanted:
            self._add_label(issue, doer, label)
        if notify:
            self._emit_issue(issue, "label_updated", doer)

    def _op_remove_label(self, issue: EmuIssue, doer: EmuUser, label: EmuLabel, *, notify: bool) -> None:
        self._remove_label(issue, doer, label)
        if notify:
            self._emit_issue(issue, "label_updated", doer)

    def _op_clear_labels(self, issue: EmuIssue, doer: EmuUser, *, notify: bool) -> None:
        # models/issues/issue_label.go clearIssueLabels: issue.LoadLabels, then deleteIssueLabel per label,
        # and (unlike DeleteIssueLabel/NewIssueLabels/ReplaceIssueLabels) no reload; the notifier
        # (services/webhook/notifier.go IssueClearLabels) converts that stale list. Same in 1.22.3 and 1.26.3.
        before = convert.issue_labels(self, issue)
        for label_id in list(issue.label_ids):
            self._remove_label(issue, doer, self._labels[label_id])
        if notify:
            self._emit_issue(issue, "label_cleared", doer, labels_as=before)

    def _op_delete_issue(self, issue: EmuIssue, doer: EmuUser, *, notify: bool) -> None:
        # services/issue/issue.go DeleteIssue: the rows go (comments included), then the notifier runs.
        rendered = convert.issue_json(self, issue, doer)
        repo = issue.repo
        del repo.issues[issue.number]
        for item in issue.timeline:
            self._comments.pop(item.id, None)
        if notify and self.at_least("1.25"):
            self._emit_issue(issue, "deleted", doer, rendered=rendered)

    def _op_create_comment(self, issue: EmuIssue, doer: EmuUser, body: str, *, notify: bool) -> EmuComment:
        comment = self._timeline(issue, doer, "comment", body)
        if notify:
            self._emit_comment(comment, "created", doer)
        return comment

    def _op_edit_comment(self, comment: EmuComment, doer: EmuUser, body: str, *, notify: bool) -> None:
        if body == comment.body:
            return
        old_body, comment.body = comment.body, body
        comment.updated = self.now()
        if notify:
            self._emit_comment(comment, "edited", doer, changes={"body": {"from": old_body}})

    def _op_delete_comment(self, comment: EmuComment, doer: EmuUser, *, notify: bool) -> None:
        rendered = convert.comment_json(self, comment)
        comment.issue.timeline.remove(comment)
        del self._comments[comment.id]
        if notify:
            self._emit_comment(comment, "deleted", doer, rendered=rendered)


def _dedupe_exclusive(labels: Sequence[EmuLabel]) -> list[EmuLabel]:
    """``RemoveDuplicateExclusiveLabels``: of several labels in one exclusive scope, the last one wins."""
    kept: list[EmuLabel] = []
    for i, label in enumerate(labels):
        scope = label.exclusive_scope
        if scope and any(other.exclusive_scope == scope for other in labels[i + 1 :]):
            continue
        if label not in kept:
            kept.append(label)
    return kept
