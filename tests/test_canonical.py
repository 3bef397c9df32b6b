"""Canonical Issue State: parser, renderer and the `foreman state parse` report (issue requirements 1, 2, 4)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.canonical import (
    FIELD_KEYS,
    CanonicalState,
    ParseResult,
    parse_comment,
    render,
    state_parse_report,
)
from bot.core.vocabulary import ROLES, STATES
from tests.conftest import SHARED

SEED_850 = SHARED / "seeds" / "004_3bdea2fd42671c60.txt"
MARKDOWN_HEADING = "## Canonical Issue State"


def _seed() -> str:
    return SEED_850.read_text(encoding="utf-8")


def _seed_rendered_form() -> tuple[int, str]:
    """The block as the web page shows it: a bare heading line, NEXT_PROMPT unfenced between blank lines."""
    lines = _seed().split("\n")
    start = lines.index("Canonical Issue State")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("LAST_UPDATED_BY:"))
    return start + 1, "\n".join(lines[start : end + 1])


def _seed_markdown_flat() -> str:
    """The block's Markdown source as the seed stores it: one line, its line breaks collapsed to spaces."""
    line = next(line for line in _seed().split("\n") if MARKDOWN_HEADING in line)
    return line[line.index(MARKDOWN_HEADING) :].strip()


def _seed_markdown_form() -> str:
    """The Markdown source with its line breaks put back: one line per key, fence lines on their own.

    The seed's scrape collapsed the comment's newlines; this restores them and changes nothing else.
    """
    text = _seed_markdown_flat().replace(MARKDOWN_HEADING + " ", MARKDOWN_HEADING + "\n\n", 1)
    text = re.sub(r"\s*(```\w*)\s*", r"\n\1\n", text)
    return re.sub(r" (?=(?:{}):)".format("|".join(FIELD_KEYS)), "\n", text)


SEED_STATE = CanonicalState(
    state="ready",
    who_is_next="controller",
    next_action="Controller assesses eligibility and allocates Issue #850 after specification amendment verification",
    next_prompt=(
        "Assess Issue #850 eligibility and allocate to gitea-author for implementation of native MCP "
        "bootstrap provisioning per amended specification."
    ),
    what_happened=(
        "Author appended authoritative specification amendment for durable, idempotent provisioning "
        "transition to Issue #850."
    ),
    why=(
        "Refines AC1-AC10 into journaled phases, idempotency key, concurrency pin, compensating recovery, "
        "server-side reuse, canonical path/preservation, and satisfiable next action."
    ),
    related_prs=(),
    blockers="none",
    validation=(
        "Author verified Issue #850 open, read prior state, resolved comment_issue capability, and posted "
        "authoritative amendment comment with read-after-write verification."
    ),
    last_updated_by="jcwalker3 (prgs-author)",
)

SIMPLE = SEED_STATE  # a valid state for the small tests below


def _block(**overrides: str) -> str:
    """A hand-written block in the seed's key order; an override replaces a value, "DROP" removes the key.

    Lines: 1 heading, 3 STATE, 4 WHO_IS_NEXT, 5 NEXT_ACTION, 6-9 NEXT_PROMPT and its fence,
    10 WHAT_HAPPENED, 11 WHY, 12 RELATED_PRS, 13 BLOCKERS, 14 VALIDATION, 15 LAST_UPDATED_BY.
    """
    fields = {
        "STATE": "in-progress",
        "WHO_IS_NEXT": "author",
        "NEXT_ACTION": "Implement the bootstrap",
        "NEXT_PROMPT": "\n```text\nDo the work.\n```",
        "WHAT_HAPPENED": "Allocated",
        "WHY": "It was ready",
        "RELATED_PRS": "none",
        "BLOCKERS": "none",
        "VALIDATION": "lease read back",
        "LAST_UPDATED_BY": "controller-bot",
    }
    fields.update(overrides)
    body = [MARKDOWN_HEADING, ""]
    for key, value in fields.items():
        if value != "DROP":
            body.append(f"{key}:{value}" if value.startswith("\n") or not value else f"{key}: {value}")
    return "\n".join(body) + "\n"


