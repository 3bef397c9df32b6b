"""The verb table, decision by decision: every verb x role x precondition state gives the documented decision.

The matrix below is written by hand from the issue's rules (issue 7, item 2; seed 001): role and ownership
gates refuse ``not_authorized`` (NA) and come first; missing artifacts are a ``tracing_gap`` naming every
missing token (``gap:a+b``). It is the documentation the code is held to, not derived from the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from bot.core.gateway import GatewayContext, Role
from bot.core.verbs import VERBS, evaluate

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
        )


STATES: dict[str, State] = {
    "no lease": State(),
    "my lease": State(lease=ME),
    "my lease, worktree": State(lease=ME, worktree=True),
    "my lease, worktree, commits": State(lease=ME, worktree=True, commits=2),
    "my expired lease": State(lease=ME, live=False, worktree=True, commits=2),
    "their lease": State(lease=THEM, worktree=True, commits=2),
    "their PR": State(lease=THEM, worktree=True, commits=2, pr_author=THEM),
    "their approved PR": State(lease=THEM, worktree=True, commits=2, pr_author=THEM, approved=True),
    "my approved PR": State(lease=ME, worktree=True, commits=2, pr_author=ME, approved=True),
}

# verb -> state -> decision per column (controller, author, reviewer, merger, not on the roster)
EXPECTED: dict[str, dict[str, str]] = {
    "allocate_next_work": {s: "ok NA NA NA NA" for s in STATES},
    "bootstrap_issue_worktree": {
        "no lease": "NA NA NA NA NA",
        "my lease": "ok ok ok ok NA",
        "my lease, worktree": "ok ok ok ok NA",
        "my lease, worktree, commits": "ok ok ok ok NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "ok ok ok ok NA",
    },
    "lock_issue": {
        "no lease": "NA NA NA NA NA",
        "my lease": "gap:worktree gap:worktree gap:worktree gap:worktree NA",
        "my lease, worktree": "ok ok ok ok NA",
        "my lease, worktree, commits": "ok ok ok ok NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "ok ok ok ok NA",
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
    },
    "get_runtime_context": {s: "ok ok ok ok NA" for s in STATES},
    "open_pr": {
        "no lease": "NA NA NA NA NA",
        "my lease": "NA gap:worktree+commits NA NA NA",
        "my lease, worktree": "NA gap:commits NA NA NA",
        "my lease, worktree, commits": "NA ok NA NA NA",
        "my expired lease": "NA NA NA NA NA",
        "their lease": "NA NA NA NA NA",
        "their PR": "NA NA NA NA NA",
        "their approved PR": "NA NA NA NA NA",
        "my approved PR": "NA ok NA NA NA",
    },
    "claim_review": {
        "no lease": "NA NA gap:pull_request NA NA",
        "my lease": "NA NA gap:pull_request NA NA",
        "my lease, worktree": "NA NA gap:pull_request NA NA",
        "my lease, worktree, commits": "NA NA gap:pull_request NA NA",
        "my expired lease": "NA NA gap:pull_request NA NA",
        "their lease": "NA NA gap:pull_request NA NA",
        "their PR": "NA NA ok NA NA",
        "their approved PR": "NA NA ok NA NA",
        "my approved PR": "NA NA NA NA NA",  # the self-review block
    },
    "merge": {
        "no lease": "NA NA NA gap:pull_request+approval NA",
        "my lease": "NA NA NA gap:pull_request+approval NA",
        "my lease, worktree": "NA NA NA gap:pull_request+approval NA",
        "my lease, worktree, commits": "NA NA NA gap:pull_request+approval NA",
        "my expired lease": "NA NA NA gap:pull_request+approval NA",
        "their lease": "NA NA NA gap:pull_request+approval NA",
        "their PR": "NA NA NA gap:approval NA",
        "their approved PR": "NA NA NA ok NA",
        "my approved PR": "NA NA NA ok NA",
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
    """Issue 7 "Done when": the table-driven decision for every verb x role x precondition state."""
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
    from bot.core.verbs import render_params_markdown, render_verb_table_markdown
    from tests.conftest import REPO_ROOT

    doc = (REPO_ROOT / "docs" / "mcp.md").read_text(encoding="utf-8")
    assert _generated(doc, "verb-table") == render_verb_table_markdown()
    assert _generated(doc, "params") == render_params_markdown()


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
