"""The `foreman` commands that read no configuration: `demo`, `emulator` and `token-digest` (bot/cli/__init__.py
runs them before any config is loaded)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bot.cli.common import EXIT_USAGE
from bot.cli.parsing import Commands, add_json, port, seconds


def register(commands: Commands) -> None:
    """``foreman demo``, ``emulator`` and ``token-digest``."""
    demo = commands.add("demo", "run the whole loop against the bundled Gitea emulator in a temporary directory")
    demo.add_argument("--keep", action="store_true", help="keep the temporary directory (config, database, logs)")
    demo.add_argument("--timeout", type=seconds, default=30.0, metavar="S", help="seconds each step may take")
    demo.add_argument("--verbose", action="store_true",
                      help="each step in full, and the evidence comments with their JSON (default: a short timeline)")
    emulator = commands.add(
        "emulator", "serve the bundled Gitea emulator with a demo repository; prints URL, users, tokens"
    )
    emulator.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    emulator.add_argument("--port", type=port, default=3000, help="port to listen on; 0 picks a free one "
                          "(default: %(default)s)")
    emulator.add_argument("--dir", type=Path, metavar="DIR", dest="root",
                          help="keep its files (git repositories, foreman.toml) here (default: a new temporary folder)")
    emulator.add_argument("--hook-url", type=hook_url, metavar="URL",
                          help="add a signed webhook to this foreman's /webhook; the written config's serve listens "
                          "on its port and path")
    add_json(emulator)
    digest = commands.add("token-digest", "print the [mcp.token_digests] entry of a token read from standard input "
                          "(the config then holds only its SHA-256)")
    digest.add_argument("--login", metavar="LOGIN", help="print it as a TOML line for this login")


def cmd_token_digest(login: str | None) -> int:
    """``foreman token-digest``: the digest of the one token on standard input (a trailing newline dropped)."""
    import hashlib

    token = sys.stdin.buffer.read(1 << 16).removesuffix(b"\n").removesuffix(b"\r")
    if not token or any(byte <= 0x20 for byte in token):
        refusal = {"error": "invalid_input",
                   "message": "standard input must hold one token (no spaces or line breaks inside it)",
                   "exact_next_action": 'printf %s "$TOKEN" | foreman token-digest'}
        print(json.dumps(refusal), file=sys.stderr)
        return EXIT_USAGE
    digest = f"sha256:{hashlib.sha256(token).hexdigest()}"
    print(f'"{login}" = "{digest}"' if login else digest)
    return 0


def hook_url(value: str) -> str:
    """``--hook-url``: an http(s) URL with a host (its port, if given, a valid one)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises ValueError on a port that is not one)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a URL foreman can listen for: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s) URL with a host (e.g. "
                                         "http://127.0.0.1:8081/webhook)")
    return value