def _only_error(result: ParseResult) -> tuple[str, int, str | None]:
    assert result.current is None
    assert len(result.errors) == 1, result.errors
    error = result.errors[0]
    return error.code, error.line, error.key


# --- finding blocks: the seed's two forms, tolerated variations, what is not a block ----------------------------------


@pytest.mark.needs_shared
def test_seed_rendered_and_markdown_forms_parse_to_the_same_record() -> None:
    """Requirement 1: both forms of the block shown in seed 004 parse, and to the same record."""
    _, rendered = _seed_rendered_form()
    markdown = _seed_markdown_form()
    assert "```text\nAssess Issue #850" in markdown and "NEXT_PROMPT:\n\nAssess Issue #850" in rendered
    from_rendered = parse_comment(rendered)
    from_markdown = parse_comment(markdown)
    assert from_rendered.errors == () and from_markdown.errors == ()
    assert from_rendered.current == from_markdown.current == SEED_STATE


@pytest.mark.needs_shared
def test_whole_seed_page_yields_exactly_the_rendered_block_at_its_line() -> None:
    """Requirement 1: in a whole page of prose, only the real block is found, with its line number."""
    start, _ = _seed_rendered_form()
    result = parse_comment(_seed())
    assert result.block_count == 1
    assert result.blocks[0].start_line == start
    assert result.current == SEED_STATE


@pytest.mark.needs_shared
def test_render_reproduces_the_seed_markdown_source_up_to_line_breaks() -> None:
    """Requirement 2: the renderer writes the seed's Markdown source form (## heading, ```text fence)."""
    assert " ".join(render(SEED_STATE).split()) == _seed_markdown_flat()
    assert render(SEED_STATE) == _seed_markdown_form() + "\n"


def test_crlf_and_lone_cr_line_endings_parse_like_lf() -> None:
    """Requirement 1: CRLF line endings (and old-Mac CR) are normalized; line numbers stay the same."""
    text = "intro\n\n" + render(SIMPLE)
    for ending in ("\r\n", "\r"):
        result = parse_comment(text.replace("\n", ending))
        assert result.current == SIMPLE
        assert result.blocks[0].start_line == 3


def test_trailing_spaces_and_tabs_are_ignored_on_every_line() -> None:
    """Requirement 1: trailing spaces never change a value, a heading or a fence."""
    text = "\n".join(line + "  \t " for line in render(SIMPLE).split("\n"))
    assert parse_comment(text).current == SIMPLE


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5, 6])
def test_heading_of_every_atx_level_starts_a_block(level: int) -> None:
    """Requirement 1: a heading of any level (1-6), with or without closing hashes."""
    body = render(SIMPLE).split("\n", 1)[1]
    for heading in (f"{'#' * level} Canonical Issue State", f"{'#' * level} canonical issue state {'#' * 3}"):
        assert parse_comment(f"{heading}\n{body}").current == SIMPLE


@pytest.mark.parametrize(
    "heading",
    ["Canonical Issue State", "Canonical Issue State:", "**Canonical Issue State**", "Canonical Issue State\n====="],
)
def test_bare_bold_and_setext_headings_start_a_block(heading: str) -> None:
    """Requirement 1: the rendered form's bare heading line, and setext/bold variants of it."""
    body = render(SIMPLE).split("\n", 1)[1]
    assert parse_comment(f"{heading}\n{body}").current == SIMPLE


@pytest.mark.parametrize(
    "heading", ["####### Canonical Issue State", "    ## Canonical Issue State", "## Canonical Issue States"]
)
def test_text_that_is_not_a_canonical_heading_starts_no_block(heading: str) -> None:
    """Requirement 1: level 7, an indented code line or another title is not the block's heading."""
    body = render(SIMPLE).split("\n", 1)[1]
    assert parse_comment(f"{heading}\n{body}").block_count == 0


def test_block_inside_a_quotation_is_ignored() -> None:
    """Requirement 1: people quote old states in replies; a quoted block is not a block."""
    quoted = "\n".join("> " + line for line in render(replace(SIMPLE, state="done")).split("\n"))
    result = parse_comment(f"As you said earlier:\n\n{quoted}\n\nI disagree.\n")
    assert result.block_count == 0
    result = parse_comment(f"{quoted}\n\n{render(SIMPLE)}")
    assert result.block_count == 1 and result.current == SIMPLE


