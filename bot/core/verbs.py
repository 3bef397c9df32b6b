"""The one verb table: gateway preconditions, MCP tool names, comment commands, docs and tests read it."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]  # (no stubs installed; the project adds none)

from bot.core.canonical import FIELD_KEYS
from bot.core.gateway import ROLES, Decision, GatewayContext, Precondition, Role, evaluate_preconditions
from bot.core.jsontext import JSONTextError, strict_loads
from bot.core.vocabulary import MAX_ISSUE_NUMBER, STATES
from bot.core.vocabulary import ROLES as VOCABULARY_ROLES

# ruff's S106 reads "missing_token" as a password argument; it names a missing artifact (seed 001).

Effect = Literal["read", "mutate"]
Gate = Precondition[GatewayContext]
#: How an argument is typed: each kind is one JSON Schema (``Param.schema``), published and enforced alike. The edge
#: that uses a value may still refuse what no schema can say (a calendar date, a duplicate issue number).
ParamKind = Literal[
    "issue_number",
    "issue_numbers",
    "candidates",
    "boolean",
    "login",
    "text",
    "sha",
    "fingerprint",
    "key",
    "choice",
    "state",
]

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


# --------------------------------------------------------------------------- argument schemas (issue 12 item 8)
#
# One definition is the truth: each argument's JSON Schema (Draft 2020-12) is what the MCP tool publishes and
# what every call is validated against (``Param.accept``), whatever the transport. Patterns are written so that
# a stock validator reads them alike in Python and ECMA-262: ``$(?!\n)`` is the end of the string (Python's
# ``$`` also matches before a final newline), and no string accepts a lone surrogate (``\uD800-\uDFFF``).

_NO_SURROGATE = r"\uD800-\uDFFF"
_LOGIN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,39}"
_SHA = r"[0-9a-f]{40}(?:[0-9a-f]{24})?"
_FINGERPRINT = r"[0-9a-f]{64}"
_KEY = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}"  # as bot.core.bootstrap accepts them
#: One line (no CR or LF) with at least one non-space character.
_TEXT = rf"[^\S\r\n]*[^\s{_NO_SURROGATE}][^\r\n{_NO_SURROGATE}]*"
#: One stripped, non-empty line (a Canonical Issue State field).
_LINE = rf"[^\s{_NO_SURROGATE}](?:[^\r\n{_NO_SURROGATE}]*[^\s{_NO_SURROGATE}])?"
#: NEXT_PROMPT: LF line breaks, no trailing whitespace on a line, no leading or trailing blank line; may be empty.
_PROMPT_LINE = rf"[^\r\n{_NO_SURROGATE}]*[^\s{_NO_SURROGATE}]"
_PROMPT = rf"(?:{_PROMPT_LINE}(?:\n+{_PROMPT_LINE})*)?"
_ANY_TEXT = rf"[^{_NO_SURROGATE}]*"
_RFC3339 = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})"
_STATE_KEY = r"[A-Z][A-Z0-9_]*"

#: Bounds every schema states (so a long string or a huge array is refused by the schema itself).
MAX_CANDIDATES = 1000
MAX_EXCLUSIONS = 1000
MAX_LIST = 50  # labels, depends_on, related_prs of one record
MAX_JSON_TEXT = 1_000_000
MAX_LINE = 2000
MAX_PROMPT = 20_000


def _pattern(body: str) -> str:
    return f"^(?:{body})$(?!\\n)"


def _string(body: str, max_length: int, min_length: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "string"}
    if min_length:
        out["minLength"] = min_length
    out["maxLength"] = max_length
    out["pattern"] = _pattern(body)
    return out


_ISSUE_SCHEMA: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": MAX_ISSUE_NUMBER}


def _array(items: dict[str, Any], max_items: int, **more: Any) -> dict[str, Any]:
    return {"type": "array", "maxItems": max_items, **more, "items": items}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "type": [schema["type"], "null"]}


_CANDIDATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "issue_number": _ISSUE_SCHEMA,
        "number": {**_ISSUE_SCHEMA, "description": "alias of issue_number"},
        "title": _nullable(_string(_ANY_TEXT, MAX_LINE)),
        "labels": _nullable(_array(_string(_ANY_TEXT, 200, min_length=1), MAX_LIST)),
        "created_at": {**_nullable(_string(_RFC3339, 64)), "description": "RFC 3339 with an offset"},
        "depends_on": _nullable(_array(_ISSUE_SCHEMA, MAX_LIST)),
        "ready": {"type": ["boolean", "null"]},
    },
    "anyOf": [{"required": ["issue_number"]}, {"required": ["number"]}],
    "additionalProperties": False,
}
_CANDIDATES_ARRAY: dict[str, Any] = _array(_CANDIDATE_SCHEMA, MAX_CANDIDATES)
_FIELD_SCHEMAS: dict[str, dict[str, Any]] = {
    "state": {"type": "string", "enum": [row.state for row in STATES]},
    "who_is_next": {"type": "string", "enum": [row.role for row in VOCABULARY_ROLES]},
    "next_prompt": _string(_PROMPT, MAX_PROMPT),
    "related_prs": _array(_ISSUE_SCHEMA, MAX_LIST, uniqueItems=True),
    "last_updated_by": {**_string(_ANY_TEXT, MAX_LINE), "description": "ignored: always the calling identity"},
}
_STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "a Canonical Issue State in snake_case (as gitea_get_issue_state returns it); "
        "last_updated_by is always set to the calling identity"
    ),
    "properties": {
        **{key.lower(): _FIELD_SCHEMAS.get(key.lower(), _string(_LINE, MAX_LINE)) for key in FIELD_KEYS},
        "extra": {
            "type": "object",
            "maxProperties": MAX_LIST,
            "propertyNames": {**_string(_STATE_KEY, 100), "not": {"enum": list(FIELD_KEYS)}},
            "additionalProperties": _string(f"(?:{_LINE})?", MAX_LINE),
        },
    },
    "required": [key.lower() for key in FIELD_KEYS if key != "LAST_UPDATED_BY"],
    "additionalProperties": False,
}

#: What a hostile value is refused for before any schema keyword looks at it. Each limit lies beyond every value
#: the schemas accept (nesting depth 4, 110k values, int64, finite numbers, strings up to MAX_JSON_TEXT), so the
#: screen changes no verdict; it only keeps validation bounded (no str() of a 5,000-digit integer, no recursion).
_SCREEN_DEPTH = 16
_SCREEN_NODES = 250_000
_SCREEN_INT_BITS = 64
_SCREEN_STRING = MAX_JSON_TEXT  # the longest maxLength of any string here


def screen(value: object) -> str | None:
    """Why ``value`` cannot be a JSON argument any schema here accepts (too deep, too big, not JSON), or None."""
    stack: list[tuple[object, int]] = [(value, 0)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > _SCREEN_NODES:
            return f"too large (more than {_SCREEN_NODES} values)"
        if depth > _SCREEN_DEPTH:
            return f"nested more than {_SCREEN_DEPTH} levels deep"
        if node is None or isinstance(node, bool):
            continue
        if isinstance(node, int):
            if node.bit_length() > _SCREEN_INT_BITS:
                return "an integer out of range"
        elif isinstance(node, float):
            if not math.isfinite(node):
                return "NaN and Infinity are not JSON numbers"
        elif isinstance(node, str):
            if len(node) > _SCREEN_STRING:
                return "a string far too long"
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str) or len(key) > _SCREEN_STRING:
                    return "an object key that is not a JSON string"
                stack.append((item, depth + 1))
        else:
            return f"not a JSON value ({type(node).__name__})"
    return None


def decode_json_text(text: str) -> tuple[object, str | None]:
    """RFC 8259 JSON text: (its value, None), or (None, why not): malformed, NaN/Infinity, a repeated key."""
    try:
        return strict_loads(text), None
    except JSONTextError as exc:
        return None, "JSON text nested too deeply" if exc.kind == "too_deep" else f"not JSON text ({str(exc)[:120]})"


def _integers(value: object) -> object:
    """``value`` with every number as an int (run on schema-valid values only, where a number is an integer)."""
    if isinstance(value, float):
        return int(value)
    if isinstance(value, list):
        return [_integers(item) for item in value]
    if isinstance(value, dict):
        return {key: _integers(item) for key, item in value.items()}
    return value


def _where(path: Sequence[object]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


_KIND_PROBLEMS: dict[str, str] = {
    "issue_number": f"expected an issue number: an integer from 1 to {MAX_ISSUE_NUMBER}",
    "issue_numbers": f"expected an array of at most {MAX_EXCLUSIONS} issue numbers (integers, not JSON text)",
    "candidates": "expected an array of candidate objects, one object, or their JSON text",
    "boolean": "expected true or false",
    "login": "expected a Gitea login (no leading @)",
    "sha": "expected a full commit SHA in lower-case hex",
    "fingerprint": "expected the dry run's fingerprint (64 lower-case hex digits)",
    "key": "expected 1-100 of [A-Za-z0-9._:-], alphanumeric first",
    "state": "expected a Canonical Issue State object",
}


def _first_error(validator: jsonschema.protocols.Validator, value: object) -> jsonschema.ValidationError | None:
    """The first problem a validator finds (schemas list ``maxItems``/``maxLength`` before the keywords that look
    at every element, so an oversized value is refused without walking it)."""
    error = next(iter(validator.iter_errors(value)), None)
    return None if error is None else jsonschema.exceptions.best_match([error])


@cache
def _validators(param: Param) -> tuple[jsonschema.protocols.Validator, jsonschema.protocols.Validator | None]:
    """The Draft 2020-12 validator of the argument's schema, and of its JSON text's ``contentSchema`` if any."""
    schema = param.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    content = next((b["contentSchema"] for b in schema.get("anyOf", []) if "contentSchema" in b), None)
    return (
        jsonschema.Draft202012Validator(schema),
        jsonschema.Draft202012Validator(content) if content is not None else None,
    )


@dataclass(frozen=True, slots=True)
class Param:
    """One argument of a verb: its JSON Schema (published as the MCP tool's input schema, and the one definition
    every call is checked against) and the problem message a refusal names."""

    name: str
    kind: ParamKind
    description: str
    required: bool = False
    default: object = None
    choices: tuple[str, ...] = ()
    max_length: int = 200

    def __post_init__(self) -> None:
        if self.kind == "choice" and not self.choices:
            raise ValueError(f"{self.name}: a choice needs choices")
        if self.required and self.default is not None:
            raise ValueError(f"{self.name}: a required argument has no default")

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the value (``null`` is not a value: an argument is sent or left out)."""
        kind = self.kind
        out: dict[str, Any]
        if kind == "issue_number":
            out = dict(_ISSUE_SCHEMA)
        elif kind == "issue_numbers":
            out = _array(_ISSUE_SCHEMA, MAX_EXCLUSIONS)
        elif kind == "candidates":
            out = {
                "anyOf": [
                    _CANDIDATES_ARRAY,
                    _CANDIDATE_SCHEMA,
                    {
                        **_string(_ANY_TEXT, MAX_JSON_TEXT),
                        "description": "the same array or object as JSON text",
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [_CANDIDATES_ARRAY, _CANDIDATE_SCHEMA]},
                    },
                ]
            }
        elif kind == "boolean":
            out = {"type": "boolean"}
        elif kind == "login":
            out = _string(_LOGIN, 40)
        elif kind == "text":
            out = _string(_TEXT, self.max_length, min_length=1)
        elif kind == "sha":
            out = _string(_SHA, 64)
        elif kind == "fingerprint":
            out = _string(_FINGERPRINT, 64)
        elif kind == "key":
            out = _string(_KEY, 100)
        elif kind == "choice":
            out = {"type": "string", "enum": list(self.choices)}
        else:
            out = dict(_STATE_SCHEMA)
        inner = out.get("description")
        out["description"] = f"{self.description}: {inner}" if inner else self.description
        if self.default is not None:
            out["default"] = self.default
        return out

    def published_schema(self) -> dict[str, Any]:
        """As the tool's input schema publishes it: an optional argument may also be ``null``, meaning left out
        (what MCP SDKs generate for ``x: T | None = None``, and what many agent frameworks send for an unset one)."""
        value = self.schema()
        if self.required:
            return value
        if "anyOf" in value:
            return {**value, "anyOf": [*value["anyOf"], {"type": "null"}]}
        kinds = value["type"] if isinstance(value["type"], list) else [value["type"]]
        published = {**value, "type": [*kinds, "null"]}
        if "enum" in value:
            published["enum"] = [*value["enum"], None]
        return published

    def accept(self, value: object) -> tuple[object, str | None]:
        """``value`` as the verb receives it, and why it is refused (None: accepted).

        Checked against :meth:`schema` and nothing else: a hostile value first (:func:`screen`), then the schema
        (Draft 2020-12), then, for JSON text, the decoded value against ``contentSchema``. An accepted number is
        an int (JSON Schema's integer: ``1.0`` is 1); accepted JSON text is handed on decoded.
        """
        why = screen(value)
        if why is not None:
            return value, f"{self._expected()}: {why}"
        validator, content = _validators(self)
        error = _first_error(validator, value)
        if error is None and content is not None and isinstance(value, str):
            decoded, why = decode_json_text(value)
            if why is not None:
                return value, f"{self._expected()}: {why}"
            why = screen(decoded)
            if why is not None:
                return value, f"{self._expected()}: the JSON text holds {why}"
            error = _first_error(content, decoded)
            value = decoded
        if error is not None:
            where = _where(error.absolute_path)
            return value, f"{self._expected()}" + (f" ({where}: fails {error.validator})" if where else "")
        return _integers(value), None

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not acceptable, or None (see :meth:`accept`)."""
        return self.accept(value)[1]

    def _expected(self) -> str:
        if self.kind == "text":
            return f"expected one line of 1 to {self.max_length} characters, not all spaces"
        if self.kind == "choice":
            return f"expected one of {', '.join(self.choices)}"
        return _KIND_PROBLEMS[self.kind]


def _issue(description: str = "the issue number") -> Param:
    return Param("issue_number", "issue_number", description, required=True)


@dataclass(frozen=True, slots=True)
class Verb:
    """One gateway action: who may call it, what must hold first (gates first), what it touches.

    ``params`` are its arguments (the MCP tool's input schema). ``command`` is its comment command
    (``/release``), if it has one. ``executable`` is False for a verb the gateway decides but no edge
    carries out yet: it is then neither an MCP tool nor a comment command.
    """

    name: str
    summary: str
    roles: frozenset[Role]
    preconditions: tuple[Gate, ...]
    effect: Effect
    next_verbs: tuple[str, ...] = ()
    params: tuple[Param, ...] = ()
    command: str | None = None
    executable: bool = True

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
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: argument names must be unique")
        if self.command is not None and not re.fullmatch(r"/[a-z][a-z-]*", self.command):
            raise ValueError(f"{self.name}: a comment command is a slash and a lower-case word")

    @property
    def tool(self) -> str:
        """The MCP tool name."""
        return f"gitea_{self.name}"

    @property
    def issue_scoped(self) -> bool:
        """Whether the verb acts on one issue (its ``issue_number`` argument)."""
        return any(p.name == "issue_number" for p in self.params)

    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema of the verb's arguments (an object; unknown arguments are refused)."""
        return {
            "type": "object",
            "properties": {p.name: p.published_schema() for p in self.params},
            "required": [p.name for p in self.params if p.required],
            "additionalProperties": False,
        }

    def check_arguments(self, arguments: Mapping[str, object]) -> tuple[dict[str, object], list[dict[str, str]]]:
        """The arguments as the verb receives them (defaults filled in), and every problem
        (``{"argument", "problem"}``) found: the call checked against :meth:`input_schema`, one argument at a time.

        ``null`` for an optional argument means left out (the published schema allows it); for a required one it is
        refused. The
        caller's identity is never an argument: a ``caller``/``owner``-like argument the verb does not declare is
        refused like any other unknown name.
        """
        known = {p.name: p for p in self.params}
        problems = [
            {
                "argument": _shown(name),
                "problem": f"unknown argument; {self.tool} takes: {', '.join(known) or 'nothing'}",
            }
            for name in arguments
            if name not in known
        ]
        values: dict[str, object] = {}
        for param in self.params:
            if param.name not in arguments:
                if param.required:
                    problems.append({"argument": param.name, "problem": "required"})
                values[param.name] = param.default
                continue
            value = arguments[param.name]
            if value is None:
                if param.required:
                    problems.append({"argument": param.name, "problem": "required (null is not a value)"})
                values[param.name] = param.default  # an optional argument sent as null is left out
                continue
            accepted, problem = param.accept(value)
            if problem is not None:
                problems.append({"argument": param.name, "problem": problem})
            values[param.name] = accepted
        return values, problems


def _shown(name: object) -> str:
    """An argument name as a refusal may quote it: short, printable ASCII."""
    text = name if isinstance(name, str) else repr(type(name))
    return text if len(text) <= 64 and text.isascii() and text.isprintable() else ascii(text[:64])


def _verb(
    name: str,
    summary: str,
    *,
    roles: frozenset[Role],
    gates: tuple[Gate, ...] = (),
    artifacts: tuple[Gate, ...] = (),
    effect: Effect,
    next_verbs: tuple[str, ...] = (),
    params: tuple[Param, ...] = (),
    command: str | None = None,
    executable: bool = True,
) -> Verb:
    return Verb(
        name=name,
        summary=summary,
        roles=roles,
        preconditions=(role_gate(roles), *gates, *artifacts),
        effect=effect,
        next_verbs=next_verbs,
        params=params,
        command=command,
        executable=executable,
    )


_VERBS: tuple[Verb, ...] = (
    _verb(
        "allocate_next_work",
        "rank eligible issues and (with dry_run=false) lease the chosen one to an owner",
        roles=frozenset({"controller"}),
        effect="mutate",
        next_verbs=("bootstrap_issue_worktree",),
        params=(
            Param("owner", "login", "roster login that receives the lease (default: the only identity with the role)"),
            Param("action", "choice", "what the lease is for", default="implement",
                  choices=("implement", "review", "merge")),
            Param("candidates_json", "candidates",
                  "candidate records (default: open status:ready issues from Gitea); only issue_number is required"),
            Param("exclude_issue_numbers", "issue_numbers",
                  "issues removed before ranking; never selected or leased (reason excluded_by_controller)"),
            Param("dry_run", "boolean", "decide only; apply with false", default=True),
            Param("expected_fingerprint", "fingerprint",
                  "the dry-run's fingerprint: apply refuses (stale_pin) if it changed"),
        ),
        command="/allocate",
    ),
    _verb(
        "bootstrap_issue_worktree",
        "create or recover the issue's branch and worktree under branches/",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP,),
        effect="mutate",
        next_verbs=("lock_issue",),
        params=(
            _issue(),
            Param("idempotency_key", "key", "replaying the same key returns or resumes the same transition"),
            Param("expected_base", "sha", "the default-branch SHA you expect; stale_pin if the live one differs"),
        ),
        command="/bootstrap",
    ),
    _verb(
        "lock_issue",
        "lock the issue to the owner's registered worktree",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP,),
        artifacts=(PRECONDITION_WORKTREE,),
        effect="mutate",
        next_verbs=("get_issue_state", "heartbeat_lease"),
        params=(_issue(),),
        command="/lock",
    ),
    _verb(
        "heartbeat_lease",
        "extend the live lease",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        artifacts=(PRECONDITION_LIVE_LEASE,),
        effect="mutate",
        next_verbs=("post_issue_state",),
        params=(_issue(),),
        command="/heartbeat",
    ),
    _verb(
        "release_lease",
        "end the live lease with a reason (recorded, never deleted)",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        artifacts=(PRECONDITION_LIVE_LEASE,),
        effect="mutate",
        next_verbs=("get_runtime_context",),
        params=(_issue(), Param("reason", "text", "why the lease ends", default="released")),
        command="/release",
    ),
    _verb(
        "get_issue_state",
        "read the issue's latest Canonical Issue State",
        roles=ALL_ROLES,
        effect="read",
        next_verbs=("post_issue_state",),
        params=(_issue(),),
    ),
    _verb(
        "post_issue_state",
        "post an evidence comment carrying a Canonical Issue State block",
        roles=ALL_ROLES,
        gates=(PRECONDITION_OWNERSHIP_OR_CONTROLLER,),
        effect="mutate",
        next_verbs=("open_pr", "release_lease"),
        params=(
            _issue(),
            Param("state", "state", "the new state", required=True),
            Param("summary", "text", "one-paragraph human summary above the block", max_length=600),
        ),
    ),
    _verb(
        "get_runtime_context",
        "read the caller's identity, roles, leases, the default-branch SHA and what to do next",
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
        params=(_issue(),),
        executable=False,
    ),
    _verb(
        "claim_review",
        "claim the review of the issue's pull request",
        roles=frozenset({"reviewer"}),
        gates=(PRECONDITION_NOT_PR_AUTHOR,),
        artifacts=(PRECONDITION_PR_EXISTS,),
        effect="mutate",
        next_verbs=("get_issue_state", "post_issue_state"),
        params=(_issue(),),
        executable=False,
    ),
    _verb(
        "merge",
        "merge the approved pull request",
        roles=frozenset({"merger"}),
        artifacts=(PRECONDITION_PR_EXISTS, PRECONDITION_PR_APPROVED),
        effect="mutate",
        next_verbs=("post_issue_state", "release_lease"),
        params=(_issue(),),
        executable=False,
    ),
)

