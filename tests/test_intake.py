"""Webhook intake over real loopback HTTP: signatures, headers, limits, storage before ack, de-duplication."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.app import Service
from tests.conftest import SHARED
from tests.support import (
    HANG_S,
    SECRET,
    Started,
    make_settings,
    payload,
    recording_router,
    sign,
    wait_status,
    webhook_headers,
)

PAYLOADS = SHARED / "gitea" / "payloads"
# HMAC test vectors published with go-playground/webhooks (see shared/gitea/payloads/README.md).
GO_PLAYGROUND_SECRET = "IsWishesWereHorsesWedAllBeEatingSteak!"
GO_PLAYGROUND_SIGNATURES = {
    "issues-opened--go-playground.json": "98c44fd0ae42ca4208eac6f81e59b436837740abc8693bf828366b32d33b1cbc",
    "issues-assigned--go-playground.json": "7d2adaf2fb3dc3769294c737ff48da003b7c3660b4f917b85c2c25dabd34a13c",
    "issues-label_updated--go-playground.json": "3611415860ed5904c87dd589a7c5fa7e87d2a72b0b2a92ea149ba9691ba8c785",
    "issue_comment-created--go-playground.json": "690180a8c853460cba88f9b09911a531d449e9f63ed6b1ff0a0def3b972ca744",
    "issue_comment-created-on-pr--go-playground.json": (
        "8b38bf221adbaef2ce01cfa810c6d9cb977414fec306895973aea61e10e8d5a8"
    ),
    "pull_request-opened--go-playground.json": "65c18a212efc7bde0f336acaec87f596fe20e80b2a0e7e51a790dd38393ff771",
    "pull_request-label_updated--go-playground.json": (
        "c52fa035b8d9ac4d94449349b16bac5892bc59faa72be19ff39f33b6bc24315a"
    ),
    "push--go-playground.json": "60fe446c74fa0cb9474f98cc557db79e10c7aaf22cf324ad65239600b9e4d915",
}
# Coarse event header per payload file, as a v1.26 delivery would carry it (payloads README).
PAYLOAD_EVENTS = {
    "issues": ("issues", "issues"),
    "issue_comment": ("issue_comment", "issue_comment"),
    "pull_request": ("pull_request", "pull_request"),
    "push": ("push", "push"),
}

async def _post(client: TestClient[Any, Any], body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    resp = await client.post("/webhook", data=body, headers=headers)
    return resp.status, await resp.json()


async def _stored(service: Service) -> list[Any]:
    return await service.store.list(limit=1000)


async def test_gitea_signature_is_accepted_and_stored_byte_for_byte(start: Started) -> None:
    """X-Gitea-Signature (hex, no prefix) verifies; the raw body is stored before the 202."""
    service, client = await start()
    body = payload()
    headers = webhook_headers(body, delivery="d-1")
    status, doc = await _post(client, body, headers)
    assert (status, doc) == (202, {"delivery": "d-1", "status": "queued"})
    [row] = await _stored(service)
    assert row.body == body
    assert (row.event, row.action, row.sender_login) == ("issues", "opened", "alice")


async def test_answers_are_json_with_the_charset_json_response_gives() -> None:
    """The door's answers are encoded by orjson now: the same Content-Type and the same JSON as web.json_response."""
    from aiohttp import web

    from bot.intake import _json_answer

    doc = {"delivery": "d-\u00e9\"1", "status": "queued"}
    answer, reference = _json_answer(doc, 202), web.json_response(doc, status=202)
    assert (answer.status, answer.content_type, answer.charset) == (202, reference.content_type, reference.charset)
    assert answer.headers["Content-Type"] == reference.headers["Content-Type"] == "application/json; charset=utf-8"
    assert isinstance(answer.body, bytes) and json.loads(answer.body) == doc


async def test_hub_signature_256_and_github_headers_are_accepted(start: Started) -> None:
    """X-Hub-Signature-256 (sha256=) and the X-GitHub-* header copies work alone."""
    service, client = await start()
    body = payload()
    status, doc = await _post(client, body, webhook_headers(body, style="github", delivery="gh-1"))
    assert (status, doc["status"]) == (202, "queued")
    assert (await service.store.get("gh-1")) is not None