@pytest.mark.parametrize(
    ("fence", "closer", "shown"),
    [
        pytest.param("```", "```", "seed", marks=pytest.mark.needs_shared),
        pytest.param("```markdown", "```", "seed", marks=pytest.mark.needs_shared),
        ("~~~", "~~~", "rendered"),
        ("````markdown", "`````", "rendered"),
    ],
)
def test_block_inside_a_code_fence_other_than_next_prompt_is_ignored(fence: str, closer: str, shown: str) -> None:
    """Requirement 1: a block shown in a code fence (an example, a log) is not a block.

    A ``` fence is closed by the ``` line inside a rendered block (CommonMark), so rendered blocks are
    shown in longer or tilde fences here, and the seed's unfenced form in ``` fences.
    """
    example = _seed_rendered_form()[1] + "\n" if shown == "seed" else render(replace(SIMPLE, state="done"))
    text = f"Example:\n{fence}\n{example}{closer}\n\n{render(SIMPLE)}"
    result = parse_comment(text)
    assert result.block_count == 1
    assert result.current == SIMPLE


def test_block_inside_an_unclosed_code_fence_is_ignored() -> None:
    """Requirement 1: an unclosed fence runs to the end of the comment (CommonMark), hiding what follows."""
    assert parse_comment("```\n" + render(SIMPLE)).block_count == 0


def test_block_inside_a_multiline_html_comment_is_ignored() -> None:
    """Requirement 1: a commented-out block is invisible on the page, so it is not a block."""
    assert parse_comment("<!--\n" + render(SIMPLE) + "-->\n").block_count == 0
    assert parse_comment("<!-- foreman:evidence -->\n" + render(SIMPLE)).current == SIMPLE


def test_block_ends_at_prose_so_a_trailing_details_section_is_not_part_of_it() -> None:
    """Requirement 1 (../shared/DESIGN.md evidence comment): summary, block, then a collapsible JSON section."""
    text = (
        "Bootstrap done.\n\n" + render(SIMPLE) + "\n<details><summary>evidence</summary>\n\n```json\n"
        '{"STATE": "done"}\n```\n</details>\n'
    )
    result = parse_comment(text)
    assert result.current == SIMPLE
    assert result.blocks[0].end_line == 3 + render(SIMPLE).count("\n") - 1


# --- field values, structured errors, several blocks, the CLI's report ------------------------------------------------


def test_unknown_keys_are_kept_in_order() -> None:
    """Requirement 1: unknown keys are kept, not dropped and not an error; the renderer writes them back."""
    text = _block(NOTE="see #12").replace("WHY:", "ZETA_KEY:\nWHY:")
    state = parse_comment(text).current
    assert state is not None
    assert state.extra == (("ZETA_KEY", ""), ("NOTE", "see #12"))
    assert parse_comment(render(state)).current == state


@pytest.mark.parametrize(
    ("written", "parsed"),
    [
        ("none", ()),
        ("None", ()),
        ("NONE", ()),
        ("-", ()),
        ("#12", (12,)),
        ("#12, #13", (12, 13)),
        ("#13,#12", (13, 12)),
        ("12 13", (12, 13)),
        ("#12 , 13,", (12, 13)),
    ],
)
def test_related_prs_accepts_none_and_pr_number_lists(written: str, parsed: tuple[int, ...]) -> None:
    """Requirement 1: RELATED_PRS is PR numbers (#12, #13 forms) or none/None/-; order is kept."""
    state = parse_comment(_block(RELATED_PRS=written)).current
    assert state is not None and state.related_prs == parsed


@pytest.mark.parametrize("written", ["#12 and #13", "#0", "#12, #12", "org/repo#5", "n/a", "PR #4", "#١٢"])
def test_related_prs_rejects_anything_else_with_its_line(written: str) -> None:
    """Requirement 1: a RELATED_PRS value that is not PR numbers is bad_related_prs on its line."""
    assert _only_error(parse_comment(_block(RELATED_PRS=written))) == ("bad_related_prs", 12, "RELATED_PRS")


