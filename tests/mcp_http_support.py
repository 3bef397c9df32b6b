"""MCP over HTTP for tests: the official SDK's Streamable HTTP client against a service's ``/mcp``, with a bearer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

#: Generous: a hang detector on a loaded machine, never a timing.
HTTP_TIMEOUT_S = 60.0


@asynccontextmanager
async def mcp_over_http(url: str, token: str, **headers: str) -> AsyncIterator[ClientSession]:
    """An initialized client session of ``url`` (a service's ``/mcp``) holding ``token``; ended (DELETE) on exit."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}", **headers}, timeout=HTTP_TIMEOUT_S) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer, with ``is_error`` beside it."""
    result = await session.call_tool(tool, arguments)
    assert result.structured_content is not None, result
    return {**result.structured_content, "is_error": bool(result.is_error)}
