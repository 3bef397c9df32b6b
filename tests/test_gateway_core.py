"""The gateway's pure core: Decision invariants, seed 001's evaluation rule and envelopes, the verb table."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from operator import itemgetter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.core.errors import Envelope
from bot.core.gateway import (
    ROLES,
    Decision,
    GatewayContext,
    Precondition,
    RejectionKind,
    evaluate_preconditions,
)
from bot.core.verbs import (
    ALL_ROLES,
    PRECONDITION_COMMITS,
    PRECONDITION_OWNERSHIP,
    PRECONDITION_PR_EXISTS,
    TOOLS,
    VERBS,
    Verb,
    evaluate,
    mcp_tool_names,
    render_verb_table_markdown,
)

SEED_001 = "seeds/001_ef6fcefa82666549.txt"
SEED_NOT_ASSIGNED = "task is not assigned to you; call give_me_work() to find your work"
SEED_COMMIT_REMEDIATE = "commit() at least once with a non-empty message before submitting"

Flags = tuple[bool, ...]


def _seed_envelopes(shared_dir: Path) -> list[dict[str, Any]]:
    """The JSON blocks of seed 001, each as written (key order kept)."""
    text = (shared_dir / SEED_001).read_text(encoding="utf-8")
    blocks = re.findall(r"^\{\n.*?\n\}$", text, flags=re.MULTILINE | re.DOTALL)
    return [json.loads(b) for b in blocks]


def _seed_example(shared_dir: Path, error: str) -> dict[str, Any]:
    return next(e for e in _seed_envelopes(shared_dir) if e["error"] == error)


def _without_next_action(envelope: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in envelope.items() if k != "exact_next_action"}


def _flag(i: int, kind: RejectionKind, *, token: str | None = None) -> Precondition[Flags]:
    """A precondition that passes when flag ``i`` of the context is true."""
    return Precondition(
        key=f"p{i}",
        check=itemgetter(i),
        remediate=f"fix p{i}",
        missing_token=token or f"t{i}",
        rejection_kind=kind,
    )


def _ctx(caller: str = "author-1", *roles: str, **facts: Any) -> GatewayContext:
    return GatewayContext(caller=caller, caller_roles=frozenset(roles), **facts)  # type: ignore[arg-type]


def _author_on_task(**facts: Any) -> GatewayContext:
    base: dict[str, Any] = {
        "issue_number": 42,
        "lease_owner": "author-1",
        "lease_live": True,
        "worktree_registered": True,
        "commits_ahead": 2,
    }
    base.update(facts)
    return _ctx("author-1", "author", **base)


# --- Decision invariants -----------------------------------------------------------------------

_INVALID_DECISIONS: dict[str, dict[str, Any]] = {
    "allow with a kind": {"outcome": "allow", "kind": "not_authorized"},
    "allow with missing": {"outcome": "allow", "missing": ("commits",)},
    "allow with a remediation": {"outcome": "allow", "remediate": "do x"},
    "allow with a message": {"outcome": "allow", "message": "m"},
    "allow with a next action": {"outcome": "allow", "exact_next_action": "do x"},
    "allow with failed keys": {"outcome": "allow", "failed": ("p0",)},
    "reject with missing": {
        "outcome": "reject", "kind": "not_authorized", "message": "m", "remediate": "r",
        "exact_next_action": "a", "missing": ("commits",),
    },
    "reject without a remediation": {
        "outcome": "reject", "kind": "not_authorized", "message": "m", "exact_next_action": "a",
    },
    "reject without a message": {
        "outcome": "reject", "kind": "not_authorized", "remediate": "r", "exact_next_action": "a",
    },
    "reject without a next action": {
        "outcome": "reject", "kind": "not_authorized", "message": "m", "remediate": "r",
    },
    "reject without a kind": {
        "outcome": "reject", "message": "m", "remediate": "r", "exact_next_action": "a",
    },
    "reject of kind tracing_gap": {
        "outcome": "reject", "kind": "tracing_gap", "message": "m", "remediate": "r",
        "exact_next_action": "a",
    },
    "reject of an unknown kind": {
        "outcome": "reject", "kind": "nope", "message": "m", "remediate": "r", "exact_next_action": "a",
    },
    "tracing_gap without missing": {
        "outcome": "tracing_gap", "kind": "tracing_gap", "message": "m", "remediate": "r",
        "exact_next_action": "a",
    },
    "tracing_gap with an empty token": {
        "outcome": "tracing_gap", "kind": "tracing_gap", "message": "m", "remediate": "r",
        "exact_next_action": "a", "missing": ("",),
    },
    "tracing_gap without a remediation": {
        "outcome": "tracing_gap", "kind": "tracing_gap", "message": "m", "exact_next_action": "a",
        "missing": ("commits",),
    },
    "tracing_gap without a message": {
        "outcome": "tracing_gap", "kind": "tracing_gap", "remediate": "r", "exact_next_action": "a",
        "missing": ("commits",),
    },
    "tracing_gap of kind not_authorized": {
        "outcome": "tracing_gap", "kind": "not_authorized", "message": "m", "remediate": "r",
        "exact_next_action": "a", "missing": ("commits",),
    },
    "unknown outcome": {"outcome": "maybe", "kind": "not_authorized", "message": "m", "remediate": "r"},
}


@pytest.mark.parametrize("fields", _INVALID_DECISIONS.values(), ids=list(_INVALID_DECISIONS))
def test_decision_refuses_to_be_built_in_an_invalid_shape(fields: dict[str, Any]) -> None:
    """Seed 001: allow has nothing to fix; reject has a remediation, no missing[]; a gap names its missing."""
    with pytest.raises(ValueError):
        Decision(**fields)


def test_decision_constructors_build_the_three_valid_shapes() -> None:
    assert Decision.allow().allowed
    rej = Decision.reject(kind="not_authorized", message="m", remediate="r")
    assert (rej.outcome, rej.missing, rej.exact_next_action) == ("reject", (), "r")
    gap = Decision.tracing_gap(missing=["a", "b"], remediate="r")
    assert (gap.outcome, gap.kind, gap.missing, gap.message) == ("tracing_gap", "tracing_gap", ("a", "b"),
                                                                 "Missing required a, b")
    with pytest.raises(ValueError):
        Decision.tracing_gap(missing=[], remediate="r")
    with pytest.raises(ValueError):
        Decision.reject(kind="not_authorized", message="m", remediate="")


def test_allow_has_no_envelope() -> None:
    with pytest.raises(ValueError):
        Decision.allow().envelope()
    with pytest.raises(ValueError):
        Decision.allow().to_error()


@pytest.mark.parametrize(
    "fields",
    [
        {"key": "", "remediate": "r", "missing_token": "t"},
        {"key": "k", "remediate": "", "missing_token": "t"},
        {"key": "k", "remediate": "r", "missing_token": ""},
        {"key": "k", "remediate": "r", "missing_token": "t", "rejection_kind": "invalid_state"},
    ],
)
def test_precondition_refuses_incomplete_or_unknown_kind(fields: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Precondition(check=bool, **fields)


def test_precondition_rejection_kind_defaults_to_tracing_gap() -> None:
    assert Precondition(key="k", check=bool, remediate="r", missing_token="t").rejection_kind == "tracing_gap"


# --- Seed 001's evaluation rule ----------------------------------------------------------------


def test_all_passing_preconditions_allow() -> None:
    pres = [_flag(0, "not_authorized"), _flag(1, "tracing_gap")]
    assert evaluate_preconditions(pres, (True, True)) == Decision.allow()


def test_first_failing_not_authorized_rejects_without_missing() -> None:
    """Seed 001: the first failure is an identity gate: not_authorized, no missing[], even with gaps after."""
    pres = [_flag(0, "not_authorized"), _flag(1, "tracing_gap"), _flag(2, "tracing_gap")]
    d = evaluate_preconditions(pres, (False, False, False))
    assert (d.outcome, d.kind, d.missing) == ("reject", "not_authorized", ())
    assert d.message == d.remediate == "fix p0"
    assert d.failed == ("p0", "p1", "p2")
    assert "missing" not in d.envelope()


def test_tracing_gap_lists_every_missing_token_in_order_with_first_remediation() -> None:
    pres = [_flag(i, "tracing_gap") for i in range(4)]
    d = evaluate_preconditions(pres, (True, False, True, False))
    assert (d.outcome, d.missing, d.remediate) == ("tracing_gap", ("t1", "t3"), "fix p1")
    assert d.envelope()["missing"] == ["t1", "t3"]


def test_not_authorized_failing_second_still_gives_tracing_gap_naming_it() -> None:
    """Seed 001: only the FIRST failure's kind counts; missing[] holds every failing token, the gate's too."""
    pres = [_flag(0, "tracing_gap"), _flag(1, "not_authorized")]
    d = evaluate_preconditions(pres, (False, False))
    assert (d.outcome, d.kind, d.remediate) == ("tracing_gap", "tracing_gap", "fix p0")
    assert d.missing == ("t0", "t1")


def test_first_failure_is_taken_by_position_not_by_token() -> None:
    """The seed looks the first failure up by token; with a repeated token we take the one that failed."""
    pres = [_flag(0, "not_authorized", token="dup"), _flag(1, "tracing_gap", token="dup")]
    d = evaluate_preconditions(pres, (True, False))
    assert (d.outcome, d.missing, d.remediate) == ("tracing_gap", ("dup",), "fix p1")


@given(st.lists(st.tuples(st.sampled_from(["tracing_gap", "not_authorized"]), st.booleans()), max_size=8))
def test_evaluation_rule_holds_for_any_outcomes(spec: list[tuple[RejectionKind, bool]]) -> None:
    """Property (seed 001): allow iff none fail; else the first failure's kind decides; gaps list all."""
    pres = [_flag(i, kind) for i, (kind, _) in enumerate(spec)]
    ctx: Flags = tuple(ok for _, ok in spec)
    d = evaluate_preconditions(pres, ctx)
    failing = [i for i, ok in enumerate(ctx) if not ok]
    if not failing:
        assert d == Decision.allow()
        return
    first = failing[0]
    assert d.remediate == f"fix p{first}"
    assert d.failed == tuple(f"p{i}" for i in failing)
    env = d.envelope()
    assert env["error"] == d.kind and env["remediate"] == d.remediate and env["exact_next_action"]
    if spec[first][0] == "not_authorized":
        assert (d.outcome, d.kind, d.missing, d.message) == ("reject", "not_authorized", (), d.remediate)
        assert list(env) == ["error", "message", "remediate", "exact_next_action"]
    else:
        assert (d.outcome, d.kind) == ("tracing_gap", "tracing_gap")
        assert d.missing == tuple(f"t{i}" for i in failing)
        assert list(env) == ["error", "message", "missing", "remediate", "exact_next_action"]


