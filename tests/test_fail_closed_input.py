"""Fail closed at intake and in parsing: hostile input is refused alone, typed, with bounded work."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.core.canonical import HEADING_TEXT, MAX_BLOCKS, MAX_COMMENT_CHARS, parse_comment
from bot.core.intake import Delivery, admit
from tests.serve_support import serve_process
from tests.support import PROBE_S, SECRET, Started, payload, raw_post, signed_headers, webhook_headers

pytestmark = [pytest.mark.process]

# --- a bad row fails alone --------------------------------------------------------------------------------------------


async def test_a_bad_header_beside_valid_deliveries_fails_only_itself(tmp_path: Path) -> None:
    """A non-UTF-8 X-Gitea-Event beside valid deliveries used to fail the whole group commit."""
    async with serve_process(tmp_path, serve=True) as proc:
        bodies = {f"ok-{i}": payload(number=i + 1) for i in range(120)}
        bad_body = payload(number=999)
        surrogate = json.loads(payload(number=998))
        surrogate_body = json.dumps(surrogate, indent=2).replace('"opened"', '"open\\ud800ed"').encode()

        async def good(delivery: str, body: bytes) -> tuple[int, dict[str, Any]]:
            return await raw_post(proc.port, signed_headers(body, delivery=delivery), body)

        tasks = [good(d, b) for d, b in bodies.items()]
        tasks.insert(40, raw_post(proc.port, signed_headers(bad_body, event=b"issu\xff\xfees", delivery="bad-h"),
                                  bad_body))
        tasks.insert(80, raw_post(proc.port, signed_headers(surrogate_body, delivery="bad-s"), surrogate_body))
        results = await asyncio.gather(*tasks)
        bad_s, bad_h = results.pop(80), results.pop(40)
        assert bad_h[0] == 400 and bad_h[1]["error"] == "bad_header"
        assert bad_s[0] == 400 and bad_s[1]["error"] == "malformed_json"
        assert [r[0] for r in results] == [202] * len(bodies)
        assert sorted(r[1]["delivery"] for r in results) == sorted(bodies)  # each 202 names its own request
        with sqlite3.connect(proc.db) as conn:
            stored = {row[0] for row in conn.execute("SELECT delivery_id FROM deliveries")}
        assert stored == set(bodies)


async def test_the_writer_stores_each_row_alone_when_the_batch_fails(start: Started) -> None:
    """A row that admission let through but the database refuses fails alone (not its whole batch)."""
    service, _client = await start()
    admitted = [admit(webhook_headers(b, delivery=f"w-{i}"), b, secrets=[SECRET.encode()], max_body_bytes=10**6)
                for i, b in enumerate(payload(number=n + 1) for n in range(5))]
    good = [d for d in admitted if isinstance(d, Delivery)]
    assert len(good) == len(admitted)
    first = good[0]
    assert isinstance(first, Delivery)
    unstorable = Delivery(  # a lone surrogate cannot be bound as UTF-8 text: the batch's INSERT raises
        delivery_id="w-bad", event="iss\udcffues", event_type=None, action=None, sender_login=None,
        body=b"{}", body_sha256="0" * 64, headers={}, payload={},
    )
    futures = [asyncio.ensure_future(service.writer.submit(d, False)) for d in [*good[:2], unstorable, *good[2:]]]
    done = await asyncio.gather(*futures, return_exceptions=True)
    assert isinstance(done[2], Exception)
    assert [getattr(r, "outcome", None) for i, r in enumerate(done) if i != 2] == ["queued"] * 5


async def test_each_acknowledgement_belongs_to_its_own_request(start: Started) -> None:
    """A duplicate by body must not take the row of a later delivery that reuses its id (one batch)."""
    service, _client = await start()
    body_a, body_b = payload(number=1), payload(number=2)
    first = admit(webhook_headers(body_a, delivery="X"), body_a, secrets=[SECRET.encode()], max_body_bytes=10**6)
    same_body = admit(webhook_headers(body_a, delivery="Y"), body_a, secrets=[SECRET.encode()], max_body_bytes=10**6)
    same_id = admit(webhook_headers(body_b, delivery="Y"), body_b, secrets=[SECRET.encode()], max_body_bytes=10**6)
    assert isinstance(first, Delivery) and isinstance(same_body, Delivery) and isinstance(same_id, Delivery)
    results = await service.store.insert_batch([(first, False), (same_body, False), (same_id, False)])
    assert [r.outcome for r in results] == ["queued", "duplicate", "queued"]
    row = await service.store.get("Y")
    assert row is not None and results[2].pk == row.pk and row.body == body_b


# --- linear parsing, no freeze ----------------------------------------------------------------------------------------


def _hostile_heading(size: int) -> str:
    return "# a" + " " * size + "x"


def _regex_calls(text: str) -> Counter[tuple[str, str]]:
    """Every regular expression ``parse_comment(text)`` applies, as (pattern, method), counted with sys.setprofile."""
    seen: Counter[tuple[str, str]] = Counter()

    def record(frame: object, event: str, arg: object) -> None:
        pattern = getattr(arg, "__self__", None)
        if event == "c_call" and isinstance(pattern, re.Pattern):
            seen[(pattern.pattern, getattr(arg, "__name__", "?"))] += 1

    sys.setprofile(record)
    try:
        parse_comment(text)
    finally:
        sys.setprofile(None)
    return seen


def test_the_heading_check_applies_only_anchored_patterns_to_the_line() -> None:
    """The ATX closing-sequence regex ``(?:^|[ \t]+)#+$`` was quadratic (48 KB held the loop ~18 s): a search tries
    every start position and backtracks over every run of blanks. Counted, not timed: on a 64 KB hostile heading
    every pattern applied is a ``match``/``fullmatch`` anchored at the line's start, each once, and the same
    patterns run, as often, whatever the line's length (the closing run is stripped with string methods)."""
    small, large = _regex_calls(_hostile_heading(4_000)), _regex_calls(_hostile_heading(64_000))
    assert small == large
    assert large and all(method in {"match", "fullmatch"} for _, method in large), large
    assert all(count == 1 for count in large.values()), large


