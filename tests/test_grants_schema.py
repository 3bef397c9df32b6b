"""One schema: a grant can seal only what the gateway accepts, for every tool of the verb table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from bot.core import grants as g
from bot.core.digest import canonical_json, digest
from bot.core.verb_params import Param
from bot.core.verbs import VERBS, Verb
from tests.test_verbs_table import CANARY, HOSTILE, KIND_PROBES, VALID_STATE

NOW = datetime(2026, 7, 1, 12, 0, 0, tzinfo=UTC)
ISSUE = 8
FACTS = g.RunFacts(
    repo="org/repo",
    issue_number=ISSUE,
    owner="author-1",
    role="author",
    action="implement",
    lease_id="lease-1",
    worktree=g.BoundWorktree(path="/co/branches/issue-8-x", uuid="wt-uuid", branch="issue-8-x"),
)
TEARDOWN: dict[str, Any] = {"tool": "gitea_release_lease", "effect": "teardown", "args": {"issue_number": "{issue}"}}
OFFERED: tuple[Verb, ...] = tuple(v for v in VERBS.values() if v.executable)


def _valid(param: Param) -> object:
    """A value of ``param`` that a grant may seal (the run's own issue for an issue number)."""
    samples: dict[str, object] = {
        "issue_number": "{issue}",
        "state": VALID_STATE,
        "candidates": CANARY,
        "login": "{owner}",
        "text": "done by {owner}",
        "commit_message": "Done by {owner}\n\nFor #{issue}.",
        "sha": "a" * 40,
        "fingerprint": "0" * 64,
        "key": "run-7",
        "issue_numbers": [617],
        "boolean": True,
        "choice": param.choices[0] if param.choices else "",
        "count": param.minimum,
        "repository": "org/repo",
    }
    return samples[param.kind]


def _effect(tool: str) -> str:
    allowed = g.TOOL_CONTRACTS[tool].effects
    return "mutate" if "mutate" in allowed else "read"


def _template(verb: Verb, args: dict[str, Any]) -> dict[str, Any]:
    call = {"tool": verb.tool, "effect": _effect(verb.tool), "args": args}
    return {"expires_after_s": 600, "calls": [call, TEARDOWN]}


def _seal(template: dict[str, Any]) -> g.Grant:
    policy = g.PolicyTemplate.from_mapping("author.implement", template)
    return g.compile_grant(policy, FACTS, run_id="run-" + "0" * 32, host_id="host-a/1", now=NOW)


def _gateway_problems(grant: g.Grant) -> list[tuple[str, list[dict[str, str]]]]:
    found = []
    for call in grant.calls:
        _values, problems = next(v for v in OFFERED if v.tool == call.tool).check_arguments(call.arguments())
        if problems:
            found.append((call.tool, problems))
    return found


def test_the_grants_name_exactly_the_tools_the_verb_table_offers() -> None:
    assert set(g.TOOL_CONTRACTS) == {v.tool for v in OFFERED}
    for verb in OFFERED:
        assert set(g.TOOL_CONTRACTS[verb.tool].args) == {p.name for p in verb.params}, verb.tool


@pytest.mark.parametrize("verb", OFFERED, ids=lambda v: v.tool)
def test_a_template_using_every_argument_of_a_tool_compiles_and_the_gateway_accepts_the_grant(verb: Verb) -> None:
    grant = _seal(_template(verb, {p.name: _valid(p) for p in verb.params}))
    assert grant.calls[0].tool == verb.tool
    assert _gateway_problems(grant) == []


def _probes() -> list[Any]:
    cases = []
    for verb in OFFERED:
        for param in verb.params:
            for probe_id, value in (*KIND_PROBES[param.kind], *HOSTILE):
                cases.append(pytest.param(verb, param, value, id=f"{verb.tool}.{param.name}={probe_id}"))
    return cases


@pytest.mark.parametrize(("verb", "param", "value"), _probes())
def test_a_grant_compiles_only_with_values_the_gateway_accepts(verb: Verb, param: Param, value: object) -> None:
    """For every argument of every tool and every probe: a template that compiles gives a grant whose calls the
    gateway accepts; a value the gateway refuses cannot be sealed (the compiler names the argument)."""
    args = {p.name: _valid(p) for p in verb.params if p.required}
    args[param.name] = value
    _values, refused = verb.check_arguments({**args, "issue_number": ISSUE} if verb.issue_scoped else args)
    refused_here = [p for p in refused if p["argument"] == param.name]
    try:
        grant = _seal(_template(verb, args))
    except g.TemplateError as exc:
        assert any(path.startswith("calls.0.args") for path, _ in exc.problems), exc.problems
        return
    assert refused_here == [], f"sealed {param.name}={value!r}, which the gateway refuses: {refused_here}"
    assert _gateway_problems(grant) == []


def test_an_idempotency_key_the_gateway_refuses_cannot_be_sealed() -> None:
    """The named disagreement: a grant sealed idempotency_key="run/7", and the gateway then refused the call."""
    verb = VERBS["bootstrap_issue_worktree"]
    _values, problems = verb.check_arguments({"issue_number": ISSUE, "idempotency_key": "run/7"})
    assert [p["argument"] for p in problems] == ["idempotency_key"]
    with pytest.raises(g.TemplateError) as caught:
        _seal(_template(verb, {"issue_number": "{issue}", "idempotency_key": "run/7"}))
    assert caught.value.problems == (("calls.0.args", f"idempotency_key: {problems[0]['problem']}"),)


def test_a_fingerprint_pin_must_be_a_fingerprint_and_a_posted_state_a_canonical_state() -> None:
    allocate, post = VERBS["allocate_next_work"], VERBS["post_issue_state"]
    with pytest.raises(g.TemplateError, match="expected_fingerprint: expected the dry run's fingerprint"):
        _seal(_template(allocate, {"expected_fingerprint": "pinned"}))
    with pytest.raises(g.TemplateError, match="state: expected a Canonical Issue State object"):
        _seal(_template(post, {"issue_number": "{issue}", "state": {"state": "done"}}))


def test_the_contract_digest_covers_each_arguments_schema_but_not_its_wording() -> None:
    """A changed schema changes the contract digest (a grant sealed under the old one is refused at its next call);
    a reworded description does not (it changes no verdict)."""
    doc = g.contract_document()
    param = next(p for p in VERBS["bootstrap_issue_worktree"].params if p.name == "idempotency_key")
    wording = {k: v for k, v in param.schema().items() if k != "description"}
    assert doc["tools"]["gitea_bootstrap_issue_worktree"]["args"]["idempotency_key"] == {
        "required": False,
        "schema": wording,
    }
    assert '"description"' not in canonical_json(doc)
    assert g.CONTRACT_DIGEST == digest(doc)


def test_a_whole_number_written_with_a_fraction_cannot_be_sealed() -> None:
    """The gateway takes 617.0 as 617 (JSON Schema's integer), but a grant seals exact values: 1.0 is not 1."""
    verb = VERBS["allocate_next_work"]
    _values, problems = verb.check_arguments({"exclude_issue_numbers": [617.0]})
    assert problems == []
    with pytest.raises(g.TemplateError, match="without a fraction"):
        _seal(_template(verb, {"exclude_issue_numbers": [617.0], "dry_run": True}))
