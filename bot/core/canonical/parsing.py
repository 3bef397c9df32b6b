"""Finding and parsing every Canonical Issue State block in a comment body, bounded and never raising."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bot.core.canonical.records import (
    FIELD_KEYS,
    HEADING_TEXT,
    MAX_BLOCKS,
    MAX_COMMENT_CHARS,
    MAX_PR_NUMBER,
    RELATED_PRS_NONE,
    REQUIRED_KEYS,
    TEXT_KEYS,
    BlockResult,
    CanonicalState,
    ParseError,
    ParseErrorCode,
    ParseResult,
    allowed_roles,
    allowed_states,
)
from bot.core.vocabulary import is_role, is_state

_KEY_LINE = re.compile(r" {0,3}([A-Z][A-Z0-9_]*):(.*)")
_ATX = re.compile(r" {0,3}#{1,6}(?:[ \t]|$)")
_ATX_PREFIX = re.compile(r"#{1,6}(?:[ \t]+|$)")
_SETEXT_UNDERLINE = re.compile(r" {0,3}(?:=+|-+)")
_FENCE_OPEN = re.compile(r"( {0,3})(`{3,}|~{3,})(.*)")
_HTML_COMMENT_OPEN = re.compile(r" {0,3}<!--")
_PR_ITEM = re.compile(r"#?([0-9]+)")
_PR_SEPARATOR = re.compile(r"[,\s]+")


def parse_comment(body: str) -> ParseResult:
    """Find and parse every Canonical Issue State block in a comment body. Never raises on any text.

    Linear in the body, and bounded: a body over ``MAX_COMMENT_CHARS`` is refused unread (no blocks).
    """
    if len(body) > MAX_COMMENT_CHARS:
        return ParseResult(
            (),
            ParseError(
                "comment_too_long",
                1,
                None,
                f"the comment has {len(body)} characters; a Canonical Issue State is read only from comments of at "
                f"most {MAX_COMMENT_CHARS}: post the block in a comment of its own",
            ),
        )
    return parse_any_length(body)


def parse_any_length(body: str) -> ParseResult:
    """``parse_comment`` without the length bound (the benchmark measures the parser's growth with it)."""
    text = body.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in text.split("\n")]
    blocks: list[BlockResult] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _fence_open(line)
        if fence is not None:
            i = _fence_end(lines, i, fence) + 1
        elif _HTML_COMMENT_OPEN.match(line) and "-->" not in line[line.index("<!--") + 4 :]:
            i += 1
            while i < len(lines) and "-->" not in lines[i]:
                i += 1
            i += 1
        elif _heading_kind(line) is not None:
            if len(blocks) == MAX_BLOCKS:
                return ParseResult(
                    (),
                    ParseError(
                        "too_many_blocks",
                        i + 1,
                        None,
                        f"the comment has more than {MAX_BLOCKS} Canonical Issue State headings; none is read: "
                        "post one block in a comment of its own",
                    ),
                )
            block, i = _parse_block(lines, i)
            blocks.append(block)
        else:
            i += 1
    return ParseResult(tuple(blocks))


def state_parse_report(text: str) -> tuple[int, dict[str, Any]]:
    """What ``foreman state parse`` prints: (exit code, one JSON-able document).

    Exit 0 when the block that counts (the last) is valid, else 1. The document is
    ``ParseResult.to_dict()`` plus ``summary``; a text without any block gets a ``no_block`` error
    (``line`` null, since no line is at fault).
    """
    result = parse_comment(text)
    doc = result.to_dict()
    block = result.current_block
    if block is None:
        doc["errors"].append(
            {
                "code": "no_block",
                "line": None,
                "key": None,
                "message": f"no '{HEADING_TEXT}' heading outside quotations and code fences",
            }
        )
        summary = "no Canonical Issue State block found"
    else:
        which = f"the last of {result.block_count} blocks" if result.block_count > 1 else "the only block"
        verdict = "valid" if block.ok else f"invalid ({len(block.errors)} errors)"
        summary = f"{which} counts: lines {block.start_line}-{block.end_line}, {verdict}"
    doc["summary"] = summary
    return (0 if result.current is not None else 1), doc


@dataclass(frozen=True, slots=True)
class _Fence:
    indent: int
    char: str
    length: int


def _fence_open(line: str) -> _Fence | None:
    match = _FENCE_OPEN.fullmatch(line)
    if match is None:
        return None
    marks = match.group(2)
    if marks[0] == "`" and "`" in match.group(3):  # CommonMark: a backtick fence's info has no backtick
        return None
    return _Fence(len(match.group(1)), marks[0], len(marks))


