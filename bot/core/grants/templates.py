"""Policy templates: one trusted call plan per role.action, checked whole and filled from a run's facts."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from bot.core.digest import CanonicalError, canonical_json, digest
from bot.core.gateway import ROLES
from bot.core.grants.contracts import GRANT_EFFECTS, PLACEHOLDERS, TOOL_CONTRACTS, GrantEffect, ToolContract


class TemplateError(ValueError):
    """A policy template (or a compilation) that cannot become a grant; ``problems`` are ``(path, message)``."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)
        super().__init__("; ".join(f"{path}: {message}" for path, message in self.problems))


_TEMPLATE_KEY_RE = re.compile(r"([a-z]+)\.([a-z][a-z0-9_-]{0,39})")
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True, slots=True)
class TemplateCall:
    """One templated call: its arguments are canonical JSON text that may hold ``{placeholder}`` strings."""

    tool: str
    effect: GrantEffect
    args_json: str

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "effect": self.effect, "args": json.loads(self.args_json)}


@dataclass(frozen=True, slots=True)
class PolicyTemplate:
    """A trusted policy for one ``role.action``: how long a grant lives and its ordered calls (teardown last)."""

    key: str
    expires_after_s: int
    calls: tuple[TemplateCall, ...]

    @classmethod
    def from_mapping(cls, key: str, data: Mapping[str, Any]) -> PolicyTemplate:
        """From config data (``{"expires_after_s": ..., "calls": [{"tool", "effect", "args"}]}``), deep-copied.

        Raises TemplateError naming each problem's path (``calls.2.effect``); see :func:`check_template`.
        """
        problems: list[tuple[str, str]] = []
        unknown = sorted(set(data) - {"expires_after_s", "calls"})
        problems.extend((name, "unknown key") for name in unknown)
        expires = data.get("expires_after_s", 3600)
        if type(expires) is not int or expires <= 0:
            problems.append(("expires_after_s", "expected a positive whole number of seconds"))
            expires = 1
        raw_calls = data.get("calls")
        calls: list[TemplateCall] = []
        if not isinstance(raw_calls, list | tuple):
            problems.append(("calls", "expected a list of calls"))
            raw_calls = []
        for index, raw in enumerate(raw_calls):
            where = f"calls.{index}"
            if not isinstance(raw, Mapping):
                problems.append((where, "expected a table {tool, effect, args}"))
                continue
            extra = sorted(set(raw) - {"tool", "effect", "args"})
            problems.extend((f"{where}.{name}", "unknown key") for name in extra)
            tool, effect, args = raw.get("tool"), raw.get("effect"), raw.get("args", {})
            if not isinstance(tool, str):
                problems.append((f"{where}.tool", "expected a tool name"))
                continue
            if effect not in GRANT_EFFECTS:
                problems.append((f"{where}.effect", f"expected one of {', '.join(GRANT_EFFECTS)}"))
                continue
            if not isinstance(args, Mapping):
                problems.append((f"{where}.args", "expected a table of arguments"))
                continue
            try:
                args_json = canonical_json(args)
            except CanonicalError as exc:
                problems.append((f"{where}.args", str(exc)))
                continue
            calls.append(TemplateCall(tool=tool, effect=effect, args_json=args_json))
        if problems:
            raise TemplateError(problems)
        template = cls(key=key, expires_after_s=expires, calls=tuple(calls))
        found = check_template(template)
        if found:
            raise TemplateError(found)
        return template

    def canonical(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "expires_after_s": self.expires_after_s,
            "calls": [c.to_dict() for c in self.calls],
        }

    @property
    def digest(self) -> str:
        """The policy digest a grant pins: over the template exactly as configured (placeholders unfilled)."""
        return digest(self.canonical())


_SAMPLE_FACTS: Final[Mapping[str, Any]] = MappingProxyType(
    {"issue": 1, "branch": "issue-1-sample", "worktree": "/checkout/branches/issue-1-sample", "owner": "sample-owner"}
)


