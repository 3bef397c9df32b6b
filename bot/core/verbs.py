"""The one verb table: gateway preconditions, MCP tool names, comment commands, docs and tests read it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from bot.core.gateway import ROLES, Decision, GatewayContext, Precondition, Role, evaluate_preconditions

# ruff's S106 reads "missing_token" as a password argument; it names a missing artifact (seed 001).

Effect = Literal["read", "mutate"]
Gate = Precondition[GatewayContext]

ALL_ROLES: frozenset[Role] = frozenset(ROLES)


def role_gate(roles: frozenset[Role]) -> Gate:
    """The verb's first precondition: the caller holds one of ``roles`` (all roles = on the roster)."""
    if not roles:
        raise ValueError("a verb needs at least one allowed role")
    if roles == ALL_ROLES:
        return Precondition(
            key="on_roster",
            check=lambda ctx: bool(ctx.caller_roles),
            remediate="you are not on the foreman roster; ask an operator to add your login under [roster]",
            missing_token="roster_role",  # noqa: S106
            rejection_kind="not_authorized",
        )
    names = sorted(roles)
    label = " or ".join(names)
    return Precondition(
        key=f"role:{'|'.join(names)}",
        check=lambda ctx: bool(ctx.caller_roles & roles),
        remediate=f"this needs the {label} role; have a {label}-role identity perform it",
        missing_token=f"role:{'|'.join(names)}",
        rejection_kind="not_authorized",
        next_action="call gitea_get_runtime_context to see the work assigned to you",
    )


PRECONDITION_OWNERSHIP: Gate = Precondition(
    key="owns_lease",
    check=lambda ctx: ctx.owns_live_lease,
    remediate="issue is not leased to you; call gitea_get_runtime_context to find your work",
    missing_token="owns_lease",  # noqa: S106
    rejection_kind="not_authorized",
)

PRECONDITION_OWNERSHIP_OR_CONTROLLER: Gate = Precondition(
    key="owns_lease_or_controller",
    check=lambda ctx: ctx.owns_live_lease or "controller" in ctx.caller_roles,
    remediate=(
        "issue is not leased to you and you are not the controller; "
        "call gitea_get_runtime_context to find your work"
    ),
    missing_token="owns_lease_or_controller",  # noqa: S106
    rejection_kind="not_authorized",
)

PRECONDITION_NOT_PR_AUTHOR: Gate = Precondition(
    key="not_pr_author",
    check=lambda ctx: ctx.pr_author is None or ctx.pr_author != ctx.caller,
    remediate="you wrote this pull request and cannot review it; have a different reviewer claim it",
    missing_token="not_pr_author",  # noqa: S106
    rejection_kind="not_authorized",
    next_action="call gitea_get_runtime_context to find other work",
)

PRECONDITION_LIVE_LEASE: Gate = Precondition(
    key="live_lease",
    check=lambda ctx: ctx.lease_live,
    remediate="the issue has no live lease; the controller must call gitea_allocate_next_work first",
    missing_token="live_lease",  # noqa: S106
    message="Missing required live lease",
    next_action="call gitea_get_issue_state to see who holds the issue",
)

PRECONDITION_WORKTREE: Gate = Precondition(
    key="worktree_registered",
    check=lambda ctx: ctx.worktree_registered,
    remediate="no registered worktree under branches/ for this issue; call gitea_bootstrap_issue_worktree",
    missing_token="worktree",  # noqa: S106
    message="Missing required worktree",
)

PRECONDITION_COMMITS: Gate = Precondition(
    key="commits",
    check=lambda ctx: ctx.commits_ahead > 0,
    remediate="commit at least once on the issue branch, with a non-empty message, before opening a PR",
    missing_token="commits",  # noqa: S106
    message="Missing required commit(s)",
)

PRECONDITION_PR_EXISTS: Gate = Precondition(
    key="pr_exists",
    check=lambda ctx: ctx.pr_number is not None,
    remediate="no pull request for this issue yet; the author must call gitea_open_pr first",
    missing_token="pull_request",  # noqa: S106
    message="Missing required pull request",
    next_action="call gitea_get_issue_state to follow the issue until its PR is open",
)

PRECONDITION_PR_APPROVED: Gate = Precondition(
    key="pr_approved",
    check=lambda ctx: ctx.pr_approved,
    remediate="the pull request has no approving review; a reviewer must call gitea_claim_review and approve",
    missing_token="approval",  # noqa: S106
    message="Missing required approval",
    next_action="call gitea_get_issue_state to follow the review",
)


@dataclass(frozen=True, slots=True)
class Verb:
    """One gateway action: who may call it, what must hold first (gates first), what it touches."""

    name: str
    summary: str
    roles: frozenset[Role]
    preconditions: tuple[Gate, ...]
    effect: Effect
    next_verbs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.preconditions or self.preconditions[0].rejection_kind != "not_authorized":
            raise ValueError(f"{self.name}: the first precondition must be a role/ownership gate")
        kinds = [p.rejection_kind for p in self.preconditions]
        first_gap = kinds.index("tracing_gap") if "tracing_gap" in kinds else len(kinds)
        if "not_authorized" in kinds[first_gap:]:
            raise ValueError(f"{self.name}: every ownership/role gate must come before artifact checks")
        tokens = [p.missing_token for p in self.preconditions]
        if len(set(tokens)) != len(tokens):
            raise ValueError(f"{self.name}: missing tokens must be unique")

    @property
    def tool(self) -> str:
        """The MCP tool name."""
        return f"gitea_{self.name}"


