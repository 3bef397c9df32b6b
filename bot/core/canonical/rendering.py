"""Rendering a Canonical Issue State as the Markdown block the seed documents show."""

from __future__ import annotations

from bot.core.canonical.records import HEADING_TEXT, CanonicalState


def render(state: CanonicalState) -> str:
    """The block as Markdown source, the seed's form: ``##`` heading, NEXT_PROMPT in a ``text`` fence.

    Deterministic; the fence is one backtick longer than the longest backtick run in the prompt
    (at least three), so no prompt line can close it. Unknown keys follow the ten known ones.
    """
    fence = "`" * max(3, _longest_run(state.next_prompt, "`") + 1)
    related = ", ".join(f"#{number}" for number in state.related_prs) if state.related_prs else "none"
    lines = [
        f"## {HEADING_TEXT}",
        "",
        f"STATE: {state.state}",
        f"WHO_IS_NEXT: {state.who_is_next}",
        f"NEXT_ACTION: {state.next_action}",
        "NEXT_PROMPT:",
        f"{fence}text",
        *([state.next_prompt] if state.next_prompt else []),
        fence,
        f"WHAT_HAPPENED: {state.what_happened}",
        f"WHY: {state.why}",
        f"RELATED_PRS: {related}",
        f"BLOCKERS: {state.blockers}",
        f"VALIDATION: {state.validation}",
        f"LAST_UPDATED_BY: {state.last_updated_by}",
        *(f"{key}: {value}" if value else f"{key}:" for key, value in state.extra),
    ]
    return "\n".join(lines) + "\n"


def _longest_run(text: str, char: str) -> int:
    longest = current = 0
    for c in text:
        current = current + 1 if c == char else 0
        longest = max(longest, current)
    return longest
