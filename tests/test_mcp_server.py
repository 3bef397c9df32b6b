"""The MCP surface in process: tools and schemas, identity, the door before every call, results and refusals."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # (no stubs installed; the project adds none)
import pydantic
import pytest
from mcp import Client

from bot.catalog import open_door
from bot.config import Settings
from bot.core.evidence import find_marker
from bot.core.verbs import VERBS
from bot.mcp_server import IdentityError, build_server, resolve_identity
from bot.verbs.runtime import BootstrapAnswer, VerbRuntime, WorktreeBootstrap, no_bootstrap
from handlers.issue_state import on_outbox_complete
from state.db import Database
from state.issues import IssueStore
from state.outbox import OutboxStore
from tests.gitea_fixtures import OWNER, REPO, live_emulator
from tests.support import HANG_S, make_settings
from tests.test_verbs_table import VALID_STATE, argument_probes, schema_verdict

ROSTER = {
    "controller-bot": ["controller"],
    "author-1": ["author"],
    "author-2": ["author"],
    "rev-1": ["reviewer"],
    "merge-1": ["merger"],
}
TOKENS = {
    "tok-controller": "controller-bot",
    "tok-author-1": "author-1",
    "tok-author-2": "author-2",
    "tok-stranger": "stranger",
    "tok-rev-1": "rev-1",
    "tok-merge-1": "merge-1",
}
# Seed 000's canary: #617 ranks first (p0) and must never be selected or leased when excluded.
CANARY = [
    {"issue_number": 617, "title": "protected", "labels": ["priority:p0"], "created_at": "2026-07-01T10:00:00-05:00"},
    {"issue_number": 618, "title": "next", "labels": ["priority:p1"], "created_at": "2026-07-02T10:00:00-05:00"},
    {"issue_number": 619, "title": "later", "labels": [], "created_at": "2026-06-01T10:00:00-05:00"},
]
ALLOCATE: dict[str, Any] = {"owner": "author-1", "candidates_json": CANARY}
STATE = VALID_STATE


def mcp_settings(tmp_path: Path, **sections: Any) -> Settings:
    return make_settings(
        tmp_path,
        roster=ROSTER,
        mcp={"tokens": TOKENS},
        repository={"owner": OWNER, "name": REPO, "checkout_root": str(tmp_path / "checkouts")},
        allocator={"lease_ttl_s": 3600, "lease_grace_s": 60},
        **sections,
    )


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[VerbRuntime]:
    settings = mcp_settings(tmp_path)
    db = await Database.open(settings.database.path, synchronous="NORMAL")
    yield open_door(db=db, settings=settings, bot_login="foreman-bot", bootstrap_factory=no_bootstrap)
    await db.close()


@asynccontextmanager
async def connect(runtime: VerbRuntime, token: str) -> AsyncIterator[Client]:
    async with Client(build_server(runtime, resolve_identity(runtime.settings, token))) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """(is_error, structured content); the text content is always the same document as JSON."""
    result = await client.call_tool(tool, arguments)
    assert result.structured_content is not None
    assert json.loads(result.content[0].text) == result.structured_content  # type: ignore[union-attr]
    return bool(result.is_error), result.structured_content


async def lease_618(runtime: VerbRuntime) -> None:
    async with connect(runtime, "tok-controller") as client:
        error, doc = await call(
            client, "gitea_allocate_next_work", **ALLOCATE, exclude_issue_numbers=[617], dry_run=False
        )
    assert not error and doc["lease"]["issue_number"] == 618 and doc["lease"]["owner"] == "author-1"


@dataclass
class FakeBootstrap:
    """A stand-in for the worktree bootstrap at the runtime's seam; records what it was asked."""

    registered: set[int] = field(default_factory=set)
    locks: set[int] = field(default_factory=set)
    checkout: Path | None = None
    calls: list[tuple[str, int, str]] = field(default_factory=list)
    refuse: bool = False

    async def bootstrap(
        self, *, issue_number: int, caller: str, idempotency_key: str | None, expected_base: str | None
    ) -> BootstrapAnswer:
        self.calls.append(("bootstrap", issue_number, caller))
        if self.refuse:
            from bot.core.errors import Envelope

            env = Envelope(error="stale_pin", message="base moved", remediate="dry-run again", exact_next_action="x")
            return BootstrapAnswer(doc=env.to_dict(), refusal=env)
        self.registered.add(issue_number)
        return BootstrapAnswer(doc={"status": "created", "issue_number": issue_number, "proof": {},
                                    "branch": f"issue-{issue_number}-x"})

    async def replay(
        self, *, issue_number: int, caller: str, idempotency_key: str, expected_base: str | None
    ) -> BootstrapAnswer | None:
        return None

    async def lock(self, *, issue_number: int, caller: str) -> BootstrapAnswer:
        self.calls.append(("lock", issue_number, caller))
        self.locks.add(issue_number)
        return BootstrapAnswer(doc={"status": "locked", "issue_number": issue_number, "lock": {},
                                    "already_locked": False, "locked": True})

    async def worktree_registered(self, *, issue_number: int, owner: str) -> bool:
        return issue_number in self.registered

    async def locked(self, *, issue_number: int, owner: str) -> bool:
        return issue_number in self.locks

    def control_checkout(self) -> Path | None:
        return self.checkout


