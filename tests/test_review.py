"""Review end to end against the emulator: allocation to a reviewer, the self-review block, and both verdicts."""

from __future__ import annotations

from pathlib import Path

from mcp import Client

from bot.core.canonical import parse_comment
from bot.core.evidence import find_marker
from bot.mcp_server import build_server
from bot.verbs.runtime import caller_for
from state.journal import JournalStore
from state.leases import LeaseStore
from tests.gitea_fixtures import BOT, OWNER, REPO
from tests.review_support import LOOP, ROSTER, ok, put_in_review, reviews, runtime, start_work, tool, world
from tests.support import Started
from tests.world import EXTRA_TOKENS, FULL_NAME, Sections, World, open_world

__all__ = ["world"]  # the fixture


def evidence(world: World, number: int, marker: str) -> str:
    issue = world.live.emulator.issue(OWNER, REPO, number)
    [body] = [c.body for c in issue.comments if c.kind == "comment" and find_marker(c.body) == marker]
    return body


async def test_review_allocation_leases_a_status_review_issue_to_a_reviewer(world: World) -> None:
    """allocate_next_work(action=review) picks the issue in status:review and leases it for review."""
    pr = await put_in_review(world)
    doc = await ok(world, "controller-bot", "gitea_allocate_next_work", action="review", owner="author-2",
                   dry_run=False)
    lease = doc["lease"]
    assert (lease["issue_number"], lease["owner"], lease["role"], lease["action"]) == (
        pr.number, "author-2", "reviewer", "review")
    state = parse_comment(evidence(world, pr.number, f"{lease['lease_id']}:evidence")).current
    assert state is not None and (state.state, state.who_is_next) == ("review", "reviewer")
    assert "gitea_submit_review" in state.next_action
    assert world.labels(pr.number) == ["status:review"]  # a review lease leaves the status as it is


async def test_self_review_is_refused_at_allocation_and_at_the_verb(tmp_path: Path, start: Started) -> None:
    """The implementer (the last implement lease's owner) and the PR's author are never the reviewer."""
    roster = {**ROSTER, "author-1": ["author", "reviewer"], "author-3": ["reviewer", "merger"]}
    async with open_world(tmp_path, start, roster=roster, **LOOP) as world:
        pr = await put_in_review(world, poster="author-3")  # author-1 implemented it, author-3 opened the PR
        for owner in ("author-1", "author-3"):
            doc = await ok(world, "controller-bot", "gitea_allocate_next_work", action="review", owner=owner,
                           dry_run=False)
            assert doc["decision"] == "wait" and doc["applied"] is False, doc
            assert [(s["issue_number"], s["reason"]) for s in doc["skipped"]] == [(pr.number, "self_review")]
        refused, doc = await tool(world, "author-1", "gitea_claim_review", issue_number=pr.number)
        assert refused and doc["error"] == "not_authorized" and "implemented" in doc["remediate"], doc
        refused, doc = await tool(world, "author-3", "gitea_claim_review", issue_number=pr.number)
        assert refused and doc["error"] == "not_authorized" and "wrote this pull request" in doc["remediate"], doc
        assert await LeaseStore(world.service.db).open_leases(FULL_NAME) == []
        claimed = await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
        assert (claimed["lease"]["owner"], claimed["lease"]["action"]) == ("author-2", "review")


