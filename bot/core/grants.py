"""Sealed run grants (pure): canonical JSON and digests, the tools' closed argument schemas, the grant compiler,
and the broker's admission state machine (admit, complete, abort, reconcile) over a run's recorded state.

Vocabulary (issue 8, seed 002 REQ 122). A *run* is one agent's work on one leased issue, bound to the worktree
the bootstrap registered (its UUID plays the seed's "VM UUID") and to the service's host identity. Trusted policy
(a template per ``role.action`` in config) compiles, from authoritative facts, into a :class:`Grant`: an ordered
list of exact calls whose last entry is the reserved teardown. The broker admits a proposed call only when it is
exactly the next entry; everything here is a function of (grant, run state, call, now, host identity) and never
touches a database, a clock or the network.

Invariants the functions below keep (and the tests pin):

- a grant is a deep, immutable value: its calls' arguments are canonical JSON *text*, handed out as fresh copies;
  it checks its own digest when built, so a changed stored grant cannot even be loaded;
- a denial never changes the run state; only an admission, a completion, an abort or a reconciliation does;
- a position is admitted at most once, so the teardown (the last position) runs at most once;
- once set, the run's outcome (``completed``, ``failed``, ``aborted``, ``expired``) is never replaced;
- results are data: nothing in a result is read except whether the call succeeded.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any, Final, Literal, get_args

from bot.core.digest import CanonicalError, canonical_json, canonicalize, digest
from bot.core.errors import Envelope
from bot.core.gateway import ROLES

BROKER_PROTOCOL: Final = "foreman-grants/1"

Effect = Literal["read", "plan_only", "mutate", "teardown"]
EFFECTS: Final[tuple[Effect, ...]] = get_args(Effect)

#: The only categories a broker refusal ever exposes (DESIGN.md section 3, "Run grants").
Category = Literal["grant_denied", "grant_expired", "host_mismatch", "inflight_unresolved", "broker_error"]
CATEGORIES: Final[tuple[Category, ...]] = get_args(Category)

#: Why a decision went the way it did: a closed set, recorded with every decision and safe to show.
Reason = Literal[
    "admitted",
    "accepted",
    "aborted",
    "reconciled",
    "run_mismatch",
    "grant_digest_mismatch",
    "policy_changed",
    "contract_changed",
    "run_closed",
    "host_mismatch",
    "host_changed",
    "inflight",
    "wrong_worktree",
    "unknown_tool",
    "invalid_arguments",
    "expired",
    "late_result",
    "changed_arguments",
    "repeated",
    "skipped",
    "out_of_order",
    "after_failure",
    "after_abort",
    "teardown_done",
    "plan_unfinished",
    "unknown_call",
    "broker_error",
]
REASONS: Final[tuple[Reason, ...]] = get_args(Reason)

RunOutcome = Literal["completed", "failed", "aborted", "expired"]
TeardownStatus = Literal["pending", "admitted", "done", "failed", "unresolved"]
PLACEHOLDERS: Final[tuple[str, ...]] = ("issue", "branch", "worktree", "owner")


# ============================================================================ grant times


def format_time(moment: datetime) -> str:
    """Times inside grants: fixed-width UTC (text order is time order), as the database stores them."""
    if moment.tzinfo is None:
        raise ValueError("grant times must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


# ============================================================================ the tools' closed schemas

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
    effects: frozenset[Effect]
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
    name: str, effects: set[Effect], args: dict[str, ArgSpec], plan_only_requires: dict[str, Any] | None = None
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
        "effects": list(EFFECTS),
        "placeholders": list(PLACEHOLDERS),
        "tools": {name: t.contract() for name, t in sorted(TOOL_CONTRACTS.items())},
    }


CONTRACT_DIGEST: Final[str] = digest(contract_document())


# ============================================================================ policy templates


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
    effect: Effect
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
            if effect not in EFFECTS:
                problems.append((f"{where}.effect", f"expected one of {', '.join(EFFECTS)}"))
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
        problems.extend(_call_problems(where, contract, call, json.loads(call.args_json), _SAMPLE_FACTS))
    return problems


def _call_problems(
    where: str, contract: ToolContract, call: TemplateCall, args: Any, facts: Mapping[str, Any]
) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    filled = _fill(args, facts, f"{where}.args", problems)
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


def _fill(value: Any, facts: Mapping[str, Any], where: str, problems: list[tuple[str, str]]) -> Any:
    """Replace placeholders in one pass (a filled value is never expanded again).

    A string that is exactly one placeholder takes the fact's own type (``"{issue}"`` becomes an integer);
    placeholders inside longer text are replaced by the fact's text. Any other brace is refused.
    """
    if isinstance(value, dict):
        return {k: _fill(v, facts, f"{where}.{k}", problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, facts, f"{where}[{i}]", problems) for i, v in enumerate(value)]
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


# ============================================================================ the grant


@dataclass(frozen=True, slots=True)
class WorktreeFacts:
    """The worktree a run is bound to, as the bootstrap registered it."""

    path: str
    uuid: str
    branch: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts:
    """The authoritative state a grant is compiled from: the issue's live lease and its registered worktree."""

    repo: str
    issue_number: int
    owner: str
    role: str
    action: str
    lease_id: str
    worktree: WorktreeFacts

    def placeholders(self) -> dict[str, Any]:
        return {
            "issue": self.issue_number,
            "branch": self.worktree.branch,
            "worktree": self.worktree.path,
            "owner": self.owner,
        }