async def test_any_of_several_secrets_verifies_for_rotation(tmp_path: Path, start: Started) -> None:
    """Several configured secrets allow rotation; each one verifies."""
    other = "the-new-secret-after-rotation"
    _, client = await start(make_settings(tmp_path, webhook={"secrets": [SECRET, other]}))
    for secret in (SECRET, other):
        body = payload(number=len(secret))
        status, _ = await _post(client, body, webhook_headers(body, secret=secret))
        assert status == 202


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda h, b: h.pop("X-Gitea-Signature"), id="missing"),
        pytest.param(lambda h, b: h.__setitem__("X-Gitea-Signature", sign(b, "wrong-secret-xxxxxxxx")), id="wrong"),
        pytest.param(lambda h, b: h.__setitem__("X-Gitea-Signature", ""), id="empty-secret-gitea"),
        pytest.param(
            lambda h, b: (h.pop("X-Gitea-Signature"), h.__setitem__("X-Hub-Signature-256", "sha256=")),
            id="empty-secret-hub",
        ),
        pytest.param(
            lambda h, b: (h.pop("X-Gitea-Signature"), h.__setitem__("X-Hub-Signature-256", sign(b))),
            id="hub-without-prefix",
        ),
        pytest.param(lambda h, b: h.__setitem__("X-Gitea-Signature", sign(b)[:-2]), id="truncated"),
    ],
)
async def test_bad_or_missing_signature_is_401_and_nothing_is_stored(start: Started, mutate: Any) -> None:
    """Bad or missing signature answers 401 with a JSON error; nothing is stored."""
    service, client = await start()
    body = payload()
    headers = webhook_headers(body)
    mutate(headers, body)
    status, doc = await _post(client, body, headers)
    assert status == 401
    assert doc["error"] == "bad_signature" and "secret" in doc["message"]
    assert await _stored(service) == []


async def test_reserialized_body_does_not_verify(start: Started) -> None:
    """FACTS 1: the HMAC covers the raw bytes; the same JSON re-serialised must not verify."""
    service, client = await start()
    body = payload()
    headers = webhook_headers(body)
    compact = json.dumps(json.loads(body)).encode()
    assert compact != body
    status, _ = await _post(client, compact, headers)
    assert status == 401
    assert await _stored(service) == []


@pytest.mark.parametrize("missing", ["X-Gitea-Event", "X-Gitea-Delivery"])
async def test_missing_event_or_delivery_header_is_400(start: Started, missing: str) -> None:
    """A missing event or delivery header (and no X-GitHub-* copy) answers 400 naming it."""
    service, client = await start()
    body = payload()
    headers = webhook_headers(body)
    headers.pop(missing)
    status, doc = await _post(client, body, headers)
    assert status == 400
    assert doc["error"] == "missing_header" and missing in doc["message"]
    assert await _stored(service) == []


@pytest.mark.parametrize("body", [b'{"action": "opened",', b"[1, 2, 3]", b"\xff\xfe not utf-8"])
async def test_malformed_json_is_400(start: Started, body: bytes) -> None:
    """A correctly signed body that is not a JSON object answers 400; nothing is stored."""
    service, client = await start()
    status, doc = await _post(client, body, webhook_headers(body))
    assert status == 400 and doc["error"] == "malformed_json"
    assert await _stored(service) == []


def _numbered(number: Any, *, where: tuple[str, ...] = ("number", "issue.number"), comment_id: Any = 5) -> bytes:
    doc = json.loads(payload("created"))
    for path in where:
        if path == "number":
            doc["number"] = number
        elif path == "issue.number":
            doc["issue"]["number"] = number
        elif path == "comment.id":
            doc["comment"] = {"id": number, "body": "/heartbeat", "user": {"login": "alice"}}
        elif path == "pull_request.number":
            doc["pull_request"] = {"id": 3, "number": number}
        else:  # an integer anywhere else in the body
            doc["issue"]["milestone"] = {"id": number}
    if "comment.id" not in where:
        doc["comment"] = {"id": comment_id, "body": "/heartbeat", "user": {"login": "alice"}}
    return json.dumps(doc).encode()


