"""Merge end to end against the emulator: only an approved PR, exactly the approved commit, by a merger, once."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from bot.core.canonical import parse_comment
from bot.core.evidence import find_marker
from bot.emulator import pullgit
from bot.verbs.runtime import caller_for
from tests.gitea_fixtures import OWNER, REPO
from tests.review_support import LOOP, ROSTER, InReview, ok, pull_state, put_in_review, reviews, runtime, tool, world
from tests.support import Started, make_settings
from tests.world import Sections, World, open_world

__all__ = ["world"]  # the fixture


async def approved(world: World) -> InReview:
    pr = await put_in_review(world)
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    return pr


def main_sha(world: World) -> str | None:
    return pullgit.branch_sha(world.live.emulator.repo(OWNER, REPO).path, "main")


def comment_markers(world: World, number: int) -> list[str]:
    issue = world.live.emulator.issue(OWNER, REPO, number)
    return [find_marker(c.body) or "" for c in issue.comments if c.kind == "comment"]


async def test_an_approved_pr_is_merged_by_a_merger_at_exactly_the_approved_commit(world: World) -> None:
    pr = await approved(world)
    doc = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    merged, merge_commit, head = pull_state(world, pr.pull)
    assert merged and head == pr.head == doc["approved_commit"]
    assert doc["merge_commit_sha"] == merge_commit == main_sha(world)
    assert world.live.emulator.issue(OWNER, REPO, pr.number).closed is not None  # "Closes #N" closed the issue
    key = f"merge:{pr.number}:{pr.pull}"
    issue = world.live.emulator.issue(OWNER, REPO, pr.number)
    [body] = [c.body for c in issue.comments if c.kind == "comment" and find_marker(c.body) == key]
    assert merge_commit is not None and merge_commit in body
    state = parse_comment(body).current
    assert state is not None and state.who_is_next == "controller"
    # A replay adopts the merge: no second merge, no second evidence comment.
    again = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert again["adopted"] is True and again["merge_commit_sha"] == merge_commit
    assert main_sha(world) == merge_commit and comment_markers(world, pr.number).count(key) == 1


async def test_a_merge_by_anyone_but_a_merger_is_refused_by_the_door(world: World) -> None:
    pr = await approved(world)
    for login in ("author-1", "author-2", "controller-bot"):
        refused, doc = await tool(world, login, "gitea_merge_pull_request", issue_number=pr.number)
        assert refused and doc["error"] == "not_authorized" and "merger role" in doc["remediate"], doc
    assert pull_state(world, pr.pull)[0] is False


async def test_an_unapproved_pr_is_a_tracing_gap_naming_the_approval(world: World) -> None:
    pr = await put_in_review(world)
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and (doc["error"], doc["missing"]) == ("tracing_gap", ["approval"]), doc
    assert pull_state(world, pr.pull)[0] is False


async def test_a_push_after_approval_is_a_stale_pin_and_nothing_is_merged(world: World) -> None:
    pr = await approved(world)
    base = main_sha(world)
    moved = world.live.emulator.push_commit(OWNER, REPO, pr.branch, {"widget.txt": "red\n"}, pusher="author-1",
                                            message="Sneak in red")
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and doc["error"] == "stale_pin", doc
    assert doc["details"]["approved_commit"] == pr.head and doc["details"]["head"] == moved
    assert "gitea_claim_review" in doc["exact_next_action"]
    assert pull_state(world, pr.pull) == (False, None, moved) and main_sha(world) == base
    # A new review of the new head, then the merge takes exactly that commit.
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    assert [r[:2] for r in reviews(world, pr.pull)] == [("APPROVED", pr.head), ("APPROVED", moved)]
    doc = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert doc["approved_commit"] == moved and pull_state(world, pr.pull)[0] is True


async def test_the_merge_comment_command_merges_for_a_merger(world: World) -> None:
    pr = await approved(world)
    await world.comment("author-1", pr.number, "/merge")  # an author: refused, nothing merged
    assert pull_state(world, pr.pull)[0] is False
    await world.comment("author-3", pr.number, "/merge")
    merged, merge_commit, _ = pull_state(world, pr.pull)
    assert merged and merge_commit == main_sha(world)


async def test_the_merge_style_comes_from_the_config(tmp_path: Path, start: Started) -> None:
    """`[merge] style = "squash"`: one new commit on main whose only parent is the old main, holding the change."""
    sections: Sections = {**LOOP, "merge": {"style": "squash"}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as world:
        pr = await approved(world)
        base = main_sha(world)
        doc = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
        path = world.live.emulator.repo(OWNER, REPO).path
        assert pullgit.rev(path, f"{doc['merge_commit_sha']}^") == base
        assert pullgit.rev(path, f"{doc['merge_commit_sha']}^2") is None  # squash: no second parent


def test_a_merge_style_gitea_does_not_have_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="style"):
        make_settings(tmp_path, merge={"style": "octopus"})
    assert make_settings(tmp_path).merge.style == "merge"


class _PushFirst:
    """The service's Gitea client, with a push landing between foreman's head check and its merge call."""

    def __init__(self, world: World, branch: str) -> None:
        self._world, self._branch, self.pushed = world, branch, ""

    def __getattr__(self, name: str) -> object:
        return getattr(self._world.gitea, name)

    async def merge_pull(self, number: int, **options: object) -> None:
        emu = self._world.live.emulator
        self.pushed = emu.push_commit(OWNER, REPO, self._branch, {"widget.txt": "red\n"}, pusher="author-1")
        await self._world.gitea.merge_pull(number, **options)  # type: ignore[arg-type]


async def test_a_push_racing_the_merge_is_refused_by_gitea_as_a_stale_pin(world: World) -> None:
    """Gitea's own head_commit_id check (409 "head out of date") is the last guard: a stale_pin, nothing merged."""
    pr = await approved(world)
    base = main_sha(world)
    racing = _PushFirst(world, pr.branch)
    rt = runtime(world)
    rt.gitea = racing
    result = await rt.call("merge_pull_request", caller_for(world.service.settings, "author-3", "mcp"),
                           {"issue_number": pr.number})
    assert result.refusal is not None and result.refusal.error == "stale_pin", result.doc
    assert result.refusal.details["head"] == racing.pushed != pr.head
    assert pull_state(world, pr.pull) == (False, None, racing.pushed) and main_sha(world) == base


