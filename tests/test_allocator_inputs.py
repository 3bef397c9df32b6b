"""The allocator's inputs: exclude_issue_numbers and candidates_json normalized strictly or refused typed (AC1, AC3)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from bot.core.allocator import (
    Candidate,
    InputError,
    InvalidDecision,
    check_apply,
    normalize_candidates,
    normalize_exclusions,
)
from tests.test_allocator_core import CANARY, run


def problems_of(raw: object) -> list[dict[str, Any]]:
    with pytest.raises(InputError) as caught:
        normalize_candidates(raw)
    envelope = caught.value.envelope
    assert envelope.error == "invalid_input"
    problems: list[dict[str, Any]] = envelope.details["problems"]
    return problems


# --- exclude_issue_numbers (AC1) --------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [[617], (617,), {617}, frozenset({617}), "[617]", [617, 617]])
def test_exclusions_accept_typed_lists_and_json_array(raw: object) -> None:
    """AC1: exclude_issue_numbers is a typed list of issue numbers (JSON string kept for transports)."""
    assert normalize_exclusions(raw) == frozenset({617})


@pytest.mark.parametrize(
    ("raw", "index", "fragment"),
    [
        (617, None, "got integer"),
        ("617", None, "got integer"),
        ([True], 0, "boolean true"),
        ([617, 3.0], 1, "float"),
        ([617, "618"], 1, "string '618'"),
        ([0], 0, "positive"),
        ([-4], 0, "positive"),
        ({"617": True}, None, "got object"),
        ("[617", None, "malformed JSON"),
    ],
)
def test_exclusions_reject_anything_but_positive_integers(raw: object, index: int | None, fragment: str) -> None:
    """AC1/AC3: exclusions are as strict as candidates: no scalars, booleans, floats or numeric strings."""
    with pytest.raises(InputError) as caught:
        normalize_exclusions(raw)
    problem = caught.value.problems[0]
    assert problem.input == "exclude_issue_numbers"
    assert problem.index == index
    assert fragment in problem.problem


def test_invalid_exclusions_fail_closed_and_lease_nothing() -> None:
    """AC1/AC3: a malformed exclusion list never degrades to "no exclusions"."""
    decision = run(CANARY, [True])
    assert isinstance(decision, InvalidDecision)
    assert decision.envelope.error == "invalid_input"
    assert decision.fingerprint is None


# --- candidates_json (AC3) --------------------------------------------------------------------------------------------


def test_json_string_decoded_list_and_single_object_normalize_equally() -> None:
    """AC3: decoded list, JSON string of it, and Candidate values give the same candidates."""
    from_list = normalize_candidates(CANARY)
    assert normalize_candidates(json.dumps(CANARY)) == from_list
    assert normalize_candidates(tuple(CANARY)) == from_list
    assert normalize_candidates(from_list) == from_list
    assert [c.issue_number for c in from_list] == [612, 617, 776]
    single = normalize_candidates(CANARY[0])
    assert single == normalize_candidates(json.dumps(CANARY[0])) == [from_list[1]]


def test_json_string_and_decoded_list_decide_identically() -> None:
    """AC3/AC4: the transport form does not change the decision or its fingerprint."""
    assert run(json.dumps(CANARY), "[617]").to_dict() == run(CANARY, [617]).to_dict()


def test_candidate_fields_are_normalized() -> None:
    """AC3: alias `number`, RFC 3339 offsets, sorted de-duplicated labels/depends_on, null = omitted."""
    [c] = normalize_candidates(
        {"number": 9, "labels": ["b", "a", "b"], "created_at": "2026-07-20T21:35:15.5-05:00",
         "depends_on": [3, 2, 3], "title": None, "ready": None}
    )
    assert c == Candidate(
        issue_number=9,
        labels=("a", "b"),
        created_at=datetime(2026, 7, 20, 21, 35, 15, 500000, tzinfo=timezone(timedelta(hours=-5))),
        depends_on=(2, 3),
    )
    [z] = normalize_candidates({"issue_number": 9, "number": 9, "created_at": "2026-07-21T02:35:15z"})
    assert z.created_at == datetime(2026, 7, 21, 2, 35, 15, tzinfo=UTC)
    [ns] = normalize_candidates({"issue_number": 9, "created_at": "2026-07-21T02:35:15.123456789+00:00"})
    assert ns.created_at == datetime(2026, 7, 21, 2, 35, 15, 123456, tzinfo=UTC)


def test_true_is_rejected_as_issue_number() -> None:
    """AC3: `true` is not issue #1, in candidates_json as in transport-decoded lists."""
    for raw in ('[{"issue_number": true}]', [{"issue_number": True}], {"number": True}):
        [problem] = problems_of(raw)
        assert problem["index"] == 0
        assert problem["field"] in {"issue_number", "number"}
        assert "boolean" in problem["problem"]


