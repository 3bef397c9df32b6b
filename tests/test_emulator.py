"""The Gitea emulator behaves as ../shared/gitea/FACTS.md says Gitea v1.26.3 does: API semantics, webhooks, faults."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from bot.emulator import ROUTES, SentWebhook, go_json, sign_body
from tests.conftest import SHARED
from tests.gitea_fixtures import (
    BOT,
    HOOK_SECRET,
    OWNER,
    REPO,
    TOKENS,
    LiveEmulator,
    WebhookSink,
    live_emulator,
    webhook_sink,
)

ISSUES = f"/repos/{OWNER}/{REPO}/issues"
GO_PLAYGROUND_SECRET = b"IsWishesWereHorsesWedAllBeEatingSteak!"
#: X-Gitea-Signature of each go-playground sample, from shared/gitea/payloads/README.md.
GO_PLAYGROUND_SIGNATURES = {
    "issues-opened--go-playground.json": "98c44fd0ae42ca4208eac6f81e59b436837740abc8693bf828366b32d33b1cbc",
    "issues-label_updated--go-playground.json": "3611415860ed5904c87dd589a7c5fa7e87d2a72b0b2a92ea149ba9691ba8c785",
    "issue_comment-created--go-playground.json": "690180a8c853460cba88f9b09911a531d449e9f63ed6b1ff0a0def3b972ca744",
    "push--go-playground.json": "60fe446c74fa0cb9474f98cc557db79e10c7aaf22cf324ad65239600b9e4d915",
}


@pytest.fixture
async def live() -> AsyncIterator[LiveEmulator]:
    async with live_emulator() as env:
        yield env


@pytest.fixture
async def sink() -> AsyncIterator[WebhookSink]:
    async with webhook_sink() as receiver:
        yield receiver


@pytest.fixture
async def hooked(live: LiveEmulator, sink: WebhookSink) -> LiveEmulator:
    """The live emulator with one ``issues`` hook (comments and labels included) pointing at the sink."""
    live.emulator.add_hook(OWNER, REPO, url=sink.url, secret=HOOK_SECRET, events=["issues"])
    return live


async def _call(
    live: LiveEmulator, method: str, path: str, *, login: str = BOT, body: Any = None
) -> tuple[int, Any, dict[str, str]]:
    async with live.session.request(method, live.api(path), headers=live.auth(login), json=body) as resp:
        raw = await resp.read()
        data = json.loads(raw) if raw else None
        return resp.status, data, dict(resp.headers)


def _of_type(deliveries: list[SentWebhook], event_type: str) -> list[SentWebhook]:
    return [d for d in deliveries if d.event_type == event_type]


# --- labels, issues and comments --------------------------------------------------------------------------------------


async def test_issue_label_filter_is_and_unknown_dropped(live: LiveEmulator) -> None:
    """labels= is AND over names; unknown names are dropped; all-unknown drops the filter (FACTS §5)."""
    emu = live.emulator
    emu.create_issue(OWNER, REPO, title="both", author="alice", labels=["bug", "feature"])
    emu.create_issue(OWNER, REPO, title="bug", author="alice", labels=["bug"])
    emu.create_issue(OWNER, REPO, title="none", author="alice")

    async def titles(labels: str) -> list[str]:
        status, data, _ = await _call(live, "GET", f"{ISSUES}?labels={labels}")
        assert status == 200
        return [i["title"] for i in data]

    assert await titles("bug,feature") == ["both"]
    assert await titles("bug") == ["bug", "both"]
    assert await titles("bug,nope") == ["bug", "both"]
    assert await titles("nope,zilch") == ["none", "bug", "both"]


async def test_mixed_label_elements_answer_400_and_unknown_names_are_ignored(live: LiveEmulator) -> None:
    """IssueLabelsOption: all ints or all strings; a mix is 400; unknown names ignored; 200 full list."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    bug_id = next(label.id for label in live.emulator.repo(OWNER, REPO).labels.values() if label.name == "bug")
    status, data, _ = await _call(live, "POST", f"{ISSUES}/1/labels", body={"labels": [bug_id, "feature"]})
    assert status == 400
    assert data["message"] == "labels should be an array of strings or integers"
    status, data, _ = await _call(live, "POST", f"{ISSUES}/1/labels", body={"labels": ["feature", "ghost"]})
    assert (status, [label["name"] for label in data]) == (200, ["feature"])
    status, data, _ = await _call(live, "POST", f"{ISSUES}/1/labels", body={"labels": [bug_id]})
    assert (status, [label["name"] for label in data]) == (200, ["bug", "feature"])
    status, _, _ = await _call(live, "DELETE", f"{ISSUES}/1/labels/987654")
    assert status == 422


