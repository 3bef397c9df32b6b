"""`foreman mcp`: the verb table as MCP tools over stdio, for one identity named by FOREMAN_MCP_TOKEN."""

from __future__ import annotations

import hmac
import importlib.metadata
import io
import json
import logging
import os
import re
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import anyio
import mcp.types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from bot.config import Settings
from bot.core.errors import Envelope, EnvelopeError
from bot.core.gateway import GatewayContext, evaluate_preconditions
from bot.core.grants import Grant, broker_refusal
from bot.core.json_depth import MAX_NESTING, collapsed
from bot.core.verbs import NOT_ON_ROSTER, ON_ROSTER, TOOLS, VERBS, Verb, identity_gate
from bot.mcp_resources import ResourceDoor, resource_handlers
from bot.verbs.runs.broker import Broker
from bot.verbs.runs.start import is_run_token
from bot.verbs.runtime import BootstrapFactory, Caller, VerbResult, VerbRuntime, caller_for, refused
from state.db import open_database
from state.grants import GrantStore

log = logging.getLogger("foreman.mcp")

TOKEN_ENV = "FOREMAN_MCP_TOKEN"  # noqa: S105 (the name of the variable, not a token)


def _version() -> str:
    try:
        return importlib.metadata.version("gitea-foreman")
    except importlib.metadata.PackageNotFoundError:
        return "0"


class IdentityError(Exception):
    """``foreman mcp`` cannot tell who it serves: no token, or a token not in ``[mcp.tokens]``."""


def _utf8(token: str) -> bytes | None:
    """The token's bytes, or None when the environment held bytes that are not UTF-8 (surrogate escapes)."""
    try:
        return token.encode("utf-8")
    except UnicodeEncodeError:
        return None


def resolve_identity(settings: Settings, token: str | None) -> Caller:
    """The caller a token stands for: ``[mcp.tokens]`` maps it to a login, the roster gives the roles.

    Every configured token is compared in constant time. A login without roster roles is still an
    identity: it is served, and the gateway refuses its calls ``not_authorized``.
    """
    if not token:
        raise IdentityError(f"{TOKEN_ENV} is not set; set it to one of the tokens under [mcp.tokens]")
    raw = _utf8(token)
    if raw is None:
        raise IdentityError(f"{TOKEN_ENV} is not valid UTF-8 text; set it to one of the tokens under [mcp.tokens]")
    login: str | None = None
    for known, who in settings.mcp.tokens.items():
        if hmac.compare_digest(known.encode(), raw):
            login = who
    if login is None:
        raise IdentityError(f"{TOKEN_ENV} is not one of the tokens under [mcp.tokens]")
    return caller_for(settings, login, "mcp")


def tool_description(verb: Verb) -> str:
    """What an agent reads about a tool: what it does, who may call it and when (in words: a gate's internal name
    is only in a refusal's details), what a replay does, and what it answers."""
    who, when = verb.who_and_when()
    lines = [f"{verb.summary[0].upper()}{verb.summary[1:]}.", f"Who may call it: {who}."]
    if when:
        lines.append(f"When: {'; '.join(when)}.")
    lines.append(f"Replay: {verb.replay}." if verb.replay else "Read-only: calling it again changes nothing.")
    lines.append("Answers its result in structuredContent (see the outputSchema), or a refusal (isError): {error, "
                 "message, remediate, exact_next_action}, missing[] for a tracing_gap, details when there are more; "
                 "exact_next_action is a step you can take with your own tools.")
    return "\n".join(lines)


def tool_for(verb: Verb, *, repository: bool = False) -> types.Tool:
    """The MCP tool of a verb, all from the verb table: name, title, description, input and output schemas, and
    annotations (the MCP specification's hints: read-only, destructive, idempotent, closed world)."""
    read = verb.effect == "read"
    return types.Tool(
        name=verb.tool,
        title=verb.title,
        description=tool_description(verb),
        input_schema=verb.input_schema(repository=repository),
        output_schema=verb.output_schema(),
        annotations=types.ToolAnnotations(
            title=verb.title,
            read_only_hint=read,
            destructive_hint=False if read else verb.destructive,
            idempotent_hint=verb.idempotent,
            open_world_hint=False,
        ),
    )