# --- Envelopes exactly as seed 001 shows them --------------------------------------------------


def test_seed_has_three_example_envelopes_of_two_kinds(shared_dir: Path) -> None:
    assert [e["error"] for e in _seed_envelopes(shared_dir)] == ["tracing_gap", "not_authorized", "not_authorized"]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["commits gap", "agent experience", "agent-visible impact"])
def test_each_of_the_seeds_three_example_envelopes_is_reproduced_exactly(shared_dir: Path, index: int) -> None:
    """Issue 7 "Done when": seed 001's three JSON examples, byte for byte (same keys, order and values).

    The seed's own preconditions (its ownership gate first, then its commits check, in its words) are
    evaluated by our gateway: the owner without commits gets the first, anyone else the other two.
    """
    seed = _seed_envelopes(shared_dir)[index]
    preconditions = [
        replace(PRECONDITION_OWNERSHIP, remediate=SEED_NOT_ASSIGNED),
        replace(PRECONDITION_COMMITS, remediate=SEED_COMMIT_REMEDIATE),
    ]
    context = _author_on_task(commits_ahead=0) if seed["error"] == "tracing_gap" else _ctx("intruder", "author")
    env = evaluate_preconditions(preconditions, context).envelope()
    assert json.dumps(_without_next_action(env), indent=2) == json.dumps(seed, indent=2)
    assert env["exact_next_action"] == seed["remediate"]