def _closes(line: str, fence: _Fence) -> bool:
    body = line.lstrip(" ")
    return len(line) - len(body) <= 3 and len(body) >= fence.length and body == fence.char * len(body)


def _fence_end(lines: list[str], opener: int, fence: _Fence) -> int:
    """Index of the closing fence line, or ``len(lines)`` when the fence is never closed."""
    j = opener + 1
    while j < len(lines) and not _closes(lines[j], fence):
        j += 1
    return j


def _heading_kind(line: str) -> Literal["atx", "plain"] | None:
    """Whether the line is a Canonical Issue State heading, and of which kind."""
    body = line.lstrip(" ")
    if len(line) - len(body) > 3:
        return None
    kind: Literal["atx", "plain"] = "plain"
    atx = _ATX_PREFIX.match(body)
    if atx is not None:
        kind = "atx"
        body = _strip_atx_closing(body[atx.end() :])
    body = body.strip().removesuffix(":")
    for mark in ("**", "__"):
        if len(body) > 4 and body.startswith(mark) and body.endswith(mark):
            body = body[2:-2]
            break
    body = body.strip().removesuffix(":").rstrip()
    return kind if body.casefold() == HEADING_TEXT.casefold() else None


def _strip_atx_closing(text: str) -> str:
    """Drop an ATX heading's closing ``#`` run (CommonMark: preceded by a space or tab, or the whole text).

    Done with string methods, in one pass: the regex ``(?:^|[ \t]+)#+$`` it replaces backtracks over every
    run of blanks, quadratic in the line (a 48 KB line held the event loop for seconds).
    """
    kept = text.rstrip("#")
    if len(kept) == len(text):
        return text
    if not kept:
        return ""
    return kept.rstrip(" \t") if kept[-1] in " \t" else text


def _parse_block(lines: list[str], heading: int) -> tuple[BlockResult, int]:
    """Parse the block whose heading is ``lines[heading]``; return it and the index to resume at."""
    i = heading + 1
    if _heading_kind(lines[heading]) == "plain" and i < len(lines) and _SETEXT_UNDERLINE.fullmatch(lines[i]):
        i += 1
    last = heading  # the last non-blank line that belongs to the block
    values: dict[str, tuple[str, int]] = {}
    order: list[str] = []
    errors: list[ParseError] = []
    stop: int | None = None  # the non-key line that ended the block, if any
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        match = _KEY_LINE.fullmatch(line)
        if match is None:
            stop = i
            break
        key, inline = match.group(1), match.group(2).strip()
        line_no = i + 1
        if key == "NEXT_PROMPT":
            value, i, last, prompt_errors = _read_prompt(lines, i, inline)
            errors.extend(prompt_errors)
        else:
            value, last, i = inline, i, i + 1
        if key in values:
            errors.append(
                ParseError(
                    "duplicate_key",
                    line_no,
                    key,
                    f"{key} appears again (first on line {values[key][1]}); a block states each key once",
                )
            )
            continue
        values[key] = (value, line_no)
        order.append(key)

    start_no, end_no = heading + 1, last + 1
    for key in REQUIRED_KEYS:
        if key not in values:
            where = (
                f"the block ended at line {stop + 1}, which is not a KEY: value line "
                "(only NEXT_PROMPT may span several lines)"
                if stop is not None
                else "the block ended at the end of the comment"
            )
            errors.append(ParseError("missing_key", start_no, key, f"required key {key} is missing; {where}"))
    errors.extend(_check_values(values))
    errors.sort(key=lambda error: error.line)
    resume = stop if stop is not None else i
    if errors:
        return BlockResult(start_no, end_no, None, tuple(errors)), resume
    related = _parse_related_prs(values["RELATED_PRS"][0])
    assert isinstance(related, tuple)  # _check_values reported anything else
    state = CanonicalState(
        state=values["STATE"][0],
        who_is_next=values["WHO_IS_NEXT"][0],
        next_action=values["NEXT_ACTION"][0],
        next_prompt=values["NEXT_PROMPT"][0],
        what_happened=values["WHAT_HAPPENED"][0],
        why=values["WHY"][0],
        related_prs=related,
        blockers=values["BLOCKERS"][0],
        validation=values["VALIDATION"][0],
        last_updated_by=values["LAST_UPDATED_BY"][0],
        extra=tuple((key, values[key][0]) for key in order if key not in FIELD_KEYS),
    )
    return BlockResult(start_no, end_no, state, ()), resume