async def test_approve_records_the_verdict_on_the_head_and_hands_on_to_the_merger(world: World) -> None:
    pr = await put_in_review(world)
    claimed = await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    context = await ok(world, "author-2", "gitea_get_runtime_context")
    assert context["exact_next_action"].startswith(f"review the pull request of #{pr.number} and call "
                                                   f"gitea_submit_review with issue_number={pr.number}")
    refused, again = await tool(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    assert refused and again["error"] == "conflict", again
    doc = await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    assert doc["review"]["commit_id"] == pr.head and doc["lease"]["end_reason"] == "reviewed"
    assert reviews(world, pr.pull) == [("APPROVED", pr.head, True)]
    state = parse_comment(evidence(world, pr.number, f"{claimed['lease']['lease_id']}:review")).current
    assert state is not None and (state.state, state.who_is_next) == ("review", "merger")
    assert "gitea_merge_pull_request" in state.next_action
    # A replay adopts the recorded verdict: one review on Gitea, one evidence comment.
    replay = await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    assert replay["adopted"] is True and replay["review"] == doc["review"]
    assert reviews(world, pr.pull) == [("APPROVED", pr.head, True)]
    evidence(world, pr.number, f"{claimed['lease']['lease_id']}:review")


async def test_request_changes_hands_the_issue_back_to_its_author_in_the_same_worktree(world: World) -> None:
    pr = await put_in_review(world)
    journal = JournalStore(world.service.db)
    [before] = await journal.history(FULL_NAME.lower(), pr.number)
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    refused, doc = await tool(world, "author-2", "gitea_submit_review", issue_number=pr.number,
                              verdict="request_changes")
    assert refused and doc["error"] == "invalid_input", doc  # request_changes needs a body
    doc = await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="request_changes",
                   body="The widget must be navy, not blue.")
    assert reviews(world, pr.pull) == [("REQUEST_CHANGES", pr.head, True)]
    back = doc["author_lease"]
    assert (back["owner"], back["action"], back["status"]) == ("author-1", "implement", "live")
    assert world.labels(pr.number) == ["status:in-progress"]
    # The hand-back's own evidence (auto-allocation then finishes its bootstrap: the latest state says to lock).
    state = parse_comment(evidence(world, pr.number, f"{back['lease_id']}:evidence")).current
    assert state is not None and (state.state, state.who_is_next) == ("in-progress", "author")
    assert "gitea_bootstrap_issue_worktree" in state.next_action
    # The author's bootstrap recovers its worktree and branch (nothing created) under the new lease.
    boot = await ok(world, "author-1", "gitea_bootstrap_issue_worktree", issue_number=pr.number)
    proof = boot["proof"]
    assert proof["created"] == {"branch": False, "worktree": False}, proof
    assert (proof["branch"], proof["registration"]["worktree_path"]) == (before.branch, before.worktree_path)
    assert proof["registration"]["lease_id"] == back["lease_id"]
    assert (Path(before.worktree_path) / "README.md").is_file()
    locked = await ok(world, "author-1", "gitea_lock_issue", issue_number=pr.number)
    assert locked["status"] == "locked"
    history = await LeaseStore(world.service.db).history(FULL_NAME, pr.number)
    assert [(lease.action, lease.owner, lease.end_reason) for lease in history] == [
        ("implement", "author-1", "pull request opened"), ("review", "author-2", "reviewed"),
        ("implement", "author-1", None)]


def review_posts(world: World) -> int:
    return sum(1 for r in world.live.emulator.requests if r.method == "POST" and "reviews" in (r.route or ""))


