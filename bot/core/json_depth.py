"""JSON nested deeper than a parser reads: the same text with what is too deep collapsed. Standard library only
(the stdio bridge imports it too), pure."""

from __future__ import annotations

import re

#: Nesting a refused line keeps when it is read again: deeper values are read as 0 (the SDK's parser refuses a few
#: hundred levels, Python's a thousand; no verb argument is nested more than 16 deep).
MAX_NESTING = 64
#: The tokens that make JSON's structure: an escape (inside a string), a quote, a bracket or a brace.
_STRUCTURE = re.compile(r'\\.|["\[\]{}]', re.DOTALL)


def collapsed(text: str, depth: int = MAX_NESTING) -> str | None:
    """``text`` with every value nested deeper than ``depth`` replaced by ``0`` (strings respected), or None when
    its brackets do not balance. One pass over its structural characters only."""
    parts: list[str] = []
    level, start, cut_from, in_string = 0, 0, -1, False
    for token in _STRUCTURE.finditer(text):
        mark = token.group()
        if mark[0] == "\\":
            continue
        if mark == '"':
            in_string = not in_string
            continue
        if in_string:
            continue
        if mark in "[{":
            level += 1
            if level == depth + 1:
                cut_from = token.start()
            continue
        if level == depth + 1 and cut_from >= 0:
            parts += [text[start:cut_from], "0"]
            start, cut_from = token.end(), -1
        level -= 1
        if level < 0:
            return None
    if level or in_string:
        return None
    return "".join([*parts, text[start:]])
