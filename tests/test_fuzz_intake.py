"""Fuzz campaigns over webhook intake and the Canonical Issue State parser: fixed seeds, bounded time."""

from __future__ import annotations

import asyncio
import functools
import gc
import hashlib
import json
import random
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from multidict import CIMultiDict

from bot.core.canonical import HEADING_TEXT, parse_comment
from bot.core.intake import KNOWN_EVENTS, Delivery, Rejection, admit
from tests.support import SECRET, payload, raw_post, sign
from tests.test_process import ServeProcess

SEED = 20261201
INTAKE_INPUTS = 10_000
PARSER_INPUTS = 10_000
MAX_MS = 50.0
DOCUMENTED = {200, 202, 400, 401, 413, 415}
LONE = "\ud800"


def _best_ms(fn: Any, *args: Any, repeat: int = 3) -> float:
    """Best of three: the 2 cores are shared, so an outlier is timed again before it counts."""
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        fn(*args)
        best = min(best, (time.perf_counter() - began) * 1000)
    return best


class RequestGenerator:
    """(headers, body) pairs: a valid delivery with one or two things changed, or something hostile."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = 0

    def body(self) -> bytes:
        r = self.rng
        base = payload(r.choice(["opened", "label_updated", "closed"]), number=r.randint(1, 10**6))
        kind = r.randrange(14)
        if kind == 0:
            return b"[" * r.randint(500, 5000) + b"]" * r.randint(0, 5000)
        if kind == 1:
            return b'{"a":' * r.randint(500, 3000) + b"1" + b"}" * r.randint(0, 3000)
        if kind == 2:
            return b'{"action": "opened", "n": ' + b"9" * r.randint(4000, 20000) + b"}"
        if kind == 3:
            return base.replace(b'"commit_id": ""', r.choice([b'"commit_id": NaN', b'"commit_id": -Infinity']))
        if kind == 4:
            return base.replace(b'"opened"', b'"op\\ud800ened"').replace(b'"closed"', b'"\\udfffclosed"')
        if kind == 5:
            cut = r.randint(0, len(base))
            return base[:cut]
        if kind == 6:
            data = bytearray(base)
            for _ in range(r.randint(1, 8)):
                data[r.randrange(len(data))] = r.randrange(256)
            return bytes(data)
        if kind == 7:
            return json.dumps(r.choice([[], 1, "x", None, True, [1, 2], 1.5])).encode()
        if kind == 8:
            doc = json.loads(base)
            doc["action"] = r.choice([[], {}, 1, None, True, "x" * r.randint(1, 5000), LONE + "x"])
            return json.dumps(doc).encode()
        if kind == 9:
            doc = json.loads(base)
            doc["sender"] = r.choice([[], "alice", {"login": []}, {"login": 7}, None])
            return json.dumps(doc, indent=2).encode()
        if kind == 10:
            doc = json.loads(base)
            doc["repository"] = r.choice([None, [], {"full_name": []}, {"full_name": "elsewhere/other"}])
            return json.dumps(doc, indent=2).encode()
        if kind == 11:
            return b"\xef\xbb\xbf" + base  # json.loads over bytes accepts a UTF-8 BOM; so does Gitea's receiver
        return base

    def headers(self, body: bytes) -> dict[str, str]:
        r = self.rng
        self.n += 1
        delivery = f"fz-{self.n}-{r.randrange(10**9)}"
        headers = {
            "Content-Type": "application/json",
            "X-Gitea-Event": r.choice(["issues", "issue_comment", "push", "pull_request"]),
            "X-Gitea-Event-Type": "issues",
            "X-Gitea-Delivery": delivery,
            "X-Gitea-Signature": sign(body),
        }
        kind = r.randrange(12)
        if kind == 0:
            headers["X-Gitea-Signature"] = r.choice(["", "00", "zz" * 32, "é" * 64, sign(body).upper() + "0"])
        elif kind == 1:
            headers.pop(r.choice(["X-Gitea-Event", "X-Gitea-Delivery", "Content-Type"]))
        elif kind == 2:
            headers["X-Gitea-Event"] = r.choice(["ISSUES", "is sues", "x" * 300, "évent", "", "issues\x7f", "1abc"])
        elif kind == 3:
            headers["X-Gitea-Delivery"] = r.choice(["", "x" * 201, "a\x01b", "ünï"])
        elif kind == 4:
            headers["Content-Type"] = r.choice(["text/plain", "application/x-www-form-urlencoded", "json", ""])
        elif kind == 5:
            headers["Content-Encoding"] = r.choice(["gzip", "br", "deflate", "identity", "x"])
        elif kind == 6:
            headers["X-Hub-Signature-256"] = "sha256=" + r.choice([sign(body), "é" * 64, ""])
            headers.pop("X-Gitea-Signature")
        elif kind == 7:
            headers["X-Gitea-Event"] = r.choice(sorted(KNOWN_EVENTS))
        return headers

    def surrogate_headers(self, headers: dict[str, str]) -> dict[str, str]:
        """What aiohttp hands over for header bytes that are not UTF-8 (decoded with surrogateescape)."""
        name = self.rng.choice(sorted(headers))
        return {**headers, name: headers[name] + "\udcff\udcfe"}


async def test_webhook_intake_fuzz_never_fails_anyone_and_never_holds_the_loop(tmp_path: Path) -> None:
    """10,000 requests (headers and body, most correctly signed so they reach the JSON and storage checks) through
    a real service on loopback, every one also through the pure admission, timed. No 500 and no uncaught
    exception, every answer a JSON document with a documented status, every 202 stored once under its own id, the
    event loop never held over 50 ms, and /metrics still renders with labels from known values only."""
    gen = RequestGenerator(SEED)
    secrets = [SECRET.encode()]
    statuses: Counter[int] = Counter()
    accepted: dict[str, str] = {}  # delivery id -> body hash, for every 202
    slowest = 0.0
    inputs = [(gen.headers(body), body) for body in (gen.body() for _ in range(INTAKE_INPUTS))]

    # The pure admission with every input, plus header values as aiohttp decodes undecodable bytes.
    gc.disable()
    try:
        for headers, body in inputs:
            for variant in (headers, gen.surrogate_headers(headers)):
                ci = CIMultiDict(variant)
                verdict = admit(ci, body, secrets=secrets, max_body_bytes=256 * 1024)
                assert isinstance(verdict, Delivery | Rejection)
                if isinstance(verdict, Rejection):
                    assert verdict.status in DOCUMENTED and verdict.error and verdict.message
                call = functools.partial(admit, ci, body, secrets=secrets, max_body_bytes=256 * 1024)
                ms = _best_ms(call, repeat=1)
                if ms > MAX_MS:
                    ms = _best_ms(call)
                slowest = max(slowest, ms)
    finally:
        gc.enable()
    assert slowest < MAX_MS, f"an input held admission {slowest:.1f} ms"

    # Every input through a real `foreman serve` on loopback, 16 at a time: its own event loop, measured by itself.
    proc = ServeProcess(tmp_path, module="bot", overrides={"webhook": {"max_body_bytes": 262144}})
    await proc.start("serve", "--config", str(proc.config))
    semaphore = asyncio.Semaphore(16)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as session:

            async def post(headers: dict[str, str], body: bytes) -> tuple[int, Any]:
                if any(ch < " " or ch == "\x7f" for value in headers.values() for ch in value):
                    # aiohttp's client refuses control characters in a header; a raw socket sends them as they are.
                    raw = [(k.encode(), v.encode("utf-8", "surrogateescape")) for k, v in headers.items()]
                    status, doc = await raw_post(proc.port, raw, body)
                    # aiohttp's HTTP parser refuses control characters before the app runs: a plain-text 400.
                    return status, doc if status != 400 or doc else {"error": "bad_request"}
                async with session.post(f"{proc.url}/webhook", data=body, headers=headers) as resp:
                    return resp.status, await resp.json()

            async def send(headers: dict[str, str], body: bytes) -> None:
                async with semaphore:
                    status, doc = await post(headers, body)
                    statuses[status] += 1
                    assert status in DOCUMENTED, (status, doc, headers)
                    assert isinstance(doc, dict) and ("error" in doc or "status" in doc)
                    if status == 202:
                        assert doc["delivery"] == headers["X-Gitea-Delivery"]
                        accepted[doc["delivery"]] = hashlib.sha256(body).hexdigest()

            await asyncio.gather(*(send(h, b) for h, b in inputs))
            async with session.get(f"{proc.url}/metrics") as resp:
                assert resp.status == 200
                text = await resp.text()
    finally:
        await proc.kill()
    with sqlite3.connect(proc.db) as conn:
        stored = dict(conn.execute("SELECT delivery_id, body FROM deliveries").fetchall())
    assert set(accepted) <= set(stored)
    for delivery, digest in accepted.items():
        assert hashlib.sha256(stored[delivery]).hexdigest() == digest
    assert statuses[202] > 1000 and statuses[400] > 1000 and statuses[401] > 500, statuses
    for line in text.splitlines():
        if line.startswith("foreman_deliveries_total{"):
            event = line.split('event="', 1)[1].split('"', 1)[0]
            assert event in KNOWN_EVENTS | {"other", "unverified"}, line
    match = re.search(r"^foreman_event_loop_lag_max_seconds (\S+)", text, re.M)
    assert match is not None
    lag_max_s = float(match.group(1))
    assert lag_max_s < MAX_MS / 1000, lag_max_s
    print(f"intake fuzz: {len(inputs)} inputs, statuses {dict(statuses)}, slowest admission {slowest:.2f} ms, "
          f"serve's loop lag max {lag_max_s * 1000:.1f} ms")


class CommentGenerator:
    """Comment bodies from the grammar's pieces and the hostile shapes that broke parsers before."""

    PIECES = (
        f"## {HEADING_TEXT}", f"# {HEADING_TEXT} #", f"**{HEADING_TEXT}**", f"{HEADING_TEXT}:", f"{HEADING_TEXT}",
        "=====", "-----", "STATE: ready", "STATE: in-progress", "WHO_IS_NEXT: author", "NEXT_ACTION: do it",
        "NEXT_PROMPT:", "RELATED_PRS: #1, #2", "BLOCKERS: none", "VALIDATION: ok", "LAST_UPDATED_BY: x",
        "```", "~~~~", "```text", "<!--", "-->", "> quoted", "    indented", "", "X_EXTRA: y", "#", "######",
        "state: ready", LONE, "\ufeff", "\r", "\t", "RELATED_PRS: " + "#9" * 50,
    )

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def hostile_line(self) -> str:
        r = self.rng
        n = r.choice([100, 1000, 10_000, 48_000])
        return r.choice([
            "# a" + " " * n + "x", "# a" + " \t" * (n // 2) + "#x", "#" * n, "#" * 6 + " " * n, " " * n + "#",
            "STATE:" + " " * n + "x", "RELATED_PRS: " + "#1 ," * (n // 4), "**" * (n // 2), "`" * n, "~" * n,
            "<!--" * (n // 4), f"## {HEADING_TEXT}" + " #" * (n // 2), "A" * n + ":" + "b" * n, "_" * n + ":",
        ])

    def body(self) -> str:
        r = self.rng
        lines: list[str] = []
        for _ in range(r.randint(1, 40)):
            roll = r.random()
            if roll < 0.08:
                lines.append(self.hostile_line())
            elif roll < 0.9:
                lines.append(r.choice(self.PIECES))
            else:
                lines.append("".join(chr(r.randint(1, 0x2FFF)) for _ in range(r.randint(1, 60))))
        if r.random() < 0.05:
            lines = lines * r.randint(10, 200)
        return r.choice(["\n", "\r\n", "\r"]).join(lines)


def test_canonical_parser_fuzz_never_raises_and_stays_under_50ms() -> None:
    """10,000 comment bodies assembled from the grammar's pieces (headings in every form, key lines, fences, HTML
    comments, quotations) and hostile ones (long blank runs, long lines, deep repetition, lone surrogates), each
    parsed and timed: never raises, no body over 50 ms."""
    gen = CommentGenerator(SEED)
    slowest = 0.0
    with_blocks = 0
    total_bytes = 0
    gc.disable()
    try:
        for _ in range(PARSER_INPUTS):
            body = gen.body()
            total_bytes += len(body)
            began = time.perf_counter()
            result = parse_comment(body)
            ms = (time.perf_counter() - began) * 1000
            if ms > MAX_MS:
                ms = min(ms, _best_ms(parse_comment, body))
            slowest = max(slowest, ms)
            with_blocks += bool(result.block_count)
            result.to_dict()  # the report every caller builds must not raise either
    finally:
        gc.enable()
    assert slowest < MAX_MS, f"a comment held the parser {slowest:.1f} ms"
    assert with_blocks > PARSER_INPUTS // 10  # the corpus really reaches the block grammar
    print(f"parser fuzz: {PARSER_INPUTS} bodies, {total_bytes / 1e6:.1f} MB, {with_blocks} with a block, "
          f"slowest {slowest:.2f} ms")