async def test_a_hostile_comment_does_not_freeze_a_real_serve(tmp_path: Path) -> None:
    """Against a real `foreman serve`: a 48 KB hostile comment; /healthz answers throughout."""
    async with serve_process(tmp_path, serve=True) as proc:
        doc = json.loads(payload())
        doc.update(action="created", comment={"id": 5, "body": _hostile_heading(48_000), "user": {"login": "reader"},
                                                 "created_at": "2026-12-01T10:00:00Z",
                                                 "updated_at": "2026-12-01T10:00:00Z"})
        body = json.dumps(doc, indent=2).encode()
        async with aiohttp.ClientSession() as session:
            headers = webhook_headers(body, event="issue_comment", delivery="hostile-1")
            async with session.post(f"{proc.url}/webhook", data=body, headers=headers) as resp:
                assert resp.status == 202
            answered = 0
            while proc.status("hostile-1") is None or proc.status("hostile-1")[0] != "done":  # type: ignore[index]
                async with session.get(f"{proc.url}/healthz", timeout=aiohttp.ClientTimeout(total=PROBE_S)) as resp:
                    assert resp.status == 200
                answered += 1
                await asyncio.sleep(0.01)
            async with session.get(f"{proc.url}/metrics") as resp:
                text = await resp.text()
        # No time threshold here (the parse's work is bounded by the test above); the loop's lag is printed.
        lag = re.search(r"^foreman_event_loop_lag_max_seconds (\S+)", text, re.M)
        assert lag is not None
        print(f"\nhostile comment processed; /healthz answered {answered} times; loop lag max {lag.group(1)} s")


# --- typed refusals, no metric series from unverified input -----------------------------------------------------------


async def test_unsigned_requests_never_mint_metric_series(start: Started) -> None:
    """Labels came from unsigned headers (3,000 requests, 3,000 series; `\\xff` broke /metrics)."""
    _service, client = await start()
    before = (await (await client.get("/metrics")).read()).count(b"\n")
    for i in range(300):
        body = b"{}"
        await client.post("/webhook", data=body, headers={"Content-Type": "application/json",
                                                           "X-Gitea-Event": f"evil-{i}", "X-Gitea-Delivery": str(i),
                                                           "X-Gitea-Signature": "00"})
    status, _ = await raw_post(client.port or 0, [(b"Content-Type", b"application/json"), (b"X-Gitea-Event", b"\xff"),
                                                  (b"X-Gitea-Delivery", b"1"), (b"X-Gitea-Signature", b"00")], b"{}")
    assert status == 401
    resp = await client.get("/metrics")
    assert resp.status == 200
    text = await resp.text()
    assert "evil-" not in text
    assert text.count("\n") - before <= 4  # one new series (unverified, rejected_401) and its help lines at most


