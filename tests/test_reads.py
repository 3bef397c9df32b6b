"""The read verbs (issue 33, items 1 and 2): gitea_read_issue and gitea_read_pull_request through the door, on the
emulator: what they answer, how long text is cut and read on, and what they refuse."""

from __future__ import annotations

from tests.gitea_fixtures import OWNER, REPO
from tests.review_support import ok, put_in_review, tool, world
from tests.world import World

__all__ = ["world"]  # the fixture


async def test_the_author_reads_its_issue_body_and_a_maintainers_comment(world: World) -> None:
    """Item 1: title, body, labels, state, the comments with trust and evidence, the state, the linked PR."""
    review = await put_in_review(world)
    comment = await world.comment("alice", review.number, "Please keep the old colour as an option.")
    doc = await ok(world, "author-1", "gitea_read_issue", issue_number=review.number, newest_first=True)
    assert doc["title"] == "Make the widget blue" and doc["state"] == "open"
    assert doc["labels"] == ["status:review"]
    first = doc["comments"]["items"][0]
    assert (first["id"], first["author"], first["body"]) == (comment, "alice", "Please keep the old colour as an "
                                                                                "option.")
    assert first["trusted"] is True and first["evidence"] is False
    assert any(item["evidence"] for item in doc["comments"]["items"][1:]), doc["comments"]
    assert doc["canonical_state"]["state"]["state"] == "review"
    assert [p["number"] for p in doc["pull_requests"]] == [review.pull]


async def test_reading_an_issue_with_no_recorded_pull_request_never_lists_every_pull_request(world: World) -> None:
    """The author reads its issue before any PR exists: only open pull requests are searched for its branch (a
    search of merged ones too lists all the repository ever had, and grew each life's read with the lives before)."""
    number = await world.open_issue("alice", "Make the widget green")
    emu = world.live.emulator
    before = len(emu.requests)
    doc = await ok(world, "author-1", "gitea_read_issue", issue_number=number)
    assert doc["pull_requests"] == []
    listings = [r.query for r in emu.requests[before:] if r.method == "GET" and (r.route or "").endswith("/pulls")]
    assert listings and all(("state", "open") in query for query in listings), listings


async def test_the_reviewer_reads_the_diff_files_and_a_failing_status(world: World) -> None:
    """Item 2: the diff, the changed files, the reviews, the combined status of the head."""
    review = await put_in_review(world)
    world.live.emulator.set_commit_status(OWNER, REPO, review.head, context="ci/build", state="failure",
                                          target_url="https://ci.example/7", description="2 tests failed")
    doc = await ok(world, "author-2", "gitea_read_pull_request", issue_number=review.number)
    assert doc["pull_number"] == review.pull and doc["head"]["sha"] == review.head
    assert [(f["filename"], f["status"], f["additions"]) for f in doc["files"]["items"]] == [
        ("widget.txt", "added", 1)]
    assert "+blue" in doc["diff"]["text"] and doc["diff"]["files_on_page"] == ["widget.txt"]
    assert doc["commit_status"]["state"] == "failure"
    [status] = doc["commit_status"]["statuses"]
    assert (status["context"], status["state"], status["target_url"], status["description"]) == (
        "ci/build", "failure", "https://ci.example/7", "2 tests failed")


async def test_an_issue_of_another_repository_is_refused(world: World) -> None:
    review = await put_in_review(world)
    for name in ("gitea_read_issue", "gitea_read_pull_request"):
        refused, doc = await tool(world, "author-1", name, issue_number=review.number, repository="other/repo")
        assert refused and doc["error"] == "not_authorized" and doc["details"]["reason"] == "other_repository", doc
