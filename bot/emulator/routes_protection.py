"""The emulator's branch-protection routes (routers/api/v1/repo/branch.go ``*BranchProtection``)."""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from bot.emulator.core import Emulator
from bot.emulator.http_helpers import (
    DOER_KEY,
    NOT_FOUND_MESSAGE,
    json_response,
    no_content,
    read_json_body,
    request_doer,
)
from bot.emulator.model import PERM_LEVEL, EmuRepo, EmuUser
from bot.emulator.protection import (
    ProtectionRule,
    can_write_code,
    ordered_rules,
    repo_rules,
    rule_by_name,
    rule_json,
)
from bot.emulator.pullstate import next_id
from bot.emulator.state import ApiError

#: Plain boolean/text options copied as given (``CreateBranchProtectionOption`` / ``EditBranchProtectionOption``).
_PLAIN: Final = (
    "enable_merge_whitelist",
    "enable_status_check",
    "enable_approvals_whitelist",
    "block_on_rejected_reviews",
    "block_on_official_review_requests",
    "block_on_outdated_branch",
    "dismiss_stale_approvals",
    "ignore_stale_approvals",
    "require_signed_commits",
    "protected_file_patterns",
    "unprotected_file_patterns",
)
#: 1.23+ options (priority #32286, force push #28086, admin override #32248).
_NEW_PLAIN: Final = ("priority", "block_admin_merge_override")
#: Whitelist option → (rule field, kind): ``write`` users need write on code (``updateUserWhitelist``),
#: ``reader`` users read on pull requests (``updateApprovalWhitelist``).
_USER_LISTS: Final = (
    ("push_whitelist_usernames", "push_whitelist_user_ids", "write"),
    ("force_push_allowlist_usernames", "force_push_allowlist_user_ids", "write"),
    ("merge_whitelist_usernames", "merge_whitelist_user_ids", "write"),
    ("approvals_whitelist_username", "approvals_whitelist_user_ids", "reader"),
)
_TEAM_LISTS: Final = (
    ("push_whitelist_teams", "push_whitelist_team_ids"),
    ("force_push_allowlist_teams", "force_push_allowlist_team_ids"),
    ("merge_whitelist_teams", "merge_whitelist_team_ids"),
    ("approvals_whitelist_teams", "approvals_whitelist_team_ids"),
)


def _admin_repo(emu: Emulator, request: web.Request) -> tuple[EmuRepo, EmuUser]:
    """routers/api/v1/api.go: ``repoAssignment`` (404 when the repository is not visible), then the group's
    ``reqToken()`` (401) and ``reqAdmin()`` (403 unless repo admin or site admin)."""
    repo = emu.find_repo(request.match_info["owner"], request.match_info["repo"])
    viewer: EmuUser | None = request.get(DOER_KEY)
    if repo is None or emu.perm_of(repo, viewer) == "none":
        raise ApiError(404, NOT_FOUND_MESSAGE)
    doer = request_doer(request)
    if PERM_LEVEL[emu.perm_of(repo, doer)] < PERM_LEVEL["admin"]:
        raise ApiError(403, "user should be an owner or a collaborator with admin write of a repository")
    return repo, doer


def _rule_name(emu: Emulator, request: web.Request) -> str:
    """1.22 routes ``/{name}`` (one path segment); 1.23+ ``/*`` (slashes allowed)."""
    name = request.match_info["name"]
    if "/" in name and not emu.at_least("1.23"):
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return name


def _user_ids(emu: Emulator, repo: EmuRepo, names: Any, kind: str) -> list[int]:
    """``GetUserIDsByNames`` (unknown: 422 ``user does not exist``), then the whitelist filter Gitea applies on
    save: ``write`` keeps users with write on code, ``reader`` those who can read pull requests."""
    users: list[EmuUser] = []
    for name in names or []:
        user = emu.find_user(str(name))
        if user is None:
            raise ApiError(422, f"user does not exist [uid: 0, name: {name}]")
        users.append(user)
    if kind == "write":
        return [u.id for u in users if can_write_code(emu, repo, u)]
    return [u.id for u in users if PERM_LEVEL[emu.unit_perm(repo, u, "repo.pulls")] >= PERM_LEVEL["read"]]