def with_bootstrap(runtime: VerbRuntime, fake: WorktreeBootstrap) -> VerbRuntime:
    async def factory(_: VerbRuntime) -> WorktreeBootstrap:
        return fake

    return open_door(db=runtime.db, settings=runtime.settings, gitea=runtime.gitea, bootstrap_factory=factory)


# --- tools, schemas and identity --------------------------------------------------------------------------------------


#: The author's and the controller's (issue 33: reviewers and mergers need no worktree, and are not offered them).
WORKTREE = ["gitea_bootstrap_issue_worktree", "gitea_lock_issue"]
EVERY_ROLE = [
    "gitea_heartbeat_lease",
    "gitea_release_lease",
    "gitea_get_issue_state",
    "gitea_post_issue_state",
    "gitea_get_runtime_context",
]
#: The read tools every roster identity has, last in the table.
READS = ["gitea_read_issue", "gitea_read_pull_request"]


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("tok-controller", ["gitea_allocate_next_work", *WORKTREE, *EVERY_ROLE, "gitea_assess_work_issue_duplicate",
                            *READS]),
        ("tok-author-1", [*WORKTREE, *EVERY_ROLE, "gitea_publish_worktree", "gitea_open_pull_request",
                          "gitea_update_pull_request", "gitea_assess_work_issue_duplicate", *READS]),
        ("tok-rev-1", [*EVERY_ROLE, "gitea_assess_work_issue_duplicate", "gitea_claim_review",
                       "gitea_submit_review", *READS]),
        ("tok-merge-1", [*EVERY_ROLE, "gitea_assess_work_issue_duplicate", "gitea_merge_pull_request", *READS]),
        ("tok-stranger", []),
    ],
)
async def test_each_role_is_offered_the_tools_it_may_call_with_the_tables_schemas(
    runtime: VerbRuntime, token: str, expected: list[str]
) -> None:
    """Tools named as in ../shared/DESIGN.md, in table order, and only those the caller's roles may call (DESIGN: tools
    appear only to the roles that may call them)."""
    async with connect(runtime, token) as client:
        tools = (await client.list_tools()).tools
    assert [t.name for t in tools] == expected
    for tool in tools:
        verb = VERBS[tool.name.removeprefix("gitea_")]
        assert tool.input_schema == verb.input_schema()
        jsonschema.Draft202012Validator.check_schema(tool.input_schema)
        assert tool.annotations is not None and tool.annotations.read_only_hint == (verb.effect == "read")


async def test_a_tool_not_listed_for_the_caller_is_refused_by_the_door_not_as_unknown(runtime: VerbRuntime) -> None:
    """The list only saves an agent a call: naming another role's tool gets the gateway's not_authorized (the
    same refusal a comment command gets), not an unknown-tool answer."""
    async with connect(runtime, "tok-author-1") as client:
        result = await client.call_tool("gitea_merge_pull_request", {"issue_number": 1})
    doc = result.structured_content
    assert result.is_error and doc is not None and doc["error"] == "not_authorized", doc
    assert "merger role" in doc["message"], doc


def test_allocation_arguments_are_typed_in_the_schema() -> None:
    """Seed 000 AC1, AC3: exclusions are an array of integers; candidates an array, object or text."""
    schema = VERBS["allocate_next_work"].input_schema()
    props = schema["properties"]
    assert props["exclude_issue_numbers"]["type"] == ["array", "null"]  # optional: null means left out
    assert props["exclude_issue_numbers"]["items"]["type"] == "integer"
    assert [a["type"] for a in props["candidates_json"]["anyOf"]] == ["array", "object", "string", "null"]
    assert (props["dry_run"]["type"], props["dry_run"]["default"]) == (["boolean", "null"], True)
    assert props["expected_fingerprint"]["type"] == ["string", "null"]
    assert schema["additionalProperties"] is False and schema["required"] == []
    check = jsonschema.Draft202012Validator(schema)
    assert check.is_valid({"candidates_json": CANARY, "exclude_issue_numbers": [617]})
    assert check.is_valid({"candidates_json": json.dumps(CANARY), "dry_run": False})
    assert check.is_valid({"candidates_json": CANARY[0]})
    assert not check.is_valid({"exclude_issue_numbers": [True]})
    assert not check.is_valid({"exclude_issue_numbers": 617})
    assert not check.is_valid({"caller": "controller-bot"})


