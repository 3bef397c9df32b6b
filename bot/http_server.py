"""The HTTP server under the app: aiohttp's connection protocol, answering malformed requests in JSON, bounded in time.

aiohttp offers no public hook for the answer to a request its parser refuses (a bad header line, an invalid chunk
size, a line over 8190 bytes: aio-libs/aiohttp#3287 is open): it answers plain text from
``RequestHandler.handle_error`` and logs the client's mistake as an ERROR with a traceback. The runner here serves
the app with a ``RequestHandler`` subclass that answers those in JSON (the shape of every other refusal) and logs
one line; a server fault (a 500) is still aiohttp's answer and its ERROR traceback.

Time: aiohttp has one timer for a connection waiting for a request's head, idle or half-sent, its keep-alive
(``[server] keepalive_timeout_s``, passed as ``keepalive_timeout``): a client that connects and stalls is cut when
it expires. A request's body is bounded in size and time where it is read (``read_body``: the webhook door's
``[webhook]`` bounds, ``/mcp``'s ``[mcp]`` ones).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
from aiohttp import StreamReader, web, web_protocol

from bot.config import Settings
from bot.core.intake import Rejection

log = logging.getLogger("foreman.http")


class BodyCutShort(web.RequestPayloadError):
    """The client closed its side of the connection (a half-close) before the request's body ended."""


def runner_options(settings: Settings) -> dict[str, Any]:
    """The keyword arguments for the runner that serves ``Service.make_app()`` (``foreman serve`` and the tests).

    Gitea never compresses a delivery; with aiohttp's decompression off, a body that claims a Content-Encoding
    reaches intake untouched and is refused there (415) instead of failing inside the HTTP parser (a dropped
    connection and a traceback). ``keepalive_timeout``: how long a connection may wait for a request's head.
    """
    return {"auto_decompress": False, "keepalive_timeout": settings.server.keepalive_timeout_s}


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class _Connection(web_protocol.RequestHandler):
    """One client connection: aiohttp's protocol, with the client's malformed requests answered in JSON."""

    __slots__ = ("_last_body",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._last_body: StreamReader | None = None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:  # a fault of the server's own: aiohttp's answer and its logged traceback
            return super().handle_error(request, status, exc, message)
        # A request aiohttp's parser refused: the client's mistake, answered like every refusal, logged in a line.
        detail = _one_line(message or (str(exc) if exc is not None else "malformed request"))
        log.info("HTTP request from %s refused by the parser (%d): %s", request.remote, status, detail)
        if request.writer.output_size > 0:  # as aiohttp: an answer already started cannot be replaced
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        response = web.Response(
            body=orjson.dumps({"error": "bad_request", "message": f"the HTTP request could not be parsed: {detail}"}),
            status=status,
            content_type="application/json",
            charset="utf-8",
        )
        response.force_close()
        return response

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._messages:  # the body of the request parsed last, which may still be arriving
            self._last_body = self._messages[-1][1]

    def eof_received(self) -> bool | None:  # type: ignore[override]  # asyncio.Protocol allows True: keep open
        """The client half-closed (it sends nothing more but still reads). aiohttp closes the transport at once, so
        a request whose body was cut short got no answer and its handler a "Connection lost" traceback. Unless the
        connection is idle (waiting for a request's head), it stays open to answer what it has (then closes), and a
        body not complete ends with ``BodyCutShort`` (the webhook answers it 400)."""
        # aiohttp's own state: start() awaits _waiter only when idle; _messages holds the requests not yet handled.
        if self._waiter is not None and not self._waiter.done() and not self._messages:
            return None
        bodies = [body for _, body in self._messages]
        if self._last_body is not None:
            bodies.append(self._last_body)
        if self._current_request is not None:
            bodies.append(self._current_request.content)
        for body in bodies:
            if not body.is_eof():
                body.set_exception(
                    BodyCutShort("the client closed its side of the connection before the request body ended")
                )
                body.feed_eof()  # nothing more comes: aiohttp must not linger reading it after the answer
        self.close()
        return True


class _Server(web.Server):
    def __call__(self) -> web_protocol.RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class ServiceRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are ``_Connection`` (give it ``runner_options(settings)``)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        # AppRunner builds its Server (with the app's handler and request factory) in Application._make_handler;
        # the class is swapped so that it makes our connections. Checked, so an aiohttp that builds another kind
        # fails here (and in tests/test_http_server.py) instead of silently serving plain-text refusals.
        if type(server) is not web.Server:
            raise TypeError(f"aiohttp built a {type(server).__name__}, not web.Server: update bot/http_server.py")
        server.__class__ = _Server
        return server


async def read_body(request: web.Request, *, limit: int, timeout_s: float, setting: str,
                    read_declared: bool = False) -> bytes | Rejection:
    """A request's body, at most ``limit`` bytes, whole within ``timeout_s`` however it trickles in; else the
    refusal: 413 over the size (declared or streamed), 408 over the time (naming ``setting``), 400 for a body that
    cannot be read. ``read_declared``: a body of declared length is read in one call (the app's ``client_max_size``
    must cover ``limit``)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        return Rejection(413, "payload_too_large", f"Content-Length {declared} is over the limit {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            if declared is not None and read_declared:
                return await request.read()
            async for chunk in request.content.iter_chunked(65536):
                size += len(chunk)
                if size > limit:
                    return Rejection(413, "payload_too_large", f"body is over the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        return Rejection(408, "request_timeout", f"the request body did not arrive within {timeout_s:g} s ({setting})")
    # The server's payload errors are web.RequestPayloadError (a broken chunk, a body cut short by a half-close:
    # BodyCutShort), not the client's ClientPayloadError; a connection lost has nobody left to answer.
    except (web.RequestPayloadError, aiohttp.ClientPayloadError) as exc:
        return Rejection(400, "bad_body", f"the request body could not be read: {exc}")
    except ConnectionResetError:
        return Rejection(400, "bad_body", "the connection was lost before the request body ended")
    return b"".join(chunks)