def _read_prompt(lines: list[str], at: int, inline: str) -> tuple[str, int, int, list[ParseError]]:
    """Read NEXT_PROMPT starting at its key line; return (value, resume index, last line, errors)."""
    if not inline:
        k = at + 1
        while k < len(lines) and not lines[k]:
            k += 1
        fence = _fence_open(lines[k]) if k < len(lines) else None
        if fence is not None:
            end = _fence_end(lines, k, fence)
            content = [_dedent(line, fence.indent) for line in lines[k + 1 : end]]
            if end == len(lines):
                error = ParseError(
                    "unclosed_fence",
                    k + 1,
                    "NEXT_PROMPT",
                    f"the NEXT_PROMPT fence {fence.char * fence.length} is never closed, "
                    "so it runs to the end of the comment",
                )
                return _trim_blank(content), end, end - 1, [error]
            return _trim_blank(content), end + 1, end, []
    content = [inline] if inline else []
    errors: list[ParseError] = []
    last = at
    j = at + 1
    while j < len(lines):
        line = lines[j]
        if _KEY_LINE.fullmatch(line) or _ATX.match(line) or _heading_kind(line) is not None:
            break
        fence = _fence_open(line)
        if fence is None:
            content.append(line)
            if line:
                last = j
            j += 1
            continue
        end = _fence_end(lines, j, fence)
        content.extend(lines[j : end + 1])
        if end == len(lines):
            errors.append(
                ParseError(
                    "unclosed_fence",
                    j + 1,
                    "NEXT_PROMPT",
                    f"a fence {fence.char * fence.length} inside NEXT_PROMPT is never closed",
                )
            )
            return _trim_blank(content), end, end - 1, errors
        last = end
        j = end + 1
    return _trim_blank(content), j, last, errors


def _check_values(values: Mapping[str, tuple[str, int]]) -> list[ParseError]:
    errors: list[ParseError] = []
    for key in ("STATE", "WHO_IS_NEXT", "RELATED_PRS", *TEXT_KEYS):
        if key in values and not values[key][0]:
            errors.append(
                ParseError(
                    "empty_value",
                    values[key][1],
                    key,
                    f"{key} has no value (write `none` when there is nothing to say)",
                )
            )
    vocabularies: tuple[tuple[str, ParseErrorCode, Callable[[str], bool], Callable[[], str]], ...] = (
        ("STATE", "unknown_state", is_state, allowed_states),
        ("WHO_IS_NEXT", "unknown_role", is_role, allowed_roles),
    )
    for key, kind, known, allowed in vocabularies:
        if key in values and values[key][0]:
            value, line_no = values[key]
            if not known(value):
                hint = _case_hint(value, allowed())
                errors.append(ParseError(kind, line_no, key, f"{key} {value!r} is not one of {allowed()}{hint}"))
    if "RELATED_PRS" in values and values["RELATED_PRS"][0]:
        value, line_no = values["RELATED_PRS"]
        parsed = _parse_related_prs(value)
        if isinstance(parsed, str):
            errors.append(ParseError("bad_related_prs", line_no, "RELATED_PRS", parsed))
    return errors


def _parse_related_prs(value: str) -> tuple[int, ...] | str:
    """PR numbers (``#12, #13``, ``12 13``, ``#12,#13``) or ``none``/``-``; a str is the error message."""
    if value.casefold() in RELATED_PRS_NONE:
        return ()
    numbers: list[int] = []
    for item in _PR_SEPARATOR.split(value):
        if not item:
            continue
        match = _PR_ITEM.fullmatch(item)
        if match is None:
            return f"RELATED_PRS item {item!r} is not a PR number; write `#12, #13` (PRs of this repository) or `none`"
        number = int(match.group(1))
        if not 0 < number <= MAX_PR_NUMBER:
            return f"RELATED_PRS item {item!r} is not a valid PR number"
        if number in numbers:
            return f"RELATED_PRS lists #{number} twice"
        numbers.append(number)
    return tuple(numbers)


def _trim_blank(content: list[str]) -> str:
    start, end = 0, len(content)
    while start < end and not content[start]:
        start += 1
    while end > start and not content[end - 1]:
        end -= 1
    return "\n".join(content[start:end])


def _dedent(line: str, indent: int) -> str:
    body = line.lstrip(" ")
    return line[min(indent, len(line) - len(body)) :]

def _case_hint(value: str, allowed: str) -> str:
    for candidate in allowed.split(", "):
        if candidate.casefold() == value.casefold():
            return f" (values are case-sensitive: did you mean {candidate!r}?)"
    return ""
