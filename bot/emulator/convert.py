"""Render emulator records as Gitea v1.26.3 API JSON (services/convert), key order as in modules/structs."""

from __future__ import annotations

import hashlib
import urllib.parse
from collections.abc import Mapping
from datetime import datetime, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from bot.emulator import pullgit
from bot.emulator.gitrepo import CommitInfo
from bot.emulator.model import PERM_LEVEL, EmuComment, EmuHook, EmuIssue, EmuLabel, EmuRepo, EmuUser
from bot.emulator.pullstate import EmuPull, EmuReview, EmuReviewComment, pull_record

if TYPE_CHECKING:
    from bot.emulator.state import EmulatorState

JSON = dict[str, Any]
ZERO_TIME: Final = "0001-01-01T00:00:00Z"


def rfc3339(moment: datetime) -> str:
    """Go's ``time.Time`` JSON form for whole seconds: RFC 3339 with the zone offset, ``Z`` for UTC."""
    text = moment.replace(microsecond=0).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def unix_time(ts: int, tz: tzinfo) -> str:
    """A Gitea ``TimeStamp`` (unix seconds) as the API shows it, in the server's zone."""
    return rfc3339(datetime.fromtimestamp(ts, tz))


def _opt_time(ts: int | None, tz: tzinfo) -> str | None:
    return None if ts is None else unix_time(ts, tz)


def user_json(emu: EmulatorState, user: EmuUser, viewer: EmuUser | None, *, signed: bool | None = None) -> JSON:
    """``convert.ToUser``: e-mail only for signed-in viewers, private fields only for the user or an admin."""
    is_signed = viewer is not None if signed is None else signed
    authed = viewer is not None and (viewer.admin or viewer.id == user.id)
    host = urllib.parse.urlsplit(emu.app_url).hostname or "localhost"
    return {
        "id": user.id,
        "login": user.login,
        "login_name": "",
        "source_id": 0,
        "full_name": user.full_name,
        "email": user.email if is_signed else f"{user.login.lower()}@noreply.{host}",
        "avatar_url": f"{emu.app_url}avatars/{hashlib.md5(user.email.encode()).hexdigest()}",  # noqa: S324
        "html_url": f"{emu.app_url}{user.login}",
        "language": "en-US" if authed else "",
        "is_admin": user.admin if authed else False,
        "last_login": unix_time(user.created, emu.tz) if authed else ZERO_TIME,
        "created": unix_time(user.created, emu.tz),
        "restricted": False,
        "active": authed,
        "prohibit_login": False,
        "location": "",
        "website": "",
        "description": "",
        "visibility": "public",
        "followers_count": 0,
        "following_count": 0,
        "starred_repos_count": 0,
        "username": user.login,
    }


def org_json(emu: EmulatorState, org: EmuUser) -> JSON:
    """``convert.ToOrganization``."""
    return {
        "id": org.id,
        "name": org.login,
        "username": org.login,
        "full_name": org.full_name,
        "email": "",
        "avatar_url": f"{emu.app_url}avatars/{org.id}",
        "description": "",
        "website": "",
        "location": "",
        "visibility": "public",
        "repo_admin_change_team_access": False,
    }


def label_json(emu: EmulatorState, label: EmuLabel) -> JSON:
    """``convert.ToLabel``: colour without ``#``; an org label's url is under ``/orgs/{org}``."""
    if label.org_id:
        org = next((u for u in emu.users() if u.id == label.org_id), None)
        url = f"{emu.app_url}api/v1/orgs/{org.login if org else label.org_id}/labels/{label.id}"
    else:
        url = f"{emu.app_url}api/v1/repos/{emu.repo_by_id(label.repo_id).full_name}/labels/{label.id}"
    return {
        "id": label.id,
        "name": label.name,
        "exclusive": label.exclusive,
        "is_archived": label.is_archived,
        "color": label.color.lstrip("#"),
        "description": label.description,
        "url": url,
    }


def issue_labels(emu: EmulatorState, issue: EmuIssue) -> list[EmuLabel]:
    """The issue's labels as Gitea loads them: ordered by name."""
    labels = [label for i in issue.label_ids if (label := emu.label(i)) is not None]
    return sorted(labels, key=lambda label: (label.name, label.id))


def issue_html_url(emu: EmulatorState, issue: EmuIssue) -> str:
    """Web URL of an issue or pull request."""
    kind = "pulls" if issue.is_pull else "issues"
    return f"{emu.app_url}{issue.repo.full_name}/{kind}/{issue.number}"


