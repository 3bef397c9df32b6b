"""Branch protection rules of emulated repositories (models/git/protected_branch.go) and the checks built on them."""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final

from bot.emulator.model import PERM_LEVEL, EmuRepo, EmuUser

if TYPE_CHECKING:
    from bot.emulator.state import EmulatorState

#: modules/glob/glob.go ``IsSpecialByte`` (1.26) / gobwas ``syntax.Special`` (1.22): a rule name with one of these
#: is a glob pattern; without, a plain branch name matched case-insensitively.
GLOB_SPECIALS: Final = frozenset("*?\\[]{}")


@dataclass(eq=False)
class ProtectionRule:
    """A ``protected_branch`` row: ``rule_name`` is a branch name or a glob (``release/*``, ``**``).

    Whitelists hold user and team ids, as Gitea stores them; the API shows them as names."""

    id: int
    repo: EmuRepo
    rule_name: str
    created: int
    updated: int
    #: 1.23+ (#32286): lower first; before, every rule is 0.
    priority: int = 0
    enable_push: bool = False
    enable_push_whitelist: bool = False
    push_whitelist_user_ids: list[int] = field(default_factory=list)
    push_whitelist_team_ids: list[int] = field(default_factory=list)
    push_whitelist_deploy_keys: bool = False
    #: 1.23+ (#28086).
    enable_force_push: bool = False
    enable_force_push_allowlist: bool = False
    force_push_allowlist_user_ids: list[int] = field(default_factory=list)
    force_push_allowlist_team_ids: list[int] = field(default_factory=list)
    force_push_allowlist_deploy_keys: bool = False
    enable_merge_whitelist: bool = False
    merge_whitelist_user_ids: list[int] = field(default_factory=list)
    merge_whitelist_team_ids: list[int] = field(default_factory=list)
    enable_status_check: bool = False
    #: Glob patterns over status contexts; None when never set (Go's nil slice: ``null`` in the JSON).
    status_check_contexts: list[str] | None = None
    enable_approvals_whitelist: bool = False
    approvals_whitelist_user_ids: list[int] = field(default_factory=list)
    approvals_whitelist_team_ids: list[int] = field(default_factory=list)
    required_approvals: int = 0
    block_on_rejected_reviews: bool = False
    block_on_official_review_requests: bool = False
    block_on_outdated_branch: bool = False
    dismiss_stale_approvals: bool = False
    ignore_stale_approvals: bool = False
    require_signed_commits: bool = False
    protected_file_patterns: str = ""
    unprotected_file_patterns: str = ""
    #: 1.23+ (#32248): a repo admin's ``force_merge`` no longer skips a failed protection check.
    block_admin_merge_override: bool = False

    @property
    def is_plain_name(self) -> bool:
        """``!IsRuleNameSpecial(RuleName)``."""
        return not any(c in GLOB_SPECIALS for c in self.rule_name)

    def matches(self, branch: str) -> bool:
        """``ProtectedBranch.Match``: a plain name case-insensitively, a glob with ``/`` as separator."""
        if self.is_plain_name:
            return self.rule_name.lower() == branch.lower()
        return glob_regex(self.rule_name, separator="/").fullmatch(branch) is not None


#: Seeding keywords (``protect_branch(..., **options)``) that are rule fields (not ids, repo or times).
RULE_OPTIONS: Final = frozenset(
    f.name for f in fields(ProtectionRule) if f.name not in ("id", "repo", "rule_name", "created", "updated")
)

_RULES: weakref.WeakKeyDictionary[EmuRepo, list[ProtectionRule]] = weakref.WeakKeyDictionary()


def repo_rules(repo: EmuRepo) -> list[ProtectionRule]:
    """The repository's rules in creation order (the table; use ``ordered_rules`` for matching)."""
    return _RULES.setdefault(repo, [])


def ordered_rules(emu: EmulatorState, repo: EmuRepo) -> list[ProtectionRule]:
    """models/git/protected_branch_list.go ``FindRepoProtectedBranchRules`` + ``sort``: by priority (1.23+), then
    plain names before globs, then the oldest first (``created_unix``; ties keep insertion order)."""
    rules = list(repo_rules(repo))
    if emu.at_least("1.23"):
        rules.sort(key=lambda r: (r.priority, not r.is_plain_name, r.created))
    else:
        rules.sort(key=lambda r: (not r.is_plain_name, r.created))
    return rules