async def test_label_updated_carries_full_list_and_no_label_key(hooked: LiveEmulator) -> None:
    """Every add/replace/remove sends issue_label/label_updated with issue.labels = the full set after."""
    hooked.emulator.create_issue(OWNER, REPO, title="x", author="alice", labels=["bug"])
    await hooked.client().add_labels(1, ["feature"])
    deliveries = await hooked.emulator.drain_webhooks()
    [updated] = _of_type(deliveries, "issue_label")
    payload = updated.payload
    assert (updated.event, payload["action"]) == ("issues", "label_updated")
    assert [label["name"] for label in payload["issue"]["labels"]] == ["bug", "feature"]
    assert "label" not in payload and "changes" not in payload
    assert payload["sender"]["login"] == BOT
    assert payload["commit_id"] == ""


async def test_clear_labels_sends_label_cleared(hooked: LiveEmulator) -> None:
    """DELETE .../labels answers 204 and sends label_cleared listing the labels from *before* the clear
    (models/issues/issue_label.go clearIssueLabels never reloads; notifier.go IssueClearLabels converts it)."""
    hooked.emulator.create_issue(OWNER, REPO, title="x", author="alice", labels=["bug", "feature"])
    status, data, _ = await _call(hooked, "DELETE", f"{ISSUES}/1/labels")
    assert (status, data) == (204, None)
    [cleared] = _of_type(await hooked.emulator.drain_webhooks(), "issue_label")
    assert cleared.action == "label_cleared"
    assert [label["name"] for label in cleared.payload["issue"]["labels"]] == ["bug", "feature"]
    assert hooked.emulator.label_names(OWNER, REPO, 1) == []
    assert "label" not in cleared.payload


