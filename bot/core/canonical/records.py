"""The Canonical Issue State record, its parse results, and the bounds and rules its values obey."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.core.vocabulary import ROLES, STATES, is_role, is_state

HEADING_TEXT = "Canonical Issue State"

FIELD_KEYS: tuple[str, ...] = (
    "STATE",
    "WHO_IS_NEXT",
    "NEXT_ACTION",
    "NEXT_PROMPT",
    "WHAT_HAPPENED",
    "WHY",
    "RELATED_PRS",
    "BLOCKERS",
    "VALIDATION",
    "LAST_UPDATED_BY",
)
REQUIRED_KEYS: tuple[str, ...] = FIELD_KEYS
# Keys whose value is free text on one line and must not be empty.
TEXT_KEYS: tuple[str, ...] = (
    "NEXT_ACTION",
    "WHAT_HAPPENED",
    "WHY",
    "BLOCKERS",
    "VALIDATION",
    "LAST_UPDATED_BY",
)
RELATED_PRS_NONE: frozenset[str] = frozenset({"none", "-"})  # compared case-insensitively
MAX_PR_NUMBER = 2**63 - 1  # Gitea ids are int64

ParseErrorCode = Literal[
    "missing_key",
    "duplicate_key",
    "unknown_state",
    "unknown_role",
    "bad_related_prs",
    "empty_value",
    "unclosed_fence",
    "comment_too_long",
    "too_many_blocks",
]
#: A comment longer than this is not read for a state block at all, and one with more blocks than
#: ``MAX_BLOCKS`` is given up on at the first block past it: a block is a few hundred bytes, and the parser is
#: linear but Python-speed, so these bound one comment's hold on the event loop at a few milliseconds whatever
#: its author sends (Gitea itself sets no limit on a comment). Measured by ``python -m bench.canonical``.
MAX_COMMENT_CHARS = 64 * 1024
MAX_BLOCKS = 64

_KEY_RE = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass(frozen=True, slots=True, kw_only=True)
class CanonicalState:
    """One valid Canonical Issue State. Construction validates, so every instance renders and parses back.

    Single-line fields hold stripped text without line breaks (non-empty, except values in ``extra``).
    ``next_prompt`` may span lines; it has no trailing whitespace on any line, no leading or trailing
    blank line, and may be empty. ``related_prs`` holds distinct positive PR numbers in the order given.
    ``extra`` keeps unknown ``KEY: value`` lines in their order.
    """

    state: str
    who_is_next: str
    next_action: str
    next_prompt: str
    what_happened: str
    why: str
    related_prs: tuple[int, ...]
    blockers: str
    validation: str
    last_updated_by: str
    extra: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.state, str) or not is_state(self.state):
            raise ValueError(f"STATE {self.state!r} is not one of {allowed_states()}")
        if not isinstance(self.who_is_next, str) or not is_role(self.who_is_next):
            raise ValueError(f"WHO_IS_NEXT {self.who_is_next!r} is not one of {allowed_roles()}")
        for key in TEXT_KEYS:
            value = getattr(self, key.lower())
            _check_line(key, value)
            if not value:
                raise ValueError(f"{key} must not be empty (write `none` when there is nothing to say)")
        _check_prompt(self.next_prompt)
        seen_prs: set[int] = set()
        for number in self.related_prs:
            # bool is an int subclass; True would render as #1 and parse back as 1.
            if type(number) is not int or not 0 < number <= MAX_PR_NUMBER or number in seen_prs:
                raise ValueError(f"RELATED_PRS needs distinct positive PR numbers, got {self.related_prs!r}")
            seen_prs.add(number)
        seen_keys: set[str] = set()
        for key, value in self.extra:
            if not _KEY_RE.fullmatch(key) or key in FIELD_KEYS or key in seen_keys:
                raise ValueError(f"extra key {key!r} must be a new, distinct [A-Z][A-Z0-9_]* key")
            seen_keys.add(key)
            _check_line(key, value)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; field names in snake_case, ``extra`` as an ordered object."""
        return {
            "state": self.state,
            "who_is_next": self.who_is_next,
            "next_action": self.next_action,
            "next_prompt": self.next_prompt,
            "what_happened": self.what_happened,
            "why": self.why,
            "related_prs": list(self.related_prs),
            "blockers": self.blockers,
            "validation": self.validation,
            "last_updated_by": self.last_updated_by,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CanonicalState:
        """Inverse of ``to_dict``; ``extra`` is optional. ValueError on unknown or missing fields."""
        names = {key.lower() for key in FIELD_KEYS}
        unknown = sorted(set(data) - names - {"extra"})
        missing = sorted(names - set(data))
        if unknown or missing:
            raise ValueError(f"canonical state fields: unknown {unknown}, missing {missing}")
        related = data["related_prs"]
        if not isinstance(related, list | tuple):
            raise ValueError("related_prs must be a list of PR numbers")
        extra = data.get("extra", {})
        if not isinstance(extra, Mapping):
            raise ValueError("extra must be an object of KEY: value")
        return cls(
            **{name: data[name] for name in names if name != "related_prs"},
            related_prs=tuple(related),
            extra=tuple((str(k), v) for k, v in extra.items()),
        )


@dataclass(frozen=True, slots=True)
class ParseError:
    """A structured reason a block is not valid. ``line`` is 1-based in the original comment."""

    code: ParseErrorCode
    line: int
    key: str | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "line": self.line, "key": self.key, "message": self.message}


