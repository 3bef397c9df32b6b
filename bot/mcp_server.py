"""`foreman mcp`: the verb table as MCP tools over stdio, for one identity named by FOREMAN_MCP_TOKEN.

Built on the official SDK's low-level ``mcp.server.Server`` rather than ``MCPServer``: ``MCPServer`` derives a
pydantic argument model from a function signature, which coerces (``true`` becomes ``1``, JSON text inside a
string is decoded for any non-string field), drops unknown arguments silently and answers a validation
failure with plain text. Here every tool publishes the schema the verb table declares, receives its
arguments exactly as sent, and answers with structured content: the verb's result, or the error envelope
(``is_error``), never a traceback. Every call goes through :class:`bot.verbs_runtime.VerbRuntime` (the gateway).
"""

from __future__ import annotations

import hmac
import importlib.metadata
import json
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from bot.config import Settings
from bot.core.verbs import TOOLS, VERBS, Verb
from bot.verbs_runtime import BootstrapFactory, Caller, VerbResult, VerbRuntime, caller_for
from state.db import Database

log = logging.getLogger("foreman.mcp")

TOKEN_ENV = "FOREMAN_MCP_TOKEN"  # noqa: S105 (the name of the variable, not a token)


def _version() -> str:
    try:
        return importlib.metadata.version("gitea-foreman")
    except importlib.metadata.PackageNotFoundError:
        return "0"


class IdentityError(Exception):
    """``foreman mcp`` cannot tell who it serves: no token, or a token not in ``[mcp.tokens]``."""


def resolve_identity(settings: Settings, token: str | None) -> Caller:
    """The caller a token stands for: ``[mcp.tokens]`` maps it to a login, the roster gives the roles.

    Every configured token is compared in constant time. A login without roster roles is still an
    identity: it is served, and the gateway refuses its calls ``not_authorized``.
    """
    if not token:
        raise IdentityError(f"{TOKEN_ENV} is not set; set it to one of the tokens under [mcp.tokens]")
    login: str | None = None
    for known, who in settings.mcp.tokens.items():
        if hmac.compare_digest(known.encode(), token.encode()):
            login = who
    if login is None:
        raise IdentityError(f"{TOKEN_ENV} is not one of the tokens under [mcp.tokens]")
    return caller_for(settings, login, "mcp")


def tool_for(verb: Verb) -> types.Tool:
    """The MCP tool of a verb: its name, summary, gates and input schema from the verb table."""
    gates = "; ".join(
        f"{p.key} ({p.rejection_kind})" for p in verb.preconditions
    )
    description = (
        f"{verb.summary[0].upper()}{verb.summary[1:]}. Checked first, in order: {gates}. "
        "A refusal is structured: {error, message, remediate, exact_next_action} plus missing[] for a tracing_gap."
    )
    return types.Tool(
        name=verb.tool,
        description=description,
        input_schema=verb.input_schema(),
        annotations=types.ToolAnnotations(
            read_only_hint=verb.effect == "read",
            destructive_hint=False,
            idempotent_hint=verb.effect == "read",
            open_world_hint=False,
        ),
    )


def offered_tools() -> list[types.Tool]:
    """The tools an MCP server offers: every executable verb of the table, in table order."""
    return [tool_for(verb) for verb in VERBS.values() if verb.executable]


def result_of(doc: dict[str, Any], *, is_error: bool) -> types.CallToolResult:
    """The answer: the document as structured content and as JSON text (plain JSON values only, key order kept)."""
    text = json.dumps(doc, default=str)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=json.loads(text), is_error=is_error
    )


#: Runs the verb with the given arguments (through the gateway); what an ``Around`` hook wraps.
RunVerb = Callable[[dict[str, Any]], Awaitable[VerbResult]]
#: A hook around every tool call (a run broker, issue 8): gets the tool name, the arguments as sent and the
#: verb runner; returns the document to answer with and whether it is an error. It may refuse without
#: running the verb, or run it with other arguments.
Around = Callable[[str, dict[str, Any], RunVerb], Awaitable[tuple[dict[str, Any], bool]]]


def build_server(runtime: VerbRuntime, caller: Caller, *, around: Around | None = None) -> Server[Any]:
    """An MCP server whose tools run as ``caller`` through ``runtime`` (identity fixed at start)."""
    tools = offered_tools()
    repository = f"{runtime.settings.repository.owner}/{runtime.settings.repository.name}"

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        verb = TOOLS.get(params.name)
        name = verb.name if verb is not None else params.name

        async def run(arguments: dict[str, Any]) -> VerbResult:
            return await runtime.call(name, caller, arguments)

        arguments = dict(params.arguments or {})
        if around is None:
            result = await run(arguments)
            return result_of(result.doc, is_error=not result.ok)
        doc, is_error = await around(params.name, arguments, run)
        return result_of(doc, is_error=is_error)

    roles = ", ".join(sorted(caller.roles)) or "no roster role"
    return Server(
        "foreman",
        version=_version(),
        instructions=(
            f"You act as {caller.login} ({roles}) on {repository}. Start with gitea_get_runtime_context: "
            "it names what you may call now and the exact next action."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


@asynccontextmanager
async def open_runtime(
    settings: Settings, *, bootstrap_factory: BootstrapFactory | None = None, wakeup: Callable[[], None] | None = None
) -> AsyncIterator[VerbRuntime]:
    """A runtime over the configured database and (when a token is configured) Gitea, closed afterwards."""
    import aiohttp

    from bot.gitea import GiteaClient

    db = await Database.open(
        settings.database.path,
        synchronous=settings.database.synchronous,
        busy_timeout_ms=settings.database.busy_timeout_ms,
    )
    try:
        async with aiohttp.ClientSession() as session:
            token = settings.gitea_token()
            gitea = (
                GiteaClient(
                    session,
                    base_url=settings.gitea.url,
                    token=token,
                    owner=settings.repository.owner,
                    repo=settings.repository.name,
                    timeout_s=settings.gitea.timeout_s,
                )
                if token
                else None
            )
            runtime = VerbRuntime(db=db, settings=settings, gitea=gitea, bot_login=settings.gitea.bot_login or "")
            if bootstrap_factory is not None:
                runtime.bootstrap_factory = bootstrap_factory
            runtime.wakeup = wakeup
            yield runtime
    finally:
        await db.close()


async def serve_stdio(settings: Settings, caller: Caller) -> int:
    """Serve MCP on stdin/stdout until the client closes stdin. Logs go to stderr."""
    async with open_runtime(settings) as runtime:
        server = build_server(runtime, caller)
        log.info(
            "mcp: serving %s (%s) on %s over stdio; %d tools",
            caller.login,
            ", ".join(sorted(caller.roles)) or "no roster role",
            runtime.repo,
            len(offered_tools()),
        )
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    return 0


def token_from_environment() -> str | None:
    return os.environ.get(TOKEN_ENV)