def issue_json(emu: EmulatorState, issue: EmuIssue, viewer: EmuUser | None) -> JSON:
    """``convert.ToAPIIssue``; ``pull_request`` is non-null exactly for pull requests."""
    tz = emu.tz
    html_url = issue_html_url(emu, issue)
    assignees = [user_json(emu, u, None) for u in issue.assignees]
    data: JSON = {
        "id": issue.id,
        "url": f"{emu.app_url}api/v1/repos/{issue.repo.full_name}/issues/{issue.number}",
        "html_url": html_url,
        "number": issue.number,
        "user": user_json(emu, issue.poster, viewer),
        "original_author": "",
        "original_author_id": 0,
        "title": issue.title,
        "body": issue.body,
        "ref": "",
        "assets": [],
        "labels": [label_json(emu, label) for label in issue_labels(emu, issue)],
        "milestone": None,
        "assignee": assignees[0] if assignees else None,
        "assignees": assignees or None,
        "state": issue.state,
        "is_locked": issue.is_locked,
        "comments": len(issue.comments),
        "created_at": unix_time(issue.created, tz),
        "updated_at": unix_time(issue.updated, tz),
        "closed_at": _opt_time(issue.closed, tz),
        "due_date": None,
        "time_estimate": 0,
        "pull_request": (
            {"merged": False, "merged_at": None, "draft": work_in_progress(issue.title), "html_url": html_url}
            if issue.is_pull else None
        ),
        "repository": {
            "id": issue.repo.id,
            "name": issue.repo.name,
            "owner": issue.repo.owner.login,
            "full_name": issue.repo.full_name,
        },
        "pin_order": 0,
        "content_version": issue.content_version,
    }
    if not emu.at_least("1.26"):
        del data["content_version"]  # modules/structs/issue.go Issue.ContentVersion: 1.26.0
    if not emu.at_least("1.25"):
        del data["time_estimate"]  # Issue.TimeEstimate: 1.25.0
    return data


def comment_json(emu: EmulatorState, comment: EmuComment) -> JSON:
    """``convert.ToAPIComment``: on a PR ``issue_url`` is empty and ``pull_request_url`` set, else the reverse."""
    issue = comment.issue
    html_url = issue_html_url(emu, issue)
    return {
        "id": comment.id,
        "html_url": f"{html_url}#issuecomment-{comment.id}",
        "pull_request_url": html_url if issue.is_pull else "",
        "issue_url": "" if issue.is_pull else html_url,
        "user": user_json(emu, comment.poster, None),
        "original_author": "",
        "original_author_id": 0,
        "body": comment.body,
        "assets": [],
        "created_at": unix_time(comment.created, emu.tz),
        "updated_at": unix_time(comment.updated, emu.tz),
    }


def clone_url(emu: EmulatorState, repo: EmuRepo, host_url: str | None) -> str:
    """``clone_url``: the bare repository's ``file://`` URL (``clone_protocol="file"``, the default), or the
    http(s) URL as models/repo/repo.go ``ComposeHTTPSCloneURL`` builds it: from ROOT_URL up to 1.25
    (1.24-1.25 ``PUBLIC_URL_DETECTION=legacy``), from the request's Host in 1.26 (``auto``,
    modules/httplib/url.go ``GuessCurrentHostURL``; ROOT_URL when there is no request, as in webhooks)."""
    if emu.clone_protocol == "file":
        return repo.path.resolve().as_uri()
    base = host_url if host_url and emu.at_least("1.26") else emu.app_url
    return f"{base.rstrip('/')}/{repo.owner.login}/{repo.name}.git"