def test_tracing_gap_envelope_matches_seed_example_literally(shared_dir: Path) -> None:
    """Seed 001 "Agent experience" for a missing commit: same keys, same order, same values."""
    seed = _seed_example(shared_dir, "tracing_gap")
    commits = replace(PRECONDITION_COMMITS, remediate=SEED_COMMIT_REMEDIATE)
    env = evaluate_preconditions([commits], _author_on_task(commits_ahead=0)).envelope()
    assert json.dumps(_without_next_action(env)) == json.dumps(seed)
    assert env["exact_next_action"] == SEED_COMMIT_REMEDIATE


def test_not_authorized_envelope_matches_seed_example_literally(shared_dir: Path) -> None:
    """Seed 001 ownership refusal: message equals remediate, and there is no missing[]."""
    seed = _seed_example(shared_dir, "not_authorized")
    owns = replace(PRECONDITION_OWNERSHIP, remediate=SEED_NOT_ASSIGNED)
    env = evaluate_preconditions([owns, PRECONDITION_COMMITS], _ctx("intruder", "author")).envelope()
    assert json.dumps(_without_next_action(env)) == json.dumps(seed)


def test_envelope_carries_the_same_values_as_the_shared_error_envelope() -> None:
    """DESIGN section 3: the same refusal through bot.core.errors.Envelope (only its key order differs)."""
    for d in (
        evaluate("open_pull_request", _author_on_task(commits_ahead=0, worktree_registered=False)),
        evaluate("merge_pull_request", _ctx("author-1", "author")),
    ):
        err = d.to_error()
        assert isinstance(err, Envelope)
        assert err.to_dict() == d.envelope()


