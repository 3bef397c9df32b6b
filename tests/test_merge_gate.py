"""The merge gate counts only the verdict foreman's review verb recorded (issue 29, item 3; item 8's dismissed
approval): approvals posted on Gitea any other way are named as not counted, never merged on."""

from __future__ import annotations

from typing import Any

from bot.core.canonical import parse_comment
from bot.core.evidence import find_marker
from tests.gitea_fixtures import BOT, OWNER, REPO
from tests.review_support import InReview, ok, pull_state, put_in_review, tool, world
from tests.world import World

__all__ = ["world"]  # the fixture


async def post_review(world: World, login: str, pr: InReview, event: str, *, commit_id: str | None = None) -> int:
    """A review posted on Gitea by ``login`` with its own token (the emulator's review API), not through foreman."""
    review = await world.call(login, "POST", f"/pulls/{pr.pull}/reviews",
                              {"event": event, "body": f"{event} by {login}", "commit_id": commit_id or pr.head})
    return int(review["id"])


async def foreman_approval(world: World, pr: InReview) -> int:
    """author-2 (a roster reviewer) claims the review and approves through the verb; the Gitea review's id."""
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    doc = await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    return int(doc["review"]["id"])


def not_counted(doc: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(n["review_id"], n["user"], n["why"]) for n in doc["details"]["not_counted"]]


async def test_an_outsider_writers_approval_on_gitea_never_lets_the_merge_through(world: World) -> None:
    """alice writes to the repository but is not on the roster: her approval is refused as not recorded, named."""
    pr = await put_in_review(world)
    alice = await post_review(world, "alice", pr, "APPROVED")
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and (doc["error"], doc["missing"]) == ("tracing_gap", ["approval"]), doc
    assert doc["details"]["reason"] == "approval_not_recorded", doc
    assert not_counted(doc) == [(alice, "alice", "not_recorded")]
    assert f"review {alice} by alice" in doc["message"]
    assert pull_state(world, pr.pull)[0] is False


async def test_the_implementers_own_approval_posted_on_gitea_is_refused(world: World) -> None:
    """The PR was posted by foreman's account, so Gitea lets the implementer (author-1, a writer) approve it with its
    own account: that approval is named as the implementer's and never counts."""
    world.live.emulator.set_permission(OWNER, REPO, "author-1", "write")
    pr = await put_in_review(world, poster=BOT)
    own = await post_review(world, "author-1", pr, "APPROVED")
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and doc["error"] == "tracing_gap" and doc["details"]["reason"] == "approval_not_recorded", doc
    assert not_counted(doc) == [(own, "author-1", "by_implementer")]
    assert pull_state(world, pr.pull)[0] is False


async def test_a_dismissed_approval_does_not_count_at_the_door_nor_at_the_merge(world: World) -> None:
    """Item 8: a dismissed approval counted for `pr_approved` and at merge. Alone it is a tracing gap at the door;
    with another approval standing (alice's), the merge names foreman's as dismissed and merges nothing."""
    pr = await put_in_review(world)
    mine = await foreman_approval(world, pr)
    world.live.emulator.dismiss_review(OWNER, REPO, pr.pull, mine)  # a maintainer, on Gitea
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and (doc["error"], doc["missing"]) == ("tracing_gap", ["approval"]), doc
    assert "details" not in doc  # the door's own gate: no approval stands on Gitea
    alice = await post_review(world, "alice", pr, "APPROVED")
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and doc["details"]["reason"] == "approval_withdrawn", doc
    assert not_counted(doc) == [(mine, BOT, "dismissed"), (alice, "alice", "not_recorded")]
    assert pull_state(world, pr.pull)[0] is False


async def test_foremans_recorded_approval_on_the_head_merges_and_the_evidence_names_the_others(world: World) -> None:
    """An outsider's later approval neither blocks nor counts: the merge goes on foreman's, and its evidence comment
    lists the outsider's as not counted."""
    pr = await put_in_review(world)
    mine = await foreman_approval(world, pr)
    alice = await post_review(world, "alice", pr, "APPROVED")
    doc = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert doc["approved_commit"] == pr.head and pull_state(world, pr.pull)[0] is True
    issue = world.live.emulator.issue(OWNER, REPO, pr.number)
    [body] = [c.body for c in issue.comments if find_marker(c.body) == f"merge:{pr.number}:{pr.pull}"]
    state = parse_comment(body).current
    assert state is not None and f"review {mine}" in state.why
    assert f'"review_id": {alice}' in body and '"why": "not_recorded"' in body, body


