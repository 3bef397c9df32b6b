"""Evidence and failure comments: a human summary, the Canonical Issue State, JSON evidence, a hidden marker."""

from __future__ import annotations

import json
import re
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


def _summary(text: str) -> str:
    one_paragraph = " ".join(text.split())
    if not one_paragraph:
        raise ValueError("an evidence comment needs a human summary")
    return one_paragraph if len(one_paragraph) <= _MAX_SUMMARY else one_paragraph[: _MAX_SUMMARY - 1] + "…"


def _details(evidence: Mapping[str, Any]) -> str:
    doc = json.dumps(scrub(evidence), indent=2, sort_keys=True, ensure_ascii=False, default=str)
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
) -> str:
    """The comment body for a successful mutation: summary, state block, collapsed JSON, marker."""
    parts = [_summary(summary)]
    if state is not None:
        parts.append(render(state).rstrip("\n"))
    parts.append(_details(evidence))
    parts.append(marker(key))
    return "\n\n".join(parts) + "\n"


def render_failure(*, key: str, what: str, envelope: Envelope, evidence: Mapping[str, Any]) -> str:
    """The comment body for a refusal or failure: what happened and the exact next action (never a shell line)."""
    lines = [
        _summary(f"{what} was refused: {envelope.message}"),
        f"**Why:** `{envelope.error}`" + (f" (missing: {', '.join(envelope.missing)})" if envelope.missing else ""),
        f"**To fix:** {envelope.remediate}",
        f"**Next action:** {envelope.exact_next_action}",
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