def first_match(emu: EmulatorState, repo: EmuRepo, branch: str) -> ProtectionRule | None:
    """``GetFirstMatchProtectedBranchRule``: the first rule of the ordered list that matches ``branch``."""
    return next((r for r in ordered_rules(emu, repo) if r.matches(branch)), None)


def rule_by_name(repo: EmuRepo, name: str) -> ProtectionRule | None:
    """``GetProtectedBranchRuleByName``: the exact rule name (the ``branch_name`` column)."""
    return next((r for r in repo_rules(repo) if r.rule_name == name), None)


def glob_regex(pattern: str, *, separator: str | None) -> re.Pattern[str]:
    """A gobwas/glob (Gitea's modules/glob from 1.23) pattern as a regular expression: ``*`` any run of
    non-separators, ``**`` anything, ``?`` one non-separator, ``[a-z]``/``[!a-z]`` classes, ``{a,b}`` alternatives,
    ``\\`` escapes. Without a separator ``*`` and ``?`` cross ``/`` (status-check contexts)."""
    not_sep = f"[^{re.escape(separator)}]" if separator else "."
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        if c == "*":
            if pattern.startswith("**", i):
                out.append(".*")
                i += 2
                continue
            out.append(f"{not_sep}*")
        elif c == "?":
            out.append(not_sep)
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                negate = body.startswith("!")
                body = body[1:] if negate else body
                out.append(f"[{'^' if negate else ''}{body.replace(chr(92), chr(92) * 2)}]")
                i = end + 1
                continue
        elif c == "{":
            depth += 1
            out.append("(?:")
        elif c == "}" and depth:
            depth -= 1
            out.append(")")
        elif c == "," and depth:
            out.append("|")
        else:
            out.append(re.escape(c))
        i += 1
    try:
        return re.compile("".join(out) + ")" * depth, re.DOTALL)
    except re.error:
        # An invalid pattern: Gitea falls back to ``glob.MustCompile(glob.QuoteMeta(rule))`` (a literal).
        return re.compile(re.escape(pattern))


def _in_teams(emu: EmulatorState, user: EmuUser, team_ids: list[int]) -> bool:
    """``organization.IsUserInTeams``."""
    return any((team := emu.team(t)) is not None and user in team.members for t in team_ids)


def can_write_code(emu: EmulatorState, repo: EmuRepo, user: EmuUser) -> bool:
    """``Permission.CanWrite(unit.TypeCode)`` / ``HasAccessUnit(..., TypeCode, AccessModeWrite)``."""
    return PERM_LEVEL[emu.unit_perm(repo, user, "repo.code")] >= PERM_LEVEL["write"]


def is_merge_whitelisted(emu: EmulatorState, rule: ProtectionRule, user: EmuUser) -> bool:
    """``IsUserMergeWhitelisted``: without a merge whitelist, write on code; with one, listed or in a listed team."""
    if not rule.enable_merge_whitelist:
        return can_write_code(emu, rule.repo, user)
    return user.id in rule.merge_whitelist_user_ids or _in_teams(emu, user, rule.merge_whitelist_team_ids)


def is_user_allowed_to_merge(emu: EmulatorState, repo: EmuRepo, branch: str, user: EmuUser | None) -> bool:
    """services/pull/merge.go ``IsUserAllowedToMerge``: write on code without a rule; with a rule, its merge
    whitelist (``IsUserMergeWhitelisted``) decides."""
    if user is None:
        return False
    rule = first_match(emu, repo, branch)
    if rule is None:
        return can_write_code(emu, repo, user)
    return is_merge_whitelisted(emu, rule, user)


def is_official_reviewer(emu: EmulatorState, repo: EmuRepo, base_branch: str, user: EmuUser) -> bool:
    """models/issues/review.go ``IsOfficialReviewer`` → models/git ``IsUserOfficialReviewer``: without a rule or
    without an approvals whitelist, write on code; with the whitelist, listed or in a listed team."""
    rule = first_match(emu, repo, base_branch)
    if rule is None or not rule.enable_approvals_whitelist:
        return can_write_code(emu, repo, user)
    return user.id in rule.approvals_whitelist_user_ids or _in_teams(emu, user, rule.approvals_whitelist_team_ids)