def test_empty_next_prompt_is_allowed_fenced_or_not() -> None:
    """Requirement 1 (edge case): NEXT_PROMPT may be empty; it renders as an empty fence and parses back."""
    for written in ("\n```text\n```", "", "\n\n"):
        state = parse_comment(_block(NEXT_PROMPT=written)).current
        assert state is not None and state.next_prompt == ""
    empty = replace(SIMPLE, next_prompt="")
    assert "NEXT_PROMPT:\n```text\n```\n" in render(empty)
    assert parse_comment(render(empty)).current == empty


def test_fence_inside_next_prompt_is_kept_when_the_outer_fence_is_longer() -> None:
    """Requirement 1 (edge case): a longer fence lets NEXT_PROMPT contain fences and even a quoted block."""
    prompt = "Post a state like:\n```\n## Canonical Issue State\nSTATE: done\n```\n\n  Then stop."
    text = _block(NEXT_PROMPT=f"\n````text\n{prompt}\n````")
    result = parse_comment(text)
    assert result.block_count == 1
    assert result.current is not None and result.current.next_prompt == prompt
    rendered = render(result.current)
    assert "NEXT_PROMPT:\n````text\n" in rendered
    assert parse_comment(rendered).current == result.current


def test_unfenced_next_prompt_runs_to_the_next_key_and_loses_surrounding_blank_lines() -> None:
    """Requirement 1: the rendered form's NEXT_PROMPT, multi-line, starting inline or on the next line."""
    text = _block(NEXT_PROMPT="First line.\n\n  second, indented\n```\nKEY: inside a fence\n```\n")
    state = parse_comment(text).current
    assert state is not None
    assert state.next_prompt == "First line.\n\n  second, indented\n```\nKEY: inside a fence\n```"
    assert state.what_happened == "Allocated"


def test_values_are_case_sensitive_and_the_error_says_so() -> None:
    """Requirement 1: no silent guess, even for a capitalized STATE; the message points at the fix."""
    result = parse_comment(_block(STATE="Ready"))
    assert _only_error(result) == ("unknown_state", 3, "STATE")
    assert "did you mean 'ready'" in result.errors[0].message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"STATE": "shipped"}, ("unknown_state", 3, "STATE")),
        ({"WHO_IS_NEXT": "qa-bot"}, ("unknown_role", 4, "WHO_IS_NEXT")),
        ({"RELATED_PRS": "see below"}, ("bad_related_prs", 12, "RELATED_PRS")),
        ({"WHY": ""}, ("empty_value", 11, "WHY")),
        ({"STATE": ""}, ("empty_value", 3, "STATE")),
        ({"VALIDATION": "DROP"}, ("missing_key", 1, "VALIDATION")),
        ({"NEXT_PROMPT": "\n````text\nnever closed"}, ("unclosed_fence", 7, "NEXT_PROMPT")),
    ],
)
def test_each_error_kind_names_its_code_line_and_key(overrides: dict[str, str], expected: tuple[str, int, str]) -> None:
    """Requirement 1: an unknown STATE/WHO_IS_NEXT, a bad value or a missing key is a structured error."""
    if expected[0] == "unclosed_fence":
        result = parse_comment(_block(**overrides))
        assert result.current is None
        fence_errors = [(e.code, e.line, e.key) for e in result.errors if e.code == "unclosed_fence"]
        assert fence_errors == [expected]
        assert {e.code for e in result.errors} == {"unclosed_fence", "missing_key"}  # the fence ate the rest
    else:
        assert _only_error(parse_comment(_block(**overrides))) == expected


def test_repeated_key_is_an_error_on_the_second_line_naming_the_first() -> None:
    """Requirement 1: a repeated key is duplicate_key, never a silent choice between the two values."""
    text = _block().replace("WHY: It was ready\n", "WHY: It was ready\n\nWHY: or was it\n")
    result = parse_comment(text)
    assert _only_error(result) == ("duplicate_key", 13, "WHY")
    assert "first on line 11" in result.errors[0].message


