"""The emulator's version switch: each behaviour that differs between Gitea 1.22.3 and 1.26.3, pinned on both."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.gitea_fixtures import BOT, HOOK_SECRET, OWNER, REPO, TOKENS, LiveEmulator, live_emulator, webhook_sink

ISSUES = f"/repos/{OWNER}/{REPO}/issues"
VERSIONS = ("1.22.3", "1.26.3")


@pytest.fixture(params=VERSIONS)
async def live(request: pytest.FixtureRequest) -> AsyncIterator[LiveEmulator]:
    async with live_emulator(version=request.param) as env:
        yield env


def _new(live: LiveEmulator) -> bool:
    return live.emulator.version.startswith("1.26")


async def test_version_endpoint_reports_the_switch(live: LiveEmulator) -> None:
    assert await live.client().get_version() == live.emulator.version


async def test_issue_json_fields_by_version(live: LiveEmulator) -> None:
    """modules/structs/issue.go Issue: time_estimate from 1.25.0, content_version from 1.26.0."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    async with live.session.get(live.api(f"{ISSUES}/1"), headers=live.auth()) as resp:
        data = await resp.json()
    assert ("content_version" in data, "time_estimate" in data) == (_new(live), _new(live))


async def test_stale_content_version_is_409_only_from_1_26(live: LiveEmulator) -> None:
    """routers/api/v1/repo/issue.go EditIssue passes content_version to ChangeContent from 1.26.0 (409 when
    stale); 1.22.3's EditIssueOption has no such field (ignored)."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice", body="one")
    live.emulator.edit_issue(OWNER, REPO, 1, actor="alice", body="two")
    body = {"body": "three", "content_version": 0}
    async with live.session.patch(live.api(f"{ISSUES}/1"), json=body, headers=live.auth()) as resp:
        assert resp.status == (409 if _new(live) else 201)


async def test_token_scheme_case_by_version(live: LiveEmulator) -> None:
    """services/auth/oauth2.go parseToken (<=1.24): ``token`` lowercase only; 1.25+ httpauth: any case."""
    async with live.session.get(live.api("/user"), headers={"Authorization": f"Token {TOKENS[BOT]}"}) as resp:
        assert resp.status == (200 if _new(live) else 401)
    async with live.session.get(live.api("/user"), headers={"Authorization": f"BEARER {TOKENS[BOT]}"}) as resp:
        assert resp.status == 200


async def test_malformed_label_elements_by_version(live: LiveEmulator) -> None:
    """prepareForReplaceOrAdd: 400 "a label must be an integer or a string" from 1.23; 1.22 skips them."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    body = {"labels": ["bug", {"id": 1}]}
    async with live.session.post(live.api(f"{ISSUES}/1/labels"), json=body, headers=live.auth()) as resp:
        assert resp.status == (400 if _new(live) else 200)


async def test_webhook_extras_by_version(live: LiveEmulator) -> None:
    """Hook-Installation-Target-Type headers from 1.24.0 (services/webhook/deliver.go addDefaultHeaders);
    pull_request in comment payloads from 1.23.0 (IssueCommentPayload); issues/deleted from 1.25.0
    (services/webhook/notifier.go DeleteIssue)."""
    emu = live.emulator
    async with webhook_sink() as sink:
        emu.add_hook(OWNER, REPO, url=sink.url, secret=HOOK_SECRET, events=["issues", "pull_request"])
        emu.create_issue(OWNER, REPO, title="pr", author="alice", pull=True)
        emu.create_issue(OWNER, REPO, title="doomed", author="alice")
        await live.client().create_comment(1, "on the PR")
        await live.client().delete_issue(2)
        deliveries = await emu.drain_webhooks()
    [comment] = [d for d in deliveries if d.event_type == "pull_request_comment"]
    assert ("pull_request" in comment.payload) == _new(live)
    assert ("X-Gitea-Hook-Installation-Target-Type" in comment.headers) == _new(live)
    assert [d.action for d in deliveries if d.event_type == "issues"] == (["deleted"] if _new(live) else [])


async def test_bare_refusals_and_timeline_items_as_gitea_answers_them(live: LiveEmulator) -> None:
    """ctx.Status with an empty body: 403 in EditIssue, editIssueComment, deleteIssueComment, DeleteIssueLabel
    and ClearIssueLabels (audit #19); deleteIssueComment answers 400 for a timeline item without content
    (HasContentSupport, audit #17); the add/replace 403 is JSON from 1.23, bare in 1.22."""
    emu = live.emulator
    emu.create_issue(OWNER, REPO, title="x", author="alice", labels=["bug"])
    comment = emu.create_comment(OWNER, REPO, 1, author="alice", body="hi")
    timeline = next(item for item in emu.issue(OWNER, REPO, 1).timeline if item.kind != "comment")

    async def status_and_body(method: str, path: str, login: str, body: object = None) -> tuple[int, bytes]:
        async with live.session.request(method, live.api(path), json=body, headers=live.auth(login)) as resp:
            return resp.status, await resp.read()

    bare = [
        ("PATCH", f"{ISSUES}/1", {"title": "y"}),
        ("PATCH", f"{ISSUES}/comments/{comment.id}", {"body": "y"}),
        ("DELETE", f"{ISSUES}/comments/{comment.id}", None),
        ("DELETE", f"{ISSUES}/1/labels/1", None),
        ("DELETE", f"{ISSUES}/1/labels", None),
    ]
    for method, path, body in bare:
        assert await status_and_body(method, path, "bob", body) == (403, b""), (method, path)
    assert await status_and_body("DELETE", f"{ISSUES}/comments/{timeline.id}", BOT) == (400, b"")
    status, raw = await status_and_body("POST", f"{ISSUES}/1/labels", "bob", {"labels": ["feature"]})
    assert status == 403 and (b"write permission is required" in raw) == _new(live) and (raw == b"") != _new(live)


def test_review_hook_events_go_by_the_group_name_only() -> None:
    """updateHookEvents (routers/api/v1/utils/hook.go) sets HookEventPullRequestReview from
    "pull_request_review" alone; a fine review type listed in ``events`` turns nothing on (audit #20)."""
    from bot.emulator.webhooks import expand_hook_events

    reviews = {"pull_request_review_approved", "pull_request_review_rejected", "pull_request_review_comment"}
    assert expand_hook_events(["pull_request_review"]) >= reviews
    assert not expand_hook_events(["pull_request_review_approved"]) & reviews