def _team_ids(emu: Emulator, repo: EmuRepo, names: Any) -> list[int]:
    """``GetTeamIDsByNames`` for an organization's repository (unknown: 422 ``team does not exist``); teams
    without access to the repository are dropped (``updateTeamWhitelist``)."""
    ids: list[int] = []
    for name in names or []:
        team = next((t for t in emu.teams_of(repo.owner) if t.name.lower() == str(name).lower()), None)
        if team is None:
            raise ApiError(422, f"team does not exist [org_id {repo.owner.id}, team_id 0, name: {name}]")
        if team.covers(repo):
            ids.append(team.id)
    return ids


def _apply_lists(emu: Emulator, repo: EmuRepo, rule: ProtectionRule, form: dict[str, Any], *, edit: bool) -> None:
    """The whitelists of a create (every list replaced) or an edit (only those given)."""
    new = emu.at_least("1.23")
    resolved: dict[str, list[int]] = {}
    for option, target, kind in _USER_LISTS:
        if option.startswith("force_push") and not new:
            continue
        if edit and form.get(option) is None:
            continue
        resolved[target] = _user_ids(emu, repo, form.get(option), kind)
    if repo.owner.is_org:
        for option, target in _TEAM_LISTS:
            if option.startswith("force_push") and not new:
                continue
            if edit and form.get(option) is None:
                continue
            resolved[target] = _team_ids(emu, repo, form.get(option))
    for target, ids in resolved.items():
        setattr(rule, target, ids)


def _recheck(emu: Emulator, repo: EmuRepo, rule: ProtectionRule) -> None:
    """``CheckPRsForBaseBranch`` after a save: open PRs into matching branches are re-tested."""
    for issue in repo.issues.values():
        if issue.is_pull and issue.closed is None and rule.matches(issue.base_branch):
            pull = emu.pull_of(issue)
            if pull.merged is None:
                emu._start_check(pull)