async def test_exclusive_scoped_label_replaces_its_sibling(live: LiveEmulator) -> None:
    """Adding an exclusive scoped label removes the other label of that scope in the same change."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice", labels=["status/ready", "bug"])
    labels = await live.client().add_labels(1, ["status/in-progress"])
    assert [label.name for label in labels] == ["bug", "status/in-progress"]


async def test_patch_issue_answers_201_and_sends_edits(hooked: LiveEmulator) -> None:
    """PATCH issue answers 201 (sic); title and body edits are separate deliveries with changes.*.from."""
    hooked.emulator.create_issue(OWNER, REPO, title="old title", body="old body", author="alice")
    status, data, _ = await _call(
        hooked, "PATCH", f"{ISSUES}/1", body={"title": "new title", "body": "new body", "state": "closed"}
    )
    assert status == 201
    assert (data["title"], data["state"]) == ("new title", "closed")
    edits = [d.payload for d in await hooked.emulator.drain_webhooks()]
    assert [(p["action"], sorted(p.get("changes", {}))) for p in edits] == [
        ("edited", ["added_labels", "removed_labels", "title"]),
        ("edited", ["added_labels", "body", "removed_labels"]),
        ("closed", []),
    ]
    assert edits[0]["changes"]["title"]["from"] == "old title"
    assert edits[1]["changes"]["body"]["from"] == "old body"


async def test_comments_are_all_oldest_first_without_pagination(live: LiveEmulator) -> None:
    """GET .../comments returns every comment oldest first, ignoring page/limit, with X-Total-Count."""
    live.emulator.create_issue(OWNER, REPO, title="chatty", author="alice")
    ids = [live.emulator.create_comment(OWNER, REPO, 1, author="bob", body=f"c{n}").id for n in range(55)]
    status, data, headers = await _call(live, "GET", f"{ISSUES}/1/comments?limit=5&page=2")
    assert status == 200
    assert [c["id"] for c in data] == ids
    assert headers["X-Total-Count"] == "55"
    assert "Link" not in headers


async def test_issue_list_defaults_paging_and_link_header(live: LiveEmulator) -> None:
    """Open by default (unknown state too), PRs included without type, limit capped at 50, RFC 5988 links."""
    emu = live.emulator
    for n in range(54):
        emu.create_issue(OWNER, REPO, title=f"i{n}", author="alice")
    emu.create_issue(OWNER, REPO, title="pr", author="alice", pull=True)
    emu.create_issue(OWNER, REPO, title="closed", author="alice", closed=True)
    status, data, headers = await _call(live, "GET", f"{ISSUES}?state=bogus&limit=500")
    assert status == 200 and len(data) == 50
    assert data[0]["title"] == "pr" and data[0]["pull_request"] is not None
    assert headers["X-Total-Count"] == "55"
    base = f"{live.base_url}/api/v1{ISSUES}"
    assert headers["Link"] == (
        f'<{base}?limit=500&page=2&state=bogus>; rel="next",<{base}?limit=500&page=2&state=bogus>; rel="last"'
    )
    status, data, headers = await _call(live, "GET", f"{ISSUES}?type=issues&page=2&limit=50")
    assert [i["title"] for i in data] == ["i3", "i2", "i1", "i0"]
    assert 'rel="first"' in headers["Link"] and 'rel="prev"' in headers["Link"]
    assert 'rel="next"' not in headers["Link"]
    _, data, _ = await _call(live, "GET", f"{ISSUES}?state=closed")
    assert [i["title"] for i in data] == ["closed"]


async def test_created_issue_with_labels_sends_opened_then_label_updated(hooked: LiveEmulator) -> None:
    """POST issue with labels (ids) → 201, then deliveries issues/opened and issue_label/label_updated."""
    bug = next(label for label in hooked.emulator.repo(OWNER, REPO).labels.values() if label.name == "bug")
    status, data, _ = await _call(hooked, "POST", ISSUES, body={"title": "new", "labels": [bug.id]})
    assert status == 201 and data["pull_request"] is None
    deliveries = await hooked.emulator.drain_webhooks()
    assert [(d.event_type, d.action) for d in deliveries] == [("issues", "opened"), ("issue_label", "label_updated")]


async def test_comment_edit_webhook_only_when_body_changes_and_delete_carries_old_comment(
    hooked: LiveEmulator,
) -> None:
    """edited only for a real change (changes.body.from); deleted carries the comment as it was."""
    hooked.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    client = hooked.client()
    comment = await client.create_comment(1, "first")
    await client.edit_comment(comment.id, "first")
    await client.edit_comment(comment.id, "second")
    await client.delete_comment(comment.id)
    deliveries = await hooked.emulator.drain_webhooks()
    assert [d.action for d in deliveries] == ["created", "edited", "deleted"]
    assert {d.event for d in deliveries} == {"issue_comment"}
    edited, deleted = deliveries[1].payload, deliveries[2].payload
    assert edited["changes"]["body"]["from"] == "first"
    assert deleted["comment"]["body"] == "second" and deleted["comment"]["id"] == comment.id
    assert deleted["issue"]["comments"] == 0
    assert await client.list_issue_comments(1) == []


async def test_own_comments_come_back_as_webhooks(hooked: LiveEmulator) -> None:
    """Gitea does not filter by actor: the bot's own comment is delivered with sender = the bot."""
    hooked.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    await hooked.client().create_comment(1, "from the bot")
    [created] = await hooked.emulator.drain_webhooks()
    assert created.payload["sender"]["login"] == BOT
    assert created.payload["comment"]["user"]["login"] == BOT
    assert created.payload["is_pull"] is False and "pull_request" not in created.payload