# --- The verb table's decisions ----------------------------------------------------------------


def test_self_review_is_blocked_as_not_authorized() -> None:
    ctx = _ctx("rev-1", "reviewer", "author", issue_number=42, pr_number=7, pr_author="rev-1", issue_state="review")
    d = evaluate("claim_review", ctx)
    assert (d.outcome, d.kind, d.missing) == ("reject", "not_authorized", ())
    assert "not_pr_author" in d.failed
    ok = evaluate("claim_review", replace(ctx, pr_author="author-1"))
    assert ok.allowed
    implemented = evaluate("claim_review", replace(ctx, pr_author="author-1", implementer="rev-1"))
    assert (implemented.kind, implemented.failed) == ("not_authorized", ("not_implementer",))


def test_claim_review_without_a_pr_is_a_tracing_gap() -> None:
    d = evaluate("claim_review", _ctx("rev-1", "reviewer", issue_number=42))
    assert (d.outcome, d.missing) == ("tracing_gap", ("pull_request", "status_review"))


def test_merge_by_a_non_merger_is_not_authorized() -> None:
    for roles in (("author",), ("reviewer",), ("controller",), ()):
        d = evaluate("merge_pull_request", _ctx("someone", *roles, pr_number=7, pr_author="author-1", pr_approved=True))
        assert (d.outcome, d.kind, d.missing) == ("reject", "not_authorized", ())
    ok = evaluate("merge_pull_request", _ctx("merger-1", "merger", pr_number=7, pr_author="author-1", pr_approved=True))
    assert ok.allowed


def test_merge_without_pr_or_approval_lists_both_missing() -> None:
    d = evaluate("merge_pull_request", _ctx("merger-1", "merger", issue_number=42))
    assert (d.outcome, d.missing) == ("tracing_gap", ("pull_request", "approval"))


