"""Malformed and slow HTTP at a real `foreman serve` (raw sockets): JSON answers, no tracebacks, bounded reads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bot.config import Settings
from tests.serve_support import ServeProcess, serve_process
from tests.support import HANG_S, payload, sign

pytestmark = [pytest.mark.process]

#: Short bounds for the tests (the defaults are 10 s and 15 s); each wait below is a hang detector (HANG_S), far
#: above every bound.
READ_TIMEOUT_S = 1.5
KEEPALIVE_S = 2.0


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[ServeProcess]:
    bounds = {"webhook": {"read_timeout_s": READ_TIMEOUT_S}, "server": {"keepalive_timeout_s": KEEPALIVE_S}}
    async with serve_process(tmp_path, overrides=bounds, serve=True) as proc:
        yield proc


def _head(*lines: bytes) -> bytes:
    """A signed webhook request's head (a body of `payload()`), with ``lines`` added and no blank line yet."""
    body = payload()
    return b"".join([
        b"POST /webhook HTTP/1.1\r\nHost: foreman\r\nContent-Type: application/json\r\nX-Gitea-Event: issues\r\n",
        b"X-Gitea-Delivery: raw-1\r\nX-Gitea-Signature: ", sign(body).encode(), b"\r\n",
        *(line + b"\r\n" for line in lines),
    ])


class Exchange:
    """One raw connection: what was sent, and the answer (status, JSON body) with the seconds it took."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Exchange:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def send(self, data: bytes, *, half_close: bool = False) -> None:
        self.writer.write(data)
        await self.writer.drain()
        if half_close:
            self.writer.write_eof()

    async def answer(self) -> tuple[int, dict[str, object], float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), HANG_S)
        took = loop.time() - started
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        assert headers.get("content-type", "").startswith("application/json"), head
        body = await asyncio.wait_for(self.reader.readexactly(int(headers["content-length"])), HANG_S)
        return int(lines[0].split()[1]), json.loads(body), took

    async def closed_within(self) -> float:
        """Seconds until the server closes the connection (EOF), read without sending anything more."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await asyncio.wait_for(self.reader.read(), HANG_S) == b""
        return loop.time() - started

    def close(self) -> None:
        self.writer.close()


@asynccontextmanager
async def connected(port: int) -> AsyncIterator[Exchange]:
    """A raw connection to ``port``, closed afterwards."""
    exchange = await Exchange.open(port)
    try:
        yield exchange
    finally:
        exchange.close()


async def ask(port: int, data: bytes, *, half_close: bool = False) -> tuple[int, dict[str, object], float]:
    """``data`` sent on a connection of its own: the answer (status, JSON body, the seconds it took)."""
    async with connected(port) as exchange:
        await exchange.send(data, half_close=half_close)
        return await exchange.answer()


def _clean_log(proc: ServeProcess) -> None:
    text = proc.stderr.read_text()
    assert "Traceback" not in text and " ERROR " not in text, text


@pytest.mark.parametrize(("request_bytes", "said"), [
    (_head(b"Bad Header Line", b"Content-Length: 2", b"") + b"{}", "Invalid header token"),
    (_head(b"Transfer-Encoding: chunked", b"") + b"zz\r\n{}\r\n0\r\n\r\n", "chunk size"),
    (_head(b"X-Long: " + b"a" * 9000, b"Content-Length: 2", b"") + b"{}", "Got more than 8190 bytes"),
])
async def test_a_request_the_http_parser_refuses_is_answered_400_in_json_and_logs_no_traceback(
    serve: ServeProcess, request_bytes: bytes, said: str
) -> None:
    """Issue 29 item 6: a bad header line, an invalid chunk size, a header line too long were answered in plain
    text with an ERROR traceback in the log; now `{"error": "bad_request", "message"}` and one INFO line."""
    status, doc, _ = await ask(serve.port, request_bytes)
    assert status == 400 and doc["error"] == "bad_request" and said in str(doc["message"]), doc
    await serve.wait_for(lambda: "refused by the parser (400)" in serve.stderr.read_text(), "the one-line log")
    _clean_log(serve)


@pytest.mark.parametrize("request_bytes", [
    _head(b"Transfer-Encoding: chunked", b"") + b'5\r\n{"a":\r\n',
    _head(b"Content-Length: 100", b"") + b'{"a":',
])
async def test_a_body_cut_short_by_a_half_close_is_answered_400_in_json(
    serve: ServeProcess, request_bytes: bytes
) -> None:
    """Issue 29 item 6: a chunked (or declared-length) body whose sender half-closed the connection got no answer
    and a "Connection lost" traceback; the server keeps the connection open to answer it 400 `bad_body`."""
    async with connected(serve.port) as exchange:
        await exchange.send(request_bytes, half_close=True)
        status, doc, _ = await exchange.answer()
        await exchange.closed_within()
    assert status == 400 and doc["error"] == "bad_body" and "closed its side" in str(doc["message"]), doc
    assert serve.status("raw-1") is None
    _clean_log(serve)


async def test_a_whole_delivery_then_a_half_close_is_still_answered_and_stored(serve: ServeProcess) -> None:
    """A client may half-close once its request is sent: the answer still reaches it (202) and the delivery is
    stored."""
    body = payload()
    status, doc, _ = await ask(serve.port, _head(b"Content-Length: " + str(len(body)).encode(), b"") + body,
                               half_close=True)
    assert status == 202 and doc == {"delivery": "raw-1", "status": "queued"}, doc
    assert serve.status("raw-1") is not None
    _clean_log(serve)


@pytest.mark.parametrize("request_bytes", [
    _head(b"Content-Length: 100", b""),
    _head(b"Transfer-Encoding: chunked", b""),
    _head(b"Content-Length: 100", b"") + b'{"action": "opened", ',
])
async def test_a_client_that_sends_the_head_and_stalls_gets_408_within_the_read_timeout(
    serve: ServeProcess, request_bytes: bytes
) -> None:
    """Issue 29 item 6: a client that sent its headers (and maybe part of the body), then nothing, was never cut;
    now it is answered 408 `request_timeout` once `[webhook] read_timeout_s` has passed, and the connection closes."""
    status, doc, took = await ask(serve.port, request_bytes)
    assert status == 408 and doc["error"] == "request_timeout" and "read_timeout_s" in str(doc["message"]), doc
    assert READ_TIMEOUT_S * 0.8 <= took <= READ_TIMEOUT_S + 5.0, took
    assert serve.status("raw-1") is None
    _clean_log(serve)


@pytest.mark.parametrize("request_bytes", [b"", b"POST /webhook HTTP/1.1\r\nHost: foreman\r\nContent-Le"])
async def test_a_client_that_stalls_before_its_head_ends_is_cut_at_the_keepalive_timeout(
    serve: ServeProcess, request_bytes: bytes
) -> None:
    """Issue 29 item 6: a connection that sends nothing, or half a head, is closed once `[server]
    keepalive_timeout_s` has passed (aiohttp's default was an hour)."""
    async with connected(serve.port) as exchange:
        await exchange.send(request_bytes)
        took = await exchange.closed_within()
    assert took <= KEEPALIVE_S + 5.0, took
    _clean_log(serve)


def test_the_read_bounds_default_to_10_and_15_seconds() -> None:
    settings = Settings.model_validate({})
    assert (settings.webhook.read_timeout_s, settings.server.keepalive_timeout_s) == (10.0, 15.0)
