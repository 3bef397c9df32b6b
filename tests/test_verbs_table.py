"""The verb table, decision by decision: every verb x role x precondition state gives the documented decision."""

# The matrix below is written by hand from seed 001's rules: role and ownership
# gates refuse ``not_authorized`` (NA) and come first; missing artifacts are a ``tracing_gap`` naming every
# missing token (``gap:a+b``). It is the documentation the code is held to, not derived from the code.

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # (no stubs installed; the project adds none)
import pytest

from bot.core.gateway import GatewayContext, Role
from bot.core.verbs import VERBS, Verb, evaluate

ME, THEM = "me", "them"
COLUMNS: tuple[Role | None, ...] = ("controller", "author", "reviewer", "merger", None)


@dataclass(frozen=True)
class State:
    """A precondition state, with the caller as ``me``."""

    lease: str | None = None  # "me" or "them"
    live: bool = True
    worktree: bool = False
    commits: int = 0
    pr_author: str | None = None
    approved: bool = False
    implementer: str | None = None
    locked: bool = False

    def context(self, role: Role | None) -> GatewayContext:
        return GatewayContext(
            caller=ME,
            caller_roles=frozenset({role}) if role else frozenset(),
            issue_number=42,
            lease_owner=self.lease,
            lease_live=self.lease is not None and self.live,
            worktree_registered=self.worktree,
            commits_ahead=self.commits,
            pr_number=7 if self.pr_author else None,
            pr_author=self.pr_author,
            pr_approved=self.approved,
            implementer=self.implementer,
            issue_state="review" if self.pr_author else None,  # a PR in these states is in status:review
            locked=self.locked,
        )


STATES: dict[str, State] = {
    "no lease": State(),
    "my lease": State(lease=ME),
    "my lease, worktree": State(lease=ME, worktree=True),
    "my lease, worktree, commits": State(lease=ME, worktree=True, commits=2, locked=True),
    "my expired lease": State(lease=ME, live=False, worktree=True, commits=2, locked=True),
    "their lease": State(lease=THEM, worktree=True, commits=2, locked=True),
    "their PR": State(lease=THEM, worktree=True, commits=2, pr_author=THEM, locked=True),
    "their approved PR": State(lease=THEM, worktree=True, commits=2, pr_author=THEM, approved=True, locked=True),
    "my approved PR": State(lease=ME, worktree=True, commits=2, pr_author=ME, approved=True, locked=True),
    "my lease on their PR": State(lease=ME, pr_author=THEM),
    "their PR I implemented": State(pr_author=THEM, implementer=ME),
}

