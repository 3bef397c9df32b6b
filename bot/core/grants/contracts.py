"""The grants' vocabulary and what a grant may say about each tool of the verb table, with the contract digest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

from bot.core.digest import canonical_json, digest
from bot.core.verb_params import Param
from bot.core.verbs import VERBS, Verb

BROKER_PROTOCOL: Final = "foreman-grants/1"

#: How a grant entry uses its tool; the verb table's ``Effect`` says only whether the verb reads or mutates.
GrantEffect = Literal["read", "plan_only", "mutate", "teardown"]
GRANT_EFFECTS: Final[tuple[GrantEffect, ...]] = get_args(GrantEffect)

PLACEHOLDERS: Final[tuple[str, ...]] = ("issue", "branch", "worktree", "owner")

#: What a grant may do with each tool the verb table offers: the effects its entries may carry, and the arguments
#: (with exactly these values) a ``plan_only`` entry of a mutating tool must carry to be a plan only. The arguments
#: themselves are the verb table's: a grant seals only values the gateway accepts.
_GRANT_USES: Final[Mapping[str, tuple[frozenset[GrantEffect], Mapping[str, Any]]]] = MappingProxyType(
    {
        "allocate_next_work": (frozenset({"plan_only", "mutate"}), MappingProxyType({"dry_run": True})),
        "bootstrap_issue_worktree": (frozenset({"mutate"}), MappingProxyType({})),
        "lock_issue": (frozenset({"mutate"}), MappingProxyType({})),
        "heartbeat_lease": (frozenset({"mutate"}), MappingProxyType({})),
        "release_lease": (frozenset({"mutate", "teardown"}), MappingProxyType({})),
        "get_issue_state": (frozenset({"read", "plan_only"}), MappingProxyType({})),
        "post_issue_state": (frozenset({"mutate"}), MappingProxyType({})),
        "get_runtime_context": (frozenset({"read", "plan_only"}), MappingProxyType({})),
        "claim_review": (frozenset({"mutate"}), MappingProxyType({})),
        "submit_review": (frozenset({"mutate"}), MappingProxyType({})),
        "merge_pull_request": (frozenset({"mutate"}), MappingProxyType({})),
        "publish_worktree": (frozenset({"mutate"}), MappingProxyType({})),
        "open_pull_request": (frozenset({"mutate"}), MappingProxyType({})),
        "update_pull_request": (frozenset({"mutate"}), MappingProxyType({})),
        "assess_work_issue_duplicate": (frozenset({"read", "plan_only"}), MappingProxyType({})),
        "read_issue": (frozenset({"read", "plan_only"}), MappingProxyType({})),
        "read_pull_request": (frozenset({"read", "plan_only"}), MappingProxyType({})),
    }
)


def sealed_value_problem(param: Param, value: object) -> str | None:
    """Why a grant cannot pin ``value`` for ``param``, or None: the gateway's own check (:meth:`Param.accept`),
    plus two rules of an exact plan. ``null`` is not a value (an argument is pinned or left out), and the value
    must be the one the tool receives (``1.0`` would reach it as ``1``, so the grant could never be matched)."""
    if value is None:
        return "expected a value, not null: a grant leaves an argument it does not pin out"
    accepted, problem = param.accept(value)
    if problem is not None:
        return problem
    if not isinstance(value, str) and canonical_json(accepted) != canonical_json(value):
        return "a grant pins the exact value the tool receives: write whole numbers without a fraction"
    return None


@dataclass(frozen=True, slots=True)
class ToolContract:
    """What a grant may say about one MCP tool: the effects it may carry and the verb's arguments (closed).

    ``plan_only_requires``: arguments a ``plan_only`` entry must carry with exactly these values (an allocation
    is a plan only while it is a dry run). ``issue_scoped``: its ``issue_number`` must be the run's issue.
    """

    tool: str
    effects: frozenset[GrantEffect]
    args: Mapping[str, Param]
    plan_only_requires: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def issue_scoped(self) -> bool:
        return "issue_number" in self.args

    def check(self, arguments: Mapping[str, Any]) -> list[str]:
        """Every problem of ``arguments`` against the verb's arguments (unknown names included), in name order."""
        problems = [f"{name}: unknown argument" for name in sorted(arguments) if name not in self.args]
        for name in sorted(self.args):
            param = self.args[name]
            if name not in arguments:
                if param.required:
                    problems.append(f"{name}: required")
                continue
            problem = sealed_value_problem(param, arguments[name])
            if problem is not None:
                problems.append(f"{name}: {problem}")
        return problems

    def contract(self) -> dict[str, Any]:
        return {
            "effects": sorted(self.effects),
            "args": {
                name: {"required": param.required, "schema": _without_descriptions(param.schema())}
                for name, param in sorted(self.args.items())
            },
            "plan_only_requires": dict(self.plan_only_requires),
        }


def _without_descriptions(schema: Any) -> Any:
    # A reworded description changes no verdict, so it must not change the contract digest (and end every run).
    if isinstance(schema, dict):
        kept = {k: v for k, v in schema.items() if not (k == "description" and isinstance(v, str))}
        return {k: _without_descriptions(v) for k, v in kept.items()}
    if isinstance(schema, list):
        return [_without_descriptions(v) for v in schema]
    return schema


def _contract(verb: Verb) -> ToolContract:
    effects, plan_only_requires = _GRANT_USES[verb.name]
    contract = ToolContract(
        tool=verb.tool,
        effects=effects,
        args=MappingProxyType({p.name: p for p in verb.params}),
        plan_only_requires=plan_only_requires,
    )
    allowed: set[GrantEffect] = {"read", "plan_only"} if verb.effect == "read" else {"plan_only", "mutate", "teardown"}
    if not effects <= allowed:
        raise ValueError(f"{verb.tool}: a {verb.effect} verb cannot be {', '.join(sorted(effects - allowed))}")
    if verb.effect == "mutate" and "plan_only" in effects and not plan_only_requires:
        raise ValueError(f"{verb.tool}: a mutating tool is a plan only with the arguments that make it one")
    problems = contract.check(plan_only_requires) if plan_only_requires else []
    if [p for p in problems if not p.endswith(": required")]:
        raise ValueError(f"{verb.tool}: plan_only_requires: {'; '.join(problems)}")
    return contract


def _contracts() -> Mapping[str, ToolContract]:
    offered = [verb for verb in VERBS.values() if verb.executable]
    if {verb.name for verb in offered} != set(_GRANT_USES):
        raise ValueError("every tool the verb table offers needs its grant use, and only those")
    return MappingProxyType({verb.tool: _contract(verb) for verb in offered})


#: One table: every MCP tool a grant may name (the verb table's offered tools), with the verb's arguments.
TOOL_CONTRACTS: Final[Mapping[str, ToolContract]] = _contracts()


def contract_document() -> dict[str, Any]:
    """What the contract digest covers: the protocol, the effect vocabulary and every tool's arguments and effects."""
    return {
        "protocol": BROKER_PROTOCOL,
        "effects": list(GRANT_EFFECTS),
        "placeholders": list(PLACEHOLDERS),
        "tools": {name: t.contract() for name, t in sorted(TOOL_CONTRACTS.items())},
    }


CONTRACT_DIGEST: Final[str] = digest(contract_document())
