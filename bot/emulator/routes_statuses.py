"""The emulator's commit-status routes (routers/api/v1/repo/status.go)."""

from __future__ import annotations

import re
from typing import Any, Final

from aiohttp import web

from bot.emulator import convert, pullgit
from bot.emulator.core import Emulator
from bot.emulator.http_helpers import (
    DOER_KEY,
    NOT_FOUND_MESSAGE,
    json_response,
    link_header,
    list_options,
    read_json_body,
    request_doer,
    total_count_headers,
)
from bot.emulator.model import PERM_LEVEL, EmuRepo, EmuUser
from bot.emulator.state import ApiError
from bot.emulator.statuses import (
    FILTER_STATES,
    EmuCommitStatus,
    combine,
    latest_per_context,
    no_better_than,
    status_json,
    statuses_of,
)

_HEX: Final = re.compile(r"[0-9a-fA-F]+")
#: ``CommitStatusOptions.ToOrders`` (``leastindex`` is index DESC and ``highestindex`` ASC, as Gitea has them).
_ORDERS: Final[dict[str, tuple[str, bool]]] = {
    "oldest": ("created", False),
    "recentupdate": ("updated", True),
    "leastupdate": ("updated", False),
    "leastindex": ("index", True),
    "highestindex": ("index", False),
}


def _code_repo(emu: Emulator, request: web.Request) -> tuple[EmuRepo, EmuUser | None]:
    """``repoAssignment`` (404) and the group's ``reqRepoReader(unit.TypeCode)`` (403)."""
    repo = emu.find_repo(request.match_info["owner"], request.match_info["repo"])
    doer: EmuUser | None = request.get(DOER_KEY)
    if repo is None or emu.perm_of(repo, doer) == "none":
        raise ApiError(404, NOT_FOUND_MESSAGE)
    if PERM_LEVEL[emu.unit_perm(repo, doer, "repo.code")] < PERM_LEVEL["read"]:
        raise ApiError(403, "user should have specific read permission or be a repo admin or a site admin")
    return repo, doer


def _commit(repo: EmuRepo, rev: str) -> str | None:
    """``gitRepo.GetCommit(rev)``: any revision git resolves (a full or short sha, a branch, a tag)."""
    return pullgit.rev(repo.path, rev)


def _tag_sha(repo: EmuRepo, name: str) -> str | None:
    return pullgit.rev(repo.path, f"refs/tags/{name}")