@dataclass(frozen=True, slots=True)
class GrantCall:
    """One exact call of a grant. ``arguments_json`` is canonical JSON text: immutable, compared as text."""

    position: int
    tool: str
    effect: Effect
    arguments_json: str

    @property
    def arguments_digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.arguments_json.encode("utf-8")).hexdigest()

    def arguments(self) -> dict[str, Any]:
        """A fresh copy of the compiled arguments (mutating it changes nothing in the grant)."""
        value: dict[str, Any] = json.loads(self.arguments_json)
        return value

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "tool": self.tool,
            "effect": self.effect,
            "arguments": self.arguments(),
            "arguments_digest": self.arguments_digest,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Grant:
    """A sealed run grant. Built only by :func:`compile_grant` or :meth:`from_json`; checks itself on creation.

    ``digest`` is the grant digest: SHA-256 over the canonical body (everything else). Construction raises
    ``ValueError`` if the digest does not match, the positions are not 0..n-1, or the teardown is not exactly
    the last entry.
    """

    run_id: str
    repo: str
    issue_number: int
    owner: str
    role: str
    action: str
    lease_id: str
    policy_key: str
    policy_digest: str
    contract_digest: str
    host_id: str
    worktree: WorktreeFacts
    issued_at: datetime
    expires_at: datetime
    calls: tuple[GrantCall, ...]
    digest: str

    def __post_init__(self) -> None:
        if not self.calls or [c.position for c in self.calls] != list(range(len(self.calls))):
            raise ValueError("grant calls must be numbered 0..n-1")
        effects = [c.effect for c in self.calls]
        if effects[-1] != "teardown" or effects.count("teardown") != 1:
            raise ValueError("a grant has exactly one teardown, its last call")
        if self.expires_at <= self.issued_at:
            raise ValueError("a grant expires after it is issued")
        if digest(self.body()) != self.digest:
            raise ValueError("grant digest does not match its contents")

    @property
    def teardown(self) -> GrantCall:
        return self.calls[-1]

    @property
    def teardown_position(self) -> int:
        return len(self.calls) - 1

    def body(self) -> dict[str, Any]:
        """Everything the digest covers."""
        return _body_of({name: getattr(self, name) for name in _BODY_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """The body, each call's argument digest and the grant digest (what ``foreman grants`` shows)."""
        out = self.body()
        out["calls"] = [c.to_dict() for c in self.calls]
        out["grant_digest"] = self.digest
        return out

    def canonical(self) -> str:
        """The stored form: canonical JSON of the body plus the digest."""
        return canonical_json({**self.body(), "grant_digest": self.digest})

    @classmethod
    def from_json(cls, text: str) -> Grant:
        """Load a stored grant; ``ValueError`` if it is malformed or its digest does not match."""
        try:
            doc = json.loads(text)
            worktree = doc["worktree"]
            calls = tuple(
                GrantCall(
                    position=c["position"],
                    tool=c["tool"],
                    effect=c["effect"],
                    arguments_json=canonical_json(c["arguments"]),
                )
                for c in doc["calls"]
            )
            if doc.get("protocol") != BROKER_PROTOCOL:
                raise ValueError(f"unknown grant protocol {doc.get('protocol')!r}")
            return cls(
                run_id=doc["run_id"],
                repo=doc["repo"],
                issue_number=doc["issue_number"],
                owner=doc["owner"],
                role=doc["role"],
                action=doc["action"],
                lease_id=doc["lease_id"],
                policy_key=doc["policy"]["key"],
                policy_digest=doc["policy"]["digest"],
                contract_digest=doc["contract_digest"],
                host_id=doc["host_id"],
                worktree=WorktreeFacts(path=worktree["path"], uuid=worktree["uuid"], branch=worktree["branch"]),
                issued_at=parse_time(doc["issued_at"]),
                expires_at=parse_time(doc["expires_at"]),
                calls=calls,
                digest=doc["grant_digest"],
            )
        except (KeyError, TypeError, CanonicalError, json.JSONDecodeError) as exc:
            raise ValueError(f"malformed grant: {exc}") from exc


_RUN_ID_RE = re.compile(r"run-[0-9a-f]{32}")


def compile_grant(template: PolicyTemplate, facts: RunFacts, *, run_id: str, host_id: str, now: datetime) -> Grant:
    """Compile and seal: fill the template from authoritative facts, check every call against its tool's closed
    schema, and pin run id, digests, host identity, expiry and the bound worktree UUID.

    Raises TemplateError naming every problem. The template and facts are copied, never referenced.
    """
    problems = list(check_template(template))
    if template.key != f"{facts.role}.{facts.action}":
        problems.append(("<key>", f"the run's lease is {facts.role}.{facts.action}, not {template.key}"))
    if not _RUN_ID_RE.fullmatch(run_id):
        problems.append(("run_id", "expected run-<32 hex digits>"))
    for name, value in (
        ("host_id", host_id),
        ("worktree.uuid", facts.worktree.uuid),
        ("worktree.path", facts.worktree.path),
        ("worktree.branch", facts.worktree.branch),
        ("owner", facts.owner),
        ("lease_id", facts.lease_id),
        ("repo", facts.repo),
    ):
        if not value.strip():
            problems.append((name, "must not be empty"))
    if type(facts.issue_number) is not int or facts.issue_number < 1:
        problems.append(("issue_number", "expected a positive integer"))
    if problems:
        raise TemplateError(problems)
    values = facts.placeholders()
    calls: list[GrantCall] = []
    for index, call in enumerate(template.calls):
        contract = TOOL_CONTRACTS[call.tool]
        found = _call_problems(f"calls.{index}", contract, call, json.loads(call.args_json), values)
        problems.extend(found)
        if not found:
            filled = _fill(json.loads(call.args_json), values, f"calls.{index}.args", [])
            calls.append(
                GrantCall(position=index, tool=call.tool, effect=call.effect, arguments_json=canonical_json(filled))
            )
    if problems:
        raise TemplateError(problems)
    expires_at = now + timedelta(seconds=template.expires_after_s)
    fields: dict[str, Any] = {
        "run_id": run_id,
        "repo": facts.repo,
        "issue_number": facts.issue_number,
        "owner": facts.owner,
        "role": facts.role,
        "action": facts.action,
        "lease_id": facts.lease_id,
        "policy_key": template.key,
        "policy_digest": template.digest,
        "contract_digest": CONTRACT_DIGEST,
        "host_id": host_id,
        "worktree": facts.worktree,
        "issued_at": parse_time(format_time(now)),
        "expires_at": parse_time(format_time(expires_at)),
        "calls": tuple(calls),
    }
    unsealed = _body_of(fields)
    return Grant(**fields, digest=digest(unsealed))


_BODY_FIELDS: Final = (
    "run_id",
    "repo",
    "issue_number",
    "owner",
    "role",
    "action",
    "lease_id",
    "policy_key",
    "policy_digest",
    "contract_digest",
    "host_id",
    "worktree",
    "issued_at",
    "expires_at",
    "calls",
)


def _body_of(fields: Mapping[str, Any]) -> dict[str, Any]:
    # One function for a grant's body, used before the grant exists (to seal it) and after (to check it).
    worktree: WorktreeFacts = fields["worktree"]
    calls: tuple[GrantCall, ...] = fields["calls"]
    return {
        "protocol": BROKER_PROTOCOL,
        "run_id": fields["run_id"],
        "repo": fields["repo"],
        "issue_number": fields["issue_number"],
        "owner": fields["owner"],
        "role": fields["role"],
        "action": fields["action"],
        "lease_id": fields["lease_id"],
        "policy": {"key": fields["policy_key"], "digest": fields["policy_digest"]},
        "contract_digest": fields["contract_digest"],
        "host_id": fields["host_id"],
        "worktree": {"path": worktree.path, "uuid": worktree.uuid, "branch": worktree.branch},
        "issued_at": format_time(fields["issued_at"]),
        "expires_at": format_time(fields["expires_at"]),
        "calls": [
            {"position": c.position, "tool": c.tool, "effect": c.effect, "arguments": c.arguments()} for c in calls
        ],
    }


# ============================================================================ run state and decisions


@dataclass(frozen=True, slots=True)
class InFlight:
    """A call admitted and not settled yet. ``host_changed``: its completion arrived on another host identity,
    so its result was refused and it stays unresolved until independently reconciled."""

    call_id: str
    position: int
    admitted_at: datetime
    host_id: str
    host_changed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "position": self.position,
            "admitted_at": format_time(self.admitted_at),
            "host_id": self.host_id,
            "host_changed": self.host_changed,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> InFlight:
        return cls(
            call_id=doc["call_id"],
            position=doc["position"],
            admitted_at=parse_time(doc["admitted_at"]),
            host_id=doc["host_id"],
            host_changed=bool(doc.get("host_changed", False)),
        )


@dataclass(frozen=True, slots=True)
class RunState:
    """Where a run's plan stands. ``version`` is the stored row's version (conditional writes compare it)."""

    run_id: str
    next_position: int = 0
    inflight: InFlight | None = None
    outcome: RunOutcome | None = None
    teardown: TeardownStatus = "pending"
    version: int = 0

    @property
    def closed(self) -> bool:
        """The teardown ran (or is known never to run here again): nothing is admitted any more."""
        return self.teardown in ("done", "failed", "unresolved")

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "next_position": self.next_position,
            "inflight": self.inflight.to_dict() if self.inflight else None,
            "outcome": self.outcome,
            "teardown": self.teardown,
            "closed": self.closed,
            "version": self.version,
        }


@dataclass(frozen=True, slots=True)
class ProposedCall:
    """A call as proposed (by the model), snapshotted: canonical argument text, or None when it has none.

    ``worktree_uuid`` is the UUID the edge resolved, just now, for the run's worktree (None: none registered).
    """

    tool: str
    arguments_json: str | None
    worktree_uuid: str | None

    @classmethod
    def of(cls, tool: object, arguments: object, *, worktree_uuid: str | None) -> ProposedCall:
        try:
            text = canonical_json(arguments if arguments is not None else {})
        except CanonicalError:
            text = None
        return cls(tool=tool if isinstance(tool, str) else repr(tool), arguments_json=text, worktree_uuid=worktree_uuid)


@dataclass(frozen=True, slots=True)
class Pins:
    """What the edge knows independently of the stored grant: the run its token names, the grant digest
    recorded for that run, the policy digest of the template in force (None: not checked) and this code's
    contract digest."""

    run_id: str
    grant_digest: str
    policy_digest: str | None
    contract_digest: str = CONTRACT_DIGEST


VerdictKind = Literal["admit", "complete", "abort", "reconcile"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One broker decision. ``state`` is the run state after it (the same object when nothing changed).

    ``call``: the grant entry concerned (admitted, completed, or matched); ``expected``: the entry that would be
    admitted next (for the refusal's next action). ``settles``: the in-flight call was settled by this decision.
    ``unresolved_uuid``: a worktree this host must not clean up (teardown refused on a foreign host).
    """

    kind: VerdictKind
    ok: bool
    reason: Reason
    state: RunState
    category: Category | None = None
    call: GrantCall | None = None
    expected: GrantCall | None = None
    call_id: str | None = None
    inert: bool = False
    settles: bool = False
    unresolved_uuid: str | None = None

    def __post_init__(self) -> None:
        if self.ok != (self.category is None):
            raise ValueError("a verdict has a category exactly when it refuses")
        if self.reason not in REASONS:
            raise ValueError(f"unknown reason {self.reason!r}")


def _deny(
    kind: VerdictKind,
    state: RunState,
    category: Category,
    reason: Reason,
    *,
    call: GrantCall | None = None,
    expected: GrantCall | None = None,
    call_id: str | None = None,
    unresolved_uuid: str | None = None,
) -> Verdict:
    return Verdict(
        kind=kind,
        ok=False,
        reason=reason,
        state=state,
        category=category,
        call=call,
        expected=expected,
        call_id=call_id,
        unresolved_uuid=unresolved_uuid,
    )


def expected_call(grant: Grant, state: RunState, now: datetime) -> GrantCall | None:
    """The one entry admissible next (ignoring in-flight and host): the next plan step while the run goes on;
    the reserved teardown once the plan is done, failed, aborted or expired; nothing once the teardown ran."""
    if state.teardown != "pending":
        return None
    if closing_outcome(grant, state, now) is not None:
        return grant.teardown
    return grant.calls[state.next_position]


def closing_outcome(grant: Grant, state: RunState, now: datetime) -> RunOutcome | None:
    """The recorded outcome, or ``expired`` when the grant ran out before the plan finished."""
    if state.outcome is not None:
        return state.outcome
    return "expired" if now >= grant.expires_at else None


def _pin_problem(grant: Grant, state: RunState, pins: Pins | None) -> Reason | None:
    if state.run_id != grant.run_id:
        return "run_mismatch"
    if pins is None:
        return None
    if pins.run_id != grant.run_id:
        return "run_mismatch"
    if pins.grant_digest != grant.digest:
        return "grant_digest_mismatch"
    if pins.policy_digest is not None and pins.policy_digest != grant.policy_digest:
        return "policy_changed"
    if pins.contract_digest != grant.contract_digest:
        return "contract_changed"
    return None


def admit(
    grant: Grant,
    state: RunState,
    call: ProposedCall,
    *,
    now: datetime,
    host_id: str,
    call_id: str,
    pins: Pins | None = None,
) -> Verdict:
    """Admit ``call`` only if it is exactly the grant's next entry; every check runs before the tool would.

    Checks, in order (the first failing one decides): pins (run id, grant/policy/contract digests); run closed;
    host identity; an unresolved in-flight call; the bound worktree UUID; tool and closed-schema arguments;
    expiry (not for the teardown); then the sequence: a call equal to the expected entry is admitted, anything
    else is refused as changed, repeated, skipped or out of order (or after a failure or abort).
    An admission moves the run to "in flight" for ``call_id``; a refusal leaves the state untouched.
    """
    expected = expected_call(grant, state, now)
    pin = _pin_problem(grant, state, pins)
    if pin is not None:
        return _deny("admit", state, "grant_denied", pin)
    if state.closed:
        return _deny("admit", state, "grant_denied", "run_closed")
    matches = _matches(grant, call)
    is_teardown = expected is not None and expected.effect == "teardown" and expected in matches
    if host_id != grant.host_id:
        unresolved = grant.worktree.uuid if (is_teardown or grant.teardown in matches) else None
        return _deny("admit", state, "host_mismatch", "host_mismatch", expected=expected, unresolved_uuid=unresolved)
    if state.inflight is not None:
        return _deny("admit", state, "inflight_unresolved", "inflight", expected=expected)
    if call.worktree_uuid != grant.worktree.uuid:
        unresolved = grant.worktree.uuid if grant.teardown in matches else None
        return _deny("admit", state, "grant_denied", "wrong_worktree", expected=expected, unresolved_uuid=unresolved)
    contract = TOOL_CONTRACTS.get(call.tool)
    if contract is None or all(c.tool != call.tool for c in grant.calls):
        return _deny("admit", state, "grant_denied", "unknown_tool", expected=expected)
    if call.arguments_json is None or contract.check(json.loads(call.arguments_json)):
        return _deny("admit", state, "grant_denied", "invalid_arguments", expected=expected)
    if expected is None:
        return _deny("admit", state, "grant_denied", "teardown_done")
    outcome = closing_outcome(grant, state, now)
    if outcome == "expired" and not is_teardown:
        return _deny("admit", state, "grant_expired", "expired", expected=expected)
    if expected in matches:
        admitted_state = replace(
            state,
            inflight=InFlight(call_id=call_id, position=expected.position, admitted_at=now, host_id=host_id),
            teardown="admitted" if expected.effect == "teardown" else state.teardown,
            outcome=outcome if expected.effect == "teardown" else state.outcome,
        )
        return Verdict(
            kind="admit",
            ok=True,
            reason="admitted",
            state=admitted_state,
            call=expected,
            expected=expected,
            call_id=call_id,
            inert=expected.effect == "plan_only",
        )
    return _deny(
        "admit",
        state,
        "grant_denied",
        _sequence_reason(grant, state, call, matches, expected, outcome),
        expected=expected,
        call=matches[0] if matches else None,
    )


def _matches(grant: Grant, call: ProposedCall) -> list[GrantCall]:
    return [c for c in grant.calls if c.tool == call.tool and c.arguments_json == call.arguments_json]


def _sequence_reason(
    grant: Grant,
    state: RunState,
    call: ProposedCall,
    matches: list[GrantCall],
    expected: GrantCall,
    outcome: RunOutcome | None,
) -> Reason:
    if outcome == "failed":
        return "after_failure"
    if outcome == "aborted":
        return "after_abort"
    if outcome == "completed" and matches and matches[0].position < grant.teardown_position:
        return "repeated"
    if matches:
        # Ahead of the plan: skipping (the teardown too, while the plan is unfinished); behind it: repeating.
        if any(m.position < state.next_position for m in matches):
            return "repeated"
        return "skipped"
    if call.tool == expected.tool:
        return "changed_arguments"
    return "out_of_order"


def complete(grant: Grant, state: RunState, *, call_id: str, ok: bool, now: datetime, host_id: str) -> Verdict:
    """Settle the in-flight call ``call_id`` with its result (``ok``: the tool succeeded).

    Host identity and expiry are checked again: a result arriving on another host is refused and the call stays
    unresolved (``host_changed``); a result after expiry (or after an abort) settles the call but is refused and
    does not advance the plan. An accepted success advances one step (reaching the teardown completes the plan);
    an accepted failure records ``failed`` (only the teardown remains; the step is never retried). The teardown's
    own result closes the run either way: it ran once.
    """
    inflight = state.inflight
    if inflight is None or inflight.call_id != call_id:
        return _deny("complete", state, "grant_denied", "unknown_call", call_id=call_id)
    entry = grant.calls[inflight.position]
    if inflight.host_changed:
        return _deny("complete", state, "inflight_unresolved", "host_changed", call=entry, call_id=call_id)
    is_teardown = entry.effect == "teardown"
    if host_id != grant.host_id or host_id != inflight.host_id:
        kept = replace(state, inflight=replace(inflight, host_changed=True))
        return _deny(
            "complete",
            kept,
            "host_mismatch",
            "host_changed",
            call=entry,
            call_id=call_id,
            unresolved_uuid=grant.worktree.uuid,
        )
    settled = replace(state, inflight=None)
    if not is_teardown and now >= grant.expires_at:
        late = replace(settled, outcome=state.outcome or "expired")
        return Verdict(
            kind="complete",
            ok=False,
            reason="late_result",
            state=late,
            category="grant_expired",
            call=entry,
            call_id=call_id,
            settles=True,
        )
    if not is_teardown and state.outcome is not None:
        return Verdict(
            kind="complete",
            ok=False,
            reason="after_abort",
            state=settled,
            category="grant_denied",
            call=entry,
            call_id=call_id,
            settles=True,
        )
    if is_teardown:
        after = replace(settled, teardown="done" if ok else "failed")
        return Verdict(
            kind="complete",
            ok=True,
            reason="accepted",
            state=after,
            call=entry,
            call_id=call_id,
            settles=True,
            unresolved_uuid=None if ok else grant.worktree.uuid,
        )
    if ok:
        position = state.next_position + 1
        outcome: RunOutcome | None = "completed" if position == grant.teardown_position else None
        after = replace(settled, next_position=position, outcome=outcome)
    else:
        after = replace(settled, outcome="failed")
    return Verdict(
        kind="complete",
        ok=True,
        reason="accepted",
        state=after,
        call=entry,
        call_id=call_id,
        inert=entry.effect == "plan_only",
        settles=True,
    )


def abort(grant: Grant, state: RunState, *, now: datetime) -> Verdict:
    """Abort (or cancel) the run: record ``aborted`` unless an outcome is already recorded, and keep any
    in-flight call. The teardown is then admissible once nothing is in flight (``inflight_unresolved`` until
    the call settles or is reconciled)."""
    if state.closed:
        return _deny("abort", state, "grant_denied", "run_closed")
    after = replace(state, outcome=state.outcome or closing_outcome(grant, state, now) or "aborted")
    if state.inflight is not None:
        return Verdict(
            kind="abort",
            ok=True,
            reason="aborted",
            state=after,
            call=grant.calls[state.inflight.position],
            call_id=state.inflight.call_id,
            expected=grant.teardown,
        )
    return Verdict(kind="abort", ok=True, reason="aborted", state=after, expected=grant.teardown)


def reconcile(grant: Grant, state: RunState, *, call_id: str, now: datetime) -> Verdict:
    """Independent reconciliation by an operator of an in-flight call whose result will never arrive here.

    Allowed only once the run is no longer going on (aborted, failed, expired) or the call's completion was seen
    on another host. The call is settled without a result: it never advances the plan. A reconciled teardown
    leaves the worktree ``unresolved`` (it is reported, and never torn down again by the broker).
    """
    inflight = state.inflight
    if inflight is None or inflight.call_id != call_id:
        return _deny("reconcile", state, "grant_denied", "unknown_call", call_id=call_id)
    if closing_outcome(grant, state, now) is None and not inflight.host_changed:
        return _deny("reconcile", state, "grant_denied", "plan_unfinished", call_id=call_id)
    entry = grant.calls[inflight.position]
    if entry.effect == "teardown":
        after = replace(state, inflight=None, teardown="unresolved")
        return Verdict(
            kind="reconcile",
            ok=True,
            reason="reconciled",
            state=after,
            call=entry,
            call_id=call_id,
            settles=True,
            unresolved_uuid=grant.worktree.uuid,
        )
    after = replace(state, inflight=None, outcome=closing_outcome(grant, state, now) or "aborted")
    return Verdict(
        kind="reconcile", ok=True, reason="reconciled", state=after, call=entry, call_id=call_id, settles=True
    )


# ============================================================================ refusals and summaries

_MESSAGES: Final[Mapping[Category, str]] = MappingProxyType(
    {
        "grant_denied": "the run's sealed grant does not admit this call now",
        "grant_expired": "the run's grant has expired",
        "host_mismatch": "this host is not the host the run's grant is bound to",
        "inflight_unresolved": "an earlier call of this run has not settled yet",
        "broker_error": "the run broker could not decide; nothing was run and the run's outcome is unchanged",
    }
)


def refusal(verdict: Verdict, run_id: str) -> dict[str, Any]:
    """The error envelope of a refused verdict: the bounded category, a fixed message and a next action.

    Nothing from the proposed call or its result is echoed back. ``details`` carries the run id and the
    reason (both from closed sets or the grant), plus the unresolved worktree UUID when teardown was refused.
    """
    category = verdict.category
    if category is None:
        raise ValueError("an accepted verdict has no refusal")
    return broker_refusal(
        category, run_id, reason=verdict.reason, expected=verdict.expected, unresolved_uuid=verdict.unresolved_uuid
    )


def broker_refusal(
    category: Category,
    run_id: str,
    *,
    reason: Reason = "broker_error",
    expected: GrantCall | None = None,
    unresolved_uuid: str | None = None,
) -> dict[str, Any]:
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}")
    if category == "grant_denied" and expected is not None:
        remediate = "make exactly the next call of the grant; the grant cannot be changed, extended or replayed"
        next_action = f"call {expected.tool} with exactly {expected.arguments_json}"
    elif category == "inflight_unresolved":
        remediate = "wait for the earlier call to finish; an operator reconciles a call that never finishes"
        next_action = "wait for the pending call's result, then make the next call of the grant"
    elif category == "broker_error":
        remediate = "retry the same call later; an operator can inspect the run with `foreman grants`"
        next_action = "retry the same call once; if it is refused again, stop and report the run id"
    else:
        remediate = "this run cannot go on; an operator inspects it with `foreman grants`"
        next_action = "stop and report the run id to the operator"
    details: dict[str, Any] = {"run_id": run_id}
    if category != "broker_error":
        details["reason"] = reason
    if unresolved_uuid is not None:
        details["unresolved_worktree_uuid"] = unresolved_uuid
    envelope = Envelope(
        error=category, message=_MESSAGES[category], remediate=remediate, exact_next_action=next_action, details=details
    )
    return envelope.to_dict()


def mark_inert(result: Mapping[str, Any], *, run_id: str, position: int) -> dict[str, Any]:
    """A plan-only result as handed back: the result under ``plan``, flagged inert (never executed by anyone)."""
    return {
        "inert": True,
        "run_id": run_id,
        "position": position,
        "plan": canonicalize(result),
        "note": "plan-only result: recorded by the broker and never executed; commands in it are text",
    }


def summarize(grant: Grant, state: RunState) -> dict[str, Any]:
    """The run's grant and where it ended, for an evidence comment."""
    return {
        "run_id": grant.run_id,
        "policy": grant.policy_key,
        "grant_digest": grant.digest,
        "policy_digest": grant.policy_digest,
        "contract_digest": grant.contract_digest,
        "worktree_uuid": grant.worktree.uuid,
        "steps_done": min(state.next_position, grant.teardown_position),
        "steps": grant.teardown_position,
        "outcome": state.outcome,
        "teardown": state.teardown,
    }


def run_end_summary(grant: Grant, state: RunState, *, denied: int = 0) -> str:
    """One human paragraph for the evidence comment posted when a run closes (its teardown ran, failed or was
    reconciled). Built from the grant and the recorded state only; nothing a model or a tool returned."""
    done = min(state.next_position, grant.teardown_position)
    outcome = state.outcome or "ended"
    text = (
        f"Run {grant.run_id} ({grant.policy_key}) of {grant.owner} on #{grant.issue_number} ended {outcome}: "
        f"{done} of {grant.teardown_position} granted calls were accepted"
    )
    if denied:
        text += f", {denied} proposed call{'s were' if denied != 1 else ' was'} denied by the run broker"
    if state.teardown == "done":
        text += f", and the reserved teardown ({grant.teardown.tool}) ran once on worktree {grant.worktree.uuid}."
    else:
        text += (
            f"; the reserved teardown ({grant.teardown.tool}) is {state.teardown}, so worktree "
            f"{grant.worktree.uuid} is reported unresolved for an operator."
        )
    return text + " The sealed grant and every decision are listed by `foreman grants " + grant.run_id + "`."