def test_identity_comes_from_the_token_and_the_roster(tmp_path: Path) -> None:
    settings = mcp_settings(tmp_path)
    controller = resolve_identity(settings, "tok-controller")
    assert (controller.login, controller.roles, controller.channel) == ("controller-bot", frozenset({"controller"}),
                                                                        "mcp")
    assert resolve_identity(settings, "tok-stranger").roles == frozenset()
    for token in (None, "", "tok-nope", "tok-controller "):
        with pytest.raises(IdentityError):
            resolve_identity(settings, token)


@pytest.mark.parametrize(("token", "needle"), [(None, "is not set"), ("tok-nope", "is not one of")])
def test_foreman_mcp_refuses_to_start_without_a_known_token(tmp_path: Path, token: str | None, needle: str) -> None:
    """No token or an unknown one: a clear error naming the key, exit 2, nothing served."""
    from tests.test_mcp_stdio import foreman_mcp_command, mcp_config

    config = mcp_config(tmp_path)
    env = {"PATH": "/usr/bin:/bin", **({"FOREMAN_MCP_TOKEN": token} if token else {})}
    done = subprocess.run(
        foreman_mcp_command(config), env=env, capture_output=True, text=True, timeout=HANG_S, check=False
    )
    assert done.returncode == 2
    assert done.stdout == ""
    error = json.loads(done.stderr.strip().splitlines()[-1])
    assert (error["error"], error["key"]) == ("invalid_config", "mcp.tokens") and needle in error["message"]


# --- the gateway before every call, then each verb --------------------------------------------------------------------


async def test_an_identity_off_the_roster_gets_the_not_authorized_envelope(runtime: VerbRuntime) -> None:
    """Seed 001: the envelope, exactly: error, message (= remediate), remediate, next action."""
    async with connect(runtime, "tok-stranger") as client:
        for tool in VERBS:
            if not VERBS[tool].executable:
                continue
            error, doc = await call(client, f"gitea_{tool}", issue_number=1)
            assert error
            assert list(doc) == ["error", "message", "remediate", "exact_next_action"], tool
            assert doc["error"] == "not_authorized" and doc["message"] == doc["remediate"]


async def test_the_role_gate_comes_before_argument_checks(runtime: VerbRuntime) -> None:
    """Gates first: an author calling the controller's tool with garbage learns only that it may not."""
    async with connect(runtime, "tok-author-1") as client:
        error, doc = await call(client, "gitea_allocate_next_work", candidates_json=5, caller="controller-bot")
    assert error and doc["error"] == "not_authorized" and "controller" in doc["message"]


@pytest.mark.parametrize(
    ("arguments", "problems"),
    [
        ({}, {"issue_number": "required"}),
        ({"issue_number": "42"}, {"issue_number": f"expected an issue number: an integer from 1 to {2**63 - 1}"}),
        ({"issue_number": True}, {"issue_number": f"expected an issue number: an integer from 1 to {2**63 - 1}"}),
        ({"issue_number": 0}, {"issue_number": f"expected an issue number: an integer from 1 to {2**63 - 1}"}),
        ({"issue_number": None}, {"issue_number": "required (null is not a value)"}),
        ({"issue_number": 42, "owner": "a"}, {"owner": "unknown argument; gitea_heartbeat_lease takes: issue_number"}),
    ],
)
async def test_malformed_arguments_are_refused_as_invalid_input(
    runtime: VerbRuntime, arguments: dict[str, Any], problems: dict[str, str]
) -> None:
    """Typed inputs, fail closed; the caller's identity can never be passed as an argument."""
    async with connect(runtime, "tok-author-1") as client:
        error, doc = await call(client, "gitea_heartbeat_lease", **arguments)
    assert error and doc["error"] == "invalid_input"
    assert {p["argument"]: p["problem"] for p in doc["details"]["problems"]} == problems


async def test_an_unknown_tool_is_invalid_input_naming_the_offered_ones(runtime: VerbRuntime) -> None:
    async with connect(runtime, "tok-controller") as client:
        for name in ("gitea_merge", "gitea_delete_repo"):
            error, doc = await call(client, name, issue_number=1)
            assert error and doc["error"] == "invalid_input" and "gitea_allocate_next_work" in doc["remediate"]