async def test_a_signed_unknown_event_is_counted_as_other(start: Started) -> None:
    _service, client = await start()
    body = payload()
    await client.post("/webhook", data=body, headers=webhook_headers(body, event="made_up_event", delivery="u-1"))
    text = await (await client.get("/metrics")).text()
    assert 'event="made_up_event"' not in text and 'event="other",outcome="queued"' in text


def _signed(body: bytes, **extra: str) -> dict[str, str]:
    return {**webhook_headers(body, delivery=f"t-{hash(body)}"), **extra}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"[" * 1000 + b"]" * 1000, "malformed_json"),
        (b'{"a":' * 1000 + b"1" + b"}" * 1000, "malformed_json"),
        (b'{"n": ' + b"7" * 5000 + b"}", "malformed_json"),
        (b'{"n": NaN}', "malformed_json"),
        (b'{"n": Infinity}', "malformed_json"),
        (b'{"n": -Infinity}', "malformed_json"),
        (b'{"s": "\\udc00"}', "malformed_json"),
        (b'{"\\ud800": 1}', "malformed_json"),
        (b'\xff{"a": 1}', "malformed_json"),
    ],
    ids=["deep-array", "deep-object", "5000-digits", "nan", "infinity", "-infinity", "lone-surrogate",
         "surrogate-key", "not-utf8"],
)
async def test_hostile_json_gets_a_typed_400(start: Started, body: bytes, error: str) -> None:
    """Deep nesting, huge integers, NaN/Infinity gave 500s or were accepted."""
    service, client = await start()
    resp = await client.post("/webhook", data=body, headers=_signed(body))
    assert resp.status == 400
    doc = await resp.json()
    assert doc["error"] == error and doc["message"]
    assert await service.store.list() == []


async def test_a_non_ascii_signature_header_is_a_401_not_a_500(start: Started) -> None:
    _service, client = await start()
    body = payload()
    headers = [(b"Content-Type", b"application/json"), (b"X-Gitea-Event", b"issues"),
               (b"X-Gitea-Delivery", b"sig-1"), (b"X-Gitea-Signature", "é".encode() * 32)]
    status, doc = await raw_post(client.port or 0, headers, body)
    assert status == 401 and doc["error"] == "bad_signature"
    headers[-1] = (b"X-Hub-Signature-256", b"sha256=\xff\xfe")
    status, doc = await raw_post(client.port or 0, headers, body)
    assert status == 401 and doc["error"] == "bad_signature"


async def test_a_content_encoding_on_a_plain_body_is_refused_typed(start: Started) -> None:
    _service, client = await start()
    body = payload()
    for coding in ("gzip", "deflate", "br"):
        resp = await client.post("/webhook", data=body, headers=_signed(body, **{"Content-Encoding": coding}))
        assert resp.status == 415, coding
        assert (await resp.json())["error"] == "unsupported_media_type"
    resp = await client.post("/webhook", data=body, headers=_signed(body, **{"Content-Encoding": "identity"}))
    assert resp.status == 202


def test_a_comment_past_the_length_bound_is_refused_unread() -> None:
    """Untrusted text is parsed only as far as needed; a huge comment is not read at all."""
    block = f"## {HEADING_TEXT}\nSTATE: ready\n"
    result = parse_comment("x" * MAX_COMMENT_CHARS + "\n" + block)
    assert result.block_count == 0 and result.current is None
    assert [e.code for e in result.errors] == ["comment_too_long"]
    assert parse_comment("x" * (MAX_COMMENT_CHARS - len(block) - 1) + "\n" + block).block_count == 1


def test_a_comment_with_too_many_blocks_is_refused() -> None:
    """Each block costs ~10 us in errors alone: the count of blocks is bounded too, or 64 KB of headings hold 30 ms."""
    heading = f"## {HEADING_TEXT}\n"
    assert parse_comment(heading * MAX_BLOCKS).block_count == MAX_BLOCKS
    result = parse_comment(heading * (MAX_BLOCKS + 1))
    assert result.block_count == 0 and [e.code for e in result.errors] == ["too_many_blocks"]


