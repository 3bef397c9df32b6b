"""`foreman mcp`: the MCP server over stdio for the identity of its token, or bound to a run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from typing import Any

from bot.cli.common import EXIT_OK, EXIT_USAGE
from bot.config import Settings


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
    return asyncio.run(serve_stdio(settings, caller))


#: JSON-RPC error code of a refused ``foreman mcp`` start (the implementation-defined server error range).
MCP_REFUSED_CODE = -32001


def answer_refusal_on_the_wire(refusal: dict[str, Any], *, timeout_s: float = 10.0, max_bytes: int = 1 << 20) -> None:
    """An MCP client shows a JSON-RPC error to its first request, but only "connection closed" for a server that
    exits: answer that request (normally ``initialize``) with the refusal, then let the process exit. Reads at most
    ``max_bytes`` of standard input for at most ``timeout_s``; nothing is written when no request comes (EOF)."""
    import os
    import select
    import time

    deadline = time.monotonic() + timeout_s
    fd = sys.stdin.fileno() if sys.stdin is not None else -1
    pending, read = b"", 0
    while fd >= 0 and read < max_bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        read += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict) and "id" in message and "method" in message:
                error = {"code": MCP_REFUSED_CODE, "message": f"{refusal['error']}: {refusal['message']}",
                         "data": refusal}
                with contextlib.suppress(OSError):
                    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}) + "\n")
                    sys.stdout.flush()
                return


def _mcp_token_refusal(message: str) -> dict[str, Any]:
    return {
        "error": "invalid_config",
        "key": "mcp.tokens",
        "message": message,
        "remediate": "Start foreman mcp with FOREMAN_MCP_TOKEN set to a token listed in [mcp.tokens], or to the "
        "token `foreman run start` printed for a run.",
        "exact_next_action": "set FOREMAN_MCP_TOKEN to a configured token and start foreman mcp again",
    }
