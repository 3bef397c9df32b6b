"""The dashboard over HTTP: token, cookie or 401; HTML and JSON over the same stores; nothing secret, text escaped."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.app import Service
from bot.dashboard.render import _LINK_QUERY, _REFRESH, issue_link
from bot.dashboard.routes import COOKIE, session_value
from state.db import utcnow
from state.leases import LeaseStore
from state.outbox import OutboxIntent
from tests.support import HANG_S, SECRET, Started, make_settings, payload, wait_status, webhook_headers

TOKEN = "dash-token-0123456789abcdef"
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _settings(tmp_path: Path, **extra: Any) -> Any:
    from bot.config_sections import AllocatorConfig

    # No automatic allocation in these tests (where the allocator has the switch): the seeded lease is the only one.
    quiet = {"allocator": {"auto": False}} if "auto" in AllocatorConfig.model_fields else {}
    return make_settings(
        tmp_path, dashboard={"token": TOKEN}, repository={"owner": "org", "name": "repo"},
        roster={"author-1": ["author"], "author-2": ["author"], "controller-bot": ["controller"]}, **quiet,
        **extra,
    )


async def _deliver(service: Service, client: TestClient[Any, Any], body: bytes, status: str) -> str:
    headers = webhook_headers(body)
    resp = await client.post("/webhook", data=body, headers=headers)
    assert resp.status == 202, await resp.text()
    delivery = headers["X-Gitea-Delivery"]
    await wait_status(service, delivery, status)
    return delivery


async def _seed(service: Service, client: TestClient[Any, Any]) -> dict[str, Any]:
    """Real deliveries through intake and the worker; a lease and outbox entries through their stores."""
    ready_issue = {"id": 1007, "number": 7, "title": HOSTILE, "state": "open",
                   "labels": [{"id": 1, "name": "status:ready"}, {"id": 2, "name": HOSTILE}]}
    opened = await _deliver(service, client, payload("opened", number=7, issue=ready_issue), "done")
    leased_issue = {"id": 1009, "number": 9, "title": "leased", "state": "open",
                    "labels": [{"id": 1, "name": "status:ready"}]}
    await _deliver(service, client, payload("opened", number=9, issue=leased_issue), "done")
    foreign = payload("opened", number=3, repository={"id": 9, "name": "else", "full_name": "other/else",
                                                      "owner": {"login": "other"}})
    ignored = await _deliver(service, client, foreign, "ignored")
    now = utcnow()
    async with service.db.transaction() as conn:
        await LeaseStore(service.db).acquire(
            conn, repo="org/repo", issue_number=9, owner="author-2", role="author", action="implement",
            ttl=timedelta(hours=1), now=now, actor="operator:test", fingerprint="fp-1", request={"exclude": [4]},
        )
    await service.outbox.add(OutboxIntent("t:labels", 7, "labels", {"add": ["status:in-progress"], "remove": []}),
                             repo="org/repo")
    entry = await service.outbox.by_key("t:labels")
    assert entry is not None
    claimed = await service.outbox.claim(entry, "test-sender")
    assert claimed is not None
    observed = {"labels": ["status:ready", HOSTILE]}
    assert await service.outbox.verification_failed(claimed, error="labels differ", observed=observed, result={})
    return {"opened": opened, "ignored": ignored}


async def _client(tmp_path: Path, start: Started, **extra: Any) -> tuple[Service, TestClient[Any, Any]]:
    return await start(_settings(tmp_path, **extra))


async def test_without_a_token_the_dashboard_is_off(tmp_path: Path, start: Started) -> None:
    _, client = await start(make_settings(tmp_path))
    for path in ("/dashboard", "/dashboard/api/overview", f"/dashboard?token={TOKEN}"):
        resp = await client.get(path, headers=AUTH, allow_redirects=False)
        assert resp.status == 404, path


async def test_no_token_or_a_wrong_one_is_401_with_the_envelope(tmp_path: Path, start: Started) -> None:
    _, client = await _client(tmp_path, start)
    wrong = [({}, "/dashboard"), ({"Authorization": "Bearer nope"}, "/dashboard/api/overview"),
             ({"Authorization": f"Basic {TOKEN}"}, "/dashboard"), ({}, "/dashboard?token=nope"),
             ({"Cookie": f"{COOKIE}={TOKEN}"}, "/dashboard"), ({}, "/dashboard/issues/1")]
    for headers, path in wrong:
        resp = await client.get(path, headers=headers, allow_redirects=False)
        assert resp.status == 401, (headers, path)
        doc = await resp.json()
        assert doc["error"] == "not_authorized" and doc["remediate"] and doc["exact_next_action"], doc
        assert TOKEN not in await resp.text()
        assert "set-cookie" not in {k.lower() for k in resp.headers}


async def _raw_get(client: TestClient[Any, Any], target: bytes, header: bytes) -> tuple[int, bytes]:
    """One GET written byte for byte on a real socket (an HTTP client library would refuse to send these bytes):
    the status and the body."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: dash\r\n" + header + b"\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), HANG_S)
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(("target", "header"), [
    (b"/dashboard", b"Cookie: " + COOKIE.encode() + b"=\xff\xfe"),
    (b"/dashboard", b"Cookie: " + COOKIE.encode() + b"=\xc3\xa9t\xc3\xa9"),
    (b"/dashboard/api/overview", b"Authorization: Bearer \xff"),
    (b"/dashboard/api/overview", b"Authorization: Bearer \xc3\xa9"),
    (b"/dashboard?token=%FF", b"X-Probe: 1"),
    (b"/dashboard?token=%ED%A0%80", b"X-Probe: 1"),
])
async def test_a_token_or_cookie_that_is_not_ascii_is_refused_like_any_wrong_token(
    tmp_path: Path, start: Started, caplog: pytest.LogCaptureFixture, target: bytes, header: bytes
) -> None:
    """Issue 29 item 6: bytes that are not UTF-8 (or not ASCII) in the session cookie, the bearer value or
    ?token= are a wrong token: 401 with the envelope, never a 500 with a traceback before authentication."""
    _, client = await _client(tmp_path, start)
    status, body = await _raw_get(client, target, header)
    assert status == 401, body
    assert json.loads(body)["error"] == "not_authorized", body
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_token_in_the_query_sets_an_httponly_cookie_and_redirects_to_the_bare_url(
    tmp_path: Path, start: Started
) -> None:
    _, client = await _client(tmp_path, start)
    resp = await client.get(f"/dashboard/issues/7?token={TOKEN}", allow_redirects=False)
    assert resp.status == 303
    assert resp.headers["Location"] == "/dashboard/issues/7"
    cookie = resp.headers["Set-Cookie"]
    assert f"{COOKIE}={session_value(TOKEN)}" in cookie and TOKEN not in cookie
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/dashboard" in cookie
    # The client keeps the cookie: the bare URL and the API now answer without the token.
    page = await client.get("/dashboard/issues/7")
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    api = await client.get("/dashboard/api/leases")
    assert api.status == 200 and "live" in await api.json()