async def test_a_pr_posted_by_foreman_itself_cannot_be_approved_through_gitea(world: World) -> None:
    """Gitea refuses a verdict by the PR's own poster: with foreman's token on both sides (the reviewer has no
    token of its own) that is an invalid_state refusal before Gitea is asked, naming the operator's fix, and the
    review lease stays with the reviewer (nothing recorded)."""
    pr = await put_in_review(world, poster=BOT)
    claimed = await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    posts = review_posts(world)
    refused, doc = await tool(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    assert refused and doc["error"] == "invalid_state" and "PR's poster" in doc["message"], doc
    assert doc["details"]["reason"] == "review_by_pr_poster" and doc["details"]["poster"] == BOT, doc
    assert "gitea.identity_tokens.author-2" in doc["exact_next_action"], doc
    assert reviews(world, pr.pull) == []
    assert review_posts(world) == posts  # refused before Gitea was asked
    lease = await LeaseStore(world.service.db).get(claimed["lease"]["lease_id"])
    assert lease is not None and lease.status == "live"


async def test_a_reviewer_with_its_own_gitea_token_approves_a_pr_foreman_posted(tmp_path: Path, start: Started) -> None:
    """With `gitea.identity_tokens` for the reviewer, the verdict is posted as the reviewer's own account, so Gitea
    takes an approval of a PR the bot posted (official: the reviewer writes to the repository)."""
    sections: Sections = {**LOOP, "gitea": {"identity_tokens": {"author-2": EXTRA_TOKENS["author-2"]}}}
    async with open_world(tmp_path, start, roster=ROSTER, **sections) as world:
        world.live.emulator.set_permission(OWNER, REPO, "author-2", "write")
        pr = await put_in_review(world, poster=BOT)
        await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
        doc = await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
        assert doc["review"]["state"] == "APPROVED"
        emu = world.live.emulator
        [review] = emu.pull_of(emu.issue(OWNER, REPO, pr.pull)).reviews
        assert (review.reviewer.login, review.state, review.official) == ("author-2", "APPROVED", True)


async def test_a_merge_lease_goes_only_to_an_approved_pull_request(world: World) -> None:
    """A merge lease is the merge queue's hand-out of an approved PR: a `status:ready` issue is never leased to a
    merger (before the merge queue, action=merge leased a ready issue to the merger with an implementer's label,
    assignee and bootstrap prompt; then it was refused outright)."""
    number = await world.open_issue("alice", "Ready but not for a merger")
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    before = await LeaseStore(world.service.db).history(FULL_NAME, number)
    doc = await ok(world, "controller-bot", "gitea_allocate_next_work", action="merge", owner="author-3",
                   dry_run=False)
    assert doc["decision"] == "wait" and doc["applied"] is False, doc
    assert [lease for lease in await LeaseStore(world.service.db).every_lease() if lease.owner == "author-3"] == []
    assert await LeaseStore(world.service.db).history(FULL_NAME, number) == before
    refused, doc = await tool(world, "controller-bot", "gitea_allocate_next_work", action="merge", owner="author-2",
                              dry_run=False)
    assert refused and doc["error"] == "not_authorized" and "merger" in doc["message"], doc


async def test_a_review_lease_gets_no_worktree(world: World) -> None:
    """A reviewer is not offered the bootstrap (issue 33 item 4: an author's tool); called anyway on its review lease,
    it is refused by the role gate, and nothing changes (before: `invalid_state` `no_worktree_for_action`)."""
    pr = await put_in_review(world)
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    async with Client(build_server(runtime(world), caller_for(world.service.settings, "author-2", "mcp"))) as client:
        offered = {t.name for t in (await client.list_tools()).tools}
    assert not offered & {"gitea_bootstrap_issue_worktree", "gitea_lock_issue"}, offered
    refused, doc = await tool(world, "author-2", "gitea_bootstrap_issue_worktree", issue_number=pr.number)
    assert refused and doc["error"] == "not_authorized" and "author or controller role" in doc["message"], doc
    assert "gitea_get_runtime_context" in doc["exact_next_action"], doc
    leases = await LeaseStore(world.service.db).history(FULL_NAME, pr.number)
    assert [(lease.owner, lease.action, lease.status) for lease in leases][-1] == ("author-2", "review", "live")
    assert await JournalStore(world.service.db).open_for_issue(FULL_NAME, pr.number) is None
    latest = await JournalStore(world.service.db).latest_completed(FULL_NAME, pr.number)
    assert latest is not None and latest.owner == "author-1"  # the implementer's, as before the call


async def test_a_verdict_whose_answer_was_lost_is_found_on_the_retry_never_posted_twice(world: World) -> None:
    """Issue 29 item 8: Gitea stored the approval but its answer was lost (the connection dropped after the store):
    the call answers ``unavailable`` with the review lease kept, and the retry finds the review by its lease's
    marker and records it; it was posted a second time (two APPROVED reviews on the PR)."""
    pr = await put_in_review(world)
    claimed = await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    world.live.emulator.faults.drop_after_store("POST", "/repos/{owner}/{repo}/pulls/{index}/reviews")
    refused, lost = await tool(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    assert refused and lost["error"] == "unavailable", lost
    assert reviews(world, pr.pull) == [("APPROVED", pr.head, True)]  # Gitea has it
    lease = await LeaseStore(world.service.db).get(claimed["lease"]["lease_id"])
    assert lease is not None and lease.status == "live"
    posts = review_posts(world)
    doc = await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    assert reviews(world, pr.pull) == [("APPROVED", pr.head, True)] and review_posts(world) == posts
    assert doc["review"]["commit_id"] == pr.head and doc["lease"]["end_reason"] == "reviewed"
    evidence(world, pr.number, f"{claimed['lease']['lease_id']}:review")


async def test_requested_changes_wait_for_a_busy_implementer_whatever_triggers_auto_allocation(world: World) -> None:
    """Issue 29 item 8: changes requested while the implementer holds ``max_leases_per_author`` (1) live leases wait
    for them: a trigger meanwhile (another issue labelled `status:ready`) leases nothing back to them, where any
    trigger did, past the cap; once their other work is released, the release's run leases it back."""
    pr = await put_in_review(world)
    other = await world.open_issue("alice", "Make the widget round")
    await world.call("alice", "POST", f"/issues/{other}/labels", {"labels": ["status:ready"]})
    leases = LeaseStore(world.service.db)
    busy = await leases.live_for_issue(FULL_NAME, other)
    assert busy is not None and (busy.owner, busy.action) == ("author-1", "implement")
    await start_work(world, "author-1", other)  # started work is never preempted by the hand-back
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    changes = await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="request_changes",
                       body="The widget must be navy.")
    assert changes["author_lease"] is None and changes["preempted"] is None, changes
    third = await world.open_issue("alice", "Make the widget shiny")
    await world.call("alice", "POST", f"/issues/{third}/labels", {"labels": ["status:ready"]})  # a trigger
    assert await leases.live_for_issue(FULL_NAME, pr.number) is None
    assert [(lease.issue_number, lease.owner) for lease in await leases.open_leases(FULL_NAME)] == [
        (other, "author-1")]
    await ok(world, "author-1", "gitea_release_lease", issue_number=other, reason="done")
    back = await leases.live_for_issue(FULL_NAME, pr.number)
    assert back is not None and (back.owner, back.action) == ("author-1", "implement"), back


async def test_requested_changes_preempt_the_implementers_newer_unstarted_issue(world: World) -> None:
    """Issue 31 item 4: the implementer holds max_leases_per_author (1) with a newer issue it has not started
    (nothing published): the hand-back takes its place at once, the newer issue goes back to `status:ready`,
    unassigned, with evidence, and the runtime context names the hand-back. Before, the changes waited behind it."""
    pr = await put_in_review(world)
    other = await world.open_issue("alice", "Make the widget round")
    await world.call("alice", "POST", f"/issues/{other}/labels", {"labels": ["status:ready"]})
    leases = LeaseStore(world.service.db)
    newer = await leases.live_for_issue(FULL_NAME, other)
    assert newer is not None and newer.owner == "author-1"
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    changes = await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="request_changes",
                       body="The widget must be navy.")
    back = changes["author_lease"]
    assert back is not None and (back["owner"], back["issue_number"], back["status"]) == (
        "author-1", pr.number, "live"), changes
    assert changes["preempted"]["lease_id"] == newer.lease_id, changes
    ended = await leases.get(newer.lease_id)
    assert ended is not None and (ended.status, ended.end_reason) == ("released", "preempted_by_hand_back")
    assert world.labels(other) == ["status:ready"]
    assert world.live.emulator.issue(OWNER, REPO, other).assignees == []
    body = evidence(world, other, f"{newer.lease_id}:preempted")
    state = parse_comment(body).current
    assert state is not None and state.state == "ready", body
    context = await ok(world, "author-1", "gitea_get_runtime_context")
    assert [lease["issue_number"] for lease in context["leases"]][:1] == [pr.number], context
    assert context["leases"][0]["handed_back"] is True
    # The preempted owner's next call on the newer issue says what happened, not only "not leased to you".
    refused, doc = await tool(world, "author-1", "gitea_heartbeat_lease", issue_number=other)
    assert refused and doc["details"]["reason"] == "lease_released", doc
    assert doc["details"]["end_reason"] == "preempted_by_hand_back", doc


