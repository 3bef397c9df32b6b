"""`foreman emulator`: the bundled Gitea emulator with a demo repository, to follow docs/operating.md by hand."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import signal
import sys
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

from bot.config_writer import merged, write_config
from bot.demo import demo_config, scratch_root, seed_demo
from bot.demo_harness import AUTHOR, LIFE_ROSTER, LIFE_USERS, OWNER, REPO, USERS
from bot.emulator import Emulator, start_emulator

HOOK_EVENTS = ("issues", "issue_comment", "pull_request", "push")


async def run(out: TextIO, *, host: str, port: int, root: Path, hook_url: str | None, as_json: bool,
              stop: asyncio.Event | None = None) -> int:
    emu = Emulator(root / "gitea")
    users = USERS + LIFE_USERS
    tokens = seed_demo(emu, users)
    secret = secrets.token_hex(24)
    mcp_tokens = {login: f"mcp-{login}-{secrets.token_hex(12)}" for login in LIFE_ROSTER}
    try:
        runner, url = await start_emulator(emu, host, port)
    except OSError as exc:
        await emu.aclose()
        print(json.dumps(listen_refusal("emulator", host, port, exc)), file=sys.stderr)
        return 2
    try:
        if hook_url:
            emu.add_hook(OWNER, REPO, url=hook_url, secret=secret, events=HOOK_EVENTS)
        config = root / "foreman.toml"
        write_config(config, foreman_config(url, tokens, secret, root, mcp_tokens, hook_url),
                     comment=f"written by foreman emulator: `foreman serve --config {config}`")
        config.chmod(0o600)  # it holds the bot's token and the webhook secret
        doc: dict[str, Any] = {
            "url": url,
            "api": f"{url}/api/v1",
            "repository": f"{OWNER}/{REPO}",
            "clone_url": f"{url}/{OWNER}/{REPO}.git",
            "users": [{"login": login, "permission": perm, "role": role, "token": tokens[login]}
                      for login, perm, role in users],
            "webhook": {"secret": secret, "url": hook_url,
                        "add": f"curl -X POST -H 'Authorization: token {tokens['maintainer']}' -H "
                        f"'Content-Type: application/json' {url}/api/v1/repos/{OWNER}/{REPO}/hooks -d "
                        + json.dumps(json.dumps({"type": "gitea", "active": True, "events": list(HOOK_EVENTS),
                                                 "config": {"url": "http://127.0.0.1:8080/webhook",
                                                            "content_type": "json", "secret": secret}}))},
            "mcp_token": mcp_tokens[AUTHOR],
            "mcp_tokens": mcp_tokens,
            "config": str(config),
            "root": str(root),
        }
        if as_json:
            out.write(json.dumps(doc, sort_keys=True) + "\n")
        else:
            out.write(_text(doc))
        out.flush()
        stopped = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        await stopped.wait()
    finally:
        await runner.cleanup()
        await emu.aclose()
    return 0


def main(*, host: str, port: int, root: Path | None, hook_url: str | None, as_json: bool) -> int:
    """``foreman emulator``: until SIGINT/SIGTERM. Its files go to ``root`` (default: a fresh temporary folder).

    It serves ``demo/widgets`` (real bare git repository, the status labels, a maintainer, a controller, an author
    and the bot account, each with an API token) on ``host``/``port``, and writes a ``foreman.toml`` next to its
    files that points `foreman serve` at it. With ``hook_url`` the repository gets a signed webhook to that
    foreman. Nothing here changes the emulator; it uses its public setup API and ``start_emulator``.
    """
    folder = root if root is not None else scratch_root("foreman-emulator-")
    folder.mkdir(parents=True, exist_ok=True)
    return asyncio.run(run(sys.stdout, host=host, port=port, root=folder.resolve(), hook_url=hook_url,
                           as_json=as_json))


def foreman_config(gitea_url: str, tokens: dict[str, str], secret: str, root: Path, mcp_tokens: dict[str, str],
                   hook_url: str | None) -> dict[str, Any]:
    """The foreman.toml for this emulator: the demo's, with the whole roster (controller, author, reviewer and merger,
    each with its own Gitea and MCP token, so a review and a merge are posted as their identities), and ``serve``
    listening where ``hook_url`` sends (its port and path; its host when that is an IP address) so the hook reaches
    it as written."""
    document = merged(demo_config(gitea_url, tokens, secret, root, mcp_tokens[AUTHOR]), {
        "roster": LIFE_ROSTER,
        "gitea": {"identity_tokens": {login: tokens[login] for login in LIFE_ROSTER}},
        "mcp": {"tokens": {token: login for login, token in mcp_tokens.items()}},
    })
    if hook_url:
        return merged(document, listen_for(hook_url))
    return document


def listen_for(hook_url: str) -> dict[str, Any]:
    """The ``[server]`` and ``[webhook]`` keys under which a foreman receives what is sent to ``hook_url``."""
    parts = urlsplit(hook_url)
    server: dict[str, Any] = {"port": parts.port or (443 if parts.scheme == "https" else 80)}
    try:
        server["host"] = str(ipaddress.ip_address(parts.hostname or ""))
    except ValueError:
        pass  # a name (localhost, a host name): keep the default loopback address, say so in the config's comment
    return {"server": server, "webhook": {"path": parts.path or "/webhook"}}


def _text(doc: dict[str, Any]) -> str:
    lines = [
        f"foreman emulator: Gitea API at {doc['api']} (files in {doc['root']})",
        f"repository {doc['repository']} (clone {doc['clone_url']}), labels status:*",
        "users (login, permission, role, API token):",
        *(f"  {u['login']:<15} {u['permission']:<6} {u['role']:<40} {u['token']}" for u in doc["users"]),
        f"webhook secret: {doc['webhook']['secret']}"
        + (f" (hook to {doc['webhook']['url']} added)" if doc["webhook"]["url"] else ""),
        "foreman MCP tokens (login, bearer token for /mcp):",
        *(f"  {login:<15} {token}" for login, token in doc["mcp_tokens"].items()),
        f"a foreman config for it: {doc['config']}",
        f"  foreman serve --config {doc['config']}",
    ]
    if not doc["webhook"]["url"]:
        lines += ["add the webhook to a running foreman (or start with --hook-url URL):", f"  {doc['webhook']['add']}"]
    lines.append("stop with Ctrl-C")
    return "\n".join(lines) + "\n"


def listen_refusal(what: str, host: str, port: int, exc: OSError) -> dict[str, Any]:
    """The one line printed when a listener cannot bind (a taken port, a host that is not ours)."""
    reason = exc.strerror or type(exc).__name__
    return {
        "error": "unavailable",
        "key": "server.port" if what == "serve" else "--port",
        "message": f"foreman {what} cannot listen on {host}:{port}: {reason}",
        "remediate": "Stop what holds the port, or choose another one"
        + (" (server.port, or FOREMAN_SERVER__PORT)." if what == "serve" else " (--port)."),
        "exact_next_action": f"run foreman {what} again with a free port",
    }