def unknown_tool(name: str, offered: Sequence[types.Tool]) -> Envelope:
    """The refusal of a tool name the server does not list (nothing runs). The name is quoted short and ASCII."""
    shown = ascii(name[:80]) + ("..." if len(name) > 80 else "")
    if not offered:  # a login with no roster role: no tool to name, only an operator can help
        return Envelope(
            error="invalid_input",
            message=f"unknown tool {shown}: this server lists no tool for you",
            remediate=NOT_ON_ROSTER,
            exact_next_action=ON_ROSTER.exact_next_action,
        )
    return Envelope(
        error="invalid_input",
        message=f"unknown tool {shown}: this server does not list it, and runs only the tools it lists",
        remediate=f"Use one of: {', '.join(tool.name for tool in offered) or '(none)'}.",
        exact_next_action="call tools/list and use a listed name exactly",
    )


def unreadable_arguments(name: str, why: str) -> Envelope:
    """The refusal of a call whose arguments the transport could not read (nothing runs, no broker sees it)."""
    return Envelope(
        error="invalid_input",
        message=f"{name[:80]!a}: the arguments are not acceptable JSON ({why}); nothing ran",
        remediate="Send arguments that match the tool's input schema: no integer of more than 4,300 digits, "
        "no lone surrogate in a string, nothing nested hundreds of levels deep.",
        exact_next_action="call the tool again with corrected arguments",
    )


def offered_tools(caller: Caller | None = None, *, repository: bool = False) -> list[types.Tool]:
    """The tools an MCP server offers, in table order: every executable verb, or (for ``caller``) those whose role
    gate its roles pass. A tool left out of the list still answers through the door (the same refusal as a comment
    command gets), so the list only saves an agent from calling what it may never call. ``repository``: each takes
    the ``repository`` argument (an identity in several repositories)."""
    return [tool_for(v, repository=repository) for v in VERBS.values()
            if v.executable and (caller is None or _may_call(v, caller))]


@dataclass(frozen=True, slots=True)
class RepositoryDoor:
    """One repository an identity works in: that repository's runtime (its settings view, its Gitea client) and
    the identity as that repository's roster knows it."""

    runtime: VerbRuntime[Any]
    caller: Caller


def choose_repository(tool: str, arguments: dict[str, Any], doors: Mapping[str, RepositoryDoor]) -> str | Envelope:
    """The repository key a call acts on, taking ``repository`` off ``arguments``: the one given (owner/name,
    case-insensitive), else the only one; several and none given, or one the identity does not work in, is an
    ``invalid_input`` envelope listing the repositories it may use."""
    given = arguments.pop("repository", None)
    keys = list(doors)
    choices = ", ".join(keys)
    if given is None:
        if len(keys) == 1:
            return keys[0]
        return Envelope(
            error="invalid_input",
            message=f"{tool}: you work in {len(keys)} repositories ({choices}); the call names none",
            remediate="Say which repository the call acts on with the repository argument (owner/name).",
            exact_next_action=f"call {tool} again with repository set to one of: {choices}",
            details={"repositories": keys},
        )
    key = given.lower() if isinstance(given, str) else None
    if key is None or key not in doors:
        shown = ascii(given)[:150]
        return Envelope(
            error="invalid_input",
            message=f"{tool}: repository {shown} is not one you work in ({choices})",
            remediate="Use one of the repositories whose roster names you.",
            exact_next_action=f"call {tool} again with repository set to one of: {choices}",
            details={"repositories": keys},
        )
    return key


def _may_call(verb: Verb, caller: Caller) -> bool:
    identity = GatewayContext(caller=caller.login, caller_roles=caller.roles)
    return evaluate_preconditions(identity_gate(verb), identity).allowed


def result_of(doc: dict[str, Any], *, is_error: bool) -> types.CallToolResult:
    """The answer: the document as structured content and as JSON text (plain JSON values only, key order kept)."""
    text = json.dumps(doc, default=str)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)], structured_content=json.loads(text), is_error=is_error
    )


#: Runs the verb with the given arguments (through the gateway); what an ``Around`` hook wraps.
RunVerb = Callable[[dict[str, Any]], Awaitable[VerbResult]]
#: A hook around every tool call (a run broker): gets the tool name, the arguments as sent and the
#: verb runner; returns the document to answer with and whether it is an error. It may refuse without
#: running the verb, or run it with other arguments.
Around = Callable[[str, dict[str, Any], RunVerb], Awaitable[tuple[dict[str, Any], bool]]]