# verb -> state -> decision per column (controller, author, reviewer, merger, not on the roster)
EXPECTED: dict[str, dict[str, str]] = {
    "allocate_next_work": {s: "ok NA NA NA NA" for s in STATES},
    "bootstrap_issue_worktree": {
        "no lease": "NA NA NA NA NA",
        "my lease": "ok ok NA NA NA",
        "my lease, worktree": "ok ok NA NA NA",
        "my lease, worktree, commits": "ok ok NA NA NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "ok ok NA NA NA",
        "my lease on their PR": "ok ok NA NA NA",
        "their PR I implemented": "NA NA NA NA NA",
    },
    "lock_issue": {
        "no lease": "NA NA NA NA NA",
        "my lease": "gap:worktree gap:worktree NA NA NA",
        "my lease, worktree": "ok ok NA NA NA",
        "my lease, worktree, commits": "ok ok NA NA NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "ok ok NA NA NA",
        "my lease on their PR": "gap:worktree gap:worktree NA NA NA",
        "their PR I implemented": "NA NA NA NA NA",
    },
    "heartbeat_lease": {
        "no lease": "gap:live_lease NA NA NA NA",
        "my lease": "ok ok ok ok NA",
        "my lease, worktree": "ok ok ok ok NA",
        "my lease, worktree, commits": "ok ok ok ok NA",
        "my expired lease": "gap:live_lease NA NA NA NA",
        "their lease": "ok NA NA NA NA",
        "their PR": "ok NA NA NA NA",
        "their approved PR": "ok NA NA NA NA",
        "my approved PR": "ok ok ok ok NA",
        "my lease on their PR": "ok ok ok ok NA",
        "their PR I implemented": "gap:live_lease NA NA NA NA",
    },
    "get_issue_state": {s: "ok ok ok ok NA" for s in STATES},
    "post_issue_state": {
        "no lease": "ok NA NA NA NA",
        "my lease": "ok ok ok ok NA",
        "my lease, worktree": "ok ok ok ok NA",
        "my lease, worktree, commits": "ok ok ok ok NA",
        "my expired lease": "ok NA NA NA NA",
        "their lease": "ok NA NA NA NA",
        "their PR": "ok NA NA NA NA",
        "their approved PR": "ok NA NA NA NA",
        "my approved PR": "ok ok ok ok NA",
        "my lease on their PR": "ok ok ok ok NA",
        "their PR I implemented": "ok NA NA NA NA",
    },
    "get_runtime_context": {s: "ok ok ok ok NA" for s in STATES},
    "publish_worktree": {
        "no lease": "NA NA NA NA NA",
        "my lease": "NA gap:worktree+issue_lock NA NA NA",
        "my lease, worktree": "NA gap:issue_lock NA NA NA",
        "my lease, worktree, commits": "NA ok NA NA NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "NA ok NA NA NA",
        "my lease on their PR": "NA gap:worktree+issue_lock NA NA NA",
        "their PR I implemented": "NA NA NA NA NA",
    },
    "open_pull_request": {
        "no lease": "NA NA NA NA NA",
        "my lease": "NA gap:worktree+commits NA NA NA",
        "my lease, worktree": "NA gap:commits NA NA NA",
        "my lease, worktree, commits": "NA ok NA NA NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "NA ok NA NA NA",
        "my lease on their PR": "NA gap:worktree+commits NA NA NA",
        "their PR I implemented": "NA NA NA NA NA",
    },
    "update_pull_request": {  # the author's own live lease only; the PR itself is the executor's (invalid_state)
        "no lease": "NA NA NA NA NA",
        "my lease": "NA ok NA NA NA",
        "my lease, worktree": "NA ok NA NA NA",
        "my lease, worktree, commits": "NA ok NA NA NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "NA ok NA NA NA",
        "my lease on their PR": "NA ok NA NA NA",
        "their PR I implemented": "NA NA NA NA NA",
    },
    "assess_work_issue_duplicate": {s: "ok ok ok ok NA" for s in STATES},
    "read_issue": {s: "ok ok ok ok NA" for s in STATES},
    "read_pull_request": {s: "ok ok ok ok NA" for s in STATES},
    "claim_review": {
        "no lease": "NA NA gap:pull_request+status_review NA NA",
        "my lease": "NA NA gap:pull_request+status_review NA NA",
        "my lease, worktree": "NA NA gap:pull_request+status_review NA NA",
        "my lease, worktree, commits": "NA NA gap:pull_request+status_review NA NA",
        "my expired lease": "NA NA gap:pull_request+status_review NA NA",
        "their lease": "NA NA gap:pull_request+status_review NA NA",
        "their PR": "NA NA ok NA NA",
        "their approved PR": "NA NA ok NA NA",
        "my approved PR": "NA NA NA NA NA",  # the self-review block: the PR's author
        "my lease on their PR": "NA NA ok NA NA",  # the gate allows; the executor refuses a live lease (conflict)
        "their PR I implemented": "NA NA NA NA NA",  # the self-review block: the implementer
    },
    "submit_review": {
        "no lease": "NA NA NA NA NA",
        "my lease": "NA NA gap:pull_request NA NA",
        "my lease, worktree": "NA NA gap:pull_request NA NA",
        "my lease, worktree, commits": "NA NA gap:pull_request NA NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "NA NA NA NA NA",
        "my lease on their PR": "NA NA ok NA NA",
        "their PR I implemented": "NA NA NA NA NA",
    },
    "merge_pull_request": {
        "no lease": "NA NA NA gap:pull_request+approval NA",
        "my lease": "NA NA NA gap:pull_request+approval NA",
        "my lease, worktree": "NA NA NA gap:pull_request+approval NA",
        "my lease, worktree, commits": "NA NA NA gap:pull_request+approval NA",
        "my expired lease": "NA NA NA gap:pull_request+approval NA",
        "their lease": "NA NA NA gap:pull_request+approval NA",
        "their PR": "NA NA NA gap:approval NA",
        "their approved PR": "NA NA NA ok NA",
        "my approved PR": "NA NA NA ok NA",
        "my lease on their PR": "NA NA NA gap:approval NA",
        "their PR I implemented": "NA NA NA gap:approval NA",
    },
}
EXPECTED["release_lease"] = dict(EXPECTED["heartbeat_lease"])


