"""The emulator's pending reviews and dismissals as Gitea's source has them (routers/api/v1/repo/pull_review.go,
models/issues/review.go ``GetCurrentReview``/``SubmitReview``, services/pull/review.go ``DismissReview``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.gitea_fixtures import BOT, HOOK_SECRET, OWNER, REPO, LiveEmulator, live_emulator, webhook_sink

VERSIONS = ["1.22.3", "1.26.3"]


async def _call(live: LiveEmulator, method: str, path: str, *, login: str = BOT, body: Any = None) -> tuple[int, Any]:
    url = live.api(f"/repos/{OWNER}/{REPO}{path}")
    async with live.session.request(method, url, json=body, headers=live.auth(login)) as response:
        raw = await response.read()
        return response.status, json.loads(raw) if raw else None


async def _new_pull(live: LiveEmulator) -> int:
    emu = live.emulator
    emu.create_branch(OWNER, REPO, "feat", files={"f.txt": "f\n"})
    return emu.create_pull(OWNER, REPO, head="feat", title="Feat", author=OWNER).number


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_pending_review_submitted_later_keeps_its_lower_id(version: str) -> None:
    """``CreatePullReview`` with no event leaves a pending review (only its author sees it listed); bob's approval
    comes after; ``SubmitPullReview`` turns the pending one into an approval through ``GetCurrentReview``, keeping
    its id, so listing by id is not the order of submission."""
    async with live_emulator(version=version) as live:
        number = await _new_pull(live)
        status, pending = await _call(live, "POST", f"/pulls/{number}/reviews", login="alice", body={"body": "draft"})
        assert status == 200 and pending["state"] == "PENDING"
        status, approval = await _call(live, "POST", f"/pulls/{number}/reviews", login="bob",
                                       body={"event": "APPROVED"})
        assert approval["id"] > pending["id"]
        assert [r["id"] for r in (await _call(live, "GET", f"/pulls/{number}/reviews", login="bob"))[1]] == [
            approval["id"]
        ]
        status, submitted = await _call(live, "POST", f"/pulls/{number}/reviews/{pending['id']}", login="alice",
                                        body={"event": "APPROVED", "body": "now"})
        assert status == 200
        assert (submitted["id"], submitted["state"], submitted["official"]) == (pending["id"], "APPROVED", True)
        listed = (await _call(live, "GET", f"/pulls/{number}/reviews", login="bob"))[1]
        assert [(r["id"], r["user"]["login"]) for r in listed] == [(pending["id"], "alice"), (approval["id"], "bob")]


@pytest.mark.parametrize("version", VERSIONS)
async def test_submitting_refuses_what_is_not_pending_or_stays_pending(version: str) -> None:
    """``SubmitPullReview``: 422 "only a pending review can be submitted", 422 "review stay pending"; someone
    else's pending review is 404 (``prepareSingleReview``)."""
    async with live_emulator(version=version) as live:
        number = await _new_pull(live)
        _, pending = await _call(live, "POST", f"/pulls/{number}/reviews", login="alice", body={"body": "draft"})
        _, done = await _call(live, "POST", f"/pulls/{number}/reviews", login="bob", body={"event": "APPROVED"})
        status, data = await _call(live, "POST", f"/pulls/{number}/reviews/{done['id']}", login="bob",
                                   body={"event": "APPROVED"})
        assert (status, data["message"]) == (422, "only a pending review can be submitted")
        status, data = await _call(live, "POST", f"/pulls/{number}/reviews/{pending['id']}", login="alice",
                                   body={"event": "PENDING", "body": "x"})
        assert (status, data["message"]) == (422, "review stay pending")
        assert (await _call(live, "POST", f"/pulls/{number}/reviews/{pending['id']}", login="bob",
                            body={"event": "COMMENT", "body": "x"}))[0] == 404


@pytest.mark.parametrize("version", VERSIONS)
async def test_dismissals_need_a_repo_admin_and_send_no_webhook(version: str) -> None:
    """``DismissPullReview``/``UnDismissPullReview``: a writer 403 "Must be repo admin"; a comment review 403
    "not need to dismiss ..."; a repo admin flips ``dismissed`` both ways; Gitea's webhook notifier has no
    ``PullReviewDismiss``, so nothing is sent."""
    async with live_emulator(version=version) as live, webhook_sink() as sink:
        emu = live.emulator
        number = await _new_pull(live)
        _, approval = await _call(live, "POST", f"/pulls/{number}/reviews", login="alice", body={"event": "APPROVED"})
        _, comment = await _call(live, "POST", f"/pulls/{number}/reviews", login="bob",
                                 body={"event": "COMMENT", "body": "hm"})
        emu.add_hook(OWNER, REPO, url=sink.url, secret=HOOK_SECRET, events=["pull_request", "pull_request_review"])
        path = f"/pulls/{number}/reviews/{approval['id']}"
        status, data = await _call(live, "POST", f"{path}/dismissals", login="alice", body={"message": "x"})
        assert (status, data["message"]) == (403, "Must be repo admin")
        status, data = await _call(live, "POST", f"/pulls/{number}/reviews/{comment['id']}/dismissals",
                                   body={"message": "x"})
        assert (status, data["message"]) == (
            403, "not need to dismiss this review because it's type is not Approve or change request")
        status, data = await _call(live, "POST", f"{path}/dismissals", body={"message": "stale"})
        assert (status, data["dismissed"]) == (200, True)
        status, data = await _call(live, "POST", f"{path}/undismissals")
        assert (status, data["dismissed"]) == (200, False)
        assert await emu.drain_webhooks() == []


@pytest.mark.parametrize("version", VERSIONS)
async def test_dismissing_on_a_closed_pr_is_refused(version: str) -> None:
    """services/pull/review.go ``DismissReview``: ``ErrDismissRequestOnClosedPR`` → 403."""
    async with live_emulator(version=version) as live:
        number = await _new_pull(live)
        _, approval = await _call(live, "POST", f"/pulls/{number}/reviews", login="alice", body={"event": "APPROVED"})
        await _call(live, "PATCH", f"/issues/{number}", body={"state": "closed"})
        status, data = await _call(live, "POST", f"/pulls/{number}/reviews/{approval['id']}/dismissals",
                                   body={"message": "x"})
        assert (status, data["message"]) == (403, "can't dismiss a review associated to a closed or merged PR")