@dataclass(frozen=True, slots=True)
class BlockResult:
    """One block found in a comment: where it is and either its state or its errors (never both)."""

    start_line: int  # the heading line, 1-based
    end_line: int  # the last line that belongs to the block, 1-based
    state: CanonicalState | None
    errors: tuple[ParseError, ...]

    @property
    def ok(self) -> bool:
        return self.state is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "start_line": self.start_line,
            "end_line": self.end_line,
            "valid": self.ok,
            "state": None if self.state is None else self.state.to_dict(),
            "errors": [error.to_dict() for error in self.errors],
        }


@dataclass(frozen=True, slots=True)
class ParseResult:
    """Every block of a comment, in order. The last block counts."""

    blocks: tuple[BlockResult, ...]
    #: Set when the comment was not read at all (``comment_too_long``): then there are no blocks.
    refused: ParseError | None = None

    @property
    def block_count(self) -> int:
        return len(self.blocks)

    @property
    def current_block(self) -> BlockResult | None:
        """The block that counts (the last one), valid or not; None when the comment has none."""
        return self.blocks[-1] if self.blocks else None

    @property
    def current(self) -> CanonicalState | None:
        """The state of the block that counts; None if there is no block or the last one is invalid."""
        block = self.current_block
        return None if block is None else block.state

    @property
    def errors(self) -> tuple[ParseError, ...]:
        """The errors of every block, in line order (an earlier invalid block is still reported)."""
        found = tuple(error for block in self.blocks for error in block.errors)
        return found if self.refused is None else (self.refused, *found)

    def to_dict(self) -> dict[str, Any]:
        current = self.current
        return {
            "block_count": self.block_count,
            "current_index": self.block_count - 1 if self.blocks else None,
            "current": None if current is None else current.to_dict(),
            "blocks": [block.to_dict() for block in self.blocks],
            "errors": [error.to_dict() for error in self.errors],
        }


def _check_line(key: str, value: str) -> None:
    if not isinstance(value, str) or "\n" in value or "\r" in value or value != value.strip():
        raise ValueError(f"{key} must be one stripped line of text, got {value!r}")


def _check_prompt(value: str) -> None:
    if not isinstance(value, str) or "\r" in value:
        raise ValueError("NEXT_PROMPT must be text with \\n line breaks")
    lines = value.split("\n")
    if any(line != line.rstrip() for line in lines) or (value and (not lines[0] or not lines[-1])):
        raise ValueError(
            "NEXT_PROMPT lines carry no trailing whitespace and the prompt has no leading or trailing blank line"
        )

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u202a-\u202e\u2066-\u2069]")


def as_line(text: str, *, limit: int = 200) -> str:
    """Outside text (a CI's status description, a file name, Gitea's message) as one stripped line a single-line
    field takes: every run of whitespace or control characters one space, cut to ``limit``; ``none`` when empty."""
    flat = " ".join(_CONTROL.sub(" ", text).split())
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return flat or "none"


def as_prompt(text: str, *, limit: int = 2000) -> str:
    """Outside text as NEXT_PROMPT takes it: control characters gone, each line without trailing whitespace, no
    leading or trailing blank line, at most ``limit`` characters."""
    lines = [_CONTROL.sub(" ", line).rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    out = "\n".join(lines)
    if len(out) > limit:
        out = out[: limit - 1].rstrip() + "…"
    return out


def allowed_states() -> str:
    """The STATE values, as an error message lists them."""
    return ", ".join(row.state for row in STATES)


def allowed_roles() -> str:
    """The WHO_IS_NEXT values, as an error message lists them."""
    return ", ".join(row.role for row in ROLES)