async def test_pages_escape_gitea_text_and_show_what_the_stores_hold(tmp_path: Path, start: Started) -> None:
    service, client = await _client(tmp_path, start, mcp={"tokens": {"mcp-secret-token-value": "author-1"}})
    seeded = await _seed(service, client)
    resp = await client.get("/dashboard", headers=AUTH)
    assert resp.status == 200
    assert resp.headers["Cache-Control"] == "no-store" and "default-src 'none'" in resp.headers[
        "Content-Security-Policy"]
    html = await resp.text()
    # One script, the page's own refresh, allowed by this response's nonce alone; Gitea's text never becomes markup.
    nonce = re.search(r"script-src 'nonce-([A-Za-z0-9_-]+)'", resp.headers["Content-Security-Policy"])
    assert nonce is not None and html.count("<script") == 1 and "<img" not in html
    assert f'<script nonce="{nonce.group(1)}">{_REFRESH}</script>' in html
    assert "&lt;script&gt;" in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    for secret in (TOKEN, SECRET, "mcp-secret-token-value"):
        assert secret not in html
    api = await (await client.get("/dashboard/api/overview", headers=AUTH)).json()
    # Deliveries: both, the foreign one 'ignored' with its reason, on the page and in the JSON.
    by_id = {d["delivery"]: d for d in api["deliveries"]["recent"]}
    assert by_id[seeded["opened"]]["status"] == "done"
    reason = by_id[seeded["ignored"]]["ignored_reason"]
    assert by_id[seeded["ignored"]]["status"] == "ignored" and reason and json.dumps(reason)[1:-1] in html
    # The live lease with its owner, role, action and expiry.
    (live,) = api["leases"]["live"]
    assert (live["issue_number"], live["owner"], live["role"], live["action"]) == (9, "author-2", "author",
                                                                                   "implement")
    # Times to the second, relative, the absolute time on hover: never the stored microseconds.
    expires = live["expires_at"][:19]
    assert f'<time datetime="{expires}Z" title="{expires.replace("T", " ")} UTC">in 59 min</time>' in html
    assert live["expires_at"] not in html and live["lease_id"] in html
    # The failed verification with both versions.
    (failed,) = [e for e in api["outbox"]["open"] if e["key"] == "t:labels"]
    assert failed["status"] == "verification_failed"
    assert failed["intended"] == {"add": ["status:in-progress"], "remove": []}
    assert failed["observed"] == {"labels": ["status:ready", HOSTILE]}
    assert "intended" in html and "Gitea shows" in html and "labels differ" in html
    # Ready candidates and the allocator's decision now: #7 is ready; the dry run for author-1 names it.
    # #9 is leased to author-2, so author-1's dry run selects #7 and skips #9 with its stable reason, shown.
    assert [c["issue_number"] for c in api["allocator"]["ready_candidates"]] == [7, 9]
    now = {d["owner"]: d for d in api["allocator"]["now"]}
    assert now["author-1"]["decision"] == "select" and now["author-1"]["issue_number"] == 7, now
    (skip,) = [s for s in now["author-1"]["skipped"] if s["issue_number"] == 9]
    assert skip["reason"] and f"<code>{skip['reason']}</code>" in html, skip
    # Nothing secret in the JSON either.
    text = json.dumps(api)
    for secret in (TOKEN, SECRET, "mcp-secret-token-value"):
        assert secret not in text


