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
from bot.emulator.protection import can_write_code, is_user_allowed_to_merge
from bot.emulator.pulls import MERGE_STYLES
from bot.emulator.pullstate import EmuReview, EmuReviewComment, ReviewState
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
    """POST /repos/{owner}/{repo}/pulls/{index}/merge (routers/api/v1/repo/pull.go ``MergePullRequest``).

    services/pull/check.go ``CheckPullMergeable`` in order: merged 405 ("The PR is already merged"; 1.22 an empty
    message), closed 404, not ``IsUserAllowedToMerge`` (write on code; with a rule, its merge whitelist) 405 "User
    not allowed to merge PR"; then (not for ``manually-merged``) work in progress 405, conflicting or still
    checking (``!CanAutoMerge()``) 405 "Please try again later", ``CheckPullBranchProtections`` 405 with the reason
    (1.22: ``not allowed to merge [reason: ...]``) unless a repo admin's ``force_merge`` may skip it. Then
    services/pull/merge.go ``Merge``: a stale ``head_commit_id`` 409 "head out of date"; a conflict while merging
    409 with the Go error struct as JSON (``ctx.JSON(http.StatusConflict, conflictError)``); a base that moved
    before the push 409 "merge push out of date"; ``fast-forward-only`` on a diverged base is
    ``ErrMergeDivergingFastForwardOnly``, which the route does not catch: 500, with an empty message except for
    site admins (``APIErrorInternal`` in prod). 200 with an empty body."""
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
    if not is_user_allowed_to_merge(emu, repo, issue.base_branch, doer):
        raise ApiError(405, "User not allowed to merge PR")
    if style != "manually-merged":
        if convert.work_in_progress(issue.title):
            raise ApiError(405, "Work in progress PRs cannot be merged")
        if not pull.checking:
            # The emulator's state may have moved without a push (seeding); a finished check is re-done here.
            emu._test_patch(pull)
        if pull.checking or not pull.mergeable:
            raise ApiError(405, "Please try again later")
        reason = emu.protection_refusal(issue)
        forced = form.get("force_merge") is True and emu.admin_may_force(repo, doer, issue.base_branch)
        if reason is not None and not forced:
            raise ApiError(405, emu.protection_message(reason))
    if style == "manually-merged":
        # The repository's pull-request unit leaves AllowManualMerge off (repo_json: allow_manual_merge false).
        raise ApiError(405, "manually-merged is not allowed an allowed merge style for this repository")
    message = str(form.get("merge_title_field") or "").strip()
    extra = str(form.get("merge_message_field") or "").strip()
    if not message:
        message = emu.default_merge_message(issue, style)
    if extra:
        message += "\n\n" + extra
    try:
        emu._op_merge_pull(
            issue,
            doer,
            style=style,
            head_commit_id=str(form.get("head_commit_id") or ""),
            message=message,
            notify=True,
        )
    except pullgit.DivergingFastForward as exc:
        text = f"Merge DivergingFastForwardOnly Error: exit status 128 - {exc}\n: {exc}\n\n"
        raise ApiError(500, text if doer.admin else "") from None
    except pullgit.RebaseConflict as exc:
        return json_response(
            {"Style": style, "CommitSHA": exc.commit, "StdOut": "", "StdErr": f"CONFLICT: {exc}\n", "Err": {}},
            status=409,
        )
    except pullgit.MergeConflict as exc:
        return json_response({"Style": style, "StdOut": "", "StdErr": f"CONFLICT: {exc}\n", "Err": {}}, status=409)
    except pullgit.PushOutOfDate:
        raise ApiError(409, "merge push out of date") from None
    if form.get("delete_branch_after_merge") is True and issue.head_branch != repo.default_branch:
        # repo_service.DeleteBranchAfterMerge: errors are only logged.
        try:
            emu._op_delete_branch(repo, doer, issue.head_branch)
        except ApiError:
            pass
    return web.Response(status=200)