def _cases() -> list[Any]:
    cases = []
    for verb, rows in EXPECTED.items():
        for state, row in rows.items():
            for role, expected in zip(COLUMNS, row.split(), strict=True):
                cases.append(pytest.param(verb, state, role, expected, id=f"{verb}|{state}|{role or 'no role'}"))
    return cases


def test_the_matrix_covers_every_verb_and_every_state() -> None:
    assert set(EXPECTED) == set(VERBS)
    for verb, rows in EXPECTED.items():
        assert set(rows) == set(STATES), verb


@pytest.mark.parametrize(("verb", "state", "role", "expected"), _cases())
def test_every_verb_role_and_state_gives_the_documented_decision(
    verb: str, state: str, role: Role | None, expected: str
) -> None:
    """The table-driven decision for every verb x role x precondition state."""
    decision = evaluate(verb, STATES[state].context(role))
    if expected == "ok":
        assert decision.allowed
    elif expected == "NA":
        assert (decision.outcome, decision.kind, decision.missing) == ("reject", "not_authorized", ())
        envelope = decision.envelope()
        assert list(envelope) == ["error", "message", "remediate", "exact_next_action"]
        assert envelope["message"] == envelope["remediate"]
    else:
        missing = tuple(expected.removeprefix("gap:").split("+"))
        assert (decision.outcome, decision.kind, decision.missing) == ("tracing_gap", "tracing_gap", missing)
        assert decision.envelope()["missing"] == list(missing)


def _generated(doc: str, name: str) -> str:
    start = doc.index(f"<!-- generated:{name} ")
    body = doc[doc.index("-->", start) + 3 :]
    return body[: body.index("<!-- generated:end -->")].lstrip("\n")


def test_the_mcp_doc_shows_the_verb_table_and_the_tool_arguments_as_the_code_has_them() -> None:
    """One table: docs/mcp.md's generated sections are exactly what the verb table renders."""
    from bot.core.verbs import render_params_markdown, render_tools_markdown, render_verb_table_markdown
    from tests.conftest import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "mcp.md").read_text(encoding="utf-8")
    assert _generated(doc, "verb-table") == render_verb_table_markdown()
    assert _generated(doc, "params") == render_params_markdown()
    assert _generated(doc, "tools") == render_tools_markdown()


def test_the_tools_table_has_one_row_per_offered_tool_with_a_valid_example_call() -> None:
    """Issue 33 item 6: docs/mcp.md's table of every tool (role, effect, replay, an example call and answer) has a
    row for each offered verb, in table order, and each example call passes the tool's own argument check."""
    from bot.core.verbs import example_arguments, render_tools_markdown

    rows = render_tools_markdown().splitlines()[2:]
    offered = [v for v in VERBS.values() if v.executable]
    assert [row.split(" | ")[0].removeprefix("| ") for row in rows] == [f"`{v.tool}`" for v in offered]
    for verb in offered:
        assert verb.check_arguments(example_arguments(verb))[1] == [], verb.name


@pytest.mark.parametrize(
    ("verb", "arguments", "problems"),
    [
        ("allocate_next_work", {}, {}),
        ("allocate_next_work", {"dry_run": 1, "action": "go", "owner": "a b"}, {"dry_run", "action", "owner"}),
        ("allocate_next_work", {"candidates_json": 6, "exclude_issue_numbers": 6}, {"candidates_json",
                                                                                    "exclude_issue_numbers"}),
        ("bootstrap_issue_worktree", {"issue_number": 1, "expected_base": "A" * 40}, {"expected_base"}),
        ("bootstrap_issue_worktree", {"issue_number": 1, "expected_base": "a" * 64, "idempotency_key": "k-1"}, set()),
        ("bootstrap_issue_worktree", {"issue_number": 1, "idempotency_key": "-k"}, {"idempotency_key"}),
        ("release_lease", {"issue_number": 1, "reason": "two\nlines"}, {"reason"}),
        ("post_issue_state", {"issue_number": 1, "state": "STATE: ready"}, {"state"}),
        ("get_runtime_context", {"issue_number": 1}, {"issue_number"}),
    ],
)
def test_arguments_are_checked_against_the_declared_parameters(
    verb: str, arguments: dict[str, Any], problems: set[str]
) -> None:
    values, found = VERBS[verb].check_arguments(arguments)
    assert {p["argument"] for p in found} == set(problems)
    if verb == "allocate_next_work" and not arguments:
        assert (values["dry_run"], values["action"]) == (True, "implement")


