"""What a merge into a branch needs, as Gitea's branch protection says it (pure): which rule applies to a base branch
(models/git/protected_branch.go ``Match``, protected_branch_list.go ``sort``/``GetFirstMatched``), how many approvals
it needs, whether rejections and an outdated head block, who may merge, and which commit statuses must pass
(services/pull/commit_status.go ``MergeRequiredContextsCommitStatus``, modules/commitstatus ``Combine``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Literal, Protocol, TypeVar

#: modules/glob: the bytes that make a rule name (or a status context) a pattern rather than a plain name.
_SPECIAL = frozenset("*?[]{}\\")

StatusState = Literal["success", "pending", "failure"]
#: Where the required status contexts come from: the protection rule, ``[merge] require_status``, the contexts seen
#: on the base branch's last commit (the default without a rule), or nowhere (no status is required).
ContextsFrom = Literal["protection", "config", "base", "none"]


class Rule(Protocol):
    """The fields of a branch protection rule the merge reads (``bot.gitea.BranchProtection`` has them)."""

    @property
    def rule_name(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def created_at(self) -> datetime | None: ...
    @property
    def required_approvals(self) -> int: ...
    @property
    def block_on_rejected_reviews(self) -> bool: ...
    @property
    def block_on_outdated_branch(self) -> bool: ...
    @property
    def dismiss_stale_approvals(self) -> bool: ...
    @property
    def ignore_stale_approvals(self) -> bool: ...
    @property
    def enable_merge_whitelist(self) -> bool: ...
    @property
    def merge_whitelist_usernames(self) -> tuple[str, ...]: ...
    @property
    def merge_whitelist_teams(self) -> tuple[str, ...]: ...
    @property
    def enable_status_check(self) -> bool: ...
    @property
    def status_check_contexts(self) -> tuple[str, ...]: ...


R = TypeVar("R", bound=Rule)


class Status(Protocol):
    """One commit status (``bot.gitea.CommitStatus`` has these)."""

    @property
    def context(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def target_url(self) -> str: ...
    @property
    def description(self) -> str: ...


def is_pattern(name: str) -> bool:
    """``IsRuleNameSpecial``: whether ``name`` holds a glob byte."""
    return any(c in _SPECIAL for c in name)


@lru_cache(maxsize=256)
def _compile(pattern: str, separator: str) -> re.Pattern[str] | None:
    """github.com/gobwas/glob's syntax as a regular expression: ``*`` any run without ``separator``, ``**`` any
    run, ``?`` one character but ``separator``, ``[...]``/``[!...]`` classes, ``{a,b}`` alternatives, ``\\``
    escapes. None when it does not compile (Gitea then matches the name literally)."""
    not_sep = f"[^{re.escape(separator)}]" if separator else "."
    out: list[str] = []
    depth = 0
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if i + 1 >= len(pattern):
                return None
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
                return None
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            if not body:
                return None
            out.append(("[^" if negate else "[") + body.replace("\\", "\\\\") + "]")
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
    if depth:
        return None
    try:
        return re.compile("".join(out), re.DOTALL)
    except re.error:
        return None


def glob_match(pattern: str, text: str, *, separator: str = "") -> bool:
    """Whether ``text`` matches the glob ``pattern`` (literally when the pattern does not compile)."""
    compiled = _compile(pattern, separator)
    return text == pattern if compiled is None else compiled.fullmatch(text) is not None


def rule_matches(rule_name: str, branch: str) -> bool:
    """``ProtectedBranch.Match``: a plain name matches case-insensitively, a pattern as a glob with ``/`` as the
    separator."""
    if not is_pattern(rule_name):
        return rule_name.lower() == branch.lower()
    return glob_match(rule_name, branch, separator="/")


def rule_for(branch: str, rules: Sequence[R]) -> R | None:
    """``GetFirstMatchProtectedBranchRule``: the rules by priority, plain names before patterns, then the oldest
    first; the first that matches ``branch``."""
    def order(rule: R) -> tuple[int, bool, float]:
        created = rule.created_at.timestamp() if rule.created_at is not None else 0.0
        return rule.priority, is_pattern(rule.rule_name), created
    return next((rule for rule in sorted(rules, key=order) if rule_matches(rule.rule_name, branch)), None)


@dataclass(frozen=True, slots=True)
class MergeRules:
    """What a merge into one base branch needs, from its protection rule (``rule``) and foreman's own floor: at least
    one approval recorded by foreman's review verb."""

    branch: str
    rule: str | None = None
    required_approvals: int = 1
    block_on_rejected_reviews: bool = False
    block_on_outdated_branch: bool = False
    dismiss_stale_approvals: bool = False
    ignore_stale_approvals: bool = False
    #: The merge whitelist's users (lower case) when the rule enables one; None: any writer may merge.
    merge_whitelist: frozenset[str] | None = None
    #: Whether the whitelist also names teams (membership is Gitea's to check at the merge).
    merge_whitelist_teams: bool = False
    required_contexts: tuple[str, ...] = ()
    contexts_from: ContextsFrom = "none"

    def to_dict(self) -> dict[str, Any]:
        return {"branch": self.branch, "rule": self.rule, "required_approvals": self.required_approvals,
                "block_on_rejected_reviews": self.block_on_rejected_reviews,
                "block_on_outdated_branch": self.block_on_outdated_branch,
                "dismiss_stale_approvals": self.dismiss_stale_approvals,
                "merge_whitelist": sorted(self.merge_whitelist) if self.merge_whitelist is not None else None,
                "required_contexts": list(self.required_contexts), "contexts_from": self.contexts_from}

    def may_merge(self, login: str) -> bool | None:
        """Whether ``login`` may merge under the merge whitelist: True, False, or None when only Gitea can say (a
        team whitelist)."""
        if self.merge_whitelist is None or login.lower() in self.merge_whitelist:
            return True
        return None if self.merge_whitelist_teams else False


