"""`foreman mcp --url URL`: an MCP stdio server that forwards every message to foreman's Streamable HTTP `/mcp`.

For MCP hosts that only start stdio servers. Standard library only: it reads no config file, opens no database and
imports nothing of the service (``python -m bot mcp --url ...`` loads this module, ``bot/__main__.py`` and the
standard-library-only ``bot.core.json_depth``, nothing else of the package). The agent holds only the endpoint's
URL and its own token (``FOREMAN_MCP_TOKEN``).

The wire, as the MCP specification (2025-06-18) defines its two transports:

- stdin: newline-delimited JSON-RPC messages from the host. Each one is POSTed to the URL with
  ``Authorization: Bearer <token>``, ``Content-Type: application/json`` and ``Accept: application/json,
  text/event-stream``. The ``initialize`` request is sent alone (nothing else is read until it is answered); its
  answer's ``Mcp-Session-Id`` header and ``protocolVersion`` go on every later request (``Mcp-Session-Id``,
  ``MCP-Protocol-Version``). Notifications and responses are sent in stdin's order; requests run concurrently
  (at most :data:`MAX_IN_FLIGHT` at once; stdin is not read while that many are unanswered).
- stdout: every JSON-RPC message the server answers, one per line: an ``application/json`` body (one message or a
  batch) or each ``data:`` event of a ``text/event-stream`` body. Whole lines, under a lock.
- A request the server refuses (any status but 2xx: 401, 403, 404, 413, 429 ...) or cannot be reached for is
  answered on stdout with a JSON-RPC error (:data:`REFUSED_CODE`, ``"<error>: <message>"``, ``data`` the server's
  JSON body, or ``{"status", "body"}``), so the host shows the reason instead of waiting. A session the server no
  longer knows (404 to a request that carried the session id, e.g. after its idle timeout) is opened again with the
  host's own ``initialize`` and the request is sent once more.
- stdin's end (or SIGTERM): the requests in flight are answered, the session is ended with ``DELETE``, exit 0.

Diagnostics are single lines on stderr; the token is never printed. A missing token or an unusable URL is refused at
start: one JSON line on stderr, the host's first request answered with the same refusal, exit 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import Any

from bot.mcp_bridge.bridge import Bridge
from bot.mcp_bridge.refusals import answer_refusal_on_the_wire, endpoint_of, refuse, start_refusal, token_problem
from bot.mcp_bridge.upstream import Upstream, refusal_of, sse_events
from bot.mcp_bridge.wire import EXIT_OK, MAX_LINE_BYTES, REFUSED_CODE, TOKEN_ENV, URL_ENV, Refused, Stdout, say

# --- the command line -------------------------------------------------------------------------------------------------

#: The options of `foreman` before its command that take a value (a command line is read past them).
_GLOBAL_VALUED = frozenset({"--config", "--repository"})


def mcp_arguments(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``mcp`` when ``mcp`` is the command of the ``foreman`` command line ``argv``, else None."""
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg in _GLOBAL_VALUED:
            index += 2
        elif arg.startswith("-"):
            index += 1
        else:
            return list(argv[index + 1:]) if arg == "mcp" else None
    return None


def wants_bridge(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether the ``foreman`` command line ``argv`` asks for the bridge: ``mcp`` with ``--url`` (or
    ``FOREMAN_MCP_URL`` set), and not ``--help`` (which the full command line answers)."""
    rest = mcp_arguments(argv)
    if rest is None or "-h" in rest or "--help" in rest:
        return False
    return any(arg == "--url" or arg.startswith("--url=") for arg in rest) or bool(environ.get(URL_ENV))


class _UsageError(Exception):
    """A bridge command line that cannot be read."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing its usage and exiting (a refusal is one JSON line)."""

    def error(self, message: str) -> Any:  # argparse's signature is NoReturn; raising keeps it so
        raise _UsageError(message)


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = _Parser(prog="foreman mcp", add_help=False)
    parser.add_argument("--url", action="append", default=[])
    parser.add_argument("--config", action="append", default=[])
    parser.add_argument("--repository", action="append", default=[])
    rest = mcp_arguments(argv)
    args = parser.parse_args([] if rest is None else rest)
    if len(args.url) > 1:
        raise _UsageError("--url given more than once; give it once")
    return args


# --- entry point ------------------------------------------------------------------------------------------------------


class _Terminated(Exception):
    """SIGTERM: the host is stopping the bridge (the session is still ended)."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """``foreman [...] mcp --url URL``: bridge stdio to the URL (or ``FOREMAN_MCP_URL``) with ``FOREMAN_MCP_TOKEN``
    until stdin ends. ``argv`` is the whole ``foreman`` command line (default: ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    try:
        args = _parse(argv)
    except _UsageError as exc:
        return refuse(start_refusal(
            "invalid_input", "--url", f"foreman mcp: {exc}",
            "Run it as: foreman mcp --url http://HOST:PORT/mcp (the token in FOREMAN_MCP_TOKEN).",
            "start foreman mcp --url URL again"))
    ignored = [arg for arg in argv if arg.split("=", 1)[0] in _GLOBAL_VALUED]  # before mcp or after it
    return serve(args.url[0] if args.url else None, environ, ignored=ignored)


def serve(url: str | None, environ: Mapping[str, str], *, ignored: Sequence[object] = ()) -> int:
    """Bridge stdio to ``url`` (None: ``FOREMAN_MCP_URL``) with the token in ``FOREMAN_MCP_TOKEN``; exit 0 at
    stdin's end, 2 when the URL or the token cannot be used (refused at start, before anything is sent)."""
    url = url or environ.get(URL_ENV) or ""
    endpoint = endpoint_of(url) if url else f"no URL: give --url or set {URL_ENV}"
    if isinstance(endpoint, str):
        return refuse(start_refusal("invalid_input", "--url", endpoint,
                                      "Give the URL of foreman serve's MCP endpoint, e.g. --url http://foreman:8080/mcp.",
                                      "start foreman mcp --url http://HOST:PORT/mcp again"))
    token = environ.get(TOKEN_ENV)
    problem = token_problem(token)
    if problem is not None or token is None:
        return refuse(start_refusal("invalid_config", TOKEN_ENV, problem or f"{TOKEN_ENV} is not set",
                                      f"Set {TOKEN_ENV} to this agent's own foreman token (an operator issues it).",
                                      f"set {TOKEN_ENV} and start foreman mcp --url URL again"))
    if ignored:
        say("--config and --repository are not read with --url: the service holds the configuration")
    bridge = Bridge(Upstream(endpoint, token), Stdout(sys.stdout.buffer))
    say(f"bridging stdio to {endpoint.shown}")
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        bridge.run(sys.stdin.buffer)
    except (_Terminated, KeyboardInterrupt):
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the session is ended once, whatever comes next
        bridge.close()
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


#: What callers of the bridge use (bot/__main__.py, bot/cli, tests/test_mcp_bridge.py).
__all__ = [
    "MAX_LINE_BYTES",
    "REFUSED_CODE",
    "TOKEN_ENV",
    "URL_ENV",
    "Refused",
    "answer_refusal_on_the_wire",
    "endpoint_of",
    "main",
    "mcp_arguments",
    "refusal_of",
    "serve",
    "sse_events",
    "wants_bridge",
]