def repo_json(emu: EmulatorState, repo: EmuRepo, perm: str, *, host_url: str | None = None) -> JSON:
    """``convert.ToRepo`` seen with access ``perm`` (``clone_url``: see ``clone_url``)."""
    level = PERM_LEVEL[perm]
    base = f"{emu.app_url}{repo.full_name}"
    host = urllib.parse.urlsplit(emu.app_url).hostname or "localhost"
    open_issues = sum(1 for i in repo.issues.values() if not i.is_pull and i.closed is None)
    open_pulls = sum(1 for i in repo.issues.values() if i.is_pull and i.closed is None)
    return {
        "id": repo.id,
        "owner": user_json(emu, repo.owner, None, signed=level > 0),
        "name": repo.name,
        "full_name": repo.full_name,
        "description": repo.description,
        "empty": False,
        "private": repo.private,
        "fork": False,
        "template": False,
        "mirror": False,
        "size": 1,
        "language": "",
        "languages_url": f"{emu.app_url}api/v1/repos/{repo.full_name}/languages",
        "html_url": base,
        "url": f"{emu.app_url}api/v1/repos/{repo.full_name}",
        "link": "",
        "ssh_url": f"git@{host}:{repo.full_name}.git",
        "clone_url": clone_url(emu, repo, host_url),
        "original_url": "",
        "website": "",
        "stars_count": 0,
        "forks_count": 0,
        "watchers_count": 1,
        "open_issues_count": open_issues,
        "open_pr_counter": open_pulls,
        "release_counter": 0,
        "default_branch": repo.default_branch,
        "archived": repo.archived_at != 0,
        "created_at": unix_time(repo.created, emu.tz),
        "updated_at": unix_time(repo.updated, emu.tz),
        "archived_at": unix_time(repo.archived_at, emu.tz) if repo.archived_at else "1970-01-01T00:00:00Z",
        "permissions": {"admin": level >= PERM_LEVEL["admin"], "push": level >= 2, "pull": level >= 1},
        "has_issues": True,
        "has_code": True,
        "internal_tracker": {
            "enable_time_tracker": True,
            "allow_only_contributors_to_track_time": True,
            "enable_issue_dependencies": True,
        },
        "has_wiki": True,
        "has_pull_requests": True,
        "has_projects": True,
        "projects_mode": "all",
        "has_releases": True,
        "has_packages": True,
        "has_actions": True,
        "ignore_whitespace_conflicts": False,
        "allow_merge_commits": True,
        "allow_rebase": True,
        "allow_rebase_explicit": True,
        "allow_squash_merge": True,
        "allow_fast_forward_only_merge": True,
        "allow_rebase_update": True,
        "allow_manual_merge": False,
        "autodetect_manual_merge": False,
        "default_delete_branch_after_merge": False,
        "default_merge_style": "merge",
        "default_allow_maintainer_edit": False,
        "default_target_branch": repo.default_branch,
        "avatar_url": "",
        "internal": False,
        "mirror_interval": "",
        "object_format_name": "sha1",
        "mirror_updated": ZERO_TIME,
        "topics": [],
        "licenses": [],
        "branch_count": 1,
    }


def _branch_info(emu: EmulatorState, repo: EmuRepo, name: str, ref: str, sha: str, perm: str) -> JSON:
    return {
        "label": name,
        "ref": ref,
        "sha": sha,
        "repo_id": repo.id,
        "repo": repo_json(emu, repo, perm),
    }


