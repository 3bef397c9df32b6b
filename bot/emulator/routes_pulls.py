"""The emulator's pull-request routes: list, create, read, reviews, merge, and branch deletion."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiohttp import web

from bot.emulator import convert, pullgit
from bot.emulator.core import Emulator
from bot.emulator.http_helpers import (
    DOER_KEY,
    NOT_FOUND_MESSAGE,
    can_be_assigned,
    json_response,
    link_header,
    list_options,
    no_content,
    read_json_body,
    request_doer,
    total_count_headers,
)
from bot.emulator.model import PERM_LEVEL, EmuIssue, EmuRepo, EmuUser
from bot.emulator.pulls import MERGE_STYLES
from bot.emulator.pullstate import ReviewState
from bot.emulator.state import ApiError

_REVIEW_EVENTS: Final[dict[str, ReviewState]] = {
    "APPROVED": "APPROVED",
    "REQUEST_CHANGES": "REQUEST_CHANGES",
    "COMMENT": "COMMENT",
}


def _pull_repo(emu: Emulator, request: web.Request) -> EmuRepo:
    """routers/api/v1/api.go: the ``/pulls`` group is ``mustAllowPulls`` (404 without read on pull requests)
    and ``reqRepoReader(unit.TypeCode)`` (403 without read on code)."""
    repo = emu.find_repo(request.match_info["owner"], request.match_info["repo"])
    doer: EmuUser | None = request.get(DOER_KEY)
    if repo is None or emu.perm_of(repo, doer) == "none":
        raise ApiError(404, NOT_FOUND_MESSAGE)
    if PERM_LEVEL[emu.unit_perm(repo, doer, "repo.pulls")] < PERM_LEVEL["read"]:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    if PERM_LEVEL[emu.unit_perm(repo, doer, "repo.code")] < PERM_LEVEL["read"]:
        raise ApiError(403, "user should have specific read permission or be a repo admin or a site admin")
    return repo


def _pull(repo: EmuRepo, request: web.Request) -> EmuIssue:
    """``GetPullRequestByIndex``: 404 for a missing number or a plain issue."""
    issue = repo.issues.get(int(request.match_info["index"]))
    if issue is None or not issue.is_pull:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return issue


def _required(form: dict[str, Any], *names: str) -> None:
    """``binding:"Required"``: the first missing field is a 422 ``[Field]: Required``."""
    for name in names:
        if not isinstance(form.get(name), str) or not form[name].strip():
            raise ApiError(422, f"[{name.capitalize()}]: Required")


_SORTS: Final = {
    "oldest": (lambda i: (i.created, i.id), False),
    "recentupdate": (lambda i: (i.updated, i.created, i.id), True),
    "leastupdate": (lambda i: (i.updated, i.created, i.id), False),
    "mostcomment": (lambda i: (len(i.comments), i.created, i.id), True),
}


async def list_pulls(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/pulls (pull.go ``ListPullRequests`` → models/issues/pull_list.go
    ``PullRequests``/``listPullRequestStatement``): only ``state`` open or closed filters, anything else (also
    none: the swagger's ``default: open`` is not applied) lists all; ``labels`` ids match any; ``poster``
    (1.23+, unknown 400) and ``base_branch`` (1.24+); ``sort`` as ``applySorts`` (newest first by default);
    page/limit with ``Link`` and ``X-Total-Count``."""
    repo = _pull_repo(emu, request)
    query = request.query
    state = query.get("state", "").strip()
    pulls = [i for i in repo.issues.values() if i.is_pull]
    if state in ("open", "closed"):
        pulls = [i for i in pulls if (i.closed is not None) == (state == "closed")]
    if (base := query.get("base_branch", "").strip()) and emu.at_least("1.24"):
        pulls = [i for i in pulls if i.base_branch == base]
    if (poster := query.get("poster", "")) and emu.at_least("1.23"):
        user = emu.find_user(poster)
        if user is None:
            raise ApiError(400, f"user does not exist [uid: 0, name: {poster}]")
        pulls = [i for i in pulls if i.poster is user]
    label_ids = {int(x) for x in query.getall("labels", []) if x.isdigit()}
    if label_ids:
        # An INNER JOIN on issue_label with ``IN``: a PR with two of the labels comes back twice in Gitea;
        # the emulator lists it once.
        pulls = [i for i in pulls if label_ids & set(i.label_ids)]
    key, descending = _SORTS.get(query.get("sort", "").strip(), (lambda i: (i.created, i.id), True))
    pulls.sort(key=key, reverse=descending)
    page, limit = list_options(request)
    total = len(pulls)
    chosen = pulls[(page - 1) * limit : page * limit]
    doer = request.get(DOER_KEY)
    rendered = await asyncio.to_thread(lambda: [convert.pull_json(emu, i, doer) for i in chosen])
    return json_response(rendered, headers=total_count_headers(total, link_header(emu, request, total, limit)))