async def test_the_runtime_context_of_an_idle_reviewer_and_merger_lists_the_work_waiting_for_their_role(
    world: World,
) -> None:
    """Issue 31: a reviewer or merger holding nothing is shown what waits for its role (before: only "nothing is
    leased to you ... wait for a controller"). Here the queues do not run by themselves ([allocator] queues = []):
    the reviewer is told to claim what is listed."""
    pr = await put_in_review(world)
    idle = await ok(world, "author-2", "gitea_get_runtime_context")
    assert [w["issue_number"] for w in idle["work_waiting"]["reviews"]] == [pr.number], idle
    assert idle["work_waiting"]["queues_running"] == [] and "gitea_claim_review" in idle["exact_next_action"], idle
    merger = await ok(world, "author-3", "gitea_get_runtime_context")
    assert merger["work_waiting"]["merges"] == [], merger
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    merger = await ok(world, "author-3", "gitea_get_runtime_context")
    [waiting] = merger["work_waiting"]["merges"]
    assert (waiting["issue_number"], waiting["stage"], waiting["approved_by"]) == (pr.number, "merge", "author-2")
    reviewer = await ok(world, "author-2", "gitea_get_runtime_context")
    assert reviewer["work_waiting"]["reviews"] == [], reviewer



async def test_a_review_decided_on_a_read_taken_before_the_verdict_leases_nothing(world: World) -> None:
    """The queues read Gitea once per run and decide on that read. A verdict recorded after the read made the PR
    approved: the apply on the stale read is refused `conflict` and no second review lease is granted (found by the
    crash test: the reviewer then held a review lease on an approved PR, which nobody would ever end, and every later
    review waited behind it)."""
    from bot.core.allocator import normalize_candidates
    from bot.verbs.queue_facts import candidates_of, latest_leases, queued_pulls
    from bot.verbs.runtime import CallOptions, operator_caller
    from tests.review_support import runtime

    pr = await put_in_review(world)
    service = world.service
    await ok(world, "author-2", "gitea_claim_review", issue_number=pr.number)
    # The run's read while the review lease is live: #N waits for review (its verdict is not recorded yet). The
    # verdict then ends that same lease: the issue's latest lease is still the one read, only its end is new.
    assert service.gitea is not None
    pulls = await queued_pulls(service.gitea, service.db, service.settings)
    records, _ = candidates_of(pulls, "review")
    assert [r["issue_number"] for r in records] == [pr.number]
    await ok(world, "author-2", "gitea_submit_review", issue_number=pr.number, verdict="approve")
    options = CallOptions(resume_own=False, max_live=1, candidates=tuple(normalize_candidates(records)),
                          lease_history=latest_leases(pulls))
    result = await runtime(world).call("allocate_next_work", operator_caller("foreman:auto-allocate", "auto"),
                                       {"owner": "author-2", "action": "review", "dry_run": False}, options=options)
    assert result.refusal is not None and result.refusal.error == "conflict", result.doc
    assert "changed since its candidate was read" in result.refusal.message
    leases = await LeaseStore(service.db).history(FULL_NAME, pr.number)
    assert [(x.action, x.status) for x in leases] == [("implement", "released"), ("review", "released")], leases