@pytest.mark.parametrize(("body", "field"), [
    (_numbered(2**70), "integer outside 64 bits"),
    (_numbered(2**63), "integer outside 64 bits"),
    (_numbered(-(2**63) - 1, where=("milestone",)), "integer outside 64 bits"),
    (_numbered(0), "number is 0"),
    (_numbered(-3, where=("issue.number",)), "issue.number is -3"),
    (_numbered("7", where=("number",)), "number is str"),
    (_numbered(True, where=("issue.number",)), "issue.number is True"),
    (_numbered(None, where=("pull_request.number",)), "pull_request.number is None"),
    (_numbered(0, where=("comment.id",)), "comment.id is 0"),
    (_numbered(1.5, where=("comment.id",)), "comment.id is 1.5"),
])
async def test_a_signed_delivery_with_a_number_no_database_holds_is_refused_typed_at_admission(
    start: Started, body: bytes, field: str
) -> None:
    """Issue 29 item 6: an issue number of 2^70 (any integer outside 64 bits, anywhere in the body) raised
    OverflowError in the handlers at each of five attempts and parked the delivery `failed`; an issue or pull
    request number or comment id that is zero, negative or not an integer was run through the handlers as if it
    named an issue. Each is a 400 `invalid_number` naming the field, before anything is stored."""
    service, client = await start()
    status, doc = await _post(client, body, webhook_headers(body, event="issue_comment"))
    assert status == 400 and doc["error"] == "invalid_number" and field in doc["message"], doc
    assert await _stored(service) == []


async def test_the_largest_numbers_gitea_can_send_are_admitted(start: Started) -> None:
    """The bounds are Gitea's (int64): 2^63-1 as an issue number and -2^63 elsewhere are admitted."""
    service, client = await start()
    for body in (_numbered(2**63 - 1), _numbered(-(2**63), where=("milestone",))):
        status, doc = await _post(client, body, webhook_headers(body, event="issue_comment"))
        assert status == 202, doc
        await wait_status(service, doc["delivery"], "done")


async def test_form_content_type_is_415(start: Started) -> None:
    """Gitea 'form' hooks sign the JSON, not the form body: refuse with 415 and say how to fix."""
    service, client = await start()
    body = b"payload=" + payload()
    headers = webhook_headers(body)
    headers["Content-Type"] = "application/x-www-form-urlencoded"
    status, doc = await _post(client, body, headers)
    assert status == 415 and "application/json" in doc["message"]
    assert await _stored(service) == []


async def test_body_over_the_limit_is_413_with_and_without_content_length(tmp_path: Path, start: Started) -> None:
    """A body over webhook.max_body_bytes answers 413, declared or streamed (chunked)."""
    service, client = await start(make_settings(tmp_path, webhook={"max_body_bytes": 1000}))
    body = payload(filler="x" * 2000)
    status, doc = await _post(client, body, webhook_headers(body))
    assert status == 413 and doc["error"] == "payload_too_large"

    async def chunks() -> AsyncIterator[bytes]:
        for start_at in range(0, len(body), 100):
            yield body[start_at : start_at + 100]

    resp = await client.post("/webhook", data=chunks(), headers=webhook_headers(body))
    assert resp.status == 413
    assert await _stored(service) == []
    small = payload()
    assert len(small) < 1000
    status, _ = await _post(client, small, webhook_headers(small))
    assert status == 202


async def test_same_delivery_id_twice_is_a_duplicate(start: Started) -> None:
    """De-duplication on the delivery id: the second answer is 200 duplicate, one row stored."""
    service, client = await start()
    body = payload()
    headers = webhook_headers(body, delivery="same-id")
    assert (await _post(client, body, headers))[0] == 202
    status, doc = await _post(client, body, headers)
    assert (status, doc["status"]) == (200, "duplicate")
    assert len(await _stored(service)) == 1


async def test_same_body_under_a_new_delivery_id_is_a_duplicate(start: Started) -> None:
    """FACTS 4: Gitea's manual Replay resends the same body under a NEW uuid: duplicate."""
    service, client = await start()
    body = payload()
    assert (await _post(client, body, webhook_headers(body, delivery="first")))[0] == 202
    status, doc = await _post(client, body, webhook_headers(body, delivery="replayed"))
    assert (status, doc["status"]) == (200, "duplicate")
    rows = await _stored(service)
    assert [r.delivery_id for r in rows] == ["first"]


async def test_concurrent_identical_deliveries_store_exactly_one(start: Started) -> None:
    """Racing copies of one delivery (Gitea sends concurrently) end with one row, one 202."""

    service, client = await start()
    body = payload()
    headers = webhook_headers(body, delivery="racer")
    results = await asyncio.gather(*(_post(client, body, headers) for _ in range(12)))
    assert sorted(status for status, _ in results) == [200] * 11 + [202]
    assert len(await _stored(service)) == 1