@pytest.mark.parametrize(
    ("raw", "index", "field", "fragment"),
    [
        ("[{\"issue_number\": 1}", None, "candidates_json", "malformed JSON"),
        ("", None, "candidates_json", "malformed JSON"),
        ('[{"issue_number": NaN}]', None, "candidates_json", "NaN"),
        ("617", None, "candidates_json", "got integer"),
        (617, None, "candidates_json", "got integer"),
        (True, None, "candidates_json", "got boolean"),
        (None, None, "candidates_json", "got null"),
        ("null", None, "candidates_json", "got null"),
        (b"[]", None, "candidates_json", "unsupported type bytes"),
        (json.dumps(json.dumps(CANARY)), None, "candidates_json", "encoded twice"),
        ([{"issue_number": 1}, 2], 1, "", "expected an object, got integer"),
        ([{"issue_number": 1}, "x"], 1, "", "got string"),
        ([{"issue_number": 3.0}], 0, "issue_number", "float"),
        ([{"issue_number": 1.5}], 0, "issue_number", "float"),
        ([{"issue_number": "617"}], 0, "issue_number", "string '617'"),
        ([{"issue_number": 0}], 0, "issue_number", "positive"),
        ([{"issue_number": -3}], 0, "issue_number", "positive"),
        ([{"issue_number": 2**63}], 0, "issue_number", "positive"),
        ([{"issue_number": None}], 0, "issue_number", "null"),
        ([{"title": "no number"}], 0, "issue_number", "missing"),
        ([{"issue_number": 1, "number": 2}], 0, "number", "disagrees"),
        ([{"issue_number": 1}, {"issue_number": 2}, {"number": 1}], 2, "issue_number", "first at index 0"),
        ([{"issue_number": 1, "depend_on": [2]}], 0, "depend_on", "unknown field"),
        ('[{"issue_number": 1, "issue_number": 2}]', 0, "issue_number", "more than once"),
        ([{"issue_number": 1, "title": 5}], 0, "title", "got integer"),
        ([{"issue_number": 1, "labels": "priority:p0"}], 0, "labels", "got string"),
        ([{"issue_number": 1, "labels": [{"name": "priority:p0"}]}], 0, "labels[0]", "got object"),
        ([{"issue_number": 1, "labels": [""]}], 0, "labels[0]", "empty string"),
        ([{"issue_number": 1, "created_at": "2026-07-20T21:35:15"}], 0, "created_at", "RFC 3339"),
        ([{"issue_number": 1, "created_at": "2026-07-20"}], 0, "created_at", "RFC 3339"),
        ([{"issue_number": 1, "created_at": "2026-02-30T00:00:00Z"}], 0, "created_at", "RFC 3339"),
        ([{"issue_number": 1, "created_at": 1784600000}], 0, "created_at", "got integer"),
        ([{"issue_number": 1, "created_at": datetime(2026, 7, 20)}], 0, "created_at", "offset"),
        ([{"issue_number": 1, "depends_on": 2}], 0, "depends_on", "got integer"),
        ([{"issue_number": 1, "depends_on": [2, True]}], 0, "depends_on[1]", "boolean"),
        ([{"issue_number": 1, "depends_on": [1]}], 0, "depends_on[0]", "itself"),
        ([{"issue_number": 1, "ready": "yes"}], 0, "ready", "boolean"),
        ([{"issue_number": 1, "ready": 1}], 0, "ready", "boolean"),
    ],
)
def test_malformed_candidates_are_rejected_naming_element_and_field(
    raw: object, index: int | None, field: str, fragment: str
) -> None:
    """AC3: malformed JSON, scalars, bad records, booleans/floats/strings as integers, duplicates: refused."""
    problems = problems_of(raw)
    assert any(
        p["index"] == index and p["field"] == field and fragment in p["problem"] for p in problems
    ), problems


def test_every_problem_is_collected_not_only_the_first() -> None:
    """AC3: one refusal lists each bad element, so the caller can fix them all at once."""
    raw = [{"issue_number": True}, {"issue_number": 2}, {"issue_number": 3.0, "labels": [1]}, {"issue_number": 2}]
    got = {(p["index"], p["field"]) for p in problems_of(raw)}
    assert got == {(0, "issue_number"), (2, "issue_number"), (2, "labels[0]"), (3, "issue_number")}