# --- guards (issue 29 item 8): each test fails when its guard is removed ---------------------------------------------


def dismiss_reviews(world: World, pull: int) -> None:
    """A repository admin dismisses every verdict on the PR on Gitea (the review stays, marked ``dismissed``)."""
    emu = world.live.emulator
    for review in emu.pull_of(emu.issue(OWNER, REPO, pull)).reviews:
        review.dismissed = True


async def test_a_dismissed_approval_never_lets_the_merge_through(world: World) -> None:
    """Issue 29 item 8: an approval dismissed on Gitea is no approval (a PR was merged on one). The merge is refused
    and nothing merged; a new approval of the head then merges it."""
    pr = await approved(world)
    dismiss_reviews(world, pr.pull)
    base = main_sha(world)
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused, doc
    assert pull_state(world, pr.pull) == (False, None, pr.head) and main_sha(world) == base
    assert f"merge:{pr.number}:{pr.pull}" not in comment_markers(world, pr.number)
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    doc = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert doc["approved_commit"] == pr.head and pull_state(world, pr.pull)[0] is True


async def test_a_merge_gitea_answered_200_without_merging_is_not_reported_merged(world: World) -> None:
    """Issue 29 item 8: the read-back is the proof. Gitea answering the merge 200 with the PR still unmerged was
    answered ok and queued the "Merged" evidence; it is ``unavailable`` (call again), nothing queued, and the retry
    merges exactly the approved commit."""
    pr = await approved(world)
    base = main_sha(world)
    rule = world.live.emulator.faults.fail("POST", "/repos/{owner}/{repo}/pulls/{index}/merge", status=200,
                                           message="accepted")
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert rule.hits == 1 and refused and doc["error"] == "unavailable", doc
    assert pull_state(world, pr.pull) == (False, None, pr.head) and main_sha(world) == base
    key = f"merge:{pr.number}:{pr.pull}"
    assert [e.key for e in await world.service.outbox.list(limit=1000) if e.key == key] == []
    assert key not in comment_markers(world, pr.number)
    doc = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert doc["merged"] is True and doc["approved_commit"] == pr.head
    assert comment_markers(world, pr.number).count(key) == 1