def test_open_pr_without_commits_is_a_tracing_gap_naming_commits() -> None:
    d = evaluate("open_pull_request", _author_on_task(commits_ahead=0))
    assert (d.outcome, d.kind, d.missing) == ("tracing_gap", "tracing_gap", ("commits",))
    assert d.message == "Missing required commit(s)"
    assert evaluate("open_pull_request", _author_on_task()).allowed


def test_open_pr_lists_every_missing_artifact_in_table_order() -> None:
    d = evaluate("open_pull_request", _author_on_task(commits_ahead=0, worktree_registered=False))
    assert d.missing == ("worktree", "commits")
    assert d.remediate == VERBS["open_pull_request"].preconditions[2].remediate


def test_open_pr_on_someone_elses_issue_is_not_authorized_before_any_gap() -> None:
    ctx = _author_on_task(lease_owner="author-2", commits_ahead=0, worktree_registered=False)
    d = evaluate("open_pull_request", ctx)
    assert (d.outcome, d.kind, d.missing) == ("reject", "not_authorized", ())
    assert d.failed[0] == PRECONDITION_OWNERSHIP.key


def test_expired_lease_is_not_ownership() -> None:
    d = evaluate("lock_issue", _author_on_task(lease_live=False))
    assert (d.outcome, d.kind) == ("reject", "not_authorized")


def test_lock_without_a_registered_worktree_points_at_bootstrap() -> None:
    d = evaluate("lock_issue", _author_on_task(worktree_registered=False))
    assert d.missing == ("worktree",)
    assert "gitea_bootstrap_issue_worktree" in d.remediate


def test_allocate_is_for_the_controller_only() -> None:
    assert evaluate("allocate_next_work", _ctx("ctl", "controller")).allowed
    d = evaluate("allocate_next_work", _ctx("author-1", "author"))
    assert (d.outcome, d.kind) == ("reject", "not_authorized")


def test_heartbeat_and_release_allow_owner_or_controller() -> None:
    foreign = {"issue_number": 42, "lease_owner": "author-2", "lease_live": True}
    for verb in ("heartbeat_lease", "release_lease"):
        assert evaluate(verb, _author_on_task()).allowed
        assert evaluate(verb, _ctx("ctl", "controller", **foreign)).allowed
        assert evaluate(verb, _ctx("author-1", "author", **foreign)).kind == "not_authorized"
        gap = evaluate(verb, _ctx("ctl", "controller", issue_number=42))
        assert (gap.outcome, gap.missing) == ("tracing_gap", ("live_lease",))


def test_reads_need_only_a_roster_role() -> None:
    for verb in ("get_issue_state", "get_runtime_context"):
        assert evaluate(verb, _ctx("rev-1", "reviewer")).allowed
        assert evaluate(verb, _ctx("stranger")).kind == "not_authorized"


def test_unknown_verb_is_invalid_input() -> None:
    d = evaluate("delete_repo", _ctx("ctl", "controller"))
    assert (d.outcome, d.kind, d.missing) == ("reject", "invalid_input", ())
    assert "allocate_next_work" in d.remediate


_contexts = st.builds(
    GatewayContext,
    caller=st.sampled_from(["a", "b", "c"]),
    caller_roles=st.frozensets(st.sampled_from(ROLES)),
    issue_number=st.none() | st.just(42),
    lease_owner=st.none() | st.sampled_from(["a", "b"]),
    lease_live=st.booleans(),
    worktree_registered=st.booleans(),
    commits_ahead=st.integers(0, 3),
    pr_approved=st.booleans(),
).flatmap(
    lambda c: st.sampled_from([None, "a", "b"]).map(
        lambda author: replace(c, pr_number=None if author is None else 7, pr_author=author)
    )
)


