"""The sealed grant: a run's exact, ordered calls compiled from a template and pinned by digests."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from bot.core.digest import CanonicalError, canonical_json, digest, text_digest
from bot.core.grants.contracts import BROKER_PROTOCOL, CONTRACT_DIGEST, TOOL_CONTRACTS, GrantEffect
from bot.core.grants.templates import PolicyTemplate, TemplateError, call_problems, check_template, fill_placeholders


def format_time(moment: datetime) -> str:
    """Times inside grants: fixed-width UTC (text order is time order), as the database stores them."""
    if moment.tzinfo is None:
        raise ValueError("grant times must be timezone-aware")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class BoundWorktree:
    """The worktree a run is bound to, as the bootstrap registered it (its UUID derived from the registration)."""

    path: str
    uuid: str
    branch: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseBinding:
    """What a run is bound to: an issue of a repository and the lease on it (its owner, role, action and id)."""

    repo: str
    issue_number: int
    owner: str
    role: str
    action: str
    lease_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFacts(LeaseBinding):
    """The authoritative state a grant is compiled from: the issue's live lease and its registered worktree."""

    worktree: BoundWorktree

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
    effect: GrantEffect
    arguments_json: str

    @property
    def arguments_digest(self) -> str:
        return text_digest(self.arguments_json)

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
class Grant(LeaseBinding):
    """A sealed run grant. Built only by :func:`compile_grant` or :meth:`from_json`; checks itself on creation.

    ``digest`` is the grant digest: SHA-256 over the canonical body (everything else). Construction raises
    ``ValueError`` if the digest does not match, the positions are not 0..n-1, or the teardown is not exactly
    the last entry.
    """

    run_id: str
    policy_key: str
    policy_digest: str
    contract_digest: str
    host_id: str
    worktree: BoundWorktree
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
                worktree=BoundWorktree(path=worktree["path"], uuid=worktree["uuid"], branch=worktree["branch"]),
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
        found = call_problems(f"calls.{index}", contract, call, json.loads(call.args_json), values)
        problems.extend(found)
        if not found:
            filled = fill_placeholders(json.loads(call.args_json), values, f"calls.{index}.args", [])
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
    worktree: BoundWorktree = fields["worktree"]
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
