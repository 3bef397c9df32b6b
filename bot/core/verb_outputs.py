"""What each verb answers: the JSON Schemas of its results (the MCP tool's ``outputSchema``) and of every refusal.

A verb declares its result with :func:`result` next to its declaration in ``bot/core/verbs.py``; ``Verb.output_schema``
wraps it with what every answer of the door carries (``verb``, ``next``) and with the two other shapes a call may
answer: the error envelope (``bot/core/errors.py``) and a run's plan-only result (``mark_inert``). Each schema names the
keys every answer of its kind holds, with their types, and leaves the others open: a key a verb adds in one case
(``replayed``, ``adopted``, ``auto_allocation``) is described where it is known and never required.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, get_args

from bot.core.errors import ErrorKind
from bot.core.gateway import ROLES
from bot.core.vocabulary import STATES

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
TEXT: Schema = {"type": "string", "minLength": 1}
INTEGER: Schema = {"type": "integer"}
NUMBER: Schema = {"type": "number"}
BOOLEAN: Schema = {"type": "boolean"}
ISSUE: Schema = {"type": "integer", "minimum": 1}
TIME: Schema = {"type": "string", "format": "date-time"}
SHA: Schema = {"type": "string", "pattern": "^[0-9a-f]{40}(?:[0-9a-f]{24})?$"}
OBJECT: Schema = {"type": "object"}
STRINGS: Schema = {"type": "array", "items": STRING}
ISSUES: Schema = {"type": "array", "items": ISSUE}


def nullable(schema: Schema) -> Schema:
    """``schema`` or ``null``."""
    return {"anyOf": [schema, {"type": "null"}]}


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def obj(required: Mapping[str, Schema], optional: Mapping[str, Schema] | None = None, *,
        description: str | None = None) -> Schema:
    """An object holding every key of ``required`` (typed), perhaps the keys of ``optional``, and perhaps others."""
    out: Schema = {"type": "object"}
    if description:
        out["description"] = description
    out["properties"] = {**required, **(optional or {})}
    out["required"] = list(required)
    return out


# --- shapes several verbs answer --------------------------------------------------------------------------------------

LEASE: Schema = obj({
    "lease_id": TEXT, "repo": TEXT, "issue_number": ISSUE, "owner": TEXT, "role": {"enum": list(ROLES)},
    "action": TEXT, "acquired_at": TIME, "expires_at": TIME, "heartbeat_at": TIME,
    "status": TEXT, "ended_at": nullable(TIME), "end_reason": nullable(STRING),
}, description="a lease as foreman records it (never deleted: an ended one has ended_at and end_reason)")

CANONICAL_STATE: Schema = obj({
    "state": {"enum": [row.state for row in STATES]}, "who_is_next": STRING, "next_action": STRING,
    "next_prompt": STRING, "what_happened": STRING, "why": STRING, "related_prs": ISSUES, "blockers": STRING,
    "validation": STRING, "last_updated_by": STRING,
}, {"extra": {"type": "object", "additionalProperties": STRING}},
    description="a Canonical Issue State in snake_case")

HANDED_OVER: Schema = obj({"lease_id": nullable(STRING), "reason": TEXT, "who_is_next": TEXT},
                          description="the lease the hand-over ended (null: it had ended already)")

AUTO_ALLOCATION: Schema = obj({"trigger": TEXT}, description="the allocation this call set off for a freed author")

OUTBOX: Schema = {**STRINGS, "description": "the keys of the comments and label changes queued for Gitea"}


def result(required: Mapping[str, Schema], optional: Mapping[str, Schema] | None = None, *,
           description: str | None = None) -> Schema:
    """A verb's result: the keys it always answers (``required``) and those it answers in some cases; the door adds
    ``verb`` and ``next`` (``Verb.output_schema``)."""
    return obj(required, optional, description=description)


# --- what every answer may be -----------------------------------------------------------------------------------------

ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)

#: Every refusal, everywhere (the design's "Error envelope": ../shared/DESIGN.md, beside the repository;
#: ``Envelope.to_dict``): ``missing`` exactly for a ``tracing_gap``; ``details`` (its ``reason`` first when there is
#: one) for the rest of what the refusal knows,
#: the failed gate's name included. Some refusals add their own keys (an allocation's decision fields).
ENVELOPE: Schema = {
    "title": "refusal",
    "description": "the call was refused (isError true) and nothing happened unless the message says otherwise",
    "type": "object",
    "properties": {
        "error": {"enum": list(ERROR_KINDS)},
        "message": TEXT,
        "missing": {"type": "array", "items": TEXT, "minItems": 1},
        "remediate": TEXT,
        "exact_next_action": TEXT,
        "details": obj({}, {"reason": STRING, "problems": array(obj({"argument": STRING, "problem": STRING}))}),
    },
    "required": ["error", "message", "remediate", "exact_next_action"],
    "if": {"properties": {"error": {"const": "tracing_gap"}}},
    "then": {"required": ["missing"]},
    "else": {"not": {"required": ["missing"]}},
}

#: A plan-only step of a run bound to a sealed grant: the broker hands the verb's result back inert, never executed
#: (``bot.core.grants.refusals.mark_inert``).
PLAN_ONLY: Schema = {
    "title": "plan-only result",
    **obj({"inert": {"const": True}, "run_id": TEXT, "position": INTEGER, "plan": OBJECT, "note": STRING}),
}


def answer_schema(verb_name: str, declared: Schema) -> Schema:
    """The ``outputSchema`` of a verb's tool: its result (with ``verb`` and ``next``), a refusal, or a plan-only
    result."""
    success = {
        "title": "result",
        "description": "the call ran (isError false)",
        **{key: value for key, value in declared.items() if key != "description"},
        "properties": {
            "verb": {"const": verb_name},
            **declared["properties"],
            "next": {**STRINGS, "description": "the tools you may call next"},
        },
        "required": ["verb", *declared["required"], "next"],
    }
    return {"type": "object", "anyOf": [success, ENVELOPE, PLAN_ONLY]}