async def test_pr_comment_is_issue_comment_event_with_pull_request_type(live: LiveEmulator, sink: WebhookSink) -> None:
    """A PR comment: X-Gitea-Event issue_comment, type pull_request_comment, is_pull, top-level pull_request."""
    live.emulator.add_hook(OWNER, REPO, url=sink.url, secret=HOOK_SECRET, events=["issues", "pull_request"])
    live.emulator.create_issue(OWNER, REPO, title="pr", author="alice", pull=True)
    await live.client().create_comment(1, "LGTM")
    [delivery] = await live.emulator.drain_webhooks()
    assert (delivery.event, delivery.event_type) == ("issue_comment", "pull_request_comment")
    assert delivery.payload["is_pull"] is True
    assert delivery.payload["pull_request"]["number"] == 1
    assert delivery.payload["comment"]["issue_url"] == ""


# --- webhooks on the wire ---------------------------------------------------------------------------------------------


async def test_webhook_signature_verifies_over_raw_bytes(hooked: LiveEmulator, sink: WebhookSink) -> None:
    """HMAC-SHA256 of the raw body with the hook secret equals X-Gitea-Signature; the body is Go's indent."""
    hooked.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    await hooked.client().create_comment(1, "a <b> & c")
    await hooked.emulator.drain_webhooks()
    [received] = sink.received
    digest = hmac.new(HOOK_SECRET.encode(), received.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(digest, received.headers["X-Gitea-Signature"])
    assert received.headers["X-Hub-Signature-256"] == f"sha256={digest}"
    sha1 = hmac.new(HOOK_SECRET.encode(), received.body, hashlib.sha1).hexdigest()
    assert received.headers["X-Hub-Signature"] == f"sha1={sha1}"
    assert received.body.startswith(b'{\n  "action": "created",\n  "issue": {\n    "id": ')
    assert not received.body.endswith(b"\n")
    assert b"a \\u003cb\\u003e \\u0026 c" in received.body
    assert json.loads(received.body)["comment"]["body"] == "a <b> & c"


async def test_webhook_header_set_is_complete(hooked: LiveEmulator, sink: WebhookSink) -> None:
    """Every v1.26 header: three delivery ids (one uuid4), coarse/fine events, signatures, target type, Go UA."""
    hooked.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    await hooked.client().add_labels(1, ["bug"])
    await hooked.emulator.drain_webhooks()
    [received] = sink.received
    headers = received.headers
    delivery = headers["X-Gitea-Delivery"]
    assert uuid.UUID(delivery).version == 4
    assert headers["X-Gogs-Delivery"] == headers["X-GitHub-Delivery"] == delivery
    assert headers["X-Gitea-Event"] == headers["X-Gogs-Event"] == headers["X-GitHub-Event"] == "issues"
    assert headers["X-Gitea-Event-Type"] == headers["X-Gogs-Event-Type"] == "issue_label"
    assert headers["X-GitHub-Event-Type"] == "issue_label"
    assert headers["X-Gitea-Signature"] == headers["X-Gogs-Signature"]
    assert headers["X-Gitea-Hook-Installation-Target-Type"] == "repository"
    assert headers["X-GitHub-Hook-Installation-Target-Type"] == "repository"
    assert headers["User-Agent"] == "Go-http-client/1.1"
    assert headers["Content-Type"] == "application/json"
    assert "X-GitHub-Hook-ID" not in headers


@pytest.mark.needs_shared
async def test_go_json_and_sign_body_match_real_gitea_bytes() -> None:
    """go_json reproduces real MarshalIndent bodies byte for byte; sign_body matches known HMAC vectors."""
    for name, signature in GO_PLAYGROUND_SIGNATURES.items():
        raw = (SHARED / "gitea" / "payloads" / name).read_bytes()
        assert go_json(json.loads(raw)) == raw, name
        assert sign_body(GO_PLAYGROUND_SECRET, raw)["X-Gitea-Signature"] == signature
    assert sign_body(b"", b"{}") == {
        "X-Gitea-Signature": "",
        "X-Gogs-Signature": "",
        "X-Hub-Signature": "sha1=",
        "X-Hub-Signature-256": "sha256=",
    }


async def test_failed_delivery_is_recorded_once_and_replay_gets_new_uuid(live: LiveEmulator) -> None:
    """No retry on non-2xx; a replay re-sends the same bytes (same signature) under a new uuid."""
    async with webhook_sink(status=500) as failing:
        live.emulator.add_hook(OWNER, REPO, url=failing.url, secret=HOOK_SECRET)
        live.emulator.create_issue(OWNER, REPO, title="x", author="alice", notify=True)
        [first] = await live.emulator.drain_webhooks()
        assert (first.status, first.ok, len(failing.received)) == (500, False, 1)
        replay = live.emulator.replay_delivery(first.delivery_id)
        await live.emulator.drain_webhooks()
    assert replay.delivery_id != first.delivery_id and replay.replay_of == first.delivery_id
    assert failing.received[1].body == failing.received[0].body
    assert failing.received[1].headers["X-Gitea-Signature"] == failing.received[0].headers["X-Gitea-Signature"]


async def test_hook_event_sets_and_api_hooks_default_inactive(live: LiveEmulator, sink: WebhookSink) -> None:
    """issues_only excludes comments; a hook created through the API without active=true sends nothing."""
    live.emulator.add_hook(OWNER, REPO, url=sink.url, secret="s", events=["issues_only"])
    status, data, _ = await _call(
        live,
        "POST",
        f"/repos/{OWNER}/{REPO}/hooks",
        body={"type": "gitea", "config": {"url": sink.url, "content_type": "json"}},
    )
    assert status == 201 and data["active"] is False and "secret" not in data["config"]
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    await live.client().create_comment(1, "quiet")
    await live.client().edit_issue(1, state="closed")
    deliveries = await live.emulator.drain_webhooks()
    assert [(d.hook_id, d.action) for d in deliveries] == [(1, "closed")]


# --- auth, permissions, git, faults and the route table ---------------------------------------------------------------


async def test_auth_schemes_and_401(live: LiveEmulator) -> None:
    """token/Bearer in any case and Basic with the token work; none or a bad token is 401 JSON."""
    for header in (
        f"token {TOKENS['bob']}",
        f"TOKEN {TOKENS['bob']}",
        f"bearer {TOKENS['bob']}",
        "Basic " + base64.b64encode(f"{TOKENS['bob']}:x-oauth-basic".encode()).decode(),
    ):
        async with live.session.get(live.api("/user"), headers={"Authorization": header}) as resp:
            assert resp.status == 200, header
            assert (await resp.json())["login"] == "bob"
    for headers in ({}, {"Authorization": "token wrong"}):
        async with live.session.get(live.api("/user"), headers=headers) as resp:
            assert resp.status == 401
            assert "message" in await resp.json()
    async with live.session.get(live.api("/version")) as resp:
        assert (await resp.json()) == {"version": "1.26.3"}


async def test_write_routes_need_write_permission(live: LiveEmulator) -> None:
    """Readers may comment but not label; the permission API answers only admins or the user themself."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    status, _, _ = await _call(live, "POST", f"{ISSUES}/1/labels", login="bob", body={"labels": ["bug"]})
    assert status == 403
    status, _, _ = await _call(live, "POST", f"{ISSUES}/1/comments", login="bob", body={"body": "hi"})
    assert status == 201
    permission = f"/repos/{OWNER}/{REPO}/collaborators/alice/permission"
    assert (await _call(live, "GET", permission, login="bob"))[0] == 403
    status, data, _ = await _call(live, "GET", permission)
    assert (status, data["permission"], data["role_name"], data["user"]["login"]) == (200, "write", "write", "alice")
    assert await live.client("bob").get_user_permission("bob") == "read"
    assert await live.client("root").get_user_permission(OWNER) == "owner"


async def test_repository_is_a_real_bare_git_repository(live: LiveEmulator) -> None:
    """clone_url is file:// to a bare repo whose branch heads match the branch API."""
    repo = await live.client().get_repo()
    main = await live.client().get_branch("main")
    out = subprocess.run(
        ["git", "ls-remote", repo.clone_url, "refs/heads/main"], capture_output=True, text=True, check=True
    )
    assert out.stdout.split()[0] == main.commit_id
    assert main.raw["commit"]["message"] == "Initial commit\n"


async def test_the_branch_api_follows_the_bare_repository_and_reads_a_commit_once(
    live: LiveEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GET .../branches/{branch}: the head git has now (a moved branch answers its new commit), slashes allowed;
    a name git forbids, a missing branch, or a folder of branches is 404 (Gitea: "branch does not exist"). The
    branch is resolved without a git process, and a commit's metadata, once read, is not read again."""
    emu = live.emulator
    first = emu.create_branch(OWNER, REPO, "feature/one", files={"a.txt": "1\n"}, message="first")
    client = live.client()
    assert ((await client.get_branch("feature/one")).commit_id, (await client.get_branch("feature/one")).raw[
        "commit"]["message"]) == (first, "first\n")
    second = emu.create_branch(OWNER, REPO, "feature/one", files={"a.txt": "2\n"}, message="second")
    moved = await client.get_branch("feature/one")
    assert (moved.commit_id, moved.raw["commit"]["message"]) == (second, "second\n")
    for name in ("nope", "feature", "feature/.hidden", "main@{1}", "main.lock"):
        status, data, _ = await _call(live, "GET", f"/repos/{OWNER}/{REPO}/branches/{name}")
        assert status == 404, (name, data)
    spawned: list[object] = []
    real_popen = subprocess.Popen

    def counting_popen(*args: object, **kwargs: object) -> object:
        spawned.append(args[0] if args else kwargs.get("args"))
        return real_popen(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(subprocess, "Popen", counting_popen)
    again = await client.get_branch("feature/one")
    assert again.commit_id == second and spawned == []


async def test_drop_after_store_really_stores(hooked: LiveEmulator) -> None:
    """The write happens (and its webhook goes out), but the connection is cut before any answer."""
    hooked.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    hooked.emulator.faults.drop_after_store("POST", "/api/v1/repos/{owner}/{repo}/issues/{index}/comments")
    with pytest.raises(aiohttp.ClientConnectionError):
        await _call(hooked, "POST", f"{ISSUES}/1/comments", body={"body": "stored anyway"})
    assert [c.body for c in hooked.emulator.issue(OWNER, REPO, 1).comments] == ["stored anyway"]
    [created] = await hooked.emulator.drain_webhooks()
    assert created.action == "created"
    status, _, _ = await _call(hooked, "POST", f"{ISSUES}/1/comments", body={"body": "answered"})
    assert status == 201


async def test_status_fault_answers_without_storing(live: LiveEmulator) -> None:
    """An injected status is answered instead of doing the work; it fires the given number of times."""
    live.emulator.create_issue(OWNER, REPO, title="x", author="alice")
    rule = live.emulator.faults.fail("*", "/repos/{owner}/{repo}/issues/{index}/comments", status=503, times=1)
    status, data, _ = await _call(live, "POST", f"{ISSUES}/1/comments", body={"body": "lost"})
    assert (status, data["message"]) == (503, "injected fault")
    assert live.emulator.issue(OWNER, REPO, 1).comments == []
    assert rule.hits == 1 and rule.remaining == 0
    assert (await _call(live, "POST", f"{ISSUES}/1/comments", body={"body": "ok"}))[0] == 201


def test_route_table_is_unique_and_under_api_v1() -> None:
    """One table drives the app: (method, swagger path) pairs are unique."""
    pairs = [(r.method, r.path) for r in ROUTES]
    assert len(pairs) == len(set(pairs)) == 42
    assert all(r.aiohttp_path.startswith("/api/v1/") for r in ROUTES)