async def test_an_unexpected_failure_is_an_envelope_without_internals(runtime: VerbRuntime) -> None:
    """Never a traceback; the failure stays in the server's log."""

    async def broken(_: VerbRuntime) -> WorktreeBootstrap:
        raise RuntimeError("secret internals /etc/passwd")

    await lease_618(runtime)
    failing = open_door(db=runtime.db, settings=runtime.settings, bootstrap_factory=broken)
    async with connect(failing, "tok-author-1") as client:
        error, doc = await call(client, "gitea_lock_issue", issue_number=618)
    assert error and doc["error"] == "unavailable"
    assert "secret" not in json.dumps(doc) and "Traceback" not in json.dumps(doc)


async def test_allocation_through_mcp_excludes_before_ranking_in_dry_run_and_apply(runtime: VerbRuntime) -> None:
    """Seed 000 AC1-AC4, AC6 through the tool: #617 ranks first, is excluded, is never selected or leased."""
    async with connect(runtime, "tok-controller") as client:
        error, listed = await call(client, "gitea_allocate_next_work", **ALLOCATE, exclude_issue_numbers=[617])
        _, texted = await call(
            client, "gitea_allocate_next_work", owner="author-1", candidates_json=json.dumps(CANARY),
            exclude_issue_numbers=[617],
        )
        assert not error and listed["decision"] == "select" and listed["issue_number"] == 618
        assert listed["fingerprint"] == texted["fingerprint"]
        assert {"issue_number": 617, "reason": "excluded_by_controller"}.items() <= listed["skipped"][0].items()
        assert listed["next"] == ["gitea_bootstrap_issue_worktree"] and listed["dry_run"] is True
        error, applied = await call(
            client,
            "gitea_allocate_next_work",
            **ALLOCATE,
            exclude_issue_numbers=[617],
            dry_run=False,
            expected_fingerprint=listed["fingerprint"],
        )
    assert not error and applied["applied"] and applied["lease"]["issue_number"] == 618
    assert await runtime.leases.history(runtime.repo, 617) == []
    assert [e.issue_number for e in await OutboxStore(runtime.db).list()] == [618, 618, 618]


async def test_allocation_refusals_are_envelopes_with_the_decision(runtime: VerbRuntime) -> None:
    async with connect(runtime, "tok-controller") as client:
        error, doc = await call(
            client, "gitea_allocate_next_work", owner="author-1", candidates_json='[{"issue_number": true}]'
        )  # refused by the published schema (contentSchema) before the allocator sees it
        assert error and doc["error"] == "invalid_input"
        assert doc["details"]["problems"] == [
            {"argument": "candidates_json", "problem": "expected an array of candidate objects, one object, or their "
             "JSON text ([0].issue_number: fails type)"}
        ]
        error, doc = await call(  # what only the allocator can tell (a repeated issue) keeps its decision
            client, "gitea_allocate_next_work", owner="author-1", candidates_json=[CANARY[0], CANARY[0]]
        )
        assert error and doc["error"] == "invalid_input" and doc["decision"] in ("invalid", "refused")
        error, doc = await call(
            client, "gitea_allocate_next_work", **ALLOCATE, dry_run=False, expected_fingerprint="0" * 64
        )
        assert error and doc["error"] == "stale_pin"
        error, doc = await call(client, "gitea_allocate_next_work", candidates_json=CANARY, owner="rev-1")
        assert error and doc["error"] == "not_authorized"
        # No owner and two authors: the next idle author by the auto-allocation policy, a dry run here.
        error, doc = await call(client, "gitea_allocate_next_work", candidates_json=CANARY)
        assert not error and doc["decision"] == "select" and doc["issue_number"] == 617, doc
    assert await runtime.leases.open_leases(runtime.repo) == []