@given(st.sampled_from(sorted(VERBS)), _contexts)
def test_any_failing_gate_in_the_table_refuses_as_not_authorized(verb_name: str, ctx: GatewayContext) -> None:
    """Gates come first in every verb, so a failing gate always means not_authorized and never missing[]."""
    verb = VERBS[verb_name]
    d = evaluate(verb_name, ctx)
    gates = [p for p in verb.preconditions if p.rejection_kind == "not_authorized"]
    if any(not g.check(ctx) for g in gates):
        assert (d.outcome, d.kind, d.missing) == ("reject", "not_authorized", ())
    elif d.allowed:
        assert all(p.check(ctx) for p in verb.preconditions)
    else:
        assert d.outcome == "tracing_gap"
        assert d.missing == tuple(p.missing_token for p in verb.preconditions if not p.check(ctx))
    if not (ctx.caller_roles & verb.roles):
        assert d.kind == "not_authorized"


# --- Table consistency -------------------------------------------------------------------------


def test_every_verb_starts_with_its_role_gate_and_keeps_gates_before_artifacts() -> None:
    for verb in VERBS.values():
        kinds = [p.rejection_kind for p in verb.preconditions]
        assert kinds[0] == "not_authorized", verb.name
        assert kinds == sorted(kinds, key=lambda k: k != "not_authorized"), verb.name
        outsiders = frozenset(ROLES) - verb.roles
        ctx = _ctx("x", *sorted(outsiders))
        assert not verb.preconditions[0].check(ctx), verb.name
        for role in verb.roles:
            assert verb.preconditions[0].check(_ctx("x", role)), (verb.name, role)


def test_tool_names_are_unique_and_derived_from_verb_names() -> None:
    tools = mcp_tool_names()
    assert len(set(tools)) == len(tools) == len(VERBS)
    assert all(TOOLS[t].tool == t == f"gitea_{TOOLS[t].name}" for t in tools)


def test_every_mcp_tool_in_design_is_in_the_table(shared_dir: Path) -> None:
    design = (shared_dir / "DESIGN.md").read_text(encoding="utf-8")
    section = design.split("### MCP tools", 1)[1].split("###", 1)[0]
    named = set(re.findall(r"`(gitea_\w+)`", section))
    assert len(named) == 8
    assert named <= set(TOOLS)


def test_next_verbs_and_tokens_are_consistent() -> None:
    for verb in VERBS.values():
        assert set(verb.next_verbs) <= set(VERBS), verb.name
        tokens = [p.missing_token for p in verb.preconditions]
        assert len(set(tokens)) == len(tokens), verb.name
    assert VERBS["open_pull_request"].preconditions[-1] is PRECONDITION_COMMITS
    assert PRECONDITION_PR_EXISTS in VERBS["merge_pull_request"].preconditions
    assert {v.effect for v in VERBS.values()} == {"read", "mutate"}
    assert {"controller", "author", "reviewer", "merger"} == set(ALL_ROLES)


@pytest.mark.parametrize(
    "preconditions",
    [
        (),
        (PRECONDITION_COMMITS,),
        (PRECONDITION_OWNERSHIP, PRECONDITION_COMMITS, PRECONDITION_OWNERSHIP),
        (PRECONDITION_OWNERSHIP, PRECONDITION_COMMITS, PRECONDITION_COMMITS),
    ],
    ids=["no gate", "artifact first", "gate after artifact", "repeated token"],
)
def test_a_verb_cannot_be_declared_out_of_shape(preconditions: tuple[Any, ...]) -> None:
    with pytest.raises(ValueError):
        Verb(name="x", summary="x", roles=ALL_ROLES, preconditions=preconditions, effect="read")


def test_markdown_table_has_one_row_per_verb_in_order() -> None:
    md = render_verb_table_markdown()
    rows = md.splitlines()[2:]
    assert [r.split("|")[1].strip().strip("`") for r in rows] == list(VERBS)
    open_pr = rows[list(VERBS).index("open_pull_request")]
    assert "`gitea_open_pull_request`" in open_pr and "`commits` (tracing_gap)" in open_pr
    assert md == render_verb_table_markdown()


def test_context_rejects_impossible_facts() -> None:
    with pytest.raises(ValueError):
        _ctx("a", "janitor")
    with pytest.raises(ValueError):
        _ctx("a", commits_ahead=-1)
    with pytest.raises(ValueError):
        _ctx("a", pr_number=7)