async def list_reviews(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/pulls/{index}/reviews (pull_review.go ``ListPullReviews``): by id (a pending
    review submitted later keeps its lower id), page/limit, ``X-Total-Count`` of every review; a pending review only
    for its author or a site admin (services/convert/pull_review.go ``ToPullReviewList``)."""
    repo = _pull_repo(emu, request)
    issue = _pull(repo, request)
    pull = emu.pull_of(issue)
    page, limit = list_options(request)
    chosen = pull.reviews[(page - 1) * limit : page * limit]
    doer = request.get(DOER_KEY)
    visible = [r for r in chosen if r.state != "PENDING" or (doer is not None and (doer.admin or doer is r.reviewer))]
    return json_response(
        [convert.review_json(emu, pull, r, doer) for r in visible], headers=total_count_headers(len(pull.reviews))
    )


def _review(emu: Emulator, issue: EmuIssue, request: web.Request, doer: EmuUser) -> EmuReview:
    """pull_review.go ``prepareSingleReview``: 404 for an unknown id, a review of another PR, or someone else's
    pending review (site admins see it)."""
    review_id = int(request.match_info["id"])
    review = next((r for r in emu.pull_of(issue).reviews if r.id == review_id), None)
    if review is None or (review.state == "PENDING" and review.reviewer is not doer and not doer.admin):
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return review


async def submit_review(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/pulls/{index}/reviews/{id} (pull_review.go ``SubmitPullReview``): only a pending
    review (422 "only a pending review can be submitted"); the event checked as on create
    (``preparePullReviewType``); a still-pending event 422 "review stay pending"; then ``SubmitReview`` on the head
    commit, which updates that pending review (``GetCurrentReview``): it keeps its id. 200 with the review."""
    repo = _pull_repo(emu, request)
    doer = request_doer(request)
    form = await read_json_body(request)
    issue = _pull(repo, request)
    review = _review(emu, issue, request, doer)
    if review.state != "PENDING":
        raise ApiError(422, "only a pending review can be submitted")
    event = str(form.get("event") or "")
    body = str(form.get("body") or "")
    state = _review_state(issue, doer, event, body, has_comments=False)
    if state == "PENDING":
        raise ApiError(422, "review stay pending")
    done = emu._op_submit_review(issue, doer, state=state, body=body, commit_id="", notify=True)
    return json_response(convert.review_json(emu, emu.pull_of(issue), done, doer))


async def _dismissal(emu: Emulator, request: web.Request, *, dismiss: bool) -> web.StreamResponse:
    """pull_review.go ``dismissReview``: 403 "Must be repo admin" unless repo admin (``ctx.Repo.IsAdmin()``);
    the review as ``prepareSingleReview`` finds it; 403 for a comment or pending review ("not need to dismiss this
    review because it's type is not Approve or change request") and on a closed or merged PR; 200 with the review."""
    repo = _pull_repo(emu, request)
    doer = request_doer(request)
    form = await read_json_body(request) if dismiss else {}
    if PERM_LEVEL[emu.perm_of(repo, doer)] < PERM_LEVEL["admin"]:
        raise ApiError(403, "Must be repo admin")
    issue = _pull(repo, request)
    review = _review(emu, issue, request, doer)
    if review.state not in ("APPROVED", "REQUEST_CHANGES"):
        raise ApiError(403, "not need to dismiss this review because it's type is not Approve or change request")
    emu._op_dismiss_review(
        issue,
        review,
        doer,
        message=str(form.get("message") or ""),
        dismiss=dismiss,
        priors=form.get("priors") is True,
    )
    return json_response(convert.review_json(emu, emu.pull_of(issue), review, doer))


async def dismiss_review(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/pulls/{index}/reviews/{id}/dismissals (``DismissPullReview``)."""
    return await _dismissal(emu, request, dismiss=True)


async def undismiss_review(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/pulls/{index}/reviews/{id}/undismissals (``UnDismissPullReview``)."""
    return await _dismissal(emu, request, dismiss=False)


def _review_state(issue: EmuIssue, doer: EmuUser, event: str, body: str, *, has_comments: bool) -> ReviewState:
    """pull_review.go ``preparePullReviewType``."""
    has_body = bool(body.strip())
    state: ReviewState = _REVIEW_EVENTS.get(event, "PENDING")
    if state == "APPROVED" and issue.poster is doer:
        raise ApiError(422, "approve your own pull is not allowed")
    if state == "REQUEST_CHANGES" and issue.poster is doer:
        raise ApiError(422, "reject your own pull is not allowed")
    if state == "COMMENT" and not has_body and not has_comments:
        raise ApiError(422, f"review event {event} requires a body or a comment")
    if state in ("REQUEST_CHANGES", "PENDING") and not has_body:
        raise ApiError(422, f"review event {event} requires a body")
    return state


async def update_pull(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/pulls/{index}/update (pull.go ``UpdatePullRequest``): merged or closed 422 with
    Gitea's nil error (message ``%!s(<nil>)``); ``IsUserAllowedToUpdate`` refused 403 with an empty body;
    services/pull/update.go ``Update``: a head not behind its base 500 (empty message but for site admins), a
    conflict 409 "merge failed because of conflict" / "rebase failed because of conflict"; 200 empty."""
    repo = _pull_repo(emu, request)
    doer = request_doer(request)
    issue = _pull(repo, request)
    pull = emu.pull_of(issue)
    if pull.merged is not None or issue.closed is not None:
        raise ApiError(422, "%!s(<nil>)")
    rebase = request.query.get("style", "") == "rebase"
    by_merge, by_rebase = emu.update_allowed(issue, doer)
    if (not by_merge and not rebase) or (rebase and not by_rebase):
        raise ApiError(403, "", bare=True)
    if rebase and not can_write_code(emu, repo, doer):
        # 1.22 lets a reader through (rebase is allowed by the unit setting alone); the push to the head branch is
        # then refused by the pre-receive hook (``AssertCanWriteCode``) and ``Update`` fails: an uncaught 500.
        raise ApiError(500, "git push rejected: User permission denied for writing." if doer.admin else "")
    try:
        emu._op_update_pull(issue, doer, rebase=rebase)
    except pullgit.MergeConflict:
        raise ApiError(409, f"{'rebase' if rebase else 'merge'} failed because of conflict") from None
    except ApiError as exc:
        if exc.status == 500 and not doer.admin:
            raise ApiError(500, "") from None
        raise
    return web.Response(status=200)


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
    state = _review_state(issue, doer, event, body, has_comments=bool(form.get("comments")))
    # The code comments first (``CreateCodeComment`` into the pending review; a line is NewLineNum, or -OldLineNum
    # when old_position is given), then the review is submitted with them.
    head = emu.pull_of(issue).head_sha()
    comments = [
        EmuReviewComment(id=next(emu._ids.comment), poster=doer, path=str(c.get("path") or ""),
                         line=-int(c["old_position"]) if int(c.get("old_position") or 0) > 0
                         else int(c.get("new_position") or 0),
                         body=str(c.get("body") or ""), commit_id=head, created=emu.now())
        for c in form.get("comments") or () if isinstance(c, dict)
    ]
    review = emu._op_submit_review(
        issue,
        doer,
        state=state,
        body=body,
        commit_id=str(form.get("commit_id") or ""),
        notify=True,
    )
    review.comments.extend(comments)
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


def _merge_base_and_head(emu: Emulator, repo: EmuRepo, issue: EmuIssue) -> tuple[str, str]:
    """``GetPullRequestFiles``'s range: a merged PR from its recorded merge base, an open one from the merge base
    of its base branch and head (``GetCompareInfo``), to the head (``refs/pull/N/head``)."""
    pull = emu.pull_of(issue)
    head = pull.head_sha()
    if pull.merged is not None:
        return pull.merge_base, head
    base = pullgit.branch_sha(repo.path, issue.base_branch) or ""
    return (pullgit.merge_base(repo.path, base, head) if base and head else ""), head


async def list_pull_files(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/pulls/{index}/files (pull.go ``GetPullRequestFiles``, 1.22 to 1.26): the files of
    the diff from the merge base to the head, ``ToChangedFile`` each; page/limit (``GetListOptions``) over them,
    with ``Link``, ``X-Total-Count`` and ``X-Page``, ``X-PerPage``, ``X-PageCount``, ``X-HasMore``."""
    repo = _pull_repo(emu, request)
    issue = _pull(repo, request)
    start, end = _merge_base_and_head(emu, repo, issue)
    files = await asyncio.to_thread(convert.changed_files, emu, repo, start, end)
    page, limit = list_options(request)
    total = len(files)
    pages = (total + limit - 1) // limit
    headers = total_count_headers(total, link_header(emu, request, total, limit))
    headers.update({"X-Page": str(page), "X-PerPage": str(limit), "X-PageCount": str(pages),
                    "X-HasMore": "true" if page < pages else "false"})
    return json_response(files[(page - 1) * limit : page * limit], headers=headers)


async def download_pull_diff(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/pulls/{index}.{diffType} (pull.go ``DownloadPullDiffOrPatch`` → services/pull
    ``DownloadDiffOrPatch``): ``diff`` is ``git diff -p`` from the PR's merge base to its head (1.22
    ``GetDiffOrPatch(pr.MergeBase, head)``, 1.26 ``GetDiff(MergeBase...head)``: the same range), written as it
    comes: ``text/plain``. ``patch`` (``git format-patch``) is not emulated: 404 here."""
    repo = _pull_repo(emu, request)
    issue = _pull(repo, request)
    if request.match_info["diffType"] != "diff":
        raise ApiError(404, NOT_FOUND_MESSAGE)
    pull = emu.pull_of(issue)
    head = pull.head_sha()
    start = pull.merge_base or _merge_base_and_head(emu, repo, issue)[0]
    body = await asyncio.to_thread(pullgit.diff, repo.path, start, head) if start and head else b""
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def list_review_comments(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/pulls/{index}/reviews/{id}/comments (pull_review.go ``GetPullReviewComments``): the
    review as ``prepareSingleReview`` finds it (404 for an unknown id, another PR's, or someone else's pending one),
    its code comments as ``ToPullReviewCommentList``, unpaged."""
    repo = _pull_repo(emu, request)
    issue = _pull(repo, request)
    doer: EmuUser | None = request.get(DOER_KEY)
    review_id = int(request.match_info["id"])
    review = next((r for r in emu.pull_of(issue).reviews if r.id == review_id), None)
    if review is None or (review.state == "PENDING" and (doer is None or (review.reviewer is not doer
                                                                          and not doer.admin))):
        raise ApiError(404, NOT_FOUND_MESSAGE)
    pull = emu.pull_of(issue)
    return json_response([convert.review_comment_json(emu, pull, review, c, doer) for c in review.comments])