async def test_a_request_changes_on_the_head_after_the_approval_blocks_the_merge(world: World) -> None:
    """author-2, the roster reviewer, requests changes on the head on Gitea with its own account after foreman
    recorded its approval: a request-changes standing on the head blocks, naming it."""
    world.live.emulator.set_permission(OWNER, REPO, "author-2", "write")
    pr = await put_in_review(world)
    await foreman_approval(world, pr)
    block = await post_review(world, "author-2", pr, "REQUEST_CHANGES")
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and doc["error"] == "invalid_state" and doc["details"]["reason"] == "changes_requested", doc
    assert [b["review_id"] for b in doc["details"]["blocking"]] == [block]
    assert pull_state(world, pr.pull)[0] is False


async def test_an_outsiders_request_changes_on_the_head_before_the_approval_still_blocks(world: World) -> None:
    """A request-changes verdict Gitea counts (official, not dismissed) on exactly the head blocks whoever posted it
    and whatever came after; once dismissed, foreman's recorded approval merges."""
    pr = await put_in_review(world)
    block = await post_review(world, "alice", pr, "REQUEST_CHANGES")
    await foreman_approval(world, pr)
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and doc["details"]["reason"] == "changes_requested", doc
    assert [(b["review_id"], b["user"]) for b in doc["details"]["blocking"]] == [(block, "alice")]
    world.live.emulator.dismiss_review(OWNER, REPO, pr.pull, block)
    await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert pull_state(world, pr.pull)[0] is True


async def test_an_approval_posted_on_gitea_never_puts_the_pull_request_in_the_merge_queue(world: World) -> None:
    """Issue 31: the merge queue hands out only what the gate lets through. A roster reviewer approving on Gitea with
    its own token (not through gitea_submit_review) leaves the PR waiting for review, and an allocation of the
    merge leases nothing; a merger who posted the PR is never handed its merge."""
    from bot.verbs.queue_view import work_queues
    from state.db import utcnow
    from tests.review_support import runtime

    pr = await put_in_review(world, poster="author-3")  # the merger posted the PR
    await post_review(world, "author-2", pr, "APPROVED")
    queues = await work_queues(runtime(world), utcnow())
    assert [q.issue.number for q in queues.reviews] == [pr.number] and queues.merges == ()
    doc = await ok(world, "controller-bot", "gitea_allocate_next_work", action="merge", owner="author-3",
                   dry_run=False)
    assert doc["decision"] == "wait" and doc["applied"] is False, doc
    await foreman_approval(world, pr)
    queues = await work_queues(runtime(world), utcnow())
    assert [q.issue.number for q in queues.merges] == [pr.number] and queues.merges[0].barred == ["author-1",
                                                                                                    "author-3"]
    doc = await ok(world, "controller-bot", "gitea_allocate_next_work", action="merge", owner="author-3",
                   dry_run=False)
    assert doc["applied"] is False and [(s["issue_number"], s["reason"]) for s in doc["skipped"]] == [
        (pr.number, "self_review")], doc


async def test_the_approval_recorded_after_thirty_other_reviews_still_counts(world: World) -> None:
    """Issue 32 item 6: Gitea lists a PR's reviews 30 a page by default, with X-Total-Count and no Link
    (pull_review.go ``ListPullReviews``). After 31 comment reviews, foreman's recorded approval is on the second page:
    before, only the first page was read, so the approval looked withdrawn and the merge was refused."""
    pr = await put_in_review(world)
    for i in range(31):
        await world.call("alice", "POST", f"/pulls/{pr.pull}/reviews",
                         {"event": "COMMENT", "body": f"note {i}", "commit_id": pr.head})
    approval = await foreman_approval(world, pr)
    merged = await ok(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert merged["merged"] is True and pull_state(world, pr.pull)[0] is True
    assert world.service.gitea is not None
    reviews = await world.service.gitea.list_reviews(pr.pull)
    assert len(reviews) == 32 and reviews[-1].id == approval


async def test_a_pull_request_retitled_as_a_draft_is_refused_before_gitea_is_asked(world: World) -> None:
    """Issue 32 item 5: someone retitles the approved PR `WIP: ...` on Gitea. The merge verb says it is a draft
    (reason pull_request_draft, what to do) and sends nothing; before, Gitea's 405 came back as a generic refusal."""
    pr = await put_in_review(world)
    await foreman_approval(world, pr)
    await world.call("alice", "PATCH", f"/issues/{pr.pull}", {"title": "WIP: not yet"})
    refused, doc = await tool(world, "author-3", "gitea_merge_pull_request", issue_number=pr.number)
    assert refused and (doc["error"], doc["details"]["reason"]) == ("invalid_state", "pull_request_draft"), doc
    assert "retitle" in doc["exact_next_action"], doc
    emu = world.live.emulator
    assert not [r for r in emu.requests if r.method == "POST" and (r.route or "").endswith("/merge")]
    assert pull_state(world, pr.pull)[0] is False