# --- the published schema is what is enforced -------------------------------------------------------------------------
#
# The oracle is the published input schema read by a stock Draft 2020-12 validator; the one addition is the
# content vocabulary (``contentMediaType: application/json`` + ``contentSchema``), which the spec leaves to the
# application: such a string must be RFC 8259 JSON text (no NaN/Infinity, no repeated key) whose value matches
# ``contentSchema``. Integers follow JSON Schema: ``1.0`` is the integer 1.

CANARY = [
    {"issue_number": 617, "title": "protected", "labels": ["priority:p0"], "created_at": "2026-07-01T10:00:00-05:00"},
    {"issue_number": 618, "title": "next", "labels": ["priority:p1"], "created_at": "2026-07-02T10:00:00-05:00"},
    {"issue_number": 619, "title": "later", "labels": [], "created_at": "2026-06-01T10:00:00-05:00"},
]
VALID_STATE: dict[str, Any] = {
    "state": "pr-open",
    "who_is_next": "reviewer",
    "next_action": "Review the pull request",
    "next_prompt": "",
    "what_happened": "implemented the change",
    "why": "issue asked for it",
    "related_prs": [7],
    "blockers": "none",
    "validation": "tests pass",
}
HUGE = 10**5000  # more than 4,300 digits: str() of it raises
NAN, INF = float("nan"), float("inf")
LONE = "\ud800"


def nested(depth: int, kind: str = "list") -> object:
    value: object = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def _strict_json(text: str) -> object:
    def pairs(items: list[tuple[str, object]]) -> dict[str, object]:
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            raise ValueError("repeated key")
        return dict(items)

    def constant(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)