def pull_json(emu: EmulatorState, issue: EmuIssue, viewer: EmuUser | None) -> JSON:
    """``convert.ToAPIPullRequest`` (services/convert/pull.go): ``id`` is the pull_request row's own id; head.sha
    is the head branch's tip, or ``refs/pull/N/head`` once the branch is gone (head.ref is then that ref);
    ``merged_*`` only once merged. 1.26 writes ``[]`` for no assignees/reviewers and omits a zero
    ``review_comments`` (``omitempty``, 1.23+); 1.22 writes null and every counter, and has neither
    ``requested_reviewers_teams`` nor ``content_version`` (modules/structs/pull.go at v1.22.3)."""
    tz = emu.tz
    pull = pull_record(emu, issue)
    repo = issue.repo
    html_url = issue_html_url(emu, issue)
    assignees = [user_json(emu, u, None) for u in issue.assignees]
    perm = emu.perm_of(repo, viewer) if viewer is not None else "none"
    head_tip = pullgit.branch_sha(repo.path, issue.head_branch) if issue.head_branch else None
    head_sha = head_tip or pullgit.rev(repo.path, pull.head_ref) or ""
    head_ref = issue.head_branch if head_tip else pull.head_ref
    base_sha = pullgit.branch_sha(repo.path, issue.base_branch) or ""
    modern = emu.at_least("1.23")
    stats = diff_stats(repo.path, pull.merge_base, head_sha)
    files, added, deleted = stats or (0, 0, 0)
    data: JSON = {
        "id": pull.id,
        "url": html_url,
        "number": issue.number,
        "user": user_json(emu, issue.poster, viewer),
        "title": issue.title,
        "body": issue.body,
        "labels": [label_json(emu, label) for label in issue_labels(emu, issue)],
        "milestone": None,
        "assignee": assignees[0] if assignees else None,
        "assignees": assignees if (assignees or modern) else None,
        "requested_reviewers": [] if modern else None,
        "requested_reviewers_teams": [],
        "state": issue.state,
        "draft": work_in_progress(issue.title),
        "is_locked": issue.is_locked,
        "comments": len(issue.comments),
        "review_comments": 0,
        "additions": added,
        "deletions": deleted,
        "changed_files": files,
        "html_url": html_url,
        "diff_url": f"{html_url}.diff",
        "patch_url": f"{html_url}.patch",
        # models/issues/pull.go ``Mergeable``: not while checking, not conflicting, not a work in progress.
        "mergeable": pull.mergeable and not pull.checking and not work_in_progress(issue.title) and pull.merged is None,
        "merged": pull.merged is not None,
        "merged_at": _opt_time(pull.merged, tz),
        "merge_commit_sha": pull.merge_commit_sha if pull.merged is not None else None,
        "merged_by": user_json(emu, pull.merged_by, None) if pull.merged_by is not None else None,
        "allow_maintainer_edit": False,
        "base": _branch_info(emu, repo, issue.base_branch, issue.base_branch, base_sha, perm),
        "head": _branch_info(emu, repo, issue.head_branch, head_ref, head_sha, perm),
        "merge_base": pull.merge_base,
        "due_date": None,
        "created_at": unix_time(issue.created, tz),
        "updated_at": unix_time(issue.updated, tz),
        "closed_at": _opt_time(issue.closed, tz),
        "pin_order": 0,
        "content_version": issue.content_version,
    }
    if modern:
        del data["review_comments"]  # ReviewComments int `json:",omitempty"` (1.23+), and no review comments here
        if stats is None:  # *int `json:",omitempty"`: left nil when GetDiffShortStat fails (no merge base)
            for key in ("additions", "deletions", "changed_files"):
                del data[key]
    else:
        del data["requested_reviewers_teams"]
    if not emu.at_least("1.26"):
        del data["content_version"]
    return data


def diff_stats(path: Path, start: str, end: str) -> tuple[int, int, int] | None:
    """``GetDiffShortStat(merge_base, head)``: files changed, lines added, lines deleted (None without a base)."""
    if not start or not end:
        return None
    return pullgit.shortstat(path, start, end)


def review_json(emu: EmulatorState, pull: EmuPull, review: EmuReview, viewer: EmuUser | None) -> JSON:
    """``convert.ToPullReview`` (services/convert/pull_review.go); html_url is the review's timeline comment."""
    html_url = issue_html_url(emu, pull.issue)
    return {
        "id": review.id,
        "user": user_json(emu, review.reviewer, viewer),
        "team": None,
        "state": review.state,
        "body": review.body,
        "commit_id": review.commit_id,
        "stale": review.stale,
        "official": review.official,
        "dismissed": review.dismissed,
        "comments_count": len(review.comments),
        "submitted_at": unix_time(review.submitted, emu.tz),
        "updated_at": unix_time(review.updated, emu.tz),
        "html_url": f"{html_url}#issuecomment-{review.comment_id}",
        "pull_request_url": html_url,
    }


def review_comment_json(
    emu: EmulatorState, pull: EmuPull, review: EmuReview, comment: EmuReviewComment, viewer: EmuUser | None
) -> JSON:
    """``convert.ToPullReviewComment`` (services/convert/pull_review.go): ``position`` is the new side's line,
    ``original_position`` the old side's (``comment.Line < 0``), the other 0. ``diff_hunk`` is Gitea's stored patch
    around the line (``CutDiffAroundLine``), which the emulator does not keep: empty, as ``patch2diff`` answers
    for a patch it cannot split."""
    html_url = issue_html_url(emu, pull.issue)
    return {
        "id": comment.id,
        "body": comment.body,
        "user": user_json(emu, comment.poster, viewer),
        "resolver": None,
        "pull_request_review_id": review.id,
        "created_at": unix_time(comment.created, emu.tz),
        "updated_at": unix_time(comment.created, emu.tz),
        "path": comment.path,
        "commit_id": comment.commit_id,
        "original_commit_id": "",
        "diff_hunk": "",
        "position": comment.line if comment.line > 0 else 0,
        "original_position": -comment.line if comment.line < 0 else 0,
        "html_url": f"{html_url}/files#issuecomment-{comment.id}",
        "pull_request_url": html_url,
    }


