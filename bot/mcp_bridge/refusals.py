"""Refusing a start that cannot serve: an unusable URL or token, said on stderr and to the host's first request."""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bot.mcp_bridge.wire import EXIT_USAGE, REFUSAL_WAIT_S, REFUSED_CODE, TOKEN_ENV

# --- refusals ---------------------------------------------------------------------------------------------------------


def start_refusal(error: str, key: str, message: str, remediate: str, next_action: str) -> dict[str, Any]:
    return {"error": error, "key": key, "message": message, "remediate": remediate, "exact_next_action": next_action}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """The server's ``/mcp`` URL, split for http.client; ``shown`` is what diagnostics print (no query string)."""

    https: bool
    host: str
    port: int
    target: str
    shown: str


def endpoint_of(url: str) -> Endpoint | str:
    """The endpoint a URL names, or why it cannot be used (not http or https, no host, a bad port, credentials)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"--url is not a URL ({exc})"
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        return f"--url must be an http:// or https:// URL (got scheme {parts.scheme or 'none'!r})"
    host = parts.hostname
    if not host:
        return "--url names no host"
    if parts.username is not None or parts.password is not None:
        return "--url must not hold credentials; the token goes in FOREMAN_MCP_TOKEN"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        return "--url holds whitespace or control characters"
    https = scheme == "https"
    port = port or (443 if https else 80)
    path = parts.path or "/"
    target = f"{path}?{parts.query}" if parts.query else path
    netloc = f"[{host}]" if ":" in host else host
    return Endpoint(https=https, host=host, port=port, target=target, shown=f"{scheme}://{netloc}:{port}{path}")


def token_problem(token: str | None) -> str | None:
    """Why ``FOREMAN_MCP_TOKEN`` cannot be sent as a bearer token, or None. Never quotes the token."""
    if not token:
        return f"{TOKEN_ENV} is not set; the bridge sends it to the service as the bearer token"
    if not all("!" <= ch <= "~" for ch in token):
        return f"{TOKEN_ENV} holds characters a bearer token cannot carry (spaces, control or non-ASCII characters)"
    return None


def answer_refusal_on_the_wire(
    refusal: dict[str, Any], *, timeout_s: float = REFUSAL_WAIT_S, max_bytes: int = 1 << 20
) -> None:
    """An MCP client shows a JSON-RPC error to its first request, but only "connection closed" for a server that
    exits: answer that request (normally ``initialize``) with the refusal, then let the process exit. Reads at most
    ``max_bytes`` of standard input for at most ``timeout_s``; nothing is written when no request comes (EOF)."""
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
                error = {"code": REFUSED_CODE, "message": f"{refusal['error']}: {refusal['message']}", "data": refusal}
                with contextlib.suppress(OSError):
                    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}) + "\n")
                    sys.stdout.flush()
                return


def refuse(refusal: dict[str, Any]) -> int:
    print(json.dumps(refusal, sort_keys=True), file=sys.stderr, flush=True)
    answer_refusal_on_the_wire(refusal)
    return EXIT_USAGE