async def create_pull(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/pulls (pull.go ``CreatePullRequest``), same-repository heads only."""
    repo = _pull_repo(emu, request)
    doer = request_doer(request)
    form = await read_json_body(request)
    _required(form, "head", "base", "title")
    head, base = str(form["head"]), str(form["base"])
    if head == base:
        raise ApiError(422, "Invalid PullRequest: There are no changes between the head and the base")
    if ":" in head and head.split(":", 1)[0].lower() != repo.owner.login.lower():
        raise ApiError(404, NOT_FOUND_MESSAGE)  # a fork's branch: the emulator has no forks
    head = head.split(":", 1)[-1]
    # parseCompareInfo: an unknown head or base ref is a 404.
    if pullgit.branch_sha(repo.path, head) is None or pullgit.branch_sha(repo.path, base) is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    existing = emu.open_pull(repo, head, base)
    if existing is not None:
        pull = emu.pull_of(existing)
        raise ApiError(
            409,
            f"pull request already exists for these targets [id: {pull.id}, issue_id: {existing.number}, "
            f"head_repo_id: {repo.id}, base_repo_id: {repo.id}, head_branch: {head}, base_branch: {base}]",
        )
    raw_labels = form.get("labels") or []
    if not isinstance(raw_labels, list):
        raise ApiError(422, "labels must be a list of label ids")
    # GetLabelsInRepoByIDs, plus GetLabelsInOrgByIDs for an org's repository; unknown ids are dropped.
    labels = [
        label
        for x in raw_labels
        if isinstance(x, int) and (label := emu.label(x)) is not None and emu.usable_label(repo, label)
    ]
    logins = list(form.get("assignees") or [])
    if form.get("assignee"):
        logins.append(form["assignee"])
    assignees: list[EmuUser] = []
    for login in dict.fromkeys(str(x) for x in logins):
        user = emu.find_user(login)
        if user is None:
            raise ApiError(422, f"Assignee does not exist: [name: user does not exist [uid: 0, name: {login}]]")
        if not can_be_assigned(emu, repo, user):
            raise ApiError(422, f"user doesn't have access to repo [user_id: {user.id}, repo_name: {repo.name}]")
        assignees.append(user)
    # Mutations run on the loop (never in a thread): the emulator's tables have no locks.
    issue = emu._op_create_pull(
        repo,
        doer,
        head=head,
        base=base,
        title=str(form["title"]),
        body=str(form.get("body") or ""),
        labels=labels,
        assignees=assignees,
        notify=True,
    )
    return json_response(convert.pull_json(emu, issue, doer), status=201)


async def get_pull(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/pulls/{index} (pull.go ``GetPullRequest``)."""
    repo = _pull_repo(emu, request)
    issue = _pull(repo, request)
    return json_response(await asyncio.to_thread(convert.pull_json, emu, issue, request.get(DOER_KEY)))


async def is_merged(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/pulls/{index}/merge (pull.go ``IsPullRequestMerged``): 204 merged, else 404."""
    repo = _pull_repo(emu, request)
    if emu.pull_of(_pull(repo, request)).merged is not None:
        return no_content()
    raise ApiError(404, NOT_FOUND_MESSAGE)


async def merge_pull(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/pulls/{index}/merge (pull.go ``MergePullRequest``, services/pull/check.go
    ``CheckPullMergeable``): merged 405, closed 404, no write on code 405, conflicting 405, a disallowed style
    405, a stale ``head_commit_id`` 409 "head out of date"; 200 with an empty body."""
    repo = _pull_repo(emu, request)
    doer = request_doer(request)
    form = await read_json_body(request)
    style = form.get("do", form.get("Do"))
    if not isinstance(style, str) or not style:
        raise ApiError(422, "[Do]: Required")
    if style not in (*MERGE_STYLES, "manually-merged"):
        raise ApiError(422, "[Do]: In")
    issue = _pull(repo, request)
    pull = emu.pull_of(issue)
    if pull.merged is not None:
        raise ApiError(405, "The PR is already merged" if emu.at_least("1.23") else "")
    if issue.closed is not None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    if PERM_LEVEL[emu.unit_perm(repo, doer, "repo.code")] < PERM_LEVEL["write"]:
        raise ApiError(405, "User not allowed to merge PR")
    if style != "manually-merged" and convert.work_in_progress(issue.title):
        # CheckPullMergeable: ErrIsWorkInProgress after the permission, before mergeability (1.22 and 1.26 alike)
        raise ApiError(405, "Work in progress PRs cannot be merged")
    emu._refresh_pull(pull)
    if not pull.mergeable:
        raise ApiError(405, "Please try again later")
    if style == "manually-merged":
        # The repository's pull-request unit leaves AllowManualMerge off (repo_json: allow_manual_merge false).
        raise ApiError(405, "manually-merged is not allowed an allowed merge style for this repository")
    message = str(form.get("merge_title_field") or "").strip()
    extra = str(form.get("merge_message_field") or "").strip()
    if not message:
        message = emu.default_merge_message(issue, style)
    if extra:
        message += "\n\n" + extra
    emu._op_merge_pull(
        issue,
        doer,
        style=style,
        head_commit_id=str(form.get("head_commit_id") or ""),
        message=message,
        notify=True,
    )
    if form.get("delete_branch_after_merge") is True and issue.head_branch != repo.default_branch:
        # repo_service.DeleteBranchAfterMerge: errors are only logged.
        try:
            emu._op_delete_branch(repo, doer, issue.head_branch)
        except ApiError:
            pass
    return web.Response(status=200)


async def list_reviews(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/pulls/{index}/reviews (pull_review.go ``ListPullReviews``): by id, page/limit,
    ``X-Total-Count``."""
    repo = _pull_repo(emu, request)
    issue = _pull(repo, request)
    pull = emu.pull_of(issue)
    page, limit = list_options(request)
    chosen = pull.reviews[(page - 1) * limit : page * limit]
    doer = request.get(DOER_KEY)
    return json_response(
        [convert.review_json(emu, pull, r, doer) for r in chosen], headers=total_count_headers(len(pull.reviews))
    )


async def create_review(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/pulls/{index}/reviews (pull_review.go ``CreatePullReview`` and
    ``preparePullReviewType``): the PR's poster may not approve or request changes (422); REQUEST_CHANGES needs a
    body, COMMENT a body; any other event leaves a pending review (no webhook); 200 with the review."""
    repo = _pull_repo(emu, request)
    doer = request_doer(request)
    form = await read_json_body(request)
    issue = _pull(repo, request)
    event = str(form.get("event") or "")
    body = str(form.get("body") or "")
    has_body = bool(body.strip())
    state: ReviewState = _REVIEW_EVENTS.get(event, "PENDING")
    if state == "APPROVED" and issue.poster is doer:
        raise ApiError(422, "approve your own pull is not allowed")
    if state == "REQUEST_CHANGES" and issue.poster is doer:
        raise ApiError(422, "reject your own pull is not allowed")
    if state == "COMMENT" and not has_body and not form.get("comments"):
        raise ApiError(422, f"review event {event} requires a body or a comment")
    if state in ("REQUEST_CHANGES", "PENDING") and not has_body:
        raise ApiError(422, f"review event {event} requires a body")
    review = emu._op_submit_review(
        issue,
        doer,
        state=state,
        body=body,
        commit_id=str(form.get("commit_id") or ""),
        notify=True,
    )
    return json_response(convert.review_json(emu, emu.pull_of(issue), review, doer))


async def delete_branch(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """DELETE /repos/{owner}/{repo}/branches/{branch} (routers/api/v1/repo/branch.go ``DeleteBranch``,
    ``reqRepoWriter(unit.TypeCode)``): 204; the default branch 403; a protected one 403; missing 404."""
    repo = emu.find_repo(request.match_info["owner"], request.match_info["repo"])
    doer = request_doer(request)
    if repo is None or emu.perm_of(repo, doer) == "none":
        raise ApiError(404, NOT_FOUND_MESSAGE)
    if PERM_LEVEL[emu.unit_perm(repo, doer, "repo.code")] < PERM_LEVEL["write"]:
        raise ApiError(403, "user should have a permission to write to a repo")
    emu._op_delete_branch(repo, doer, request.match_info["branch"])
    return no_content()