async def test_events_sent_by_the_bot_itself_are_recorded_as_ignored_self(start: Started) -> None:
    """FACTS 3: the bot's own changes come back as webhooks; recorded as ignored_self, not run."""
    ran: list[str] = []
    service, client = await start(router=recording_router(ran, lambda event, ctx: event.delivery_id))
    body = payload(sender="Foreman-Bot")
    status, doc = await _post(client, body, webhook_headers(body, delivery="mine"))
    assert (status, doc["status"]) == (202, "ignored_self")
    other = payload(sender="alice", number=2)
    await _post(client, other, webhook_headers(other, delivery="theirs"))
    await wait_status(service, "theirs", "done")
    row = await service.store.get("mine")
    assert row is not None and row.status == "ignored_self"
    assert ran == ["theirs"]


@pytest.mark.needs_shared
@pytest.mark.parametrize("name", sorted(p.name for p in PAYLOADS.glob("*.json")) or ["<none found>"])
async def test_every_real_payload_sample_is_accepted(tmp_path: Path, start: Started, name: str) -> None:
    """Guide: the service must accept every payload in shared/gitea/payloads, bytes unchanged.

    The go-playground files are checked against their published signatures (test vectors)."""
    path = PAYLOADS / name
    assert path.is_file(), f"payload sample missing: {path}"
    body = path.read_bytes()
    # Served: the sample's own repository (a delivery for any other one is ignored before the handlers).
    owner, repo = json.loads(body)["repository"]["full_name"].split("/")
    settings = make_settings(
        tmp_path, webhook={"secrets": [GO_PLAYGROUND_SECRET]}, repository={"owner": owner, "name": repo}
    )
    service, client = await start(settings)
    event = name.split("-", 1)[0]
    headers = webhook_headers(body, event=PAYLOAD_EVENTS[event][0], secret=GO_PLAYGROUND_SECRET)
    if name in GO_PLAYGROUND_SIGNATURES:
        assert headers["X-Gitea-Signature"] == GO_PLAYGROUND_SIGNATURES[name]
    status, doc = await _post(client, body, headers)
    assert (status, doc["status"]) == (202, "queued")
    await wait_status(service, doc["delivery"], "done")
    [row] = await _stored(service)
    assert row.body == body


async def test_healthz_readyz_and_metrics_without_gitea(start: Started) -> None:
    """With no Gitea configured the service runs and /readyz says so; metrics count outcomes."""
    service, client = await start()
    assert (await client.get("/healthz")).status == 200
    resp = await client.get("/readyz")
    doc = await resp.json()
    assert resp.status == 200 and doc["ready"] is True
    assert doc["checks"]["gitea"]["ok"] is False and "token" in doc["checks"]["gitea"]["detail"]
    body = payload()
    await _post(client, body, webhook_headers(body, delivery="m-1"))
    await wait_status(service, "m-1", "done")
    await _post(client, body, webhook_headers(body))
    await _post(client, body, {**webhook_headers(body), "X-Gitea-Signature": "00"})
    text = await (await client.get("/metrics")).text()
    assert 'foreman_deliveries_total{event="issues",outcome="queued"} 1.0' in text
    assert 'foreman_deliveries_total{event="issues",outcome="duplicate"} 1.0' in text
    # A refused request is unverified: its event header never becomes a label.
    assert 'foreman_deliveries_total{event="unverified",outcome="rejected_401"} 1.0' in text
    assert "foreman_inbox_depth" in text and "foreman_processing_seconds_bucket" in text


async def test_readyz_is_503_when_the_database_cannot_be_written(tmp_path: Path, start: Started) -> None:
    """DESIGN 3: /readyz is 503 when the database is not writable (another writer holds the lock)."""
    import sqlite3

    settings = make_settings(tmp_path, database={"busy_timeout_ms": 50})
    _, client = await start(settings)
    # The blocker runs in a thread: a blocking sqlite call on the event loop would stall the service's
    # own open transaction and deadlock the test.
    blocker = sqlite3.connect(settings.database.path, isolation_level=None, timeout=HANG_S, check_same_thread=False)
    try:
        await asyncio.to_thread(blocker.execute, "BEGIN EXCLUSIVE")
        assert blocker.in_transaction
        resp = await client.get("/readyz")
        doc = await resp.json()
        assert resp.status == 503 and doc["checks"]["database"]["ok"] is False
    finally:
        if blocker.in_transaction:
            await asyncio.to_thread(blocker.execute, "ROLLBACK")
        blocker.close()
    assert (await client.get("/readyz")).status == 200