def changed_files(emu: EmulatorState, repo: EmuRepo, start: str, end: str) -> list[JSON]:
    """The files ``git diff`` from ``start`` to ``end`` changes, as services/gitdiff ``GetDiffForAPI`` reads them
    (renames found), each as ``ToChangedFile`` (services/convert/convert.go) renders it: status added, deleted,
    renamed (with previous_filename), copied, changed or unchanged; additions, deletions, changes; the URLs at the
    head commit ``end``."""
    if not start or not end:
        return []
    base = f"{emu.app_url}{repo.full_name}"
    out: list[JSON] = []
    for name, status, added, deleted, previous in pullgit.changed_files(repo.path, start, end):
        escaped = urllib.parse.quote(name)
        out.append({
            "filename": name,
            "status": status,
            "additions": added,
            "deletions": deleted,
            "changes": added + deleted,
            "html_url": f"{base}/src/commit/{end}/{escaped}",
            "contents_url": f"{emu.app_url}api/v1/repos/{repo.full_name}/contents/{escaped}?ref={end}",
            "raw_url": f"{base}/raw/commit/{end}/{escaped}",
            **({"previous_filename": previous} if previous else {}),
        })
    return out


def payload_commit(emu: EmulatorState, repo: EmuRepo, fact: Mapping[str, Any]) -> JSON:
    """``PayloadCommit`` of a push (modules/repository/commits.go ``ToAPIPayloadCommit``)."""

    def payload_user(name: str, email: str) -> JSON:
        known = emu.user_by_email(email)
        return {"name": name, "email": email, "username": known.login if known else ""}

    return {
        "id": fact["id"],
        "message": fact["message"],
        "url": f"{emu.app_url}{repo.full_name}/commit/{fact['id']}",
        "author": payload_user(str(fact["author_name"]), str(fact["author_email"])),
        "committer": payload_user(str(fact["committer_name"]), str(fact["committer_email"])),
        "verification": None,
        "timestamp": fact["timestamp"],
        "added": fact["added"],
        "removed": fact["removed"],
        "modified": fact["modified"],
    }


def branch_json(emu: EmulatorState, repo: EmuRepo, name: str, head: CommitInfo, perm: str) -> JSON:
    """``convert.ToBranch`` for an unprotected branch."""
    can_push = PERM_LEVEL[perm] >= PERM_LEVEL["write"]

    def payload_user(user_name: str, email: str) -> JSON:
        known = emu.user_by_email(email)
        return {"name": user_name, "email": email, "username": known.login if known else ""}

    return {
        "name": name,
        "commit": {
            "id": head.sha,
            "message": head.message,
            "url": f"{emu.app_url}{repo.full_name}/commit/{head.sha}",
            "author": payload_user(head.author_name, head.author_email),
            "committer": payload_user(head.committer_name, head.committer_email),
            "verification": {
                "verified": False,
                "reason": "gpg.error.not_signed_commit",
                "signature": "",
                "signer": None,
                "payload": "",
            },
            "timestamp": rfc3339(head.committed_at),
            "added": None,
            "removed": None,
            "modified": None,
        },
        "protected": False,
        "required_approvals": 0,
        "enable_status_check": False,
        "status_check_contexts": [],
        "user_can_push": can_push,
        "user_can_merge": can_push,
        "effective_branch_protection_name": "",
    }


def hook_json(emu: EmulatorState, hook: EmuHook) -> JSON:
    """``convert.ToHook``: the secret is never shown."""
    return {
        "id": hook.id,
        "type": hook.type,
        "name": hook.name,
        "branch_filter": hook.branch_filter,
        "config": {"content_type": hook.content_type, "url": hook.url, "http_method": "post"},
        "events": sorted(hook.events),
        "authorization_header": "",
        "active": hook.active,
        "updated_at": unix_time(hook.updated, emu.tz),
        "created_at": unix_time(hook.created, emu.tz),
    }


#: Gitea's default ``WORK_IN_PROGRESS_PREFIXES`` (modules/setting/repository.go).
WORK_IN_PROGRESS_PREFIXES = ("WIP:", "[WIP]")


def work_in_progress(title: str) -> bool:
    """A draft's title (models/issues/pull.go ``HasWorkInProgressPrefix``: an ASCII case-insensitive prefix match;
    the JSON's ``draft`` (PR) and ``pull_request.draft`` (issue) are ``IsWorkInProgress``, services/convert)."""
    return any(title[:len(prefix)].upper() == prefix.upper() for prefix in WORK_IN_PROGRESS_PREFIXES)