async def test_the_issue_page_has_the_whole_timeline(tmp_path: Path, start: Started) -> None:
    service, client = await _client(tmp_path, start)
    seeded = await _seed(service, client)
    doc = await (await client.get("/dashboard/api/issues/7", headers=AUTH)).json()
    assert doc["issue_number"] == 7 and doc["known"]
    assert [d["delivery"] for d in doc["deliveries"]] == [seeded["opened"]]
    assert doc["snapshot"]["labels"] == sorted(["status:ready", HOSTILE])
    assert [w["key"] for w in doc["bot_writes"]] == ["t:labels"]
    kinds = [item["kind"] for item in doc["timeline"]]
    assert "delivery" in kinds and "outbox" in kinds, kinds
    assert [item["at"] for item in doc["timeline"]] == sorted(item["at"] for item in doc["timeline"])
    html = await (await client.get("/dashboard/issues/7", headers=AUTH)).text()
    assert seeded["opened"] in html and html.count("<script") == 1 and "<img" not in html and "t:labels" in html
    nine = await (await client.get("/dashboard/api/issues/9", headers=AUTH)).json()
    assert [lease["owner"] for lease in nine["leases"]] == ["author-2"]
    assert [e["kind"] for e in nine["lease_events"]] == ["acquired"]


async def test_bad_issue_numbers_and_sections_are_typed_refusals(tmp_path: Path, start: Started) -> None:
    _, client = await _client(tmp_path, start)
    for path, status, error in (("/dashboard/issues/0", 400, "invalid_input"),
                                ("/dashboard/api/issues/99999999999999999999", 400, "invalid_input"),
                                ("/dashboard/api/issues/x1", 400, "invalid_input"),
                                ("/dashboard/api/nothing", 404, "not_found")):
        resp = await client.get(path, headers=AUTH)
        assert resp.status == status, path
        assert (await resp.json())["error"] == error