async def test_heartbeat_and_release_are_for_the_owner_or_the_controller(runtime: VerbRuntime) -> None:
    """Ownership gates are not_authorized; a missing live lease is a tracing_gap."""
    await lease_618(runtime)
    async with connect(runtime, "tok-author-2") as client:
        error, doc = await call(client, "gitea_heartbeat_lease", issue_number=618)
        assert error and doc["error"] == "not_authorized" and "missing" not in doc
        error, doc = await call(client, "gitea_release_lease", issue_number=618)
        assert error and doc["error"] == "not_authorized"
    async with connect(runtime, "tok-author-1") as client:
        error, doc = await call(client, "gitea_heartbeat_lease", issue_number=618)
        assert not error and doc["lease"]["owner"] == "author-1" and doc["next"] == ["gitea_post_issue_state"]
    async with connect(runtime, "tok-controller") as client:
        error, doc = await call(client, "gitea_release_lease", issue_number=618, reason="reassigning")
        assert not error and (doc["lease"]["status"], doc["lease"]["end_reason"]) == ("released", "reassigning")
        error, doc = await call(client, "gitea_release_lease", issue_number=618)
        assert error and (doc["error"], doc["missing"]) == ("tracing_gap", ["live_lease"])
    [lease] = await runtime.leases.history(runtime.repo, 618)
    kinds = [(e["kind"], e["actor"]) for e in await runtime.leases.events(lease.lease_id)]
    assert kinds == [("acquired", "controller-bot"), ("heartbeat", "author-1"), ("released", "controller-bot")]
    release = await OutboxStore(runtime.db).by_key(f"{lease.lease_id}:release")
    assert release is not None and "reassigning" in release.payload["body"]


async def test_posted_state_goes_through_the_outbox_and_becomes_the_issues_state(runtime: VerbRuntime) -> None:
    """DESIGN: post_issue_state posts through the outbox; LAST_UPDATED_BY is the caller, always."""
    await lease_618(runtime)
    async with connect(runtime, "tok-author-2") as client:
        error, doc = await call(client, "gitea_post_issue_state", issue_number=618, state=STATE)
        assert error and doc["error"] == "not_authorized"
    async with connect(runtime, "tok-author-1") as client:
        error, doc = await call(client, "gitea_get_issue_state", issue_number=618)
        assert not error and doc["state"] is None and doc["lease"]["owner"] == "author-1"
        error, doc = await call(
            client, "gitea_post_issue_state", issue_number=618, state={**STATE, "last_updated_by": "controller-bot"}
        )
        assert not error and doc["queued"] and doc["state"]["last_updated_by"] == "author-1"
        [key] = doc["outbox"]
        _, again = await call(client, "gitea_post_issue_state", issue_number=618, state=STATE)
        assert again["queued"] is False and again["outbox"] == [key]
        error, bad = await call(client, "gitea_post_issue_state", issue_number=618, state={**STATE, "state": "nope"})
        assert error and bad["error"] == "invalid_input" and "state: fails enum" in bad["message"]
        entry = await OutboxStore(runtime.db).by_key(key)
        assert entry is not None and find_marker(entry.payload["body"]) == key
        assert "LAST_UPDATED_BY: author-1" in entry.payload["body"]
        # The sender posts it and reads it back; its completion hook makes it the issue's state.
        result = {"comment_id": 99, "created_at": "2026-07-21T12:00:00Z", "author": "foreman-bot"}
        await on_outbox_complete(IssueStore(runtime.db), runtime.settings, entry, result)
        error, doc = await call(client, "gitea_get_issue_state", issue_number=618)
    assert not error and doc["state"]["state"] == "pr-open" and doc["state_comment_id"] == 99


async def test_bootstrap_and_lock_say_unavailable_while_there_is_no_bootstrap(runtime: VerbRuntime) -> None:
    await lease_618(runtime)
    async with connect(runtime, "tok-author-1") as client:
        error, doc = await call(client, "gitea_bootstrap_issue_worktree", issue_number=618)
        assert error and doc["error"] == "unavailable" and doc["details"]["missing_component"] == "bot.verbs.bootstrap"
        assert "gitea_post_issue_state" in doc["exact_next_action"]
        error, doc = await call(client, "gitea_lock_issue", issue_number=618)
        assert error and doc["error"] == "tracing_gap" and doc["missing"] == ["worktree"]
    async with connect(runtime, "tok-author-2") as client:
        error, doc = await call(client, "gitea_bootstrap_issue_worktree", issue_number=618)
        assert error and doc["error"] == "not_authorized"


async def test_the_bootstrap_runs_only_after_the_gateway_and_lock_needs_its_worktree(runtime: VerbRuntime) -> None:
    await lease_618(runtime)
    fake = FakeBootstrap()
    wired = with_bootstrap(runtime, fake)
    async with connect(wired, "tok-author-2") as client:
        error, doc = await call(client, "gitea_bootstrap_issue_worktree", issue_number=618)
        assert error and doc["error"] == "not_authorized"
    async with connect(wired, "tok-author-1") as client:
        error, doc = await call(client, "gitea_lock_issue", issue_number=618)
        assert error and (doc["error"], doc["missing"]) == ("tracing_gap", ["worktree"])
        error, doc = await call(client, "gitea_bootstrap_issue_worktree", issue_number=618, expected_base="a" * 40)
        assert not error and doc["branch"] == "issue-618-x" and doc["next"] == ["gitea_lock_issue"]
        error, doc = await call(client, "gitea_lock_issue", issue_number=618)
        assert not error and doc["locked"]
        fake.refuse = True
        error, doc = await call(client, "gitea_bootstrap_issue_worktree", issue_number=618)
        assert error and doc["error"] == "stale_pin"
    assert fake.calls == [("bootstrap", 618, "author-1"), ("lock", 618, "author-1"), ("bootstrap", 618, "author-1")]


