"""A Streamable HTTP MCP server for the bridge's tests and benchmark: the SDK's own session manager and low-level
server with three tools, behind a bearer check, served by uvicorn.

    python -m tests.mcp_http_stub --port PORT [--json-response] [--log FILE]

- ``Authorization: Bearer good-token`` is served; ``Bearer slow-down`` gets 429 with ``Retry-After: 7``; anything
  else gets 401 with ``WWW-Authenticate: Bearer`` and foreman's JSON error shape, before any MCP processing.
- Tools: ``echo`` (its arguments back as structured content), ``hold`` (answers once ``release`` has been called:
  a client that sends one request at a time never gets ``hold`` answered), ``release``.
- ``--log FILE``: one JSON line per HTTP request (method, path, whether the token was good, the session id and
  protocol version headers it carried), for the tests to read what the bridge sent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import uvicorn
from mcp.server import Server, ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

GOOD_TOKEN = "good-token"
RATE_LIMITED_TOKEN = "slow-down"
PATH = "/mcp"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_TOOLS = [
    types.Tool(name="echo", description="its arguments back",
               input_schema={"type": "object", "additionalProperties": True}),
    types.Tool(name="hold", description="answers once release has been called",
               input_schema={"type": "object", "properties": {}}),
    types.Tool(name="release", description="lets every held call answer", input_schema={"type": "object"}),
]


def build_server() -> Server[Any]:
    released = anyio.Event()

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_TOOLS)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name == "hold":
            await released.wait()
        elif params.name == "release":
            released.set()
        doc = {"tool": params.name, "arguments": dict(params.arguments or {})}
        text = json.dumps(doc)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=doc)

    return Server("stub", version="1", on_list_tools=list_tools, on_call_tool=call_tool)


def build_app(*, json_response: bool, log: Path | None) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI app: lifespan runs the session manager; ``/mcp`` is served only with the good token."""
    manager = StreamableHTTPSessionManager(build_server(), json_response=json_response)

    async def answer(send: Send, status: int, doc: dict[str, Any], *extra: tuple[bytes, bytes]) -> None:
        body = json.dumps(doc).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            async with contextlib.AsyncExitStack() as stack:
                while True:
                    message = await receive()
                    if message["type"] == "lifespan.startup":
                        await stack.enter_async_context(manager.run())
                        await send({"type": "lifespan.startup.complete"})
                    elif message["type"] == "lifespan.shutdown":
                        await stack.aclose()
                        await send({"type": "lifespan.shutdown.complete"})
                        return
        if scope["type"] != "http":
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        auth = headers.get("authorization", "")
        if log is not None:
            entry = {"method": scope["method"], "path": scope["path"], "good_token": auth == f"Bearer {GOOD_TOKEN}",
                     "session": headers.get("mcp-session-id"), "version": headers.get("mcp-protocol-version"),
                     "accept": headers.get("accept"), "content_type": headers.get("content-type")}
            with log.open("a", encoding="utf-8") as file:
                file.write(json.dumps(entry) + "\n")
        if scope["path"] != PATH:
            await answer(send, 404, {"error": "not_found", "message": f"no {scope['path']} here"})
        elif auth == f"Bearer {RATE_LIMITED_TOKEN}":
            await answer(send, 429, {"error": "rate_limited", "message": "too many failed authentications",
                                     "remediate": "wait", "exact_next_action": "retry later"}, (b"retry-after", b"7"))
        elif auth != f"Bearer {GOOD_TOKEN}":
            await answer(send, 401, {"error": "unauthorized", "message": "the bearer token is not known",
                                     "remediate": "Set FOREMAN_MCP_TOKEN to your own token.",
                                     "exact_next_action": "ask the operator for a token"},
                         (b"www-authenticate", b"Bearer"))
        else:
            await manager.handle_request(scope, receive, send)

    return app


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.mcp_http_stub")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--json-response", action="store_true", help="answer application/json, not SSE")
    parser.add_argument("--log", type=Path, help="one JSON line per HTTP request")
    args = parser.parse_args()
    app = build_app(json_response=args.json_response, log=args.log)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