def check_template(template: PolicyTemplate) -> list[tuple[str, str]]:
    """Every structural problem of a template, each with its path; empty when it can compile.

    The key is ``<role>.<action>`` with a roster role; at least one call; known tools with an effect their
    contract allows; exactly one ``teardown`` and it is the last call; only known placeholders; arguments that
    fit the tool's closed schema once placeholders are filled; ``plan_only`` entries that really are plans.
    """
    problems: list[tuple[str, str]] = []
    match = _TEMPLATE_KEY_RE.fullmatch(template.key)
    if match is None or match.group(1) not in ROLES:
        problems.append(("<key>", f"expected <role>.<action> with a role of {', '.join(ROLES)}"))
    if not template.calls:
        problems.append(("calls", "a template needs at least its teardown call"))
    for index, call in enumerate(template.calls):
        where = f"calls.{index}"
        contract = TOOL_CONTRACTS.get(call.tool)
        if contract is None:
            problems.append((f"{where}.tool", f"unknown tool; tools are {', '.join(sorted(TOOL_CONTRACTS))}"))
            continue
        if call.effect not in contract.effects:
            allowed = ", ".join(sorted(contract.effects))
            problems.append((f"{where}.effect", f"{call.tool} may only be {allowed}"))
        last = index == len(template.calls) - 1
        if call.effect == "teardown" and not last:
            problems.append((f"{where}.effect", "teardown is reserved for the last call"))
        if last and call.effect != "teardown":
            problems.append((f"{where}.effect", "the last call must be the reserved teardown"))
        problems.extend(call_problems(where, contract, call, json.loads(call.args_json), _SAMPLE_FACTS))
    return problems


def call_problems(
    where: str, contract: ToolContract, call: TemplateCall, args: Any, facts: Mapping[str, Any]
) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    filled = fill_placeholders(args, facts, f"{where}.args", problems)
    if problems:
        return problems
    problems.extend((f"{where}.args", p) for p in contract.check(filled))
    if call.effect == "plan_only":
        for name, wanted in contract.plan_only_requires.items():
            if name not in filled or canonical_json(filled[name]) != canonical_json(wanted):
                problems.append(
                    (f"{where}.args.{name}", f"a plan_only {call.tool} needs {name} = {json.dumps(wanted)}")
                )
    if contract.issue_scoped and filled.get("issue_number") != facts["issue"]:
        problems.append((f"{where}.args.issue_number", 'a run acts on its own issue only: use "{issue}"'))
    return problems


def fill_placeholders(value: Any, facts: Mapping[str, Any], where: str, problems: list[tuple[str, str]]) -> Any:
    """Replace placeholders in one pass (a filled value is never expanded again).

    A string that is exactly one placeholder takes the fact's own type (``"{issue}"`` becomes an integer);
    placeholders inside longer text are replaced by the fact's text. Any other brace is refused.
    """
    if isinstance(value, dict):
        return {k: fill_placeholders(v, facts, f"{where}.{k}", problems) for k, v in value.items()}
    if isinstance(value, list):
        return [fill_placeholders(v, facts, f"{where}[{i}]", problems) for i, v in enumerate(value)]
    if not isinstance(value, str) or ("{" not in value and "}" not in value):
        return value
    whole = _PLACEHOLDER_RE.fullmatch(value)
    if whole is not None and whole.group(1) in facts:
        return facts[whole.group(1)]
    unknown = [name for name in _PLACEHOLDER_RE.findall(value) if name not in facts]
    stray = _PLACEHOLDER_RE.sub("", value)
    if unknown or "{" in stray or "}" in stray:
        problems.append(
            (where, f"unknown placeholder; placeholders are {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
        )
        return value
    return _PLACEHOLDER_RE.sub(lambda m: str(facts[m.group(1)]), value)