def schema_verdict(schema: dict[str, Any], arguments: dict[str, Any]) -> bool:
    """Whether ``arguments`` is valid against a tool's published ``schema`` (the oracle)."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # a stock validator's messages repr() every value, however long
    try:
        if not jsonschema.Draft202012Validator(schema).is_valid(arguments):
            return False
        for name, sub in schema.get("properties", {}).items():
            value = arguments.get(name)
            branches = [b for b in sub.get("anyOf", [sub]) if "contentSchema" in b]
            if not isinstance(value, str) or not branches:
                continue
            assert branches[0]["contentMediaType"] == "application/json"
            try:
                decoded = _strict_json(value)
            except (ValueError, RecursionError):
                return False
            if not jsonschema.Draft202012Validator(branches[0]["contentSchema"]).is_valid(decoded):
                return False
        return True
    finally:
        sys.set_int_max_str_digits(limit)


#: Hostile values every argument is probed with.
HOSTILE: tuple[tuple[str, object], ...] = (
    ("huge-int", HUGE),
    ("minus-huge-int", -HUGE),
    ("nan", NAN),
    ("infinity", INF),
    ("minus-infinity", -INF),
    ("deep-array", nested(200)),
    ("deep-object", nested(200, "object")),
    ("lone-surrogate", LONE),
    ("surrogate-inside", f"ab{LONE}cd"),
    ("long-string", "x" * 1_000_000),
    ("null", None),
)

#: Probes per argument kind: (id, value). The verdict of each comes from the oracle, never from this list.
KIND_PROBES: dict[str, tuple[tuple[str, object], ...]] = {
    "issue_number": (
        ("1", 1), ("618", 618), ("float-integer", 1.0), ("max", 2**63 - 1), ("max-float", 9.2e18),
        ("2^63", 2**63), ("0", 0), ("-1", -1), ("1.5", 1.5), ("true", True), ("text", "1"), ("array", [1]),
        ("object", {}),
    ),
    "issue_numbers": (
        ("empty", []), ("one", [617]), ("floats", [1.0, 2]), ("max", [2**63 - 1]), ("json-text", "[1,2]"),
        ("booleans", [True]), ("scalar", 617), ("zero", [0]), ("2^63", [2**63]), ("nested", [[1]]),
        ("numeric-text", ["1"]), ("nan-item", [NAN]), ("huge-item", [HUGE]), ("too-many", list(range(1, 2002))),
    ),
    "candidates": (
        ("list", CANARY), ("json-text", json.dumps(CANARY)), ("object", CANARY[0]), ("alias", {"number": 700}),
        ("float-number", [{"issue_number": 700.0}]), ("scalar", 6), ("boolean", True), ("not-json", "not json"),
        ("text-of-ints", "[1,2]"), ("double-encoded", json.dumps(json.dumps(CANARY))),
        ("boolean-number", [{"issue_number": True}]), ("no-number", [{"title": "x"}]),
        ("unknown-field", [{"issue_number": 1, "bogus": 1}]), ("empty-label", [{"issue_number": 1, "labels": [""]}]),
        ("bad-date", [{"issue_number": 1, "created_at": "yesterday"}]), ("nan-text", '[{"issue_number": NaN}]'),
        ("repeated-key-text", '[{"issue_number": 1, "issue_number": 2}]'),
        ("huge-text", '[{"issue_number": 1' + "0" * 5000 + "}]"),
        ("deep-text", "[" * 5000 + "]" * 5000), ("2^63", [{"issue_number": 2**63}]),
    ),
    "boolean": (("true", True), ("false", False), ("one", 1), ("zero", 0), ("text", "true")),
    "login": (
        ("plain", "author-1"), ("at-login", "@author-1"), ("space", "a b"), ("empty", ""), ("41-chars", "a" * 41),
        ("trailing-newline", "author-1\n"), ("number", 5),
    ),
    "text": (
        ("word", "done"), ("padded", " done "), ("empty", ""), ("blank", "   "), ("newline", "a\nb"),
        ("trailing-newline", "ab\n"), ("carriage-return", "a\rb"), ("200-chars", "x" * 200), ("201-chars", "x" * 201),
        ("601-chars", "x" * 601), ("number", 5),
    ),
    "commit_message": (
        ("subject", "Fix it"), ("body", "Fix it\n\nWhy it was broken.\n\n- a\n- b"), ("100-chars", "x" * 100),
        ("101-chars-subject", "x" * 101 + "\n\nbody"), ("long-body", "Fix\n\n" + "y" * 5000), ("no-blank-line", "a\nb"),
        ("trailing-newline", "ab\n"), ("crlf", "a\r\n\r\nb"), ("tab-in-subject", "a\tb"), ("tab-in-body", "a\n\n\tb"),
        ("trailing-space-in-body", "a\n\nb "), ("three-newlines", "a\n\n\nb"), ("blank", "   "), ("empty", ""),
        ("too-long", "a\n\n" + "z" * 10_000), ("escape", "a\x1b[31m"), ("number", 5),
    ),
    "sha": (
        ("sha1", "a" * 40), ("sha256", "0" * 64), ("upper", "A" * 40), ("short", "a" * 39),
        ("trailing-newline", "a" * 40 + "\n"), ("number", 5),
    ),
    "key": (
        ("plain", "k-1"), ("100-chars", "A" * 100), ("dash-first", "-k"), ("empty", ""), ("101-chars", "A" * 101),
        ("trailing-newline", "k\n"), ("space", "k y"),
    ),
    "fingerprint": (
        ("sha256", "0" * 64), ("upper", "A" * 64), ("sha1", "a" * 40), ("word", "done"),
        ("trailing-newline", "0" * 64 + "\n"), ("number", 5),
    ),
    "choice": (("implement", "implement"), ("unknown", "go"), ("capitalised", "Implement"), ("number", 5)),
    "count": (
        ("0", 0), ("1", 1), ("50", 50), ("51", 51), ("float-integer", 2.0), ("1.5", 1.5), ("-1", -1),
        ("2^31", 2**31), ("true", True), ("text", "1"),
    ),
    "repository": (
        ("plain", "org/repo"), ("no-slash", "repo"), ("two-slashes", "a/b/c"), ("empty", ""),
        ("trailing-newline", "org/repo\n"), ("number", 5),
    ),
    "state": (
        ("valid", VALID_STATE), ("empty-object", {}), ("text", "STATE: ready"),
        ("missing-field", {k: v for k, v in VALID_STATE.items() if k != "why"}),
        ("unknown-field", {**VALID_STATE, "colour": "blue"}), ("bad-state", {**VALID_STATE, "state": "bogus"}),
        ("bad-role", {**VALID_STATE, "who_is_next": "janitor"}), ("empty-line", {**VALID_STATE, "why": ""}),
        ("two-lines", {**VALID_STATE, "why": "a\nb"}), ("padded-line", {**VALID_STATE, "why": " a "}),
        ("boolean-pr", {**VALID_STATE, "related_prs": [True]}), ("repeated-pr", {**VALID_STATE, "related_prs": [1, 1]}),
        ("float-pr", {**VALID_STATE, "related_prs": [7.0]}), ("with-extra", {**VALID_STATE, "extra": {"RISK": "low"}}),
        ("lower-extra-key", {**VALID_STATE, "extra": {"risk": "low"}}),
        ("field-as-extra", {**VALID_STATE, "extra": {"STATE": "x"}}),
        ("two-line-extra", {**VALID_STATE, "extra": {"RISK": "a\nb"}}),
        ("prompt", {**VALID_STATE, "next_prompt": "line one\n\nline two"}),
        ("prompt-trailing-newline", {**VALID_STATE, "next_prompt": "line one\n"}),
        ("prompt-trailing-space", {**VALID_STATE, "next_prompt": "line one \nline two"}),
        ("surrogate-line", {**VALID_STATE, "why": LONE}),
    ),
}

#: The named probes (each was once accepted by one side and refused by the other).
#: The verdict column is the decision taken per probe: JSON Schema's integer admits 1.0 (as 1); a login has no
#: leading @; one line means no line break anywhere; exclusions are an array of integers, never JSON text.
ITEM_8_PROBES: tuple[tuple[str, str, dict[str, Any], bool], ...] = (
    ("float-integer", "release_lease", {"issue_number": 1.0}, True),
    ("at-login", "allocate_next_work", {"owner": "@author-1"}, False),
    ("newline-reason", "release_lease", {"issue_number": 1, "reason": "two\nlines"}, False),
    ("json-text-exclusions", "allocate_next_work", {"exclude_issue_numbers": "[1,2]"}, False),
    ("boolean-exclusions", "allocate_next_work", {"exclude_issue_numbers": [True]}, False),
    ("empty-state", "post_issue_state", {"issue_number": 1, "state": {}}, False),
    ("2^63", "get_issue_state", {"issue_number": 2**63}, False),
)


def base_arguments(verb: Verb) -> dict[str, Any]:
    """A schema-valid call of ``verb`` that an in-process server can run without Gitea."""
    out: dict[str, Any] = {}
    for param in verb.params:
        if param.kind == "issue_number":
            out[param.name] = 618
        elif param.kind == "state":
            out[param.name] = VALID_STATE
        elif param.kind == "candidates":
            out[param.name] = CANARY
        elif param.name == "owner":
            out[param.name] = "author-1"
    return out


def argument_probes(*, hostile: bool = True) -> list[Any]:
    """(verb, arguments) for every offered verb: each argument swapped for each probe of its kind (and each
    hostile value), one unknown argument, each required argument left out."""
    cases: list[Any] = []
    for verb in VERBS.values():
        if not verb.executable:
            continue
        base = base_arguments(verb)
        cases.append(pytest.param(verb.name, base, id=f"{verb.name}|base"))
        cases.append(pytest.param(verb.name, {**base, "caller": "controller-bot"}, id=f"{verb.name}|unknown-argument"))
        for param in verb.params:
            probes = KIND_PROBES[param.kind] + (HOSTILE if hostile else ())
            for probe_id, value in probes:
                arguments = {**base, param.name: value}
                cases.append(pytest.param(verb.name, arguments, id=f"{verb.name}|{param.name}|{probe_id}"))
            if param.required:
                arguments = {k: v for k, v in base.items() if k != param.name}
                cases.append(pytest.param(verb.name, arguments, id=f"{verb.name}|{param.name}|omitted"))
    return cases


def checks_verdict(verb: Verb, arguments: dict[str, Any]) -> bool:
    _, problems = verb.check_arguments(arguments)
    return not problems


@pytest.mark.parametrize(("verb", "arguments"), argument_probes())
def test_the_checks_accept_exactly_what_the_published_schema_accepts(verb: str, arguments: dict[str, Any]) -> None:
    """Verb.check_arguments (what the server enforces) and the published input schema give
    the same verdict for every offered tool and every probe, hostile values included."""
    expected = schema_verdict(VERBS[verb].input_schema(), arguments)
    assert checks_verdict(VERBS[verb], arguments) == expected


@pytest.mark.parametrize(
    ("verb", "arguments", "valid"), [pytest.param(v, a, ok, id=i) for i, v, a, ok in ITEM_8_PROBES]
)
def test_issue_12_item_8_probes_get_one_verdict_from_schema_and_checks(
    verb: str, arguments: dict[str, Any], valid: bool
) -> None:
    """The probes of item 8 that the schema and the checks disagreed on (and 2^63, which they agreed on)."""
    assert schema_verdict(VERBS[verb].input_schema(), arguments) is valid
    assert checks_verdict(VERBS[verb], arguments) is valid


def test_integral_floats_reach_the_verbs_as_integers() -> None:
    """JSON Schema's integer is a number with no fraction: 1.0 is accepted, and the verb sees the int 1."""
    values, problems = VERBS["release_lease"].check_arguments({"issue_number": 1.0})
    assert problems == [] and type(values["issue_number"]) is int and values["issue_number"] == 1
    values, problems = VERBS["allocate_next_work"].check_arguments({"exclude_issue_numbers": [617.0]})
    assert problems == [] and values["exclude_issue_numbers"] == [617]
    assert all(type(n) is int for n in values["exclude_issue_numbers"])


