"""The emulator's routes for the server, the repository, permissions, hooks, organizations and teams."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from aiohttp import web

from bot.emulator import convert, gitrepo
from bot.emulator.core import Emulator
from bot.emulator.http_helpers import (
    NOT_FOUND_MESSAGE,
    json_response,
    link_header,
    list_options,
    read_json_body,
    request_access,
    request_doer,
    request_repo,
    total_count_headers,
)
from bot.emulator.model import PERM_LEVEL, EmuTeam
from bot.emulator.state import ApiError

_HOOK_TYPES: Final = ("gitea", "gogs")


# --- server, repository, permissions, hooks ---------------------------------------------------------------------------


async def get_version(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /version."""
    return json_response({"version": emu.version})


async def get_own_user(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /user: the caller, seen by itself."""
    doer = request_doer(request)
    return json_response(convert.user_json(emu, doer, doer))


async def get_repo(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}."""
    repo, _ = request_repo(emu, request)
    host_url = f"{request.scheme}://{request.host}/"
    return json_response(convert.repo_json(emu, repo, request_access(emu, repo, request), host_url=host_url))


async def get_branch(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/branches/{branch}: read from the bare repository."""
    repo, perm = request_repo(emu, request)
    name = request.match_info["branch"]
    head = await asyncio.to_thread(gitrepo.branch_head, repo.path, name)
    if head is None:
        raise ApiError(404, f"branch does not exist [name: {name}]")
    return json_response(convert.branch_json(emu, repo, name, head, perm))


async def get_permission(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET .../collaborators/{collaborator}/permission: site admin, repo admin or the user themself."""
    repo, _ = request_repo(emu, request)
    perm = request_access(emu, repo, request)
    doer = request_doer(request)
    login = request.match_info["collaborator"]
    if not doer.admin and doer.login.lower() != login.lower() and PERM_LEVEL[perm] < PERM_LEVEL["admin"]:
        raise ApiError(
            403,
            "Only admins can query all permissions, repo admins can query all repo permissions, "
            "collaborators can query only their own",
        )
    target = emu.find_user(login)
    if target is None:
        raise ApiError(404, f"user does not exist [name: {login}]")
    access = emu.perm_of(repo, target)
    return json_response({"permission": access, "role_name": access, "user": convert.user_json(emu, target, doer)})


async def create_hook(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/hooks (repo admin); ``active`` defaults to false, as in Gitea."""
    repo, _ = request_repo(emu, request)
    perm = request_access(emu, repo, request)
    if PERM_LEVEL[perm] < PERM_LEVEL["admin"]:
        raise ApiError(403, "must be a repository admin")
    form = await read_json_body(request)
    hook_type = form.get("type")
    if hook_type not in _HOOK_TYPES:
        raise ApiError(422, f"Invalid hook type: {hook_type!r} (the emulator delivers gitea and gogs hooks)")
    config = form.get("config")
    if not isinstance(config, dict):
        raise ApiError(422, "Missing config option: url")
    for key in ("url", "content_type"):
        if not isinstance(config.get(key), str) or not config[key]:
            raise ApiError(422, f"Missing config option: {key}")
    if config["content_type"] not in ("json", "form"):
        raise ApiError(422, "Invalid content type")
    events = form.get("events") or []
    if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
        raise ApiError(422, "events must be a list of strings")
    hook = emu._op_create_hook(
        repo,
        url=config["url"],
        secret=str(config.get("secret", "")),
        events=events,
        content_type=config["content_type"],
        active=bool(form.get("active", False)),
        authorization_header=str(form.get("authorization_header", "")),
        branch_filter=str(form.get("branch_filter", "")),
        name=str(form.get("name", "")),
        hook_type=str(hook_type),
    )
    return json_response(convert.hook_json(emu, hook), status=201)

# --- organizations and teams ------------------------------------------------------------------------------------------


def team_json(emu: Emulator, team: EmuTeam) -> dict[str, Any]:
    """services/convert/convert.go ``ToTeams``: ``permission`` is the team's AccessMode, ``units_map`` the
    per-unit modes."""
    units = {unit: mode for unit, mode in team.units.items() if mode != "none"}
    return {
        "id": team.id,
        "name": team.name,
        "description": team.description,
        "organization": convert.org_json(emu, team.org),
        "includes_all_repositories": team.includes_all,
        "permission": team.access,
        "units": sorted(units),
        "units_map": units,
        "can_create_org_repo": team.access == "owner",
    }


async def list_repo_teams(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/teams (routers/api/v1/repo/teams.go ListTeams; any repo reader): the teams
    with access to the repository (``GetRepoTeams``); 405 when the owner is no organization."""
    repo, _ = request_repo(emu, request)
    request_doer(request)
    if not repo.owner.is_org:
        raise ApiError(405, "repo is not owned by an organization")
    teams = [t for t in emu.teams_of(repo.owner) if t.covers(repo)]
    return json_response([team_json(emu, t) for t in sorted(teams, key=lambda t: t.name.lower())])


async def get_team_member(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /teams/{id}/members/{username} (routers/api/v1/org/team.go GetTeamMember behind
    reqTeamReadAccess, 1.26.3): site admins, org owners and the team's members may ask; another org member
    gets 403 "Must be a team member", anyone else 404. 200 with the user when a member, else 404."""
    doer = request_doer(request)
    team = emu.team(int(request.match_info["id"]))
    if team is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    privileged = doer.admin or emu.is_org_owner(team.org, doer) or doer in team.members
    if not privileged:
        if emu.is_org_member(team.org, doer):
            raise ApiError(403, "Must be a team member")
        raise ApiError(404, NOT_FOUND_MESSAGE)
    user = emu.find_user(request.match_info["username"])
    if user is None:
        raise ApiError(404, f"user does not exist [uid: 0, name: {request.match_info['username']}]")
    if user not in team.members:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return json_response(convert.user_json(emu, user, doer))


async def list_org_repos(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /orgs/{org}/repos (routers/api/v1/user/repo.go ListOrgRepos -> listUserRepos): the org's repositories
    by id, private ones too for a signed-in caller, page/limit as ``GetListOptions`` (30, at most 50); the page
    keeps only those the caller may see (site admin, or any unit access), while X-Total-Count and Link count
    every repository the search found."""
    org = emu.find_user(request.match_info["org"])
    if org is None or not org.is_org:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    doer = request_doer(request)
    found = sorted((r for r in emu.repos() if r.owner is org), key=lambda r: r.id)
    page, limit = list_options(request)
    shown = [(r, emu.perm_of(r, doer)) for r in found[(page - 1) * limit : page * limit]]
    visible = [convert.repo_json(emu, r, perm) for r, perm in shown if doer.admin or perm != "none"]
    return json_response(visible, headers=total_count_headers(len(found), link_header(emu, request, len(found), limit)))


async def list_org_labels(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /orgs/{org}/labels (routers/api/v1/org/label.go ListLabels): by name, page/limit, X-Total-Count."""
    org = emu.find_user(request.match_info["org"])
    if org is None or not org.is_org:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    labels = sorted(emu.org_labels(org), key=lambda label: (label.name, label.id))
    page, limit = list_options(request)
    chosen = labels[(page - 1) * limit : page * limit]
    return json_response(
        [convert.label_json(emu, label) for label in chosen], headers=total_count_headers(len(labels))
    )