async def list_protections(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/branch_protections (``ListBranchProtections``): every rule in matching order
    (``FindRepoProtectedBranchRules``: priority from 1.23, plain names before globs, oldest first)."""
    repo, _ = _admin_repo(emu, request)
    return json_response([rule_json(emu, r) for r in ordered_rules(emu, repo)])


async def get_protection(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """GET /repos/{owner}/{repo}/branch_protections/{name} (``GetBranchProtection``): by exact rule name; 404."""
    repo, _ = _admin_repo(emu, request)
    rule = rule_by_name(repo, _rule_name(emu, request))
    if rule is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    return json_response(rule_json(emu, rule))


async def create_protection(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """POST /repos/{owner}/{repo}/branch_protections (``CreateBranchProtection``): ``rule_name``, else the
    deprecated ``branch_name`` (both empty: 400); an existing rule name 403 "Branch protection already exist";
    unknown whitelist users/teams 422; ``enable_push_whitelist`` (and the deploy-key and force-push flags) only
    with ``enable_push``; a negative ``required_approvals`` is 0. 201 with the rule."""
    repo, _ = _admin_repo(emu, request)
    form = await read_json_body(request)
    name = str(form.get("rule_name") or "") or str(form.get("branch_name") or "")
    if not name:
        raise ApiError(400, "both rule_name and branch_name are empty")
    if rule_by_name(repo, name) is not None:
        raise ApiError(403, "Branch protection already exist")
    now = emu.now()
    rule = ProtectionRule(id=next_id(emu, "protected_branch"), repo=repo, rule_name=name, created=now, updated=now)
    _apply_lists(emu, repo, rule, form, edit=False)
    push = form.get("enable_push") is True
    rule.enable_push = push
    rule.enable_push_whitelist = push and form.get("enable_push_whitelist") is True
    rule.push_whitelist_deploy_keys = rule.enable_push_whitelist and form.get("push_whitelist_deploy_keys") is True
    if emu.at_least("1.23"):
        rule.enable_force_push = push and form.get("enable_force_push") is True
        rule.enable_force_push_allowlist = rule.enable_force_push and form.get("enable_force_push_allowlist") is True
        rule.force_push_allowlist_deploy_keys = (
            rule.enable_force_push_allowlist and form.get("force_push_allowlist_deploy_keys") is True
        )
        for option in _NEW_PLAIN:
            if option in form:
                setattr(rule, option, type(getattr(rule, option))(form[option] or 0))
    for option in _PLAIN:
        if option in form and form[option] is not None:
            setattr(rule, option, form[option] if isinstance(form[option], str) else form[option] is True)
    contexts = form.get("status_check_contexts")
    rule.status_check_contexts = [str(c) for c in contexts] if isinstance(contexts, list) else None
    approvals = form.get("required_approvals")
    rule.required_approvals = approvals if isinstance(approvals, int) and approvals > 0 else 0
    repo_rules(repo).append(rule)
    _recheck(emu, repo, rule)
    return json_response(rule_json(emu, rule), status=201)


async def edit_protection(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """PATCH /repos/{owner}/{repo}/branch_protections/{name} (``EditBranchProtection``): only the options given
    change; ``enable_push: false`` also ends the push whitelist (force push likewise); ``required_approvals`` only
    when not negative; unknown whitelist users/teams 422; 404 for an unknown rule. 200 with the rule."""
    repo, _ = _admin_repo(emu, request)
    rule = rule_by_name(repo, _rule_name(emu, request))
    if rule is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    form = await read_json_body(request)
    # The whitelists are resolved first: an unknown user or team (422) leaves the rule as it was.
    _apply_lists(emu, repo, rule, form, edit=True)
    if isinstance(form.get("enable_push"), bool):
        if not form["enable_push"]:
            rule.enable_push = rule.enable_push_whitelist = rule.push_whitelist_deploy_keys = False
        else:
            rule.enable_push = True
            if isinstance(form.get("enable_push_whitelist"), bool):
                rule.enable_push_whitelist = form["enable_push_whitelist"]
                if not rule.enable_push_whitelist:
                    rule.push_whitelist_deploy_keys = False
                elif isinstance(form.get("push_whitelist_deploy_keys"), bool):
                    rule.push_whitelist_deploy_keys = form["push_whitelist_deploy_keys"]
    if emu.at_least("1.23"):
        if isinstance(form.get("enable_force_push"), bool):
            if not form["enable_force_push"]:
                rule.enable_force_push = rule.enable_force_push_allowlist = False
                rule.force_push_allowlist_deploy_keys = False
            else:
                rule.enable_force_push = True
                if isinstance(form.get("enable_force_push_allowlist"), bool):
                    rule.enable_force_push_allowlist = form["enable_force_push_allowlist"]
                    if not rule.enable_force_push_allowlist:
                        rule.force_push_allowlist_deploy_keys = False
                    elif isinstance(form.get("force_push_allowlist_deploy_keys"), bool):
                        rule.force_push_allowlist_deploy_keys = form["force_push_allowlist_deploy_keys"]
        if isinstance(form.get("priority"), int):
            rule.priority = form["priority"]
        if isinstance(form.get("block_admin_merge_override"), bool):
            rule.block_admin_merge_override = form["block_admin_merge_override"]
    for option in _PLAIN:
        value = form.get(option)
        if isinstance(value, bool | str):
            setattr(rule, option, value)
    if isinstance(form.get("status_check_contexts"), list):
        rule.status_check_contexts = [str(c) for c in form["status_check_contexts"]]
    approvals = form.get("required_approvals")
    if isinstance(approvals, int) and approvals >= 0:
        rule.required_approvals = approvals
    rule.updated = emu.now()
    _recheck(emu, repo, rule)
    return json_response(rule_json(emu, rule))


async def delete_protection(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """DELETE /repos/{owner}/{repo}/branch_protections/{name} (``DeleteBranchProtection``): 204; 404."""
    repo, _ = _admin_repo(emu, request)
    rule = rule_by_name(repo, _rule_name(emu, request))
    if rule is None:
        raise ApiError(404, NOT_FOUND_MESSAGE)
    repo_rules(repo).remove(rule)
    return no_content()