async def _table_contents(service: Service) -> dict[str, list[tuple[object, ...]]]:
    async with service.db.reader.execute("SELECT name FROM sqlite_master WHERE type = 'table'") as cur:
        names = [row["name"] for row in await cur.fetchall()]
    out = {}
    for name in names:
        async with service.db.reader.execute(f'SELECT * FROM "{name}"') as cur:  # noqa: S608 (sqlite_master)
            out[name] = [tuple(row) for row in await cur.fetchall()]
    return out


async def test_the_dashboard_is_read_only(tmp_path: Path, start: Started) -> None:
    """Every page and API answer (the allocator's dry run included) leaves every table as it was; only GET."""
    service, client = await _client(tmp_path, start)
    await _seed(service, client)
    before = await _table_contents(service)
    paths = ["/dashboard", "/dashboard/issues/7", "/dashboard/issues/9", "/dashboard/api/overview",
             "/dashboard/api/issues/7", *(f"/dashboard/api/{s}" for s in ("leases", "journal", "outbox",
                                                                          "deliveries", "grants", "allocator"))]
    for path in paths:
        assert (await client.get(path, headers=AUTH)).status == 200, path
    assert await _table_contents(service) == before
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        resp = await client.request(method, "/dashboard/api/overview", headers=AUTH)
        assert resp.status == 405, method


async def test_run_grants_show_every_admission_decision_and_no_token(tmp_path: Path, start: Started) -> None:
    """A sealed grant and two calls through the real broker (one admitted, one out of order): both decisions are
    on the page and in the JSON; the run token and its digest are on neither."""
    import uuid as uuid_mod

    from bot.core import grants as g
    from bot.verbs.runs.broker import Broker
    from bot.verbs.runs.start import token_digest
    from state.grants import GrantStore
    from tests.test_grants_core import TEMPLATE

    service, client = await _client(tmp_path, start)
    now = utcnow()
    facts = g.RunFacts(repo="org/repo", issue_number=8, owner="author-1", role="author", action="implement",
                       lease_id="lease-1", worktree=g.BoundWorktree(path="/co/branches/issue-8-x", uuid="wt-1",
                                                                    branch="issue-8-x"))
    grant = g.compile_grant(g.PolicyTemplate.from_mapping("author.implement", TEMPLATE), facts,
                            run_id=f"run-{uuid_mod.uuid4().hex}", host_id="host-a", now=now)
    run_token = "frun_dashboard-secret-run-token"
    store = GrantStore(service.db)
    await store.seal(grant, token_sha256=token_digest(run_token), sealed_by="test", now=now)

    async def bound(_: g.Grant) -> str | None:
        return "wt-1"

    broker = Broker(store, grant.run_id, host=lambda: "host-a", worktree=bound, policy_digest=grant.policy_digest)
    admitted = await broker.before_call("gitea_lock_issue", {"issue_number": 8})
    assert admitted.allowed
    await broker.after_call(admitted, ok=True, result={"ok": True})
    denied = await broker.before_call("gitea_release_lease", {"issue_number": 8, "reason": "done"})
    assert not denied.allowed

    (run,) = await (await client.get("/dashboard/api/grants", headers=AUTH)).json()
    assert run["run"]["run_id"] == grant.run_id and run["grant_integrity"] == "intact"
    assert [c["tool"] for c in run["calls"]] == [c["tool"] for c in TEMPLATE["calls"]]
    kinds = [d["kind"] for d in run["decisions"]]
    stored = [d.kind for d in await store.decisions(grant.run_id)]
    assert kinds == stored and len(set(kinds)) >= 2, kinds
    html = await (await client.get("/dashboard", headers=AUTH)).text()
    assert grant.run_id in html and all(kind in html for kind in kinds)
    issue = await (await client.get("/dashboard/api/issues/8", headers=AUTH)).json()
    assert "admission" in {item["kind"] for item in issue["timeline"]}
    for page in (html, json.dumps(run), json.dumps(issue)):
        assert run_token not in page and token_digest(run_token) not in page