def _verb(
    name: str,
    summary: str,
    *,
    roles: frozenset[Role],
    gates: tuple[Gate, ...] = (),
    artifacts: tuple[Gate, ...] = (),
    effect: Effect,
    next_verbs: tuple[str, ...] = (),
) -> Verb:
    return Verb(
        name=name,
        summary=summary,
        roles=roles,
        preconditions=(role_gate(roles), *gates, *artifacts),
        effect=effect,
        next_verbs=next_verbs,
    )


_VERBS: tuple[Verb, ...] = (
    _verb(
        "allocate_next_work",
        "rank eligible issues and (with apply) lease the chosen one to an owner",
        roles=frozenset({"controller"}),
        effect="mutate",
        next_verbs=("bootstrap_issue_worktree",),
    ),
    _verb(
        "bootstrap_issue_worktree",
        "create or recover the issue's branch and worktree under branches/",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP,),
        effect="mutate",
        next_verbs=("lock_issue",),
    ),
    _verb(
        "lock_issue",
        "lock the issue to the owner's registered worktree",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP,),
        artifacts=(PRECONDITION_WORKTREE,),
        effect="mutate",
        next_verbs=("get_issue_state", "heartbeat_lease"),
    ),
    _verb(
        "heartbeat_lease",
        "extend the live lease",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        artifacts=(PRECONDITION_LIVE_LEASE,),
        effect="mutate",
        next_verbs=("post_issue_state",),
    ),
    _verb(
        "release_lease",
        "end the live lease with a reason (recorded, never deleted)",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        artifacts=(PRECONDITION_LIVE_LEASE,),
        effect="mutate",
        next_verbs=("get_runtime_context",),
    ),
    _verb(
        "get_issue_state",
        "read the issue's latest Canonical Issue State",
        roles=ALL_ROLES,
        effect="read",
        next_verbs=("post_issue_state",),
    ),
    _verb(
        "post_issue_state",
        "post an evidence comment carrying a Canonical Issue State block",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        effect="mutate",
        next_verbs=("open_pr", "release_lease"),
    ),
    _verb(
        "get_runtime_context",
        "read the caller's identity, roles, leases and worktrees",
        roles=ALL_ROLES,
        effect="read",
        next_verbs=("get_issue_state", "allocate_next_work"),
    ),
    _verb(
        "open_pr",
        "open a pull request from the issue branch",
        roles=frozenset({"author"}),
        gates=(PRECONDITION_OWNERSHIP,),
        artifacts=(PRECONDITION_WORKTREE, PRECONDITION_COMMITS),
        effect="mutate",
        next_verbs=("post_issue_state", "release_lease"),
    ),
    _verb(
        "claim_review",
        "claim the review of the issue's pull request",
        roles=frozenset({"reviewer"}),
        gates=(PRECONDITION_NOT_PR_AUTHOR,),
        artifacts=(PRECONDITION_PR_EXISTS,),
        effect="mutate",
        next_verbs=("get_issue_state", "post_issue_state"),
    ),
    _verb(
        "merge",
        "merge the approved pull request",
        roles=frozenset({"merger"}),
        artifacts=(PRECONDITION_PR_EXISTS, PRECONDITION_PR_APPROVED),
        effect="mutate",
        next_verbs=("post_issue_state", "release_lease"),
    ),
)

VERBS: Mapping[str, Verb] = MappingProxyType({v.name: v for v in _VERBS})
TOOLS: Mapping[str, Verb] = MappingProxyType({v.tool: v for v in _VERBS})


def _check_table() -> None:
    if len(VERBS) != len(_VERBS) or len(TOOLS) != len(_VERBS):
        raise ValueError("verb names and MCP tool names must be unique")
    for verb in _VERBS:
        unknown = [n for n in verb.next_verbs if n not in VERBS]
        if unknown:
            raise ValueError(f"{verb.name}: next verbs {unknown} are not in the table")


_check_table()


def mcp_tool_names() -> tuple[str, ...]:
    """Every MCP tool, in table order."""
    return tuple(v.tool for v in _VERBS)


def evaluate(verb_name: str, context: GatewayContext) -> Decision:
    """Decide whether ``context.caller`` may run ``verb_name`` now (seed 001 rule).

    An unknown verb is refused as ``invalid_input`` naming the known verbs.
    """
    verb = VERBS.get(verb_name)
    if verb is None:
        known = ", ".join(VERBS)
        return Decision.reject(
            kind="invalid_input",
            message=f"unknown verb {verb_name!r}",
            remediate=f"use one of: {known}",
            exact_next_action="call gitea_get_runtime_context to see what you can do",
        )
    return evaluate_preconditions(verb.preconditions, context)


def render_verb_table_markdown() -> str:
    """The verb table for docs: one row per verb, preconditions in evaluation order with their kind."""
    lines = [
        "| verb | MCP tool | roles | effect | preconditions (in order) | next |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for v in _VERBS:
        roles = "any roster role" if v.roles == ALL_ROLES else ", ".join(sorted(v.roles))
        pre = "; ".join(f"`{p.key}` ({p.rejection_kind})" for p in v.preconditions)
        nxt = ", ".join(f"`{n}`" for n in v.next_verbs) or "-"
        lines.append(f"| `{v.name}` | `{v.tool}` | {roles} | {v.effect} | {pre} | {nxt} |")
    return "\n".join(lines) + "\n"
