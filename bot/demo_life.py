"""`foreman demo`'s agents through `foreman serve`'s `/mcp`: the author's steps, the review, the merge, the teardown."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from bot.core.canonical import parse_comment
from bot.core.teardown import pull_key
from bot.demo_harness import (
    AUTHOR,
    FULL_NAME,
    MAINTAINER,
    MERGER,
    OWNER,
    REPO,
    REVIEWER,
    StepFailed,
    call_tool,
    lease_by_id,
    mcp_session,
    state_comment_id,
    until,
    verified_comment,
)
from bot.emulator import pullgit
from state.db import read_only, to_db_time
from state.journal import JournalStore
from state.leases import LeaseStore
from state.outbox import OutboxStore

if TYPE_CHECKING:
    from bot.demo_harness import LoopHarness, Printer


async def author_steps(h: LoopHarness, p: Printer, session: Any, n: int, lease_id: str, worktree: Path, branch: str,
                       timeout_s: float) -> int:
    """The author locks, heartbeats, posts its state, publishes and opens the PR (which ends its lease), each read
    back."""
    locked = await call_tool(session, "lock", "gitea_lock_issue", issue_number=n)
    async with h.foreman_db() as db:
        lock = await JournalStore(db).live_lock(FULL_NAME, n)
    if locked.get("status") != "locked" or lock is None:
        raise StepFailed("lock", f"no live issue lock after gitea_lock_issue: {locked.get('status')}")
    p.step("lock", f"gitea_lock_issue: #{n} locked to {AUTHOR}'s worktree on {lock.branch} (lock {lock.lock_id})")

    before = to_db_time((await lease_by_id(h, lease_id)).expires_at)
    await asyncio.sleep(0.01)
    beat = await call_tool(session, "heartbeat", "gitea_heartbeat_lease", issue_number=n)
    after = to_db_time((await lease_by_id(h, lease_id)).expires_at)
    async with h.foreman_db() as db:
        beats = [event for event in await LeaseStore(db).events(lease_id) if event["kind"] == "heartbeat"]
    if not after > before or len(beats) != 1:
        raise StepFailed("heartbeat", f"the lease was not extended ({before} -> {after})")
    if beat["lease"]["lease_id"] != lease_id:
        raise StepFailed("heartbeat", f"gitea_heartbeat_lease answered for another lease: {beat['lease']}")
    p.step("heartbeat", f"gitea_heartbeat_lease: lease {lease_id} now expires {after} (was {before})")

    state = {
        "state": "in-progress",
        "who_is_next": "controller",
        "next_action": f"review {AUTHOR}'s change on its branch and allocate the follow-up",
        "next_prompt": f"#{n}: the widget is blue on the issue branch; review it and decide what comes next.",
        "what_happened": f"{AUTHOR} locked its worktree, made the change and heartbeated its lease",
        "why": "the demo's author finished its step",
        "related_prs": [],
        "blockers": "none",
        "validation": "foreman demo verified each step against Gitea and foreman's database",
    }
    posted = await call_tool(session, "state", "gitea_post_issue_state", issue_number=n, state=state,
                             summary=f"{AUTHOR} hands #{n} back to the controller.")
    [state_key] = posted["outbox"]
    comment = await verified_comment(h, "state", n, state_key, timeout_s)

    async def current() -> int | None:
        return 1 if await state_comment_id(h, n) == comment["id"] else None

    await until("state", current, timeout_s, "the author's state never became the issue's current state")
    p.step("state", f"gitea_post_issue_state: comment #{comment['id']} posted once, read back, and now #{n}'s "
                    f"state (WHO_IS_NEXT controller, LAST_UPDATED_BY {AUTHOR})")

    pr = await publish_and_open(h, p, session, n, worktree, branch)
    ended = await lease_by_id(h, lease_id)
    if ended.status != "released" or ended.end_reason != "pull_request_opened":
        raise StepFailed("release", f"the lease is {ended.status} ({ended.end_reason}) after gitea_open_pull_request")
    released = await call_tool(session, "release", "gitea_release_lease", issue_number=n, reason="done")
    if released.get("already_ended") != "pull_request_opened" or released["lease"]["lease_id"] != lease_id:
        raise StepFailed("release", f"gitea_release_lease after the hand-over answered {released}")
    p.step("release", f"gitea_open_pull_request handed #{n} to review: lease {lease_id} released ({ended.end_reason})"
                      " with the PR's record; gitea_release_lease afterwards answers already_ended, nothing queued")
    return pr


async def publish_and_open(h: LoopHarness, p: Printer, author: Any, n: int, worktree: Path, branch: str) -> int:
    """The author commits its change, pushes it and opens the pull request, each read back from Gitea."""
    (worktree / "widget.py").write_text("color = 'blue'\n", encoding="utf-8")
    published = await call_tool(author, "publish", "gitea_publish_worktree", issue_number=n,
                                message="Make the widget blue")
    on_gitea = pullgit.branch_sha(h.emulator.repo(OWNER, REPO).path, branch)
    if on_gitea != published["commit"]:
        raise StepFailed("publish", f"Gitea's {branch} is at {on_gitea}, not the published {published['commit']}")
    p.step("publish", f"gitea_publish_worktree: commit {published['commit'][:12]} by {AUTHOR} pushed to {branch} "
                      "with the bot's credentials (Gitea's branch read back at that commit)")
    opened = await call_tool(author, "pr", "gitea_open_pull_request", issue_number=n)
    pr = int(opened["pull_request"])
    seen = await h.api(AUTHOR, "GET", f"/pulls/{pr}")
    if seen["user"]["login"] != AUTHOR or seen["head"]["sha"] != published["commit"] or f"Closes #{n}" not in (
            seen["body"] or ""):
        raise StepFailed("pr", f"PR #{pr} as Gitea serves it: by {seen['user']['login']}, head {seen['head']['sha']}")
    p.step("pr", f"gitea_open_pull_request: PR #{pr} {branch} -> {seen['base']['ref']}, posted as {AUTHOR}, body "
                 f"\"Closes #{n}\"; #{n} goes to status:review")
    return pr


async def review_merge_teardown(h: LoopHarness, p: Printer, n: int, pr: int, worktree: Path, branch: str,
                                timeout_s: float, errlog: TextIO) -> dict[str, Any]:
    """The review queue hands the review to the reviewer, who approves; the merge queue hands the approved PR to the
    merger, who merges; the pull request's closed webhook tears the issue down. Returns the teardown's final
    evidence comment. Nobody allocates: each agent asks its runtime context."""
    async def in_review() -> bool | None:
        # foreman writes labels through its outbox, and the review allocation reads its candidates from Gitea.
        if await _busy(h.db_path, n):
            return None
        seen = await h.api(MAINTAINER, "GET", f"/issues/{n}")
        return True if [label["name"] for label in seen["labels"]] == ["status:review"] else None

    await until("claim", in_review, timeout_s, f"#{n} never settled in status:review")
    lease = await _handed(h, errlog, REVIEWER, "review", n, timeout_s)
    p.step("claim", f"the review queue leased the review of #{n} to {REVIEWER} by itself (lease {lease['lease_id']}; "
                    "never the PR's author nor its implementer); the reviewer's runtime context names it")
    async with mcp_session(h, errlog, REVIEWER) as reviewer:
        verdict = await call_tool(reviewer, "review", "gitea_submit_review", issue_number=n, verdict="approve")
    reviews = await h.api(MAINTAINER, "GET", f"/pulls/{pr}/reviews")
    last = reviews[-1] if reviews else {}
    if (last.get("user", {}).get("login"), last.get("state")) != (REVIEWER, "APPROVED"):
        found = [(r["user"]["login"], r["state"]) for r in reviews]
        raise StepFailed("review", f"PR #{pr}'s reviews on Gitea: {found}")
    p.step("review", f"{REVIEWER} through /mcp: gitea_submit_review approve: review #{last['id']} APPROVED "
                     f"as {REVIEWER} on {str(verdict['review']['commit_id'])[:12]}")
    handed = await _handed(h, errlog, MERGER, "merge", n, timeout_s)
    async with mcp_session(h, errlog, MERGER) as merger:
        merged = await call_tool(merger, "merge", "gitea_merge_pull_request", issue_number=n)
    seen = await h.api(MAINTAINER, "GET", f"/pulls/{pr}")
    if not seen["merged"] or seen["merge_commit_sha"] != merged["merge_commit_sha"] or (
            seen["merged_by"] or {}).get("login") != MERGER or seen["head"]["sha"] != verdict["review"]["commit_id"]:
        raise StepFailed("merge", f"PR #{pr} on Gitea: merged {seen['merged']} by {seen.get('merged_by')}")
    p.step("merge", f"the merge queue leased the approved PR #{pr} to {MERGER} by itself (lease "
                    f"{handed['lease_id']}); {MERGER} through /mcp: gitea_merge_pull_request: PR #{pr} merged by "
                    f"{MERGER} as {seen['merge_commit_sha'][:12]} (exactly the approved commit)")
    final = await verified_comment(h, "teardown", n, f"{pull_key(FULL_NAME.lower(), n, pr)}:evidence", timeout_s)
    issue = await h.api(MAINTAINER, "GET", f"/issues/{n}")
    labels = [label["name"] for label in issue["labels"]]
    state = parse_comment(final["body"]).current
    if labels != ["status:done"] or issue["state"] != "closed" or state is None or state.state != "done":
        raise StepFailed("teardown", f"#{n} is {issue['state']} with labels {labels} after the teardown")
    left = pullgit.branch_sha(h.emulator.repo(OWNER, REPO).path, branch)
    if await asyncio.to_thread(worktree.exists) or left is not None:
        raise StepFailed("teardown", f"the worktree {worktree} or the branch {branch} is still there")
    p.step("teardown", f"the pull_request closed webhook ended #{n}'s life: every lease ended, worktree removed, "
                       f"{branch} deleted, status:done, issue closed; final evidence comment #{final['id']} read back")
    return final


async def _handed(h: LoopHarness, errlog: TextIO, login: str, action: str, n: int, timeout_s: float) -> (
    dict[str, Any]
):
    """``login``'s lease on #``n`` for ``action``, once its runtime context shows the queue handed it one."""
    async def leased() -> dict[str, Any] | None:
        async with mcp_session(h, errlog, login) as session:
            context = await call_tool(session, "claim", "gitea_get_runtime_context")
        found = next((lease for lease in context.get("leases") or ()
                      if (lease.get("issue_number"), lease.get("action")) == (n, action)), None)
        if found is None:
            await asyncio.sleep(0.2)  # the queue runs off the caller's path: ask again shortly
        return found

    found = await until("claim" if action == "review" else "merge", leased, timeout_s,
                        f"the {action} queue never leased #{n} to {login}")
    assert isinstance(found, dict)
    return found


async def _busy(db_path: Path, n: int) -> bool:
    """Whether an outbox entry of the issue is not sent yet, or its completion hook has not run."""
    async with read_only(db_path) as db:
        return await OutboxStore(db).unsettled_for_issue(n) > 0