async def test_runtime_context_names_identity_work_and_the_next_action(runtime: VerbRuntime) -> None:
    """Identity, role, repository, branch SHAs, callable verbs and an exact next action (a tool)."""
    async with connect(runtime, "tok-controller") as client:
        _, doc = await call(client, "gitea_get_runtime_context")
    assert doc["identity"] == {"login": "controller-bot", "roles": ["controller"], "channel": "mcp"}
    assert (doc["role"], doc["repository"]) == ("controller", f"{OWNER}/{REPO}")
    assert {"tool": "gitea_allocate_next_work"} in doc["callable_now"]
    assert doc["exact_next_action"].startswith("call gitea_allocate_next_work")
    assert "no gitea.token" in doc["default_branch"]["detail"] and doc["default_branch"]["in_sync"] is None
    await lease_618(runtime)
    fake = FakeBootstrap()
    async with connect(with_bootstrap(runtime, fake), "tok-author-1") as client:
        _, doc = await call(client, "gitea_get_runtime_context")
        assert [lease["issue_number"] for lease in doc["leases"]] == [618]
        assert doc["exact_next_action"] == "call gitea_bootstrap_issue_worktree with issue_number=618"
        callable_now = {c["tool"]: c.get("issue_numbers") for c in doc["callable_now"]}
        assert callable_now["gitea_heartbeat_lease"] == [618] and "gitea_lock_issue" not in callable_now
        assert "gitea_allocate_next_work" not in callable_now
        fake.registered.add(618)
        _, doc = await call(client, "gitea_get_runtime_context")
        assert doc["exact_next_action"] == "call gitea_lock_issue with issue_number=618"
        fake.locks.add(618)
        _, doc = await call(client, "gitea_get_runtime_context")
        assert "gitea_heartbeat_lease" in doc["exact_next_action"]
        assert {c["tool"]: c.get("issue_numbers") for c in doc["callable_now"]}["gitea_lock_issue"] == [618]
    for action in (doc["exact_next_action"],):
        assert "git " not in action and "$" not in action


async def test_runtime_context_compares_the_live_default_branch_with_the_control_checkout(tmp_path: Path) -> None:
    async with live_emulator() as live:
        settings = mcp_settings(tmp_path)
        db = await Database.open(settings.database.path, synchronous="NORMAL")
        gitea = live.client()
        repo = await gitea.get_repo()
        checkout = tmp_path / "checkouts" / "widgets"
        subprocess.run(["git", "clone", "-q", repo.clone_url, str(checkout)], check=True, timeout=HANG_S)
        fake = FakeBootstrap(checkout=checkout)

        async def factory(_: VerbRuntime) -> WorktreeBootstrap:
            return fake

        wired = open_door(db=db, settings=settings, gitea=gitea, bootstrap_factory=factory)
        try:
            async with connect(wired, "tok-controller") as client:
                _, doc = await call(client, "gitea_get_runtime_context")
                branch = doc["default_branch"]
                live_sha = (await gitea.get_branch(repo.default_branch)).commit_id
                assert (branch["name"], branch["live_sha"], branch["checkout_sha"]) == (
                    repo.default_branch, live_sha, live_sha
                )
                assert branch["in_sync"] is True
                git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
                subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "ahead"], check=True, timeout=HANG_S)
                _, doc = await call(client, "gitea_get_runtime_context")
                assert doc["default_branch"]["in_sync"] is False
                assert doc["default_branch"]["checkout_sha"] != live_sha
        finally:
            await db.close()