async def test_readyz_is_503_naming_why_when_the_database_cannot_take_a_write(start: Started) -> None:
    """/readyz called a read-only or full database writable."""
    service, client = await start()
    assert (await client.get("/readyz")).status == 200
    service.settings.database.path.chmod(0o400)
    try:
        resp = await client.get("/readyz")
        doc = await resp.json()
        assert resp.status == 503 and doc["checks"]["database"]["reason"] == "read_only", doc
    finally:
        service.settings.database.path.chmod(0o600)
    await service.db.reader.execute("PRAGMA query_only = ON")
    resp = await client.get("/readyz")
    doc = await resp.json()
    assert resp.status == 503 and doc["checks"]["database"]["ok"] is False, doc
    await service.db.reader.execute("PRAGMA query_only = OFF")
    assert (await client.get("/readyz")).status == 200


async def test_a_body_with_too_many_values_is_refused_before_parsing(start: Started) -> None:
    """Parsing costs per value: 5 MB of `[],` held the loop ~0.5 s. Gitea sends a few hundred."""
    service, client = await start()
    for body in (b"[" + b",".join([b"[]"] * 60_000) + b"]", b'{"a": [' + b",".join([b"1"] * 150_000) + b"]}"):
        resp = await client.post("/webhook", data=body, headers=_signed(body))
        assert resp.status == 413 and (await resp.json())["error"] == "payload_too_complex"
    assert await service.store.list() == []


async def test_every_kept_header_must_be_printable_utf8(start: Started) -> None:
    """Not only X-Gitea-Event: any header stored with the delivery (X-Gitea-Event-Type, User-Agent)."""
    _service, client = await start()
    body = payload()
    for name in (b"X-Gitea-Event-Type", b"User-Agent", b"X-Gitea-Hook-Installation-Target-Type"):
        headers = [*signed_headers(body, delivery=f"hdr-{name.decode()}"), (name, b"x\xff\xfey")]
        status, doc = await raw_post(client.port or 0, headers, body)
        assert status == 400 and doc["error"] == "bad_header" and name.decode() in doc["message"], (name, doc)


def test_admission_itself_refuses_a_content_encoding() -> None:
    """The pure admission refuses it too (the HTTP edge checks first, before reading the body)."""
    body = payload()
    verdict = admit(
        {**webhook_headers(body), "Content-Encoding": "gzip"}, body, secrets=[SECRET.encode()], max_body_bytes=10**6
    )
    assert not isinstance(verdict, Delivery) and verdict.status == 415


def test_an_atx_closing_run_needs_a_blank_before_it() -> None:
    """CommonMark: `## Canonical Issue State#` keeps its `#` (not a heading here); ` ##` closes the heading."""
    assert parse_comment(f"## {HEADING_TEXT}#\nSTATE: ready").block_count == 0
    assert parse_comment(f"## {HEADING_TEXT} ##\nSTATE: ready").block_count == 1
    assert parse_comment(f"## {HEADING_TEXT}\t#\nSTATE: ready").block_count == 1


def test_the_comment_bound_is_64_kib() -> None:
    """Pinned by value: the bound is part of the contract in docs/canonical-state.md."""
    block = f"## {HEADING_TEXT}\nSTATE: ready\n"
    assert parse_comment(block + "x" * (65_536 - len(block))).block_count == 1
    assert parse_comment(block + "x" * (65_537 - len(block))).block_count == 0


@pytest.mark.parametrize(("argument", "value"), [("owner", "author-1\n"), ("owner", "author-1\r")])
def test_a_trailing_line_break_is_not_part_of_a_login(argument: str, value: str) -> None:
    """`$` in a Python pattern also matches before a final newline; the schema must not."""
    from bot.core.verbs import VERBS

    _, problems = VERBS["allocate_next_work"].check_arguments({argument: value})
    assert [p["argument"] for p in problems] == [argument]


@pytest.mark.parametrize("reason", ["done\n", "done\r\n", "done\n\n"])
def test_a_trailing_line_break_is_not_part_of_one_line_of_text(reason: str) -> None:
    from bot.core.verbs import VERBS

    _, problems = VERBS["release_lease"].check_arguments({"issue_number": 1, "reason": reason})
    assert [p["argument"] for p in problems] == ["reason"]


def test_a_state_with_an_unknown_key_is_refused() -> None:
    from bot.core.verbs import VERBS
    from tests.test_verbs_table import VALID_STATE

    verb = VERBS["post_issue_state"]
    base = {"issue_number": 1, "state": dict(VALID_STATE)}
    assert verb.check_arguments(base)[1] == []
    _, problems = verb.check_arguments({**base, "state": {**VALID_STATE, "stat": "ready"}})
    assert [p["argument"] for p in problems] == ["state"]