def test_missing_key_error_says_where_the_block_ended() -> None:
    """Requirement 1: a multi-line value ends the block early; the error explains which line did it."""
    text = _block().replace("BLOCKERS: none\n", "BLOCKERS:\n- #12 is open\n")
    result = parse_comment(text)
    assert [(e.code, e.line, e.key) for e in result.errors] == [
        ("missing_key", 1, "VALIDATION"),
        ("missing_key", 1, "LAST_UPDATED_BY"),
        ("empty_value", 13, "BLOCKERS"),
    ]
    assert all("ended at line 14" in e.message for e in result.errors if e.code == "missing_key")


def test_heading_without_any_keys_reports_every_required_key_missing() -> None:
    """Requirement 1: a heading followed by prose is a broken block, reported, not skipped."""
    result = parse_comment("## Canonical Issue State\n\nTo be written.\n")
    assert result.block_count == 1
    assert sorted(e.key or "" for e in result.errors) == sorted(FIELD_KEYS)
    assert {e.code for e in result.errors} == {"missing_key"}


def test_several_blocks_the_last_counts_and_the_count_is_reported() -> None:
    """Requirement 1: several blocks in one comment: the last counts, and that is reported."""
    first, second = replace(SIMPLE, state="in-progress"), replace(SIMPLE, state="pr-open", related_prs=(853,))
    text = render(first) + "\nLater:\n\n" + render(second)
    result = parse_comment(text)
    assert result.block_count == 2
    assert [block.state for block in result.blocks] == [first, second]
    assert result.current == second
    code, doc = state_parse_report(text)
    assert code == 0
    assert doc["block_count"] == 2 and doc["current_index"] == 1
    assert doc["current"]["related_prs"] == [853]
    assert "last of 2 blocks counts" in doc["summary"]


def test_an_invalid_last_block_does_not_fall_back_to_an_earlier_valid_one() -> None:
    """Requirement 1: the last block counts even when invalid: no silent guess from an older block."""
    text = render(SIMPLE) + "\n" + _block(STATE="shipped")
    result = parse_comment(text)
    assert result.block_count == 2 and result.blocks[0].ok
    assert result.current is None
    assert [(e.code, e.line) for e in result.errors] == [("unknown_state", render(SIMPLE).count("\n") + 4)]


def test_state_parse_report_exit_codes_and_json_document() -> None:
    """Requirement 4: exit 0 with the blocks as JSON; exit 1 with structured errors and line numbers."""
    code, doc = state_parse_report(render(SIMPLE))
    assert code == 0 and doc["current"] == SIMPLE.to_dict() and doc["errors"] == []
    assert doc["blocks"][0]["start_line"] == 1 and doc["blocks"][0]["valid"] is True

    code, doc = state_parse_report(_block(WHO_IS_NEXT="qa-bot"))
    assert code == 1 and doc["current"] is None
    assert doc["errors"] == [doc["blocks"][0]["errors"][0]]
    assert doc["errors"][0]["code"] == "unknown_role" and doc["errors"][0]["line"] == 4

    code, doc = state_parse_report("just a comment")
    assert code == 1 and doc["block_count"] == 0 and doc["current_index"] is None
    assert [e["code"] for e in doc["errors"]] == ["no_block"]
    json.dumps(doc)


# --- the record itself and its properties -----------------------------------------------------------------------------


def test_canonical_state_refuses_values_that_would_not_round_trip() -> None:
    """Requirement 2: every constructible state is valid, so render/parse holds for all of them."""
    bad: list[dict[str, Any]] = [
        {"state": "shipped"},
        {"who_is_next": "bot"},
        {"next_action": ""},
        {"why": "two\nlines"},
        {"blockers": " padded"},
        {"next_prompt": "\nleading blank"},
        {"next_prompt": "trailing space "},
        {"next_prompt": "cr\r\nline"},
        {"related_prs": (0,)},
        {"related_prs": (3, 3)},
        {"related_prs": (True,)},
        {"extra": (("STATE", "x"),)},
        {"extra": (("lower", "x"),)},
        {"extra": (("A", "1"), ("A", "2"))},
    ]
    for change in bad:
        with pytest.raises(ValueError):
            replace(SIMPLE, **change)