async def test_bootstrap_and_lock_through_mcp_run_the_real_worktree_transition() -> None:
    """The tools reach bot.verbs.bootstrap after the gateway; the context follows each step."""
    from bot.verbs.runtime import caller_for
    from tests.test_bootstrap_support import open_bootstrap_world

    async with open_bootstrap_world() as w:
        number = w.issue()
        await w.lease(number, owner="alice")
        runtime = open_door(db=w.db, settings=w.settings, gitea=w.gitea, bot_login="foreman-bot")

        def session(login: str) -> Client:
            return Client(build_server(runtime, caller_for(w.settings, login, "mcp")))

        async with session("bob") as client:
            error, doc = await call(client, "gitea_bootstrap_issue_worktree", issue_number=number)
            assert error and doc["error"] == "not_authorized"
        async with session("alice") as client:
            _, doc = await call(client, "gitea_get_runtime_context")
            assert doc["exact_next_action"] == f"call gitea_bootstrap_issue_worktree with issue_number={number}"
            branch = doc["default_branch"]
            assert branch["live_sha"] == branch["checkout_sha"] == w.main_sha() and branch["in_sync"] is True
            error, doc = await call(client, "gitea_lock_issue", issue_number=number)
            assert error and doc["missing"] == ["worktree"]
            error, doc = await call(client, "gitea_bootstrap_issue_worktree", issue_number=number)
            assert not error and doc["status"] == "completed" and doc["next"] == ["gitea_lock_issue"]
            _, doc = await call(client, "gitea_get_runtime_context")
            assert doc["exact_next_action"] == f"call gitea_lock_issue with issue_number={number}"
            error, doc = await call(client, "gitea_lock_issue", issue_number=number)
            assert not error and doc["status"] == "locked"
            _, doc = await call(client, "gitea_get_runtime_context")
            assert "gitea_heartbeat_lease" in doc["exact_next_action"]


async def test_a_hook_around_every_call_can_refuse_or_run_with_its_own_arguments(runtime: VerbRuntime) -> None:
    """The seam a run broker uses: it sees each call first; the gateway still decides what runs."""
    seen: list[tuple[str, dict[str, Any]]] = []

    async def around(tool: str, arguments: dict[str, Any], run: Any) -> tuple[dict[str, Any], bool]:
        seen.append((tool, arguments))
        if tool == "gitea_release_lease":
            return {"error": "grant_denied", "message": "not in the grant"}, True
        result = await run({**arguments, "issue_number": 618})
        return result.doc, not result.ok

    await lease_618(runtime)
    caller = resolve_identity(runtime.settings, "tok-author-1")
    async with Client(build_server(runtime, caller, around=around)) as client:
        error, doc = await call(client, "gitea_release_lease", issue_number=618)
        assert error and doc["error"] == "grant_denied"
        error, doc = await call(client, "gitea_heartbeat_lease", issue_number=1)
        assert not error and doc["issue_number"] == 618
    assert [tool for tool, _ in seen] == ["gitea_release_lease", "gitea_heartbeat_lease"]
    assert len(await runtime.leases.open_leases(runtime.repo)) == 1


# --- the published schema is what is enforced; hostile values; unlisted tools -----------------------------------------


def _identity_for(verb: str) -> str:
    # The controller may allocate; an author without a lease passes every other role gate and is then refused
    # by a precondition, so a schema-valid call is never invalid_input and a schema-invalid one always is. The review
    # and merge verbs go to their role's identity, which then meets the same preconditions.
    special = {"allocate_next_work": "tok-controller", "claim_review": "tok-rev-1", "submit_review": "tok-rev-1",
               "merge_pull_request": "tok-merge-1"}
    return special.get(verb, "tok-author-1")


class _Wire(pydantic.BaseModel):
    arguments: dict[str, Any]


# owner null is "left out" (and NaN/Infinity reach the server as null: pydantic's JSON): with two authors on this
# roster the allocator then asks for an owner (a domain refusal, also invalid_input), so those probes are about
# the roster rule, not the schema.
_OWNER_LEFT_OUT = {f"allocate_next_work|owner|{probe}" for probe in ("null", "nan", "infinity", "minus-infinity")}
_SERVER_PROBES = [p for p in argument_probes() if p.id not in _OWNER_LEFT_OUT]


@pytest.mark.parametrize(("verb", "arguments"), _SERVER_PROBES)
async def test_the_server_accepts_exactly_what_its_published_schema_accepts(
    runtime: VerbRuntime, verb: str, arguments: dict[str, Any]
) -> None:
    """The full table in process: jsonschema(the schema list_tools publishes) says invalid
    exactly when the server answers invalid_input; hostile values (item 7) are invalid_input, never a crash or
    ``unavailable``."""
    async with connect(runtime, _identity_for(verb)) as client:
        [tool] = [t for t in (await client.list_tools()).tools if t.name == VERBS[verb].tool]
        # What the SDK client puts on the wire (pydantic's JSON: NaN and Infinity become null) is what counts.
        try:
            wire = json.loads(_Wire(arguments=arguments).model_dump_json())["arguments"]
        except ValueError:  # an integer past Python's digit limit: sent as it is
            wire = arguments
        expected = schema_verdict(tool.input_schema, wire)
        result = await client.call_tool(tool.name, arguments)
    doc = result.structured_content
    assert doc is not None
    refused_as_input = bool(result.is_error) and doc.get("error") == "invalid_input"
    assert refused_as_input == (not expected), doc
    assert doc.get("error") != "unavailable"