def test_issue_links_are_bare_with_one_repository_and_name_it_with_several() -> None:
    """Found by the browser test: with one repository the issue link carried a dash (the empty-value placeholder)
    after the number, ``/dashboard/issues/1-``, a page that does not exist."""
    assert issue_link(1) == '<a href="/dashboard/issues/1">#1</a>'
    token = _LINK_QUERY.set("?repository=acme%2Fgadgets")
    try:
        assert issue_link(7) == '<a href="/dashboard/issues/7?repository=acme%2Fgadgets">#7</a>'
    finally:
        _LINK_QUERY.reset(token)


async def test_the_board_shows_health_refused_requests_and_collapses_repeats(tmp_path: Path, start: Started) -> None:
    """Issue 34, item 1: the board's health is /readyz's document (red with the reason: no Gitea token here); a bad
    signature and a body that is not JSON appear with their reason, kept in memory and bounded, nothing of their
    bodies; a ready issue is a card in the Ready column with its title."""
    service, client = await _client(tmp_path, start)
    await _seed(service, client)
    body = b'{"secret-body": "never kept"}'
    bad = {**webhook_headers(body), "X-Gitea-Signature": "0" * 64}
    assert (await client.post("/webhook", data=body, headers=bad)).status == 401
    broken = b"{not json"
    assert (await client.post("/webhook", data=broken, headers=webhook_headers(broken))).status == 400
    doc = await (await client.get("/dashboard/api/overview", headers=AUTH)).json()
    readyz = await (await client.get("/readyz")).json()
    health = doc["health"]
    assert health["ok"] is False and readyz["checks"]["gitea"]["ok"] is False
    assert any(r.startswith("Gitea: no gitea.token") for r in health["reasons"]), health
    refused = doc["attention"]["refused_deliveries"]
    assert [(c["status"], c["error"]) for c in refused["counts"]] == [(400, "malformed_json"), (401, "bad_signature")]
    assert [r["status"] for r in refused["recent"]] == [400, 401]
    assert "never kept" not in json.dumps(doc)
    ready = {c["key"]: c for c in doc["flow"]["columns"]}["ready"]["cards"]
    assert [(c["issue_number"], c["title"]) for c in ready] == [(7, HOSTILE)]
    html = await (await client.get("/dashboard", headers=AUTH)).text()
    assert "Not healthy: Gitea: no gitea.token" in html and "401 bad_signature" in html
    assert html.index('id="health"') < html.index('id="needs"') < html.index('id="board"') < html.index(
        'id="allocator"')


def test_refused_deliveries_are_bounded() -> None:
    from bot.intake import RefusedDeliveries

    refused = RefusedDeliveries(keep=5)
    for n in range(1000):
        refused.record(401, "bad_signature", "x" * 1000, f"10.0.0.{n % 250}")
    doc = refused.to_dict()
    assert len(doc["recent"]) == 5 and doc["counts"] == [{"status": 401, "error": "bad_signature", "count": 1000}]
    assert all(len(r["message"]) <= 300 for r in doc["recent"])


def test_identical_decisions_collapse_into_one_row_with_a_count() -> None:
    from bot.dashboard.board import collapse

    same = {"source": "auto", "trigger": "catch_up", "leased": [], "waiting": [2], "skipped": []}
    rows = [{**same, "at": f"2026-01-01T00:{59 - m:02d}:00.000000Z"} for m in range(19)]
    other = {"source": "auto", "trigger": "label", "leased": [1], "waiting": [], "skipped": [],
             "at": "2025-12-31T23:00:00.000000Z"}
    folded = collapse([*rows, other])
    assert [(d["trigger"], d["count"]) for d in folded] == [("catch_up", 19), ("label", 1)]
    assert folded[0]["at"] == rows[0]["at"] and folded[0]["first_at"] == rows[-1]["at"]