def test_to_dict_and_from_dict_are_inverse() -> None:
    """Requirement 4: the JSON form of a state is complete; extra stays ordered."""
    state = replace(SIMPLE, related_prs=(5, 2), extra=(("ZED", "1"), ("ALPHA", "")))
    assert CanonicalState.from_dict(state.to_dict()) == state
    assert list(state.to_dict()["extra"]) == ["ZED", "ALPHA"]
    with pytest.raises(ValueError, match="unknown"):
        CanonicalState.from_dict({**state.to_dict(), "colour": "red"})


_LINE_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\r\n")
_TRICKY = [
    "```",
    "````text",
    "~~~",
    "   ```",
    "STATE: done",
    "NEXT_PROMPT:",
    "WHY: because",
    "## Canonical Issue State",
    "Canonical Issue State",
    "**Canonical Issue State**",
    "=====",
    "---",
    "> quoted",
    "<!--",
    "-->",
    "#",
    "    indented",
    "",
]
_one_line = st.text(_LINE_CHARS, min_size=1, max_size=24).map(str.strip).filter(bool)
_text_value = st.one_of(_one_line, st.sampled_from(_TRICKY).map(str.strip).filter(bool))
_prompt = st.lists(
    st.one_of(st.text(_LINE_CHARS, max_size=24), st.sampled_from(_TRICKY)).map(str.rstrip), max_size=6
).map(lambda lines: "\n".join(lines).strip("\n"))
_extra_key = st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True).filter(lambda key: key not in FIELD_KEYS)

states = st.builds(
    CanonicalState,
    state=st.sampled_from([row.state for row in STATES]),
    who_is_next=st.sampled_from([row.role for row in ROLES]),
    next_action=_text_value,
    next_prompt=_prompt,
    what_happened=_text_value,
    why=_text_value,
    related_prs=st.lists(st.integers(1, 2**63 - 1), unique=True, max_size=4).map(tuple),
    blockers=_text_value,
    validation=_text_value,
    last_updated_by=_text_value,
    extra=st.lists(
        st.tuples(_extra_key, st.one_of(st.just(""), _text_value)), unique_by=lambda kv: kv[0], max_size=3
    ).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(state=states, before=st.sampled_from(["", "Summary.\n\n", "> ## Canonical Issue State\n> STATE: x\n\n"]))
def test_parse_of_render_is_the_state_for_every_valid_state(state: CanonicalState, before: str) -> None:
    """Requirement 2: parse(render(s)) == s for every valid state, also after quoted text."""
    result = parse_comment(before + render(state))
    assert result.errors == ()
    assert result.block_count == 1
    assert result.current == state
    assert render(state) == render(state)  # deterministic


_noise_line = st.one_of(
    st.text(max_size=40),
    st.sampled_from(_TRICKY),
    st.sampled_from([f"{key}: {value}" for key in FIELD_KEYS for value in ("none", "ready", "author", "#1")]),
)


@settings(max_examples=300, deadline=None)
@given(
    text=st.one_of(
        st.text(),
        st.lists(_noise_line, max_size=30).map("\n".join),
        st.tuples(states, st.lists(_noise_line, max_size=6), st.sampled_from(["\n", "\r\n", "\r"])).map(
            lambda t: render(t[0]).replace("\n", t[2]) + t[2].join(t[1])
        ),
    )
)
def test_parser_survives_arbitrary_text(text: str) -> None:
    """Requirement 2: no exception escapes the parser; the report is JSON; what parses renders back."""
    result = parse_comment(text)
    code, doc = state_parse_report(text)
    json.dumps(doc)
    assert code == (0 if result.current is not None else 1)
    for block in result.blocks:
        assert (block.state is None) == bool(block.errors)
        assert 1 <= block.start_line <= block.end_line <= text.count("\n") + text.count("\r") + 1
        assert all(block.start_line <= error.line for error in block.errors)
    if result.current is not None:
        assert parse_comment(render(result.current)).current == result.current
