"""An issue in review on the emulator (lease, bootstrap, a pushed commit, an open PR) and MCP calls on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from bot.catalog import open_door
from bot.core.bootstrap import branch_for
from bot.mcp_server import build_server
from bot.verbs.runtime import VerbRuntime, caller_for
from state.leases import LeaseStore
from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started
from tests.world import FULL_NAME, Sections, World, open_world

#: author-1 implements, author-2 reviews, author-3 merges (the logins are the world's roster identities).
ROSTER = {"controller-bot": ["controller"], "author-1": ["author"], "author-2": ["reviewer"], "author-3": ["merger"]}
#: The review and merge queues off: these tests hand out reviews and merges as a controller would.
LOOP: Sections = {"allocator": {"auto_allocate_owner": "author-1", "queues": []}, "bootstrap": {"on_allocate": "run"}}
TITLE = "Make the widget blue"


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start, roster=ROSTER, **LOOP) as opened:
        yield opened


@dataclass(frozen=True)
class InReview:
    number: int
    pull: int
    branch: str
    head: str


def runtime(world: World) -> VerbRuntime:
    service = world.service
    return open_door(db=service.db, settings=service.settings, gitea=service.gitea, bot_login="foreman-bot")


async def tool(world: World, login: str, name: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    """One MCP tool call as ``login``: (refused, structured result); then the outbox and webhooks settle."""
    async with Client(build_server(runtime(world), caller_for(world.service.settings, login, "mcp"))) as client:
        result = await client.call_tool(name, arguments)
    await world.settle()
    assert result.structured_content is not None
    return bool(result.is_error), dict(result.structured_content)


async def ok(world: World, login: str, name: str, **arguments: Any) -> dict[str, Any]:
    refused, doc = await tool(world, login, name, **arguments)
    assert not refused, doc
    return doc


async def put_in_review(world: World, *, poster: str = "author-1", implementer: str = "author-1") -> InReview:
    """Ready label → lease and worktree for ``implementer`` → released → a commit pushed on the issue branch → a PR
    by ``poster`` that closes the issue → `status:review` (what the author's publish and PR verbs leave)."""
    number = await world.open_issue("alice", TITLE)
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    [lease] = await LeaseStore(world.service.db).history(FULL_NAME, number)
    assert (lease.owner, lease.action, lease.status) == (implementer, "implement", "live")
    emu = world.live.emulator
    branch = branch_for(number, TITLE)
    head = emu.push_commit(OWNER, REPO, branch, {"widget.txt": "blue\n"}, pusher=implementer, message="Blue")
    pull = emu.create_pull(OWNER, REPO, head=branch, title=TITLE, author=poster, body=f"Closes #{number}")
    state = {"state": "review", "who_is_next": "reviewer", "next_action": "a reviewer claims the review",
             "next_prompt": "", "what_happened": f"opened PR #{pull.number}", "why": "implemented",
             "related_prs": [pull.number], "blockers": "none", "validation": "pushed"}
    await ok(world, "controller-bot", "gitea_post_issue_state", issue_number=number, state=state)
    await world.settle()
    # The issue is in review before the lease ends: a hand-over, not stranded work sent back to status:ready.
    await ok(world, implementer, "gitea_release_lease", issue_number=number, reason="pull request opened")
    assert world.labels(number) == ["status:review"]  # foreman's label sync follows the posted state
    return InReview(number, pull.number, branch, head)


def reviews(world: World, pull: int) -> list[tuple[str, str, bool]]:
    """(state, commit_id, official) of the PR's reviews on the emulator."""
    emu = world.live.emulator
    record = emu.pull_of(emu.issue(OWNER, REPO, pull))
    return [(r.state, r.commit_id, r.official) for r in record.reviews]


def pull_state(world: World, pull: int) -> tuple[bool, str | None, str]:
    """(merged, merge commit, head sha) of the PR on the emulator."""
    emu = world.live.emulator
    record = emu.pull_of(emu.issue(OWNER, REPO, pull))
    return record.merged is not None, record.merge_commit_sha, record.head_sha()


async def start_work(world: World, login: str, number: int) -> str:
    """``login`` starts its leased issue: locks it, writes in its registered worktree and publishes (a lease with a
    publication is started work, which a hand-back never preempts). The published commit."""
    from state.journal import JournalStore

    registration = await JournalStore(world.service.db).live_registration(FULL_NAME.lower(), number)
    assert registration is not None and registration.owner == login, registration
    await ok(world, login, "gitea_lock_issue", issue_number=number)
    (Path(registration.worktree_path) / f"work-{number}.txt").write_text("started\n", encoding="utf-8")
    published = await ok(world, login, "gitea_publish_worktree", issue_number=number, message=f"Start #{number}")
    return str(published["commit"])