def merge_rules(
    branch: str, rule: Rule | None, *, require_status: Sequence[str] | None, base_contexts: Sequence[str] = ()
) -> MergeRules:
    """The merge rules of ``branch``: its protection ``rule`` when one applies; the required statuses are the rule's
    (``enable_status_check``), else ``require_status`` (``[merge] require_status``), else ``base_contexts`` (the
    contexts seen on the base branch's last commit)."""
    if rule is not None and rule.enable_status_check:
        contexts, source = tuple(rule.status_check_contexts), "protection"
    elif require_status is not None:
        contexts, source = tuple(require_status), "config"
    else:
        contexts, source = tuple(dict.fromkeys(base_contexts)), "base"
    contexts_from: ContextsFrom = source if contexts or source == "protection" else "none"  # type: ignore[assignment]
    if rule is None:
        return MergeRules(branch, required_contexts=contexts, contexts_from=contexts_from)
    whitelist = frozenset(u.lower() for u in rule.merge_whitelist_usernames) if rule.enable_merge_whitelist else None
    return MergeRules(
        branch, rule.rule_name, max(1, rule.required_approvals), rule.block_on_rejected_reviews,
        rule.block_on_outdated_branch, rule.dismiss_stale_approvals, rule.ignore_stale_approvals, whitelist,
        rule.enable_merge_whitelist and bool(rule.merge_whitelist_teams), contexts, contexts_from)


def combine(states: Sequence[str]) -> StatusState:
    """``CommitStatusStates.Combine``: any error, failure or warning is a failure; all success or skipped is a
    success; anything else (pending, none) pending."""
    if any(s in ("error", "failure", "warning") for s in states):
        return "failure"
    if states and all(s in ("success", "skipped") for s in states):
        return "success"
    return "pending"


@dataclass(frozen=True, slots=True)
class StatusCheck:
    """The head's required statuses: their combined ``state``, the required contexts no status matches yet
    (``missing``), and the statuses that are pending or failing."""

    state: StatusState
    required: tuple[str, ...]
    missing: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    failing: tuple[tuple[str, str, str, str], ...] = ()  # (context, state, target_url, description)

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "required": list(self.required), "missing": list(self.missing),
                "pending": list(self.pending),
                "failing": [{"context": c, "state": s, "target_url": u, "description": d}
                            for c, s, u, d in self.failing]}

    def summary(self) -> str:
        """One line: which required status is failing or pending (``status check ci/build pending``)."""
        if self.failing:
            return "; ".join(f"status check {c} {s}" + (f" ({u})" if u else "") for c, s, u, _ in self.failing)
        waiting = [*self.missing, *self.pending]
        return "; ".join(f"status check {c} pending" for c in waiting) or f"status checks {self.state}"


def status_check(statuses: Sequence[Status], required: Sequence[str]) -> StatusCheck:
    """``MergeRequiredContextsCommitStatus`` over the head's latest status per context: nothing required passes; no
    status at all is pending; each required context (a glob) matched by no status keeps the state pending (unless a
    matched one fails)."""
    if not required:
        return StatusCheck("success", ())
    matched = [s for s in statuses if any(glob_match(p, s.context) for p in required)]
    missing = tuple(p for p in required if not any(glob_match(p, s.context) for s in statuses))
    pending = tuple(s.context for s in matched if s.state not in ("success", "skipped", "error", "failure",
                                                                   "warning"))
    failing = tuple((s.context, s.state, s.target_url, s.description) for s in matched
                    if s.state in ("error", "failure", "warning"))
    state = combine([s.state for s in matched])
    if not matched or (missing and state != "failure"):
        state = "pending"
    return StatusCheck(state, tuple(required), missing, pending, failing)
