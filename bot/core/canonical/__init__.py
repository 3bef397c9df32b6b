"""Canonical Issue State: find, parse and render the hand-over block posted in issue comments."""

from bot.core.canonical.parsing import parse_any_length, parse_comment, state_parse_report
from bot.core.canonical.records import (
    FIELD_KEYS,
    HEADING_TEXT,
    MAX_BLOCKS,
    MAX_COMMENT_CHARS,
    RELATED_PRS_NONE,
    REQUIRED_KEYS,
    BlockResult,
    CanonicalState,
    ParseError,
    ParseErrorCode,
    ParseResult,
    as_line,
    as_prompt,
)
from bot.core.canonical.rendering import render

__all__ = [
    "FIELD_KEYS",
    "HEADING_TEXT",
    "MAX_BLOCKS",
    "MAX_COMMENT_CHARS",
    "RELATED_PRS_NONE",
    "REQUIRED_KEYS",
    "BlockResult",
    "CanonicalState",
    "ParseError",
    "ParseErrorCode",
    "ParseResult",
    "as_line",
    "as_prompt",
    "parse_any_length",
    "parse_comment",
    "render",
    "state_parse_report",
]