VERBS: Mapping[str, Verb] = MappingProxyType({v.name: v for v in _VERBS})
TOOLS: Mapping[str, Verb] = MappingProxyType({v.tool: v for v in _VERBS})
COMMANDS: Mapping[str, Verb] = MappingProxyType({v.command: v for v in _VERBS if v.command and v.executable})


def _check_table() -> None:
    if len(VERBS) != len(_VERBS) or len(TOOLS) != len(_VERBS):
        raise ValueError("verb names and MCP tool names must be unique")
    for verb in _VERBS:
        unknown = [n for n in verb.next_verbs if n not in VERBS]
        if unknown:
            raise ValueError(f"{verb.name}: next verbs {unknown} are not in the table")
    commands = [v.command for v in _VERBS if v.command]
    if len(set(commands)) != len(commands):
        raise ValueError("comment commands must be unique")
    for verb in _VERBS:
        jsonschema.Draft202012Validator.check_schema(verb.input_schema())
        for param in verb.params:
            _validators(param)  # built (and checked) once, at import: no call pays for it


_check_table()


def mcp_tool_names(*, executable_only: bool = False) -> tuple[str, ...]:
    """Every verb's MCP tool name in table order (``executable_only``: the tools an MCP server offers)."""
    return tuple(v.tool for v in _VERBS if v.executable or not executable_only)


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
        "| verb | MCP tool | comment command | roles | effect | preconditions (in order) | next |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for v in _VERBS:
        roles = "any roster role" if v.roles == ALL_ROLES else ", ".join(sorted(v.roles))
        pre = "; ".join(f"`{p.key}` ({p.rejection_kind})" for p in v.preconditions)
        nxt = ", ".join(f"`{n}`" for n in v.next_verbs) or "-"
        tool = f"`{v.tool}`" if v.executable else f"`{v.tool}` (gateway only, not offered yet)"
        command = f"`{v.command}`" if v.command and v.executable else "-"
        lines.append(f"| `{v.name}` | {tool} | {command} | {roles} | {v.effect} | {pre} | {nxt} |")
    return "\n".join(lines) + "\n"


def render_params_markdown() -> str:
    """Every offered tool's arguments for docs: name, JSON type, required/default, meaning."""
    lines: list[str] = []
    for v in _VERBS:
        if not v.executable:
            continue
        lines.append(f"### `{v.tool}`\n\n{v.summary}.\n")
        if not v.params:
            lines.append("No arguments.\n")
            continue
        lines.append("| argument | JSON type | required / default | meaning |")
        lines.append("| --- | --- | --- | --- |")
        for p in v.params:
            schema = p.schema()
            kind = schema.get("type") or " or ".join(str(a.get("type")) for a in schema.get("anyOf", []))
            if schema.get("type") == "array":
                kind = f"array of {schema['items'].get('type', 'object')}"
            need = "required" if p.required else "-"
            if p.default is not None:
                need = f"default `{_json_value(p.default)}`"
            lines.append(f"| `{p.name}` | {kind} | {need} | {p.description} |")
        lines.append("")
    return "\n".join(lines)


def _json_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