def build_server(
    runtime: VerbRuntime[Any],
    caller: Caller,
    *,
    around: Around | None = None,
    tools: Sequence[types.Tool] | None = None,
    instructions: str | None = None,
    doors: Mapping[str, RepositoryDoor] | None = None,
) -> Server[Any]:
    """An MCP server whose tools run as ``caller`` through ``runtime`` (identity fixed at start).

    ``tools`` / ``instructions``: what the server offers and says instead of the defaults (a run-bound session
    offers only its grant's tools and names its exact calls). ``doors``: the repositories the identity works in,
    when more than one; every tool then takes ``repository`` and runs through that repository's runtime.
    """
    many = doors is not None and len(doors) > 1
    if tools is not None:
        offered = list(tools)
    elif doors is not None and many:  # what the identity may call in any of its repositories
        offered = [tool_for(v, repository=True) for v in VERBS.values()
                   if v.executable and any(_may_call(v, door.caller) for door in doors.values())]
    else:
        offered = offered_tools(caller)
    repository = ", ".join(doors) if doors is not None and many else runtime.settings.repo_key

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=offered)

    # What a call may name: a bound run's tools only; otherwise every offered verb, listed for this role or not.
    listed = {tool.name for tool in offered} if tools is not None else {tool.name for tool in offered_tools()}
    if doors is not None and many:
        roles = "; ".join(f"{key}: {', '.join(sorted(door.caller.roles)) or 'no roster role'}"
                          for key, door in doors.items())
        instructions = instructions or (
            f"You act as {caller.login} in {len(doors)} repositories ({roles}). Every tool takes repository "
            "(owner/name): give it on each call. Start with gitea_get_runtime_context in the repository you work in: "
            "it names what you may call now and the exact next action.")

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        verb = TOOLS.get(params.name)

        async def run(arguments: dict[str, Any]) -> VerbResult:
            if verb is None:  # only a listed tool runs, whatever a hook passes on
                return refused(params.name, unknown_tool(params.name, offered))
            if doors is None or not many:
                return await runtime.call(verb.name, caller, arguments)
            chosen = choose_repository(params.name, arguments, doors)
            if isinstance(chosen, Envelope):
                return refused(verb.name, chosen)
            door = doors[chosen]
            return await door.runtime.call(verb.name, door.caller, arguments)

        unreadable = (params.meta or {}).get(UNREADABLE_META)
        if unreadable is not None:  # the wire carried arguments no JSON parser of the SDK reads (see readable)
            return result_of(unreadable_arguments(params.name, str(unreadable)).to_dict(), is_error=True)
        arguments = dict(params.arguments or {})
        if around is None:
            if verb is None or params.name not in listed:
                return result_of(unknown_tool(params.name, offered).to_dict(), is_error=True)
            result = await run(arguments)
            return result_of(result.doc, is_error=not result.ok)
        # A run-bound session: its broker sees every call first (it refuses anything but the grant's next call,
        # and records the refusal); an admitted call is always one of the grant's listed tools.
        doc, is_error = await around(params.name, arguments, run)
        return result_of(doc, is_error=is_error)

    roles = ", ".join(sorted(caller.roles)) or "no roster role"
    # The issue and pull request as resources (bot.mcp_resources), read through the same doors; a run-bound session
    # makes only its grant's calls, so it offers none.
    resources = {} if around is not None else resource_handlers(
        {key: ResourceDoor(door.runtime, door.caller) for key, door in doors.items()} if doors
        else {runtime.settings.repo_key: ResourceDoor(runtime, caller)})
    if not caller.roles and not many and tools is None:
        ask = ON_ROSTER.exact_next_action
        instructions = instructions or (
            f"You act as {caller.login}, who has no role on the foreman roster of {repository}: no tool is offered to "
            f"you and every call is refused. {ask[0].upper()}{ask[1:]}.")
    return Server(
        "foreman",
        version=_version(),
        instructions=instructions
        or (
            f"You act as {caller.login} ({roles}) on {repository}. Start with gitea_get_runtime_context: "
            "it names what you may call now and the exact next action."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        **resources,
    )


# --- sessions bound to a run ------------------------------------------------------------------------------------------

#: How long a cancelled call may take to record the run's abort (it is shielded from the cancellation).
ABORT_TIMEOUT_S = 10.0


def broker_around(broker: Broker) -> Around:
    """The hook that binds a session to a run: every call goes through ``broker`` first, then the gateway.

    - ``before_call`` decides on the call as proposed; a denial is answered with its envelope (``error`` is the
      bounded category) and the gateway never sees the call;
    - an admitted call runs with ``admission.arguments()`` (the compiled arguments, never the proposed ones);
    - ``after_call`` decides on the result: a late result (expired grant, another host, an aborted run) is
      answered with the refusal instead and does not advance the plan; a plan-only result is handed back inert;
    - a call cancelled while it runs (the client cancelled the request or went away) aborts the run: its
      in-flight call is kept and blocks the teardown until it is reconciled (``foreman run reconcile``).

    The broker's own decisions are shielded from cancellation, so a decision is either recorded whole or not
    taken, and an admitted call is always followed by a settlement or an abort.
    """

    async def around(tool: str, arguments: dict[str, Any], run: RunVerb) -> tuple[dict[str, Any], bool]:
        with anyio.CancelScope(shield=True):
            admission = await broker.before_call(tool, arguments)
        if not admission.allowed:
            log.info("run %s: %s denied (%s, %s)", broker.run_id, tool, admission.category, admission.reason)
            return admission.refusal or broker_refusal("broker_error", broker.run_id), True
        try:
            result = await run(admission.arguments())
        except anyio.get_cancelled_exc_class():
            with anyio.move_on_after(ABORT_TIMEOUT_S, shield=True):
                aborted = await broker.abort(f"the MCP call {admission.tool} was cancelled while in flight")
                log.warning(
                    "run %s: %s cancelled in flight; run aborted (%s), call %s left for reconciliation",
                    broker.run_id,
                    admission.tool,
                    aborted.reason,
                    admission.call_id,
                )
            raise
        except Exception:  # the runtime never raises; if it does, the call failed and the plan ends
            log.exception("run %s: %s failed unexpectedly", broker.run_id, admission.tool)
            envelope = Envelope(
                error="unavailable",
                message="the call failed; it may or may not have taken effect",
                remediate="an operator reads the service log and the run with foreman grants",
                exact_next_action="stop and report the run id to the operator",
            )
            result = VerbResult(verb=admission.tool, doc=envelope.to_dict(), refusal=envelope)
        with anyio.CancelScope(shield=True):
            completion = await broker.after_call(admission, ok=result.ok, result=result.doc)
        if not completion.accepted:
            log.info("run %s: result of %s refused (%s)", broker.run_id, admission.tool, completion.reason)
        return completion.doc, completion.is_error

    return around


@dataclass(frozen=True, slots=True)
class RunBinding:
    """A session's run: the broker of the run its token names, the sealed grant and the identity it serves."""

    broker: Broker
    grant: Grant
    caller: Caller

    def tools(self) -> list[types.Tool]:
        """The grant's tools, in table order (every other tool would be denied anyway)."""
        granted = {call.tool for call in self.grant.calls}
        return [tool for tool in offered_tools() if tool.name in granted]

    def instructions(self, repository: str) -> str:
        plan = "; ".join(
            f"{call.position + 1}. {call.tool} {call.arguments_json}"
            + (" (the reserved teardown)" if call.effect == "teardown" else "")
            for call in self.grant.calls
        )
        return (
            f"You act as {self.caller.login} on {repository} in run {self.grant.run_id} (issue "
            f"#{self.grant.issue_number}, worktree {self.grant.worktree.path}). Every call is checked against the "
            f"run's sealed grant: make exactly these calls, in this order, with exactly these arguments: {plan}. "
            "Any other call is refused before it runs (error grant_denied, grant_expired, host_mismatch, "
            "inflight_unresolved or broker_error); a refused call cannot be retried differently."
        )

    def build_server(self, runtime: VerbRuntime[Any]) -> Server[Any]:
        repository = f"{runtime.settings.repository.owner}/{runtime.settings.repository.name}"
        return build_server(
            runtime,
            self.caller,
            around=broker_around(self.broker),
            tools=self.tools(),
            instructions=self.instructions(repository),
        )


async def bind_run(runtime: VerbRuntime[Any], token: str | None) -> RunBinding | None:
    """The run a run token names (None: not a run token, or no run has it). The session serves the run's owner
    (roster roles from the configuration); the token never names an identity of its own."""
    if token is None or not is_run_token(token) or _utf8(token) is None:
        return None
    broker = await Broker.for_token(GrantStore(runtime.db), runtime.settings, token)
    if broker is None:
        return None
    grant = await broker.grant()
    return RunBinding(broker=broker, grant=grant, caller=caller_for(runtime.settings, grant.owner, "mcp"))


@asynccontextmanager
async def open_runtime(
    settings: Settings, *, bootstrap_factory: BootstrapFactory | None = None
) -> AsyncIterator[VerbRuntime[Any]]:
    """A runtime over the configured database and (when a token is configured) Gitea, closed afterwards."""
    async with open_runtimes(settings, [settings.repo_key], bootstrap_factory=bootstrap_factory) as runtimes:
        yield runtimes[settings.repo_key]


@asynccontextmanager
async def open_runtimes(
    settings: Settings, keys: Sequence[str], *, bootstrap_factory: BootstrapFactory | None = None,
) -> AsyncIterator[dict[str, VerbRuntime[Any]]]:
    """One runtime per served repository in ``keys`` (each with its settings view and its own client), over one
    database and one HTTP session, closed afterwards."""
    import aiohttp

    from bot.catalog import open_door
    from bot.gitea import client_for

    db = await open_database(settings.database)
    try:
        async with aiohttp.ClientSession() as session:
            runtimes: dict[str, VerbRuntime[Any]] = {}
            for key in keys:
                view = settings.for_repository(key)
                runtime = open_door(db, view, client_for(session, view), bot_login=settings.gitea.bot_login or "")
                if bootstrap_factory is not None:
                    runtime.bootstrap_factory = bootstrap_factory
                runtimes[key] = runtime
            yield runtimes
    finally:
        await db.close()


def repositories_of(settings: Settings, login: str) -> list[str]:
    """The served repositories whose roster names ``login`` (case-insensitive), in configuration order; all of
    them when none does (the identity is served, and each call refused ``not_authorized``)."""
    keys = settings.repository_keys()
    mine = [key for key in keys
            if login.lower() in {name.lower() for name in settings.for_repository(key).roster}]
    return mine or keys


async def run_binding_of(
    runtimes: Mapping[str, VerbRuntime[Any]], token: str | None
) -> tuple[VerbRuntime[Any], RunBinding] | None:
    """The run a run token names, bound through its grant's repository's runtime (a sealed grant is bound to
    its repository: its policy template and roster are that repository's). A run of a repository this process
    does not serve is refused (EnvelopeError), never bound through another repository's runtime. Both transports
    bind a run through it (stdio at start, ``/mcp`` at a run's first request)."""
    first = next(iter(runtimes.values()))
    binding = await bind_run(first, token)
    if binding is None:
        return None
    grant = binding.grant
    runtime = runtimes.get(grant.repo)
    if runtime is None:
        raise EnvelopeError(Envelope(
            error="invalid_input",
            message=f"run {grant.run_id} acts for {grant.repo}, which this foreman mcp does not serve"
            f" (it serves {', '.join(runtimes)})",
            remediate=f"start foreman mcp for the run's repository: --repository {grant.repo} (listed in"
            " [[repositories]]), or add it to [[repositories]]",
            exact_next_action=f"foreman --repository {grant.repo} mcp",
            details={"run_id": grant.run_id, "repository": grant.repo, "served": list(runtimes)},
        ))
    if runtime is not first:
        binding = await bind_run(runtime, token)
        if binding is None:
            return None
    return runtime, binding


async def serve_stdio(settings: Settings, caller: Caller | None = None, *, run_token: str | None = None) -> int:
    """Serve MCP on stdin/stdout until the client closes stdin. Logs go to stderr.

    With ``caller`` (an ``[mcp.tokens]`` identity) the session is as it always was; with ``run_token`` it is bound
    to that run (:func:`bind_run`); a run token no run has is refused (exit 2) before anything is served. A run
    token that is not UTF-8 names no run: exit 2 at once (the caller prints the one line that says so). A run of a
    repository not served here raises EnvelopeError (the caller prints the refusal).
    """
    if caller is None and (run_token is None or _utf8(run_token) is None):
        return 2
    keys = settings.repository_keys() if caller is None else repositories_of(settings, caller.login)
    async with open_runtimes(settings, keys) as runtimes:
        runtime = next(iter(runtimes.values()))
        if caller is None:
            bound = await run_binding_of(runtimes, run_token)
            if bound is None:
                log.error("mcp: %s is not the token of any run; start one with `foreman run start`", TOKEN_ENV)
                return 2
            runtime, binding = bound
            server = binding.build_server(runtime)
            serving = f"run {binding.grant.run_id} of {binding.caller.login} (#{binding.grant.issue_number})"
            count = len(binding.tools())
        else:
            doors = {key: RepositoryDoor(rt, caller_for(rt.settings, caller.login, "mcp"))
                     for key, rt in runtimes.items()}
            runtime = next(iter(runtimes.values()))
            server = build_server(runtime, doors[runtime.settings.repo_key].caller, doors=doors)
            serving = f"{caller.login} ({', '.join(sorted(caller.roles)) or 'no roster role'})"
            count = len(offered_tools(caller))
        log.info("mcp: serving %s on %s over stdio; %d tools", serving, ", ".join(runtimes), count)
        async with _wire_stdin() as lines, stdio_server(stdin=cast(Any, lines)) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    return 0


# --- stdin lines the SDK cannot parse ---------------------------------------------------------------------------------

#: ``_meta`` key of a tool call whose arguments the SDK's JSON parser refused; its value says why.
UNREADABLE_META = "foreman/unreadable_arguments"
_MAX_INT_DIGITS = 4300  # Python's int/str conversion limit (and the SDK parser's)


class _HugeInteger(ValueError):
    pass


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise _HugeInteger(text[:1])
    return int(text)


#: What can make the SDK's parser refuse a line: a surrogate escape (``\ud800``) or a run of more than 4,300 digits.
_MAYBE_UNREADABLE = re.compile(r"\\u[dD][89a-fA-F]|(?<![0-9])[0-9]{4301}")  # one scan per digit run


def needs_a_look(line: str) -> bool:
    """True when the SDK's parser might refuse ``line`` (:func:`readable` has work to do); a C-speed check."""
    return line.count("[") + line.count("{") > MAX_NESTING or _MAYBE_UNREADABLE.search(line) is not None


def readable(line: str) -> str:
    """A line (stdio) or body (HTTP) the SDK reads. A ``tools/call`` request its JSON parser refuses (an integer of
    more than 4,300 digits, a lone surrogate escape, nesting of hundreds of levels) would get no answer at all over
    stdio and an uncorrelated parse error over HTTP; it is passed on with its arguments replaced by the
    ``UNREADABLE_META`` marker, so the client gets ``invalid_input`` for its request. Anything else is passed on as
    it came."""
    if not needs_a_look(line):
        return line  # the common case: nothing the SDK's parser refuses, so it parses the line once, itself
    try:
        types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        return line
    except Exception:  # noqa: S110 - whatever the SDK refuses is looked at below
        pass
    why = "a lone surrogate in a string"
    read = line  # what is read below: the line, or its collapsed form (only the repaired call is passed on)
    shallow = collapsed(line)
    if shallow is not None and shallow != line:
        why, read = f"nested more than {MAX_NESTING} levels deep", shallow
    try:
        doc = json.loads(read, parse_int=_bounded_int)
    except _HugeInteger:
        why = "an integer of more than 4,300 digits"
        try:
            doc = json.loads(read, parse_int=lambda text: 0 if len(text) > _MAX_INT_DIGITS else int(text))
        except (ValueError, RecursionError):
            return line
    except (ValueError, RecursionError):
        return line
    params = doc.get("params") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("method") != "tools/call" or not isinstance(params, dict):
        return line
    name = params.get("name")
    repaired = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": doc.get("id"),
            "method": "tools/call",
            "params": {
                "name": name if isinstance(name, str) else "",
                "arguments": {},
                "_meta": {UNREADABLE_META: why},
            },
        }
    )
    try:
        types.jsonrpc_message_adapter.validate_json(repaired, by_name=False)
    except Exception:  # the id or the name itself is unreadable: the SDK's own handling
        return line
    return repaired + "\n"


async def _readable_lines(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield readable(line)


@asynccontextmanager
async def _wire_stdin() -> AsyncIterator[AsyncIterable[str]]:
    """The wire's stdin as lines for the SDK's stdio transport (through :func:`readable`). While serving, fd 0
    points at the null device (as the SDK does for the stdin it claims), so children read EOF, never the wire."""
    wire = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    # closefd=False: a worker thread may still block reading it after the session ends; it is never recycled.
    text = io.TextIOWrapper(os.fdopen(wire, "rb", closefd=False), encoding="utf-8", errors="replace")
    try:
        yield _readable_lines(anyio.wrap_file(text))
    finally:
        os.dup2(wire, 0)


def token_from_environment() -> str | None:
    return os.environ.get(TOKEN_ENV)
