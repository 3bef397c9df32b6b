"""MCP over HTTP for tests: the official SDK's Streamable HTTP client against a service's ``/mcp``, with a bearer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.conftest import REPO_ROOT

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


@asynccontextmanager
async def serve_process(config: Path, port: int, *, env: Mapping[str, str] | None = None,
                        umask: int | None = None) -> AsyncIterator[str]:
    """A real ``foreman serve --config config`` listening on ``port`` (the config's); yields its base URL once
    /healthz answers; stopped (SIGTERM, then SIGKILL) whatever happens. ``umask``: the process's (a deployment's
    ``UMask=0077``)."""
    argv = [sys.executable, "-m", "bot", "serve", "--config", str(config)]
    stderr = config.parent / f"serve-{port}.log"
    with stderr.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=config.parent, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
            stdout=asyncio.subprocess.DEVNULL, stderr=err, umask=-1 if umask is None else umask)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = asyncio.get_running_loop().time() + HTTP_TIMEOUT_S
        async with aiohttp.ClientSession() as session:
            while True:
                if proc.returncode is not None:
                    raise AssertionError(f"foreman serve exited {proc.returncode}: {stderr.read_text()}")
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"foreman serve never became healthy: {stderr.read_text()}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"{url}/healthz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.05)
        yield url
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout=HTTP_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
