"""The grants' vocabulary and the tools' closed argument schemas, with the contract digest a grant pins."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

from bot.core.digest import digest

BROKER_PROTOCOL: Final = "foreman-grants/1"

#: How a grant entry uses its tool; the verb table's ``Effect`` says only whether the verb reads or mutates.
GrantEffect = Literal["read", "plan_only", "mutate", "teardown"]
GRANT_EFFECTS: Final[tuple[GrantEffect, ...]] = get_args(GrantEffect)

PLACEHOLDERS: Final[tuple[str, ...]] = ("issue", "branch", "worktree", "owner")

ArgKind = Literal[
    "issue_number", "issue_numbers", "boolean", "login", "text", "sha", "key", "choice", "object", "candidates"
]

_LOGIN_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,39}")
_SHA_RE = re.compile(r"[0-9a-f]{40}(?:[0-9a-f]{24})?")
_KEY_RE = re.compile(r"[A-Za-z0-9._:/-]{1,200}")


@dataclass(frozen=True, slots=True)
class ArgSpec:
    """One argument of a tool: how its value is typed, and whether it must be present."""

    kind: ArgKind
    required: bool = False
    choices: tuple[str, ...] = ()
    max_length: int = 200

    def problem(self, value: object) -> str | None:
        """Why ``value`` does not fit, or None. ``null`` never fits: an argument is present or absent."""
        kind = self.kind
        if kind == "issue_number":
            return None if type(value) is int and value > 0 else "expected a positive integer"
        if kind == "issue_numbers":
            ok = isinstance(value, list) and all(type(v) is int and v > 0 for v in value)
            return None if ok else "expected an array of positive integers"
        if kind == "boolean":
            return None if isinstance(value, bool) else "expected true or false"
        if kind == "object":
            return None if isinstance(value, dict) else "expected an object"
        if kind == "candidates":
            return None if isinstance(value, list | dict | str) else "expected candidate records"
        if not isinstance(value, str):
            return "expected a string"
        if kind == "login":
            return None if _LOGIN_RE.fullmatch(value) else "expected a Gitea login"
        if kind == "text":
            ok = bool(value.strip()) and len(value) <= self.max_length and "\n" not in value
            return None if ok else f"expected one line of 1 to {self.max_length} characters"
        if kind == "sha":
            return None if _SHA_RE.fullmatch(value) else "expected a full lower-case commit SHA"
        if kind == "key":
            return None if _KEY_RE.fullmatch(value) else "expected 1-200 characters of [A-Za-z0-9._:/-]"
        return None if value in self.choices else f"expected one of {', '.join(self.choices)}"

    def contract(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "required": self.required}
        if self.choices:
            out["choices"] = list(self.choices)
        if self.kind == "text":
            out["max_length"] = self.max_length
        return out


@dataclass(frozen=True, slots=True)
class ToolContract:
    """What a grant may say about one MCP tool: the effects it may carry and its closed argument schema.

    ``plan_only_requires``: arguments a ``plan_only`` entry must carry with exactly these values (an allocation
    is a plan only while it is a dry run). ``issue_scoped``: its ``issue_number`` must be the run's issue.
    """

    tool: str
    effects: frozenset[GrantEffect]
    args: Mapping[str, ArgSpec]
    plan_only_requires: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def issue_scoped(self) -> bool:
        return "issue_number" in self.args

    def check(self, arguments: Mapping[str, Any]) -> list[str]:
        """Every problem of ``arguments`` against the closed schema (unknown names included), in name order."""
        problems = [f"{name}: unknown argument" for name in sorted(arguments) if name not in self.args]
        for name in sorted(self.args):
            spec = self.args[name]
            if name not in arguments:
                if spec.required:
                    problems.append(f"{name}: required")
                continue
            problem = spec.problem(arguments[name])
            if problem is not None:
                problems.append(f"{name}: {problem}")
        return problems

    def contract(self) -> dict[str, Any]:
        return {
            "effects": sorted(self.effects),
            "args": {name: spec.contract() for name, spec in sorted(self.args.items())},
            "plan_only_requires": dict(self.plan_only_requires),
        }


def _tool(
    name: str, effects: set[GrantEffect], args: dict[str, ArgSpec], plan_only_requires: dict[str, Any] | None = None
) -> ToolContract:
    return ToolContract(
        tool=name,
        effects=frozenset(effects),
        args=MappingProxyType(args),
        plan_only_requires=MappingProxyType(plan_only_requires or {}),
    )


_ISSUE = ArgSpec("issue_number", required=True)

#: One table: every MCP tool a grant may name, with its closed argument schema (names as DESIGN.md lists them).
TOOL_CONTRACTS: Final[Mapping[str, ToolContract]] = MappingProxyType(
    {
        t.tool: t
        for t in (
            _tool(
                "gitea_allocate_next_work",
                {"plan_only", "mutate"},
                {
                    "owner": ArgSpec("login"),
                    "action": ArgSpec("choice", choices=("implement", "review", "merge")),
                    "candidates_json": ArgSpec("candidates"),
                    "exclude_issue_numbers": ArgSpec("issue_numbers"),
                    "dry_run": ArgSpec("boolean"),
                    "expected_fingerprint": ArgSpec("text"),
                },
                plan_only_requires={"dry_run": True},
            ),
            _tool(
                "gitea_bootstrap_issue_worktree",
                {"mutate"},
                {"issue_number": _ISSUE, "idempotency_key": ArgSpec("key"), "expected_base": ArgSpec("sha")},
            ),
            _tool("gitea_lock_issue", {"mutate"}, {"issue_number": _ISSUE}),
            _tool("gitea_heartbeat_lease", {"mutate"}, {"issue_number": _ISSUE}),
            _tool(
                "gitea_release_lease",
                {"mutate", "teardown"},
                {"issue_number": _ISSUE, "reason": ArgSpec("text")},
            ),
            _tool("gitea_get_issue_state", {"read", "plan_only"}, {"issue_number": _ISSUE}),
            _tool(
                "gitea_post_issue_state",
                {"mutate"},
                {
                    "issue_number": _ISSUE,
                    "state": ArgSpec("object", required=True),
                    "summary": ArgSpec("text", max_length=600),
                },
            ),
            _tool("gitea_get_runtime_context", {"read", "plan_only"}, {}),
        )
    }
)


def contract_document() -> dict[str, Any]:
    """What the contract digest covers: the protocol, the effect vocabulary and every tool's closed schema."""
    return {
        "protocol": BROKER_PROTOCOL,
        "effects": list(GRANT_EFFECTS),
        "placeholders": list(PLACEHOLDERS),
        "tools": {name: t.contract() for name, t in sorted(TOOL_CONTRACTS.items())},
    }


CONTRACT_DIGEST: Final[str] = digest(contract_document())
