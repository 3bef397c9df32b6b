"""Evidence and failure comments: a human summary, the Canonical Issue State, JSON evidence, a hidden marker."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from bot.core.canonical import CanonicalState, render
from bot.core.errors import Envelope
from bot.core.jsontext import JSONTextError, strict_loads

MARKER_PREFIX = "<!-- foreman:evidence "
_MARKER_RE = re.compile(r"<!-- foreman:evidence ([A-Za-z0-9._:/-]{1,200}) -->")
_KEY_RE = re.compile(r"[A-Za-z0-9._:/-]{1,200}")
# Keys that must never reach a comment, whatever a caller puts in the evidence.
_SECRET_KEYS = re.compile(r"(secret|token|password|authorization|signature)", re.IGNORECASE)
_MAX_SUMMARY = 600
# The collapsible machine-readable section render_evidence writes: a ```json fence (longer when needed).
_EVIDENCE_FENCE = re.compile(r"(`{3,})json\n(.*?)\n\1", re.DOTALL)


def marker(key: str) -> str:
    if not _KEY_RE.fullmatch(key):
        raise ValueError(f"idempotency key {key!r} must be 1-200 characters of [A-Za-z0-9._:/-]")
    return f"{MARKER_PREFIX}{key} -->"


def find_marker(body: str) -> str | None:
    """The idempotency key of the last marker in a comment body, if any."""
    found = _MARKER_RE.findall(body or "")
    return found[-1] if found else None


def scrub(evidence: Any) -> Any:
    """Drop secret-looking keys at any depth (defence in depth: callers should not pass them at all)."""
    if isinstance(evidence, Mapping):
        return {str(k): scrub(v) for k, v in evidence.items() if not _SECRET_KEYS.search(str(k))}
    if isinstance(evidence, list | tuple):
        return [scrub(v) for v in evidence]
    return evidence


# The one escaping rule (docs/canonical-state.md, "Agent text in the bot's voice"). Markdown's active ASCII
# characters are backslash-escaped (CommonMark renders ``\X`` as X for any ASCII punctuation X). ``#`` only begins
# a heading at the start of a line, so it is escaped there only (``#12`` stays an issue reference); ``_`` and ``|``
# are left: inside a line they open nothing but the emphasis of a whole word...
_ACTIVE = frozenset("\\`*~<>[]&")
# ...and every character that breaks a line or cannot be seen is shown as an escape: C0/C1 controls (line breaks,
# ESC of ANSI sequences, NEL), format characters (bidirectional overrides and isolates, zero-width characters, the
# BOM) and the line and paragraph separators.
_SHOWN_ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SENTENCE_END = (".", "!", "?", "…")


def _shown(char: str) -> str:
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def inert(text: str) -> str:
    """Free text (anything an agent or a person controls, and any message that embeds it) as one inert line.

    The one escaping rule of every bot comment: the result holds no line break of any kind and no invisible or
    control character (each is shown as ``\\n``, ``\\x1b``, ``\\u202e``, ...), and Markdown's active characters
    are backslash-escaped, so it renders as the text itself and can open no heading, fence, HTML comment,
    quotation, link or emphasis. The renderers below place it only after text of their own on the same line, or
    end it as a sentence (``_summary``), so no line of a bot comment is agent text alone.
    """
    out: list[str] = []
    for char in text:
        if char in _ACTIVE or (char == "#" and not out):
            out.append("\\" + char)
        elif unicodedata.category(char) in _SHOWN_ESCAPED:
            out.append(_shown(char))
        else:
            out.append(char)
    return "".join(out)


def _summary(text: str, *, lead: str = "") -> str:
    """Free text as one paragraph on one line (every run of whitespace, line breaks of any kind included, is one
    space), ``inert``, after the bot's own ``lead``, cut at ``_MAX_SUMMARY`` and ending as a sentence: a line that
    ends in a full stop is never a heading."""
    one_paragraph = lead + inert(" ".join(text.split()))
    if not one_paragraph.strip():
        raise ValueError("an evidence comment needs a human summary")
    if len(one_paragraph) > _MAX_SUMMARY:
        one_paragraph = one_paragraph[: _MAX_SUMMARY - 1] + "…"
    return one_paragraph if one_paragraph.endswith(_SENTENCE_END) else one_paragraph + "."


def _json_inert(doc: str) -> str:
    """JSON text with each character ``inert`` shows escaped, and ``<``, written as a JSON escape (the same value):
    no invisible character and no HTML comment in the evidence, so no marker in a bot comment but the bot's own."""
    out: list[str] = []
    for char in doc:  # json.dumps escapes C0 inside strings: a raw line feed is the indentation's
        if char == "<" or (char != "\n" and unicodedata.category(char) in _SHOWN_ESCAPED):
            units = char.encode("utf-16-be", "surrogatepass")
            out.extend(f"\\u{int.from_bytes(units[i:i + 2], 'big'):04x}" for i in range(0, len(units), 2))
        else:
            out.append(char)
    return "".join(out)


def _details(evidence: Mapping[str, Any]) -> str:
    doc = _json_inert(json.dumps(scrub(evidence), indent=2, sort_keys=True, ensure_ascii=False, default=str))
    # A fence longer than any backtick run inside keeps the JSON block intact.
    longest = max((len(m) for m in re.findall(r"`+", doc)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"<details>\n<summary>Evidence (machine-readable)</summary>\n\n{fence}json\n{doc}\n{fence}\n\n</details>"


def render_evidence(
    *,
    key: str,
    summary: str,
    state: CanonicalState | None,
    evidence: Mapping[str, Any],
    lead: str = "",
) -> str:
    """The comment body for a successful mutation: summary, state block, collapsed JSON, marker.

    ``summary`` is free text (``inert``), after ``lead``, the bot's own words as written (a command word).
    ``state`` is the one block the comment holds, rendered from the record (its values are one line each and its
    NEXT_PROMPT sits in a fence no prompt line can close).
    """
    parts = [_summary(summary, lead=lead)]
    if state is not None:
        parts.append(render(state).rstrip("\n"))
    parts.append(_details(evidence))
    parts.append(marker(key))
    return "\n\n".join(parts) + "\n"


def render_failure(*, key: str, what: str, envelope: Envelope, evidence: Mapping[str, Any]) -> str:
    """The comment body for a refusal or failure: what happened and the exact next action (never a shell line).

    ``what`` is the bot's own words (the command word, the operation's name); every text of the envelope is free
    text (it embeds file names, branches, reasons) and is rendered ``inert`` after a label of the bot's. The
    comment holds no Canonical Issue State block.
    """
    missing = f" (missing: {', '.join(inert(name) for name in envelope.missing)})" if envelope.missing else ""
    lines = [
        _summary(envelope.message, lead=f"{what} was refused: "),
        f"**Why:** `{envelope.error}`" + missing,
        f"**To fix:** {inert(envelope.remediate)}",
        f"**Next action:** {inert(envelope.exact_next_action)}",
    ]
    parts = ["\n\n".join(lines), _details({"refusal": envelope.to_dict(), **evidence}), marker(key)]
    return "\n\n".join(parts) + "\n"


def parse_evidence(body: str) -> dict[str, Any] | None:
    """The machine-readable evidence (the JSON object) of a comment ``render_evidence`` wrote, or None."""
    found = _EVIDENCE_FENCE.findall(body or "")
    if not found:
        return None
    try:
        doc = strict_loads(found[-1][1], object_pairs_hook=None)
    except JSONTextError:
        return None
    return doc if isinstance(doc, dict) else None
