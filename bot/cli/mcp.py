"""`foreman mcp`: the MCP server over stdio for the identity of its token, or bound to a run."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from bot.cli.common import EXIT_OK, EXIT_USAGE
from bot.cli.parsing import Commands
from bot.config import Settings
from bot.mcp_bridge import REFUSED_CODE as MCP_REFUSED_CODE
from bot.mcp_bridge import answer_refusal_on_the_wire

__all__ = ["MCP_REFUSED_CODE", "answer_refusal_on_the_wire", "cmd_mcp"]

#: What the in-process server says on stderr when it starts: it is an operator's tool now.
OPERATOR_NOTICE = (
    "foreman mcp: serving in-process (an operator's tool: it reads the config and opens the database); agents "
    "connect to foreman serve's /mcp, directly or through `foreman mcp --url URL`"
)


def cmd_mcp(settings: Settings, args: argparse.Namespace) -> int:
    """MCP over stdio for the identity of FOREMAN_MCP_TOKEN, or bound to the run of a run token (docs/grants.md);
    without a known token, refuse to start (exit 2)."""
    from bot.core.errors import EnvelopeError
    from bot.mcp_server import IdentityError, resolve_identity, serve_stdio, token_from_environment
    from bot.verbs.runs.start import is_run_token

    token = token_from_environment()
    try:
        caller = resolve_identity(settings, token)
    except IdentityError as exc:
        if not is_run_token(token):
            refusal = _mcp_token_refusal(str(exc))
            print(json.dumps(refusal), file=sys.stderr)
            answer_refusal_on_the_wire(refusal)
            return EXIT_USAGE
        if _is_utf8(token):  # one that is not names no run: refused below, with one line
            print(OPERATOR_NOTICE, file=sys.stderr, flush=True)
        try:
            code = asyncio.run(serve_stdio(settings, run_token=token))
        except EnvelopeError as refused:  # a run of a repository this process does not serve
            refusal = refused.envelope.to_dict()
            print(json.dumps(refusal), file=sys.stderr)
            answer_refusal_on_the_wire(refusal)
            return EXIT_USAGE
        if code != EXIT_OK:
            message = "FOREMAN_MCP_TOKEN is not the token of any run; `foreman run start` prints a run's token"
            refusal = _mcp_token_refusal(message)
            print(json.dumps(refusal), file=sys.stderr)
            answer_refusal_on_the_wire(refusal)
        return code
    print(OPERATOR_NOTICE, file=sys.stderr, flush=True)
    return asyncio.run(serve_stdio(settings, caller))


def _is_utf8(token: str | None) -> bool:
    try:
        (token or "").encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _mcp_token_refusal(message: str) -> dict[str, Any]:
    return {
        "error": "invalid_config",
        "key": "mcp.tokens",
        "message": message,
        "remediate": "Start foreman mcp with FOREMAN_MCP_TOKEN set to a token listed in [mcp.tokens], or to the "
        "token `foreman run start` printed for a run.",
        "exact_next_action": "set FOREMAN_MCP_TOKEN to a configured token and start foreman mcp again",
    }


def register(commands: Commands) -> None:
    """``foreman mcp``."""
    mcp = commands.add("mcp", "MCP over stdio for the identity of $FOREMAN_MCP_TOKEN (see docs/mcp.md): with --url, a "
                       "bridge to the service's /mcp (what agents run); without, in-process (an operator's tool)")
    mcp.add_argument("--url", metavar="URL",
                     help="foreman serve's MCP endpoint, e.g. http://foreman:8080/mcp (default: $FOREMAN_MCP_URL): "
                     "forward stdio there with $FOREMAN_MCP_TOKEN as the bearer token; reads no config or database")