@pytest.mark.parametrize(
    "name",
    ["release_lease", "gitea_open_pr", "gitea_merge", "GITEA_RELEASE_LEASE", "gitea_release_lease ", "", "gitea_",
     "gitea_release_lease\n", "x" * 10_000],  # (the SDK client itself cannot send a lone surrogate in a name)
)
async def test_a_tool_the_server_does_not_list_is_refused_and_does_nothing(runtime: VerbRuntime, name: str) -> None:
    """Only listed tools run. ``release_lease`` (no ``gitea_`` prefix) used to release the lease."""
    await lease_618(runtime)
    queued = len(await OutboxStore(runtime.db).list())
    async with connect(runtime, "tok-controller") as client:
        listed = {t.name for t in (await client.list_tools()).tools}
        assert name not in listed
        result = await client.call_tool(name, {"issue_number": 618, "reason": "probe"})
    doc = result.structured_content
    assert result.is_error and doc is not None and doc["error"] == "invalid_input"
    assert "unknown tool" in doc["message"] and "gitea_release_lease" in doc["remediate"]
    [lease] = await runtime.leases.open_leases(runtime.repo)
    assert (lease.issue_number, lease.owner) == (618, "author-1")
    assert len(await OutboxStore(runtime.db).list()) == queued  # nothing queued: no release comment


async def test_an_issue_number_past_int64_is_invalid_input_through_mcp(runtime: VerbRuntime) -> None:
    """2^63 (one past MAX_ISSUE_NUMBER) is refused as input, not by SQLite (``unavailable``)."""
    async with connect(runtime, "tok-controller") as client:
        for tool in ("gitea_get_issue_state", "gitea_heartbeat_lease", "gitea_release_lease"):
            error, doc = await call(client, tool, issue_number=2**63)
            assert error and doc["error"] == "invalid_input", (tool, doc)
            assert [p["argument"] for p in doc["details"]["problems"]] == ["issue_number"]
        error, doc = await call(client, "gitea_get_issue_state", issue_number=2**63 - 1)
        assert not error and doc["issue_number"] == 2**63 - 1


@pytest.mark.parametrize(("text", "expected"), [
    ('{"a": [1, [2]]}', '{"a": [1, 0]}'),
    ('{"a": [[[1]]], "b": "[[[[", "c": "\\"["}', '{"a": [0], "b": "[[[[", "c": "\\"["}'),
    ('[[["x"], {"k": [1]}], 2]', '[[0, 0], 2]'),
    ('{"a": [1}', None),
    ('{"a": "unterminated}', None),
])
def test_a_line_too_deep_for_the_sdk_is_collapsed_below_the_bound(text: str, expected: str | None) -> None:
    """``collapsed`` at depth 2: what is nested deeper reads as 0, brackets inside strings are text, an unbalanced
    line is None (the SDK answers it as it would)."""
    from bot.core.json_depth import collapsed

    assert collapsed(text, depth=2) == expected


async def test_runtime_contexts_polled_together_read_the_live_default_branch_once(tmp_path: Path) -> None:
    """Every agent of a repository asks the same live default branch: one read of Gitea answers them all for
    ``LIVE_BRANCH_SHARED_S`` (bot/shared_reads.py), the control checkout's side is read each time."""
    async with live_emulator() as live:
        settings = mcp_settings(tmp_path)
        db = await Database.open(settings.database.path, synchronous="NORMAL")
        gitea = live.client()
        repo = await gitea.get_repo()
        checkout = tmp_path / "checkouts" / "widgets"
        subprocess.run(["git", "clone", "-q", repo.clone_url, str(checkout)], check=True, timeout=HANG_S)

        async def factory(_: VerbRuntime) -> WorktreeBootstrap:
            return FakeBootstrap(checkout=checkout)

        wired = open_door(db=db, settings=settings, gitea=gitea, bootstrap_factory=factory)
        try:
            before = len(live.emulator.requests)
            async with connect(wired, "tok-controller") as client:
                docs = [(await call(client, "gitea_get_runtime_context"))[1] for _ in range(5)]
            reads = [r.route for r in live.emulator.requests[before:] if r.method == "GET" and r.route is not None]
            assert reads.count("/api/v1/repos/{owner}/{repo}") + reads.count("/repos/{owner}/{repo}") == 1, reads
            assert all(doc["default_branch"]["in_sync"] is True for doc in docs)
        finally:
            await db.close()