def test_every_string_in_the_published_schemas_is_bounded() -> None:
    """No argument string is unbounded (a long string is refused by the schema itself)."""

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "string" or (isinstance(node.get("type"), list) and "string" in node["type"]):
                assert "maxLength" in node or "enum" in node, path
            if node.get("type") == "array":
                assert "maxItems" in node, path
            for key, sub in node.items():
                walk(sub, f"{path}/{key}")
        elif isinstance(node, list):
            for i, sub in enumerate(node):
                walk(sub, f"{path}/{i}")

    for verb in VERBS.values():
        walk(verb.input_schema(), verb.tool)


def test_every_offered_verb_has_one_registered_executor_once_the_catalog_is_loaded() -> None:
    """The verb families register with the door; the catalog loads them all, and a door refuses to be built while an
    offered verb has none (a family the composition root forgot)."""
    import pytest

    from bot import catalog
    from bot.verbs.runtime import registry

    assert registry().missing() == []
    taken = registry().executors.pop("heartbeat_lease")
    try:
        assert registry().missing() == ["heartbeat_lease"]
        with pytest.raises(RuntimeError, match="heartbeat_lease"):
            catalog.require_complete()
    finally:
        registry().executors["heartbeat_lease"] = taken


async def test_a_door_that_learns_the_bot_login_builds_its_bootstrap_as_it(tmp_path: Path) -> None:
    """The service learns its login from Gitea after the doors exist: a worktree bootstrap the door built before
    (with the configured login) must not keep acting as that one (its evidence and git identity)."""
    from bot.catalog import open_door
    from bot.verbs.worktree import BootstrapService
    from state.db import Database
    from tests.support import make_settings

    db = await Database.open(tmp_path / "f.db")
    try:
        door = open_door(db, make_settings(tmp_path), bot_login="configured-bot")
        before = await door.worktree_bootstrap()
        assert isinstance(before, BootstrapService) and before._ctx.bot_login == "configured-bot"
        door.learned_login("Foreman-Bot")
        after = await door.worktree_bootstrap()
        assert isinstance(after, BootstrapService) and after._ctx.bot_login == "Foreman-Bot"
        assert door.bot_login == "Foreman-Bot"
    finally:
        await db.close()