def test_invalid_candidates_make_the_whole_decision_invalid_and_lease_nothing() -> None:
    """AC3/AC6: fail closed: an invalid record is never dropped to lease the rest; accounting names it."""
    decision = run([*CANARY, {"issue_number": 5, "labels": "priority:p0"}], [617])
    assert isinstance(decision, InvalidDecision)
    body = decision.to_dict()
    assert body["decision"] == "invalid"
    assert body["error"] == "invalid_input"
    assert body["issue_number"] is None
    assert body["exact_next_action"]
    assert [(s.issue_number, s.reason) for s in decision.skipped] == [(5, "invalid_candidate")]
    assert "candidates_json[3].labels" in decision.skipped[0].detail
    assert check_apply(None, decision) == decision.envelope


# --- any depth, size or integer: refused typed, never an uncaught exception -------------------------------------------

_HUGE = 10**5000  # over Python's 4,300-digit int-str limit: str(_HUGE) raises ValueError


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        "[" * 5_000 + "]" * 5_000,
        '[{"issue_number": 1, "title": ' + "[" * 3_000 + "]" * 3_000 + "}]",
        '{"issue_number": 1, "labels": ' + '{"a": ' * 3_000 + "1" + "}" * 3_000 + "}",
        '[{"issue_number": ' + "1" * 5_000 + "}]",
        '[{"issue_number": -' + "1" * 5_000 + "}]",
        '[{"issue_number": 1, "depends_on": [' + "9" * 4_301 + "]}]",
        '[{"issue_number": NaN}]',
        '[{"issue_number": Infinity}]',
        '[{"issue_number": -Infinity}]',
        '[{"issue_number": 1e999}]',
        "NaN",
        '[{"issue_number": 1, "title": "\\ud800"}]',
        '[{"issue_number": 1, "labels": ["\\udfff"]}]',
        " " * 9_000_000 + "[]",
    ],
)
def test_candidates_json_of_any_depth_size_or_integer_is_refused_typed(text: str) -> None:
    """Deep nesting once raised RecursionError; huge integers and NaN/Infinity, lone surrogates and
    oversized input are all invalid_input, with a bounded message."""
    with pytest.raises(InputError) as caught:
        normalize_candidates(text)
    doc = caught.value.envelope.to_dict()
    assert doc["error"] == "invalid_input" and len(json.dumps(doc)) < 20_000
    assert "set_int_max_str_digits" not in doc["message"]


@pytest.mark.parametrize(
    "raw",
    [
        [{"issue_number": _HUGE}],
        [{"issue_number": -_HUGE}],
        [{"issue_number": 1, "depends_on": [_HUGE]}],
        [{"issue_number": 1, "number": _HUGE}],
        [{"issue_number": 1, "number": [[[[[]]]]] * 3}],
        [{"issue_number": 1, _HUGE: 1}],
        [{"issue_number": 1, "title": "x" * 1_000_000, "number": "y" * 1_000_000}],
        [{"issue_number": 1, "created_at": "z" * 1_000_000}],
        [{"issue_number": "7" * 1_000_000}],
    ],
)
def test_decoded_candidates_with_huge_values_are_refused_with_a_bounded_message(raw: object) -> None:
    """A decoded record (the MCP surface passes objects) with an integer over 4,300 digits, or huge
    strings, is refused without str() of the integer blowing up and without echoing megabytes."""
    with pytest.raises(InputError) as caught:
        normalize_candidates(raw)
    assert len(json.dumps(caught.value.envelope.to_dict())) < 20_000


def test_deeply_nested_decoded_objects_are_refused_without_recursion() -> None:
    nested: Any = []
    for _ in range(100_000):
        nested = [nested]
    for raw in (nested, [{"issue_number": 1, "title": nested}], [{"issue_number": 1, "number": nested}]):
        with pytest.raises(InputError):
            normalize_candidates(raw)


@pytest.mark.parametrize(
    "raw", [[_HUGE], {_HUGE}, [-_HUGE], "[" + "1" * 5_000 + "]", "[" * 100_000, "[NaN]", "[1e999]"]
)
def test_exclusions_of_any_size_or_depth_are_refused_typed(raw: object) -> None:
    with pytest.raises(InputError) as caught:
        normalize_exclusions(raw)
    assert len(json.dumps(caught.value.envelope.to_dict())) < 20_000
