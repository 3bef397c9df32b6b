"""A verb's arguments: each one's JSON Schema (published as the MCP input schema) and the check every call runs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

import jsonschema  # type: ignore[import-untyped]  # (no stubs installed; the project adds none)

from bot.core.canonical import FIELD_KEYS
from bot.core.jsontext import JSONTextError, strict_loads
from bot.core.vocabulary import MAX_ISSUE_NUMBER, STATES
from bot.core.vocabulary import ROLES as VOCABULARY_ROLES

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
    "repository",
    "count",
    "commit_message",
]

# One definition is the truth: each argument's JSON Schema (Draft 2020-12) is what the MCP tool publishes and
# what every call is validated against (``Param.accept``), whatever the transport. Patterns are written so that
# a stock validator reads them alike in Python and ECMA-262: ``$(?!\n)`` is the end of the string (Python's
# ``$`` also matches before a final newline), and no string accepts a lone surrogate (``\uD800-\uDFFF``).

_NO_SURROGATE = r"\uD800-\uDFFF"
#: A commit message: its subject line (git's first line, what ``git log --oneline`` and Gitea show) and the whole.
MAX_SUBJECT = 100
MAX_COMMIT_MESSAGE = 10_000
#: What a line of text may not hold (a line break aside): C0 controls and DEL (ESC starts an ANSI sequence), C1
#: controls (NEL breaks a line), the line and paragraph separators, and the bidirectional marks, embeddings,
#: overrides and isolates (they reorder what a reader sees). A NEXT_PROMPT line may hold a tab (code); others not.
_UNSEEN_IN_PROMPT = r"\u0000-\u0008\u000B-\u001F\u007F-\u009F\u061C\u200E\u200F\u2028-\u202E\u2066-\u2069"
_UNSEEN = r"\u0009" + _UNSEEN_IN_PROMPT
_LOGIN = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,39}"
#: ``owner/name`` of a repository (Gitea's owner and repository name characters).
_REPOSITORY_NAME = _LOGIN + r"/[A-Za-z0-9_.-]{1,100}"
_SHA = r"[0-9a-f]{40}(?:[0-9a-f]{24})?"
_FINGERPRINT = r"[0-9a-f]{64}"
_KEY = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}"  # as bot.core.bootstrap accepts them
#: One line (no CR or LF) with at least one non-space character.
_TEXT = rf"[^\S\r\n{_UNSEEN}]*[^\s{_NO_SURROGATE}{_UNSEEN}][^\r\n{_NO_SURROGATE}{_UNSEEN}]*"
#: One stripped, non-empty line (a Canonical Issue State field).
_LINE = rf"[^\s{_NO_SURROGATE}{_UNSEEN}](?:[^\r\n{_NO_SURROGATE}{_UNSEEN}]*[^\s{_NO_SURROGATE}{_UNSEEN}])?"
#: NEXT_PROMPT: LF line breaks, no trailing whitespace on a line, no leading or trailing blank line; may be empty.
_PROMPT_LINE = rf"[^\r\n{_NO_SURROGATE}{_UNSEEN_IN_PROMPT}]*[^\s{_NO_SURROGATE}{_UNSEEN_IN_PROMPT}]"
_PROMPT = rf"(?:{_PROMPT_LINE}(?:\n+{_PROMPT_LINE})*)?"
_ANY_TEXT = rf"[^{_NO_SURROGATE}]*"
#: A commit message: a subject line of 1 to MAX_SUBJECT characters (one line, not all spaces), optionally a blank
#: line and a body of lines (LF breaks, a tab allowed, no trailing whitespace, paragraphs one blank line apart).
_COMMIT_MESSAGE = (rf"(?![^\n]{{{MAX_SUBJECT + 1}}}){_TEXT}"
                   rf"(?:\n\n{_PROMPT_LINE}(?:\n\n?{_PROMPT_LINE})*)?")
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
        "duplicate": {**_nullable(_string(_ANY_TEXT, MAX_LINE, min_length=1)),
                      "description": "a duplicate-work finding: the candidate is skipped duplicate_work"},
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
    "last_updated_by": _string(_ANY_TEXT, MAX_LINE),
}
#: What each Canonical Issue State field says (the snake_case keys of ``state``), as the tool schema describes them.
STATE_FIELD_DESCRIPTIONS: dict[str, str] = {
    "state": "where the issue stands now (one of the vocabulary's states)",
    "who_is_next": "the role that acts next (one of the vocabulary's roles)",
    "next_action": "one line: the next concrete step, naming the tool to call",
    "next_prompt": "what the next actor should be told, several lines allowed (empty string: nothing)",
    "what_happened": "one line: what was just done",
    "why": "one line: why it was done, or why the issue stands where it does",
    "related_prs": "the pull request numbers this issue relates to (empty array: none)",
    "blockers": "one line: what blocks the issue (write none when nothing does)",
    "validation": "one line: how the work was checked (tests run, a read-back), or none yet",
    "last_updated_by": "ignored: always the calling identity",
}
_STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": (
        "a Canonical Issue State in snake_case (as gitea_get_issue_state returns it); "
        "last_updated_by is always set to the calling identity"
    ),
    "properties": {
        **{key.lower(): {**_FIELD_SCHEMAS.get(key.lower(), _string(_LINE, MAX_LINE)),
                         "description": STATE_FIELD_DESCRIPTIONS[key.lower()]} for key in FIELD_KEYS},
        "extra": {
            "type": "object",
            "description": "more KEY: value lines kept in the block (KEY in upper case, not a field's name)",
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
    "repository": "expected a repository as owner/name",
    "count": "expected a whole number within the bounds the schema states",
    "commit_message": (f"expected a commit message: a subject line of 1 to {MAX_SUBJECT} characters without control "
                       "characters (tab, ESC, NUL, ...) or bidirectional overrides, then optionally a blank line and a "
                       "body (LF line breaks, no trailing whitespace)"),
}


def _first_error(validator: jsonschema.protocols.Validator, value: object) -> jsonschema.ValidationError | None:
    """The first problem a validator finds (schemas list ``maxItems``/``maxLength`` before the keywords that look
    at every element, so an oversized value is refused without walking it)."""
    error = next(iter(validator.iter_errors(value)), None)
    return None if error is None else jsonschema.exceptions.best_match([error])


@cache
def validators(param: Param) -> tuple[jsonschema.protocols.Validator, jsonschema.protocols.Validator | None]:
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
    #: A ``count``'s bounds (an offset, a page, a page size, an id).
    minimum: int = 0
    maximum: int = 2**31 - 1

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
        elif kind == "repository":
            out = _string(_REPOSITORY_NAME, 141)
        elif kind == "count":
            out = {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}
        elif kind == "commit_message":
            out = _string(_COMMIT_MESSAGE, self.max_length, min_length=1)
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
        validator, content = validators(self)
        if self.kind == "state" and isinstance(value, dict):  # a partial state: name every field it lacks
            absent = [key for key in _STATE_SCHEMA["required"] if key not in value]
            if absent:
                return value, f"{self._expected()}: missing {', '.join(absent)}"
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
            if error.validator == "required" and isinstance(error.instance, dict):
                absent = [key for key in error.validator_value if key not in error.instance]
                return value, f"{self._expected()}" + (f" ({where})" if where else "") + (
                    f": missing {', '.join(absent)}")
            return value, f"{self._expected()}" + (f" ({where}: fails {error.validator})" if where else "")
        return _integers(value), None

    def problem(self, value: object) -> str | None:
        """Why ``value`` is not acceptable, or None (see :meth:`accept`)."""
        return self.accept(value)[1]

    def _expected(self) -> str:
        if self.kind == "text":
            return (f"expected one line of 1 to {self.max_length} characters, not all spaces, without control "
                    "characters (tab, ESC, NUL, ...) or bidirectional overrides")
        if self.kind == "choice":
            return f"expected one of {', '.join(self.choices)}"
        if self.kind == "count":
            return f"expected a whole number from {self.minimum} to {self.maximum}"
        return _KIND_PROBLEMS[self.kind]
