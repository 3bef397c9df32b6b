"""Issue 33's Done-when, through real MCP sessions against the emulator: `foreman mcp` over stdio (a subprocess)
and the service's `/mcp` over HTTP. The author reads its issue's body and a maintainer's comment; the reviewer reads
the pull request's diff, its files and a failing commit status; both are refused an issue of another repository;
an answer over the bound is cut and the way it names to read the rest works; the resources of a live lease list and
read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from bot.config_writer import write_config
from tests.gitea_fixtures import OWNER, REPO
from tests.mcp_http_support import mcp_over_http
from tests.review_support import LOOP, ROSTER, InReview, ok, put_in_review
from tests.support import Started, emulator_sections, offline_config
from tests.test_mcp_stdio import TRANSPORTS, foreman_mcp
from tests.world import Sections, World, open_world

TOKENS = {"tok-read-author": "author-1", "tok-read-reviewer": "author-2", "tok-read-merger": "author-3"}
#: A small bound, so that a body, a comment and a diff are cut.
MAX_CHARS = 300
Open = Callable[[str], AbstractAsyncContextManager[ClientSession]]


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    sections: Sections = {**LOOP, "mcp": {"tokens": TOKENS, "read_max_chars": MAX_CHARS}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as opened:
        yield opened


@asynccontextmanager
async def sessions(world: World, transport: str, tmp_path: Path) -> AsyncIterator[Open]:
    """Sessions for a token: `foreman mcp --config` (its own process, the world's database and emulator) or the
    world's service's `/mcp`."""
    if transport == "http":
        yield lambda token: mcp_over_http(str(world.client.make_url("/mcp")), token)
        return
    settings = world.service.settings
    config = write_config(tmp_path / "stdio.toml", offline_config(Path(str(settings.database.path)), {
        **emulator_sections(world.live.base_url),
        "repository": {"owner": OWNER, "name": REPO, "checkout_root": str(settings.repository.checkout_root)},
        "roster": ROSTER, "mcp": {"tokens": TOKENS, "read_max_chars": MAX_CHARS},
    }))
    yield lambda token: foreman_mcp(config, token)


async def call(session: ClientSession, tool: str, **arguments: Any) -> tuple[bool, dict[str, Any]]:
    result = await session.call_tool(tool, arguments)
    assert result.structured_content is not None
    return bool(result.is_error), dict(result.structured_content)


async def read(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    refused, doc = await call(session, tool, **arguments)
    assert not refused, doc
    return doc


def arguments_of(instruction: str) -> dict[str, Any]:
    """The arguments a ``read_rest`` / ``next_page`` instruction names ("call T with a=1, b=x and c=2")."""
    words = instruction.split(" with ", 1)[1].replace(" and ", ", ").split(", ")
    out: dict[str, Any] = {}
    for word in words:
        name, value = word.split("=", 1)
        out[name] = int(value) if value.isdigit() else {"true": True, "false": False}.get(value, value)
    return out


async def in_review(world: World) -> tuple[InReview, int, str]:
    """An issue in review with a long body, a long maintainer's comment, a long diff and a failing status."""
    review = await put_in_review(world)
    emu = world.live.emulator
    body = "The widget must be blue. " * 40
    emu.issue(OWNER, REPO, review.number).body = body
    comment = await world.comment("alice", review.number, "Maintainer here: " + "keep the old colour. " * 30)
    lines = "".join(f"line {i} of the widget's new paint\n" for i in range(60))
    head = emu.push_commit(OWNER, REPO, review.branch, {"paint.txt": lines}, pusher="author-1", message="Paint")
    emu.set_commit_status(OWNER, REPO, head, context="ci/build", state="failure",
                          target_url="https://ci.example/builds/9", description="3 tests failed")
    await world.settle()
    return review, comment, body


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_agents_read_their_work_through_real_sessions(world: World, tmp_path: Path, transport: str) -> None:
    review, comment, body = await in_review(world)
    number = review.number
    async with sessions(world, transport, tmp_path) as open_session:
        async with open_session("tok-read-author") as author:
            doc = await read(author, "gitea_read_issue", issue_number=number)
            assert doc["title"] == "Make the widget blue" and doc["body"] == body[:MAX_CHARS]
            # The body is cut; the call it names reads the rest.
            cut = doc["body_cut"]
            assert cut["total_chars"] == len(body) and cut["next_offset"] == MAX_CHARS
            rest = await read(author, "gitea_read_issue", **arguments_of(cut["read_rest"]))
            assert doc["body"] + rest["body"] == body[:2 * MAX_CHARS]
            # The maintainer's comment, newest first: trusted (alice writes on the repository), not evidence; cut too.
            latest = await read(author, "gitea_read_issue", issue_number=number, newest_first=True, per_page=1)
            [item] = latest["comments"]["items"]
            assert (item["id"], item["author"], item["trusted"], item["evidence"]) == (comment, "alice", True, False)
            assert item["body"].startswith("Maintainer here: keep the old colour.")
            whole = world.live.emulator.comment(comment)
            assert whole is not None
            more = await read(author, "gitea_read_issue", **arguments_of(item["body_cut"]["read_rest"]))
            assert item["body"] + more["comments"]["items"][0]["body"] == whole.body[:2 * MAX_CHARS]
            following = await read(author, "gitea_read_issue", **arguments_of(latest["comments"]["next_page"]))
            assert following["comments"]["page"] == 2 and following["comments"]["items"][0]["id"] != comment
            assert [p["number"] for p in doc["pull_requests"]] == [review.pull]
            assert doc["canonical_state"]["state"]["state"] == "review"
            # Another repository's issue: refused, nothing read.
            for tool in ("gitea_read_issue", "gitea_read_pull_request"):
                refused, denial = await call(author, tool, issue_number=number, repository="someone/else")
                assert refused and denial["error"] == "not_authorized", denial
                assert denial["details"]["reason"] == "other_repository"
        async with open_session("tok-read-reviewer") as reviewer:
            doc = await read(reviewer, "gitea_read_pull_request", issue_number=number)
            assert doc["pull_number"] == review.pull
            assert [(f["filename"], f["status"]) for f in doc["files"]["items"]] == [
                ("paint.txt", "added"), ("widget.txt", "added")]
            assert doc["commit_status"]["state"] == "failure"
            assert [(s["context"], s["state"], s["target_url"], s["description"])
                    for s in doc["commit_status"]["statuses"]] == [
                ("ci/build", "failure", "https://ci.example/builds/9", "3 tests failed")]
            # The diff: paint.txt's section is longer than the bound, so it is cut with the way to read it on.
            diff = doc["diff"]
            assert diff["files"] == ["paint.txt", "widget.txt"] and diff["text"].startswith("diff --git a/paint.txt")
            assert len(diff["text"]) == MAX_CHARS and diff["cut"]["file"] == "paint.txt"
            pages = [diff["text"]]
            step = arguments_of(diff["cut"]["read_rest"])
            while step:
                page = await read(reviewer, "gitea_read_pull_request", **step)
                pages.append(page["diff"]["text"])
                step = arguments_of(page["diff"]["next_page"]) if page["diff"]["next_page"] else {}
            paint = "".join(pages)  # the first page, then page 2 on of paint.txt's section: the whole section
            assert paint.count("\n+line ") == 60 and paint.endswith("+line 59 of the widget's new paint\n")
            second = await read(reviewer, "gitea_read_pull_request", **arguments_of(diff["next_page"]))
            assert second["diff"]["files_on_page"] == ["widget.txt"] and "+blue" in second["diff"]["text"]
            refused, denial = await call(reviewer, "gitea_read_pull_request", issue_number=number,
                                         repository="someone/else")
            assert refused and denial["details"]["reason"] == "other_repository"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_resources_of_a_live_lease_list_and_read(world: World, tmp_path: Path, transport: str) -> None:
    review, _, body = await in_review(world)
    number = review.number
    await ok(world, "author-2", "gitea_claim_review", issue_number=number)
    base = f"gitea://{OWNER}/{REPO}".lower()
    async with sessions(world, transport, tmp_path) as open_session, open_session("tok-read-reviewer") as reviewer:
        listed = await reviewer.list_resources()
        assert sorted(str(r.uri) for r in listed.resources) == sorted(
            [f"{base}/issues/{number}", f"{base}/pulls/{number}", f"{base}/pulls/{number}/diff"])
        templates = await reviewer.list_resource_templates()
        assert {t.uri_template for t in templates.resource_templates} == {
            "gitea://{owner}/{repo}/issues/{n}", "gitea://{owner}/{repo}/pulls/{n}",
            "gitea://{owner}/{repo}/pulls/{n}/diff"}
        issue = await reviewer.read_resource(f"{base}/issues/{number}")
        doc = json.loads(issue.contents[0].text)  # type: ignore[union-attr]
        assert doc["issue_number"] == number and doc["body"] == body[:MAX_CHARS]
        pull = json.loads((await reviewer.read_resource(f"{base}/pulls/{number}")).contents[0].text)  # type: ignore[union-attr]
        assert pull["pull_number"] == review.pull and pull["commit_status"]["state"] == "failure"
        diff = await reviewer.read_resource(f"{base}/pulls/{number}/diff")
        text, meta = diff.contents
        assert text.mime_type == "text/x-diff" and text.text.startswith("diff --git a/paint.txt")  # type: ignore[union-attr]
        assert json.loads(meta.text)["cut"]["file"] == "paint.txt"  # type: ignore[union-attr]
        with pytest.raises(MCPError) as refused:
            await reviewer.read_resource(f"gitea://someone/else/issues/{number}")
        assert refused.value.error.data["details"]["reason"] == "other_repository"