async def create_status(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/statuses/{sha} (``NewCommitStatus``; ``reqToken``, ``reqRepoWriter(code)``):
    services/repository/commitstatus ``CreateCommitStatus`` resolves ``sha`` as any revision (a branch works;
    an unknown one is a 500, its text only for site admins) and stores the full sha. The state is not validated
    (``CreateStatusOption`` has no binding). 201 with the status; the ``status`` webhook from 1.23."""
    repo, _ = _code_repo(emu, request)
    doer = request_doer(request)
    if PERM_LEVEL[emu.unit_perm(repo, doer, "repo.code")] < PERM_LEVEL["write"]:
        raise ApiError(403, "user should have a permission to write to a repo")
    form = await read_json_body(request)
    raw = request.match_info["sha"]
    sha = _commit(repo, raw)
    if sha is None:
        text = f"GetCommit[{raw}]: object does not exist [id: {raw}, rel_path: ]"
        raise ApiError(500, text if doer.admin else "")
    status = emu._op_create_status(
        repo,
        doer,
        sha,
        state=str(form.get("state") or ""),
        context=str(form.get("context") or ""),
        target_url=str(form.get("target_url") or ""),
        description=str(form.get("description") or ""),
        notify=True,
    )
    return json_response(status_json(emu, status), status=201)


def _listing(emu: Emulator, request: web.Request, repo: EmuRepo, sha: str) -> web.StreamResponse:
    """``getCommitStatuses``: ``state`` filters on a known state, ``sort`` orders (newest first by default),
    page/limit with ``Link`` and ``X-Total-Count``."""
    found = statuses_of(repo, sha)
    state = request.query.get("state", "").strip()
    if state in FILTER_STATES:
        found = [s for s in found if s.state == state]
    key, descending = _ORDERS.get(request.query.get("sort", "").strip(), ("created", True))

    def order(s: EmuCommitStatus) -> tuple[int, int]:
        value: int = getattr(s, key)
        return value, s.index

    found.sort(key=order, reverse=descending)
    page, limit = list_options(request)
    chosen = found[(page - 1) * limit : page * limit]
    headers = total_count_headers(len(found), link_header(emu, request, len(found), limit))
    return json_response([status_json(emu, s) for s in chosen], headers=headers)


async def list_statuses(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/statuses/{sha} (``GetCommitStatuses``): 1.23+ "only accepts commit ID" (the path
    as given: a short sha or a branch lists nothing); 1.22 ``MustConvertToSHA1`` expands it first."""
    repo, _ = _code_repo(emu, request)
    sha = request.match_info["sha"]
    if not emu.at_least("1.23"):
        sha = _commit(repo, sha) or sha
    return _listing(emu, request, repo, sha)


def _ref(emu: Emulator, request: web.Request) -> str:
    """1.22 routes ``/commits/{ref}`` (one path segment); 1.23+ ``/<ref:*>`` (a ref with slashes)."""
    ref = request.match_info["ref"]
    if "/" in ref and not emu.at_least("1.23"):
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return ref


def _resolve_ref(emu: Emulator, repo: EmuRepo, ref: str) -> str | web.Response:
    """1.23+ ``resolveRefCommit(ref, 7)``: a branch, a tag, or something like a commit id (7+ hex digits) that
    exists; else 404 with the git error in ``errors``. 1.22 ``ResolveRefOrSha``: a branch or tag's sha, else
    ``MustConvertToSHA1`` (an unknown ref stays as it is and finds nothing)."""
    if emu.at_least("1.23"):
        sha = pullgit.branch_sha(repo.path, ref) or _tag_sha(repo, ref)
        if sha is None and _HEX.fullmatch(ref) and 7 <= len(ref) <= 40:
            sha = _commit(repo, ref)
        if sha is None:
            body: dict[str, Any] = {
                "message": "not found",
                "url": f"{emu.app_url}api/swagger",
                "errors": [f"object does not exist [id: {ref}, rel_path: ]"],
            }
            return json_response(body, status=404)
        return sha
    return pullgit.branch_sha(repo.path, ref) or _tag_sha(repo, ref) or _commit(repo, ref) or ref


async def list_statuses_by_ref(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/commits/{ref}/statuses (``GetCommitStatusesByRef``)."""
    repo, _ = _code_repo(emu, request)
    sha = _resolve_ref(emu, repo, _ref(emu, request))
    if isinstance(sha, web.Response):
        return sha
    return _listing(emu, request, repo, sha)


async def combined_status(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/commits/{ref}/status (``GetCombinedCommitStatusByRef``): the latest status per
    context (a page of contexts, newest first, listed by index). 1.23+ ``ToCombinedStatus``: ``state`` combined
    (``CalcCommitStatus``: any error/failure/warning is failure, all success/skipped success, else pending; no
    statuses is pending with ``statuses`` null), ``sha``, ``commit_url``, ``url``; ``Link`` and ``X-Total-Count``.
    1.22: no statuses is an empty ``CombinedStatus`` (every field zero, ``repository`` null); otherwise the worst
    state (error shown as failure), the statuses' sha, ``commit_url``/``url`` empty; ``X-Total-Count`` only."""
    repo, doer = _code_repo(emu, request)
    sha = _resolve_ref(emu, repo, _ref(emu, request))
    if isinstance(sha, web.Response):
        return sha
    latest = latest_per_context(repo, sha)
    page, limit = list_options(request)
    newest_first = sorted(latest, key=lambda s: s.index, reverse=True)
    chosen = sorted(newest_first[(page - 1) * limit : page * limit], key=lambda s: s.index)
    count = len(latest)
    repository = convert.repo_json(emu, repo, emu.perm_of(repo, doer))
    if emu.at_least("1.23"):
        api_url = repository["url"]
        body: dict[str, Any] = {
            "state": combine(emu, [s.state for s in chosen]) if chosen else "pending",
            "sha": sha,
            "total_count": len(chosen),
            "statuses": [status_json(emu, s) for s in chosen] if chosen else None,
            "repository": repository,
            "commit_url": f"{api_url}/commits/{sha}",
            "url": f"{api_url}/commits/{sha}/status",
        }
        return json_response(body, headers=total_count_headers(count, link_header(emu, request, count, limit)))
    if not chosen:
        empty = {
            "state": "",
            "sha": "",
            "total_count": 0,
            "statuses": None,
            "repository": None,
            "commit_url": "",
            "url": "",
        }
        return json_response(empty, headers=total_count_headers(count))
    state = ""
    for status in chosen:
        if state == "" or no_better_than(status.state, state):
            state = status.state
    body = {
        "state": "failure" if state == "error" else state,
        "sha": chosen[0].sha,
        "total_count": len(chosen),
        "statuses": [status_json(emu, s) for s in chosen],
        "repository": repository,
        "commit_url": "",
        "url": "",
    }
    return json_response(body, headers=total_count_headers(count))