def can_user_push(emu: EmulatorState, rule: ProtectionRule, user: EmuUser) -> bool:
    """``ProtectedBranch.CanUserPush``: push disabled is no; without a whitelist write on code; else listed."""
    if not rule.enable_push:
        return False
    if not rule.enable_push_whitelist:
        return can_write_code(emu, rule.repo, user)
    return user.id in rule.push_whitelist_user_ids or _in_teams(emu, user, rule.push_whitelist_team_ids)


def can_user_force_push(emu: EmulatorState, rule: ProtectionRule, user: EmuUser) -> bool:
    """``ProtectedBranch.CanUserForcePush`` (1.23+): force push enabled, then (allowlisted, when there is an
    allowlist, and) ``CanUserPush``."""
    if not rule.enable_force_push:
        return False
    if rule.enable_force_push_allowlist:
        listed = user.id in rule.force_push_allowlist_user_ids
        if not listed and not _in_teams(emu, user, rule.force_push_allowlist_team_ids):
            return False
    return can_user_push(emu, rule, user)


def rule_json(emu: EmulatorState, rule: ProtectionRule) -> dict[str, Any]:
    """services/convert/convert.go ``ToBranchProtection`` (modules/structs ``BranchProtection`` key order):
    ``branch_name`` is the rule name only for a plain name; whitelists as login and team names (of those who can
    read); ``priority``, the force-push fields and ``block_admin_merge_override`` from 1.23."""

    def users(ids: list[int]) -> list[str]:
        return [u.login for u in emu.users() if u.id in ids and emu.perm_of(rule.repo, u) != "none"]

    def teams(ids: list[int]) -> list[str]:
        return [t.name for i in ids if (t := emu.team(i)) is not None and t.covers(rule.repo)]

    from bot.emulator.convert import unix_time

    new = emu.at_least("1.23")
    data: dict[str, Any] = {"branch_name": rule.rule_name if rule.is_plain_name else "", "rule_name": rule.rule_name}
    if new:
        data["priority"] = rule.priority
    data |= {
        "enable_push": rule.enable_push,
        "enable_push_whitelist": rule.enable_push_whitelist,
        "push_whitelist_usernames": users(rule.push_whitelist_user_ids),
        "push_whitelist_teams": teams(rule.push_whitelist_team_ids),
        "push_whitelist_deploy_keys": rule.push_whitelist_deploy_keys,
    }
    if new:
        data |= {
            "enable_force_push": rule.enable_force_push,
            "enable_force_push_allowlist": rule.enable_force_push_allowlist,
            "force_push_allowlist_usernames": users(rule.force_push_allowlist_user_ids),
            "force_push_allowlist_teams": teams(rule.force_push_allowlist_team_ids),
            "force_push_allowlist_deploy_keys": rule.force_push_allowlist_deploy_keys,
        }
    data |= {
        "enable_merge_whitelist": rule.enable_merge_whitelist,
        "merge_whitelist_usernames": users(rule.merge_whitelist_user_ids),
        "merge_whitelist_teams": teams(rule.merge_whitelist_team_ids),
        "enable_status_check": rule.enable_status_check,
        "status_check_contexts": None if rule.status_check_contexts is None else list(rule.status_check_contexts),
        "required_approvals": rule.required_approvals,
        "enable_approvals_whitelist": rule.enable_approvals_whitelist,
        "approvals_whitelist_username": users(rule.approvals_whitelist_user_ids),
        "approvals_whitelist_teams": teams(rule.approvals_whitelist_team_ids),
        "block_on_rejected_reviews": rule.block_on_rejected_reviews,
        "block_on_official_review_requests": rule.block_on_official_review_requests,
        "block_on_outdated_branch": rule.block_on_outdated_branch,
        "dismiss_stale_approvals": rule.dismiss_stale_approvals,
        "ignore_stale_approvals": rule.ignore_stale_approvals,
        "require_signed_commits": rule.require_signed_commits,
        "protected_file_patterns": rule.protected_file_patterns,
        "unprotected_file_patterns": rule.unprotected_file_patterns,
    }
    if new:
        data["block_admin_merge_override"] = rule.block_admin_merge_override
    data |= {"created_at": unix_time(rule.created, emu.tz), "updated_at": unix_time(rule.updated, emu.tz)}
    return data
