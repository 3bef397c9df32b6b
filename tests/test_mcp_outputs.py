"""Every MCP tool's real answers against its published ``outputSchema`` (issue 33 item 4): one life of an issue driven
through real MCP sessions against the emulator calls every tool once to success and once to a refusal, and each
answer's ``structuredContent`` is validated with a stock Draft 2020-12 validator against the schema ``tools/list``
published for that tool."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # (no stubs installed; the project adds none)
import pytest
from mcp import Client

from bot.core.canonical import CanonicalState
from bot.core.verbs import TOOLS, VERBS
from bot.mcp_server import build_server, offered_tools
from bot.verbs.handback import hand_back
from bot.verbs.runtime import caller_for
from tests.gitea_fixtures import OWNER, REPO
from tests.review_support import LOOP, ROSTER, runtime
from tests.support import Started
from tests.test_publish import worktree_of
from tests.world import EXTRA_TOKENS, Sections, World, open_world

CONTROLLER, AUTHOR, REVIEWER, MERGER, STRANGER = "controller-bot", "author-1", "author-2", "author-3", "stranger"
TITLE = "Paint the widget"
SUBJECT = "Paint the widget blue"
BODY = "The widget was grey; the issue asks for blue.\n\n- widget.txt holds the colour\n- nothing else changes"


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    """author-1 implements with its own Gitea token (it posts and updates the PR as itself), author-2 reviews,
    author-3 merges; the review and merge queues are off (the agents claim their work)."""
    sections: Sections = {**LOOP, "gitea": {"identity_tokens": {AUTHOR: EXTRA_TOKENS[AUTHOR]}}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as opened:
        opened.live.emulator.set_permission(OWNER, REPO, AUTHOR, "write")
        yield opened


class Answers:
    """Each tool's answers as an MCP client received them: (is_error, structuredContent) per call."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.seen: dict[str, list[tuple[bool, dict[str, Any]]]] = {}
        self.listed: dict[str, dict[str, Any]] = {}
        self.offered: dict[str, set[str]] = {}

    async def call(self, login: str, name: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
        caller = caller_for(self.world.service.settings, login, "mcp")
        async with Client(build_server(runtime(self.world), caller)) as client:
            tools = (await client.list_tools()).tools
            self.offered[login] = {tool.name for tool in tools}
            for tool in tools:
                if tool.output_schema is not None:
                    self.listed[tool.name] = tool.output_schema
            result = await client.call_tool(name, arguments)
        await self.world.settle()
        assert result.structured_content is not None, result
        doc = dict(result.structured_content)
        self.seen.setdefault(name, []).append((bool(result.is_error), doc))
        return bool(result.is_error), doc

    async def ok(self, login: str, name: str, **arguments: Any) -> dict[str, Any]:
        refused, doc = await self.call(login, name, **arguments)
        assert not refused, (name, doc)
        return doc

    async def refused(self, login: str, name: str, **arguments: Any) -> dict[str, Any]:
        refused, doc = await self.call(login, name, **arguments)
        assert refused, (name, doc)
        return doc


def git(where: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, check=True).stdout


async def live(answers: Answers) -> None:
    """One issue from ready to merged, each tool called by the identity that would call it, plus one refused call of
    every tool."""
    world = answers.world
    a = answers
    # Refusals before anything exists: a login off the roster, a wrong role, a missing artifact, bad arguments.
    stranger = await a.refused(STRANGER, "gitea_get_runtime_context")
    # A login with no role is offered nothing and told to ask an operator, never to call a tool it does not have.
    assert a.offered[STRANGER] == set() and "operator" in stranger["exact_next_action"], stranger
    assert "gitea_" not in stranger["exact_next_action"], stranger
    stranger = await a.refused(STRANGER, "gitea_publish_worktree", issue_number=1, message="x")
    assert "gitea_" not in stranger["exact_next_action"] and "operator" in stranger["exact_next_action"], stranger
    await a.refused(AUTHOR, "gitea_allocate_next_work", dry_run=True)
    await a.refused(AUTHOR, "gitea_get_issue_state", issue_number=0)
    await a.refused(AUTHOR, "gitea_assess_work_issue_duplicate", issue_number=1, phase="later")
    await a.refused(REVIEWER, "gitea_merge_pull_request", issue_number=1)

    number = await world.open_issue("alice", TITLE)
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    worktree, _ = await worktree_of(world, number)  # auto-allocated to author-1, bootstrapped
    other = await world.open_issue("alice", "Another one")
    await a.ok(CONTROLLER, "gitea_allocate_next_work", dry_run=True,
               candidates_json=[{"issue_number": other, "title": "Another one"}])
    context = await a.ok(AUTHOR, "gitea_get_runtime_context")
    assert {"gitea_bootstrap_issue_worktree", "gitea_lock_issue"} <= a.offered[AUTHOR]
    assert {entry["tool"] for entry in context["callable_now"]} <= a.offered[AUTHOR], context["callable_now"]
    await a.ok(CONTROLLER, "gitea_get_runtime_context")
    await a.ok(AUTHOR, "gitea_assess_work_issue_duplicate", issue_number=number, phase="pre_pr")
    await a.refused(REVIEWER, "gitea_lock_issue", issue_number=number)
    await a.refused(AUTHOR, "gitea_publish_worktree", issue_number=number, message="Too early")  # not locked
    await a.refused(AUTHOR, "gitea_open_pull_request", issue_number=number)  # no commit yet
    await a.refused(AUTHOR, "gitea_bootstrap_issue_worktree", issue_number=other)
    await a.ok(AUTHOR, "gitea_bootstrap_issue_worktree", issue_number=number)
    await a.ok(AUTHOR, "gitea_lock_issue", issue_number=number)
    await a.ok(AUTHOR, "gitea_heartbeat_lease", issue_number=number)
    await a.refused(REVIEWER, "gitea_heartbeat_lease", issue_number=number)
    await a.ok(AUTHOR, "gitea_get_issue_state", issue_number=number)
    state = {"state": "in-progress", "who_is_next": "author", "next_action": "publish the worktree",
             "next_prompt": "", "what_happened": "started", "why": "leased", "related_prs": [], "blockers": "none",
             "validation": "none yet"}
    await a.ok(AUTHOR, "gitea_post_issue_state", issue_number=number, state=state, summary="Started.")
    partial = await a.refused(AUTHOR, "gitea_post_issue_state", issue_number=number,
                              state={"state": "blocked", "who_is_next": "controller"})
    assert "next_action" in partial["message"] and "validation" in partial["message"], partial
    (worktree / "widget.txt").write_text("blue\n", encoding="utf-8")
    published = await a.ok(AUTHOR, "gitea_publish_worktree", issue_number=number, message=f"{SUBJECT}\n\n{BODY}",
                           idempotency_key="paint-1")
    message = git(worktree, "log", "-1", "--format=%B", published["commit"])
    assert message.startswith(f"{SUBJECT}\n\n{BODY}\n"), message
    assert git(worktree, "log", "-1", "--format=%s", published["commit"]).strip() == SUBJECT
    await a.refused(AUTHOR, "gitea_update_pull_request", issue_number=number)  # no pull request yet
    opened = await a.ok(AUTHOR, "gitea_open_pull_request", issue_number=number)
    await a.ok(AUTHOR, "gitea_release_lease", issue_number=number)  # after the hand-over: already ended
    await a.refused(AUTHOR, "gitea_release_lease", issue_number=other)  # nobody holds it
    await a.refused(AUTHOR, "gitea_claim_review", issue_number=number)  # an author does not review
    await a.refused(REVIEWER, "gitea_submit_review", issue_number=number, verdict="approve")  # not claimed

    # The review: claimed, kept alive, given back, claimed again and approved.
    # The reads: the author reads its issue, the reviewer the pull request; another repository's is refused.
    await a.ok(AUTHOR, "gitea_read_issue", issue_number=number)
    await a.ok(REVIEWER, "gitea_read_pull_request", issue_number=number)
    await a.refused(AUTHOR, "gitea_read_issue", issue_number=number, repository="elsewhere/other")
    await a.refused(REVIEWER, "gitea_read_pull_request", issue_number=other)  # no pull request
    await a.ok(REVIEWER, "gitea_claim_review", issue_number=number)
    await a.ok(REVIEWER, "gitea_heartbeat_lease", issue_number=number)
    await a.ok(REVIEWER, "gitea_release_lease", issue_number=number, reason="back to the queue")
    await a.ok(REVIEWER, "gitea_claim_review", issue_number=number)
    await a.ok(REVIEWER, "gitea_submit_review", issue_number=number, verdict="approve")
    context = await a.ok(REVIEWER, "gitea_get_runtime_context")
    # Reviewers and mergers are offered neither the bootstrap nor the lock; callable_now lists only offered tools.
    assert not a.offered[REVIEWER] & {"gitea_bootstrap_issue_worktree", "gitea_lock_issue"}, a.offered[REVIEWER]
    assert {entry["tool"] for entry in context["callable_now"]} <= a.offered[REVIEWER], context["callable_now"]

    # The base moves on: the merge hands the issue back, the author updates the PR, a second review, the merge.
    world.live.emulator.push_commit(OWNER, REPO, "main", {"other.txt": "unrelated\n"}, pusher="alice",
                                    message="The base moves on")
    back = CanonicalState(state="in-progress", who_is_next="author",
                          next_action=f"author-1: call gitea_update_pull_request with issue_number={number}",
                          next_prompt="", what_happened="the merge was refused", why="the base moved past the head",
                          related_prs=(), blockers="none", validation="test", last_updated_by="foreman-bot")
    assert await hand_back(world.service.db, world.service.settings, issue=number, implementer=AUTHOR,
                           source="branch_outdated", state=back, actor=MERGER, now=datetime.now(UTC),
                           delivery_id=None, key=f"test:{number}:outdated", detail={}) is not None
    await world.settle()
    await a.ok(AUTHOR, "gitea_update_pull_request", issue_number=number)
    await a.ok(REVIEWER, "gitea_claim_review", issue_number=number)
    await a.ok(REVIEWER, "gitea_submit_review", issue_number=number, verdict="approve")
    context = await a.ok(MERGER, "gitea_get_runtime_context")
    assert not a.offered[MERGER] & {"gitea_bootstrap_issue_worktree", "gitea_lock_issue"}, a.offered[MERGER]
    assert {entry["tool"] for entry in context["callable_now"]} <= a.offered[MERGER], context["callable_now"]
    merged = await a.ok(MERGER, "gitea_merge_pull_request", issue_number=number)
    if os.environ.get("FOREMAN_DUMP_OUTPUTS"):
        Path(os.environ["FOREMAN_DUMP_OUTPUTS"]).write_text(json.dumps(a.seen, indent=1, default=str))
    assert merged["merged"] is True and merged["merge_commit_sha"], merged
    assert opened["pull_request"], opened


async def test_every_tool_answers_what_its_output_schema_says_on_success_and_on_refusal(world: World) -> None:
    """Issue 33 item 4: an ``outputSchema`` for every tool, matching its real ``structuredContent`` on success and on
    refusal (the error envelope), checked by a stock validator; each answer also matches its own branch."""
    answers = Answers(world)
    await live(answers)
    published = {tool.name: tool.output_schema for tool in offered_tools()}
    assert set(answers.seen) == set(published), set(published) ^ set(answers.seen)
    for name, calls in answers.seen.items():
        schema = published[name]
        assert schema is not None and answers.listed.get(name, schema) == schema, name
        jsonschema.Draft202012Validator.check_schema(schema)
        validator = jsonschema.Draft202012Validator(schema)
        branches = {branch["title"]: branch for branch in schema["anyOf"]}
        success, refusal = branches["result"], branches["refusal"]
        kinds = {is_error for is_error, _ in calls}
        assert kinds == {True, False}, f"{name}: needs a success and a refusal, got {calls}"
        for is_error, doc in calls:
            problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
            assert problems == [], (name, is_error, problems, doc)
            branch = jsonschema.Draft202012Validator(refusal if is_error else success)
            assert branch.is_valid(doc), (name, is_error, doc)
            # Precise enough to catch a wrong answer: each required key missing, or of the wrong type, is invalid.
            required = (refusal if is_error else success)["required"]
            for key in required:
                assert not validator.is_valid({k: v for k, v in doc.items() if k != key}), (name, key)
                assert not validator.is_valid({**doc, key: _wrong(doc[key])}), (name, key, doc[key])
    assert {TOOLS[name].name for name in answers.seen} == {v.name for v in VERBS.values() if v.executable}


def _wrong(value: object) -> object:
    """A value of another JSON type than ``value``."""
    return 1.5 if isinstance(value, str | bool | list | dict) or value is None else "wrong"


def _described(schema: dict[str, Any], where: str) -> list[str]:
    """Every property of ``schema`` (and of the objects inside it) without a description."""
    missing = [f"{where}.{name}" for name, sub in schema.get("properties", {}).items() if not sub.get("description")]
    for name, sub in schema.get("properties", {}).items():
        missing += _described(sub, f"{where}.{name}")
    return missing


def test_every_tool_has_a_title_honest_hints_and_every_argument_a_description() -> None:
    """Issue 33 item 4: a title, annotations from the verb table (reads read-only; the replay-safe writes idempotent),
    every argument described, the nine fields of ``state`` included, and no gate's internal name in a description."""
    gates = {p.key for verb in VERBS.values() for p in verb.preconditions if "_" in p.key or ":" in p.key}
    for tool in offered_tools():
        verb = TOOLS[tool.name]
        assert tool.title and tool.annotations is not None and tool.annotations.title == tool.title, tool.name
        hints = tool.annotations
        assert hints.read_only_hint is (verb.effect == "read"), tool.name
        assert hints.idempotent_hint is verb.idempotent and hints.open_world_hint is False, tool.name
        assert tool.description is not None
        assert not [key for key in gates if key in tool.description], (tool.name, tool.description)
        if verb.effect == "mutate":
            assert "Replay: " in tool.description, tool.name
        assert _described(tool.input_schema, tool.name) == [], tool.name
    state = TOOLS["gitea_post_issue_state"].input_schema()["properties"]["state"]["properties"]
    nine = ["state", "who_is_next", "next_action", "next_prompt", "what_happened", "why", "related_prs", "blockers",
            "validation"]
    assert all(state[name]["description"] for name in nine)
    replay_safe = {"bootstrap_issue_worktree", "open_pull_request", "merge_pull_request", "publish_worktree",
                   "update_pull_request", "submit_review"}
    assert all(VERBS[name].idempotent for name in replay_safe)
