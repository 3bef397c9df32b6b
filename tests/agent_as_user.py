"""An author agent as a deployment runs it: on a Unix user of its own, holding only the URL of ``/mcp``, its token
(``FOREMAN_MCP_TOKEN``) and the worktree it is given. Run by tests/test_agent_unix_user.py through ``runuser``.

``python agent_as_user.py work URL ISSUE``: waits for its lease and worktree, locks, writes a file, publishes and
opens the pull request, printing each answer as one JSON line. ``python agent_as_user.py attack URL JSON``: replays
the bypasses of issue 28 with what this user can reach (the paths in JSON), printing what each gave.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
import sys
import time
import urllib.error
import urllib.request
from typing import Any

#: Standard library only: the agent's Python is the system's, with nothing of foreman or its virtualenv.
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


class McpHttpSession:
    """The smallest MCP client over Streamable HTTP: initialize, then one POST per call, with the session id."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.headers = {**HEADERS, "Authorization": f"Bearer {token}"}
        self.next_id = 1

    def send(self, message: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
        request = urllib.request.Request(self.url, data=json.dumps(message).encode(),  # noqa: S310 (loopback)
                                         headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (a loopback test URL)
                body = response.read()
                return int(response.status), dict(response.headers), json.loads(body) if body else None
        except urllib.error.HTTPError as exc:
            return int(exc.code), dict(exc.headers), json.loads(exc.read() or b"null")

    def open(self) -> None:
        status, headers, doc = self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "agent", "version": "0"}}})
        if status != 200:
            raise RuntimeError(f"initialize answered {status}: {doc}")
        self.headers["Mcp-Session-Id"] = headers["mcp-session-id"] if "mcp-session-id" in headers \
            else headers["Mcp-Session-Id"]
        self.headers["MCP-Protocol-Version"] = doc["result"]["protocolVersion"]
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        self.next_id += 1
        status, _, doc = self.send({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                                    "params": {"name": tool, "arguments": arguments}})
        if status != 200 or "result" not in doc:
            return {"is_error": True, "http_status": status, "answer": doc}
        result = doc["result"]
        return {**(result.get("structuredContent") or {}), "is_error": bool(result.get("isError"))}


def say(what: str, doc: Any) -> None:
    print(json.dumps({"step": what, "doc": doc}), flush=True)


def work(url: str, issue: int) -> int:
    session = McpHttpSession(url, os.environ["FOREMAN_MCP_TOKEN"])
    session.open()
    say("context", session.call("gitea_get_runtime_context"))
    deadline = time.monotonic() + 120
    while True:  # the service allocates and bootstraps by itself; the agent follows exact_next_action
        locked = session.call("gitea_lock_issue", issue_number=issue)
        if not locked["is_error"]:
            break
        if time.monotonic() > deadline:
            say("lock", locked)
            return 1
        time.sleep(0.5)
    say("lock", locked)
    worktree = os.environ["AGENT_WORKTREE"] if "AGENT_WORKTREE" in os.environ else worktree_of(locked)
    with open(os.path.join(worktree, "agent-note.txt"), "w", encoding="utf-8") as handle:
        handle.write(f"written by uid {os.getuid()}\n")
    say("wrote", {"path": worktree, "uid": os.getuid()})
    published = session.call("gitea_publish_worktree", issue_number=issue, message=f"Work on #{issue}",
                              idempotency_key=f"publish-{issue}")
    say("publish", published)
    opened = session.call("gitea_open_pull_request", issue_number=issue, idempotency_key=f"pr-{issue}")
    say("open_pr", opened)
    return 0 if not published["is_error"] and not opened["is_error"] else 1


def worktree_of(locked: dict[str, Any]) -> str:
    """The worktree path the lock's answer names (wherever it is in the document)."""
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("worktree_path", "path") and isinstance(item, str) and "/branches/" in item:
                    found.append(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
    walk(locked)
    if not found:
        raise RuntimeError(f"the lock names no worktree: {locked}")
    return found[0]


def attempt(what: str, action: Any) -> None:
    try:
        result = action()
    except Exception as exc:  # what the attempt met is the result
        say(what, {"refused": True, "exception": type(exc).__name__, "detail": str(exc)[:200]})
    else:
        say(what, {"refused": False, "result": result})


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 (loopback)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 (a loopback test URL)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def attack(base: str, paths: dict[str, str]) -> int:
    # 1 and 2: the reviewer's MCP token and the identities' Gitea tokens, from the config and the credential files.
    for key in ("config", "mcp_token_file", "identity_token_file", "webhook_secret_file"):
        attempt(f"read {key}", lambda key=key: open(paths[key], encoding="utf-8").read()[:20])
    # 3 and 4: another author's lease moved to itself, a row put in the outbox: the database opened for writing.
    def write_database() -> str:
        with sqlite3.connect(f"file:{paths['database']}?mode=rw", uri=True, timeout=2) as conn:
            conn.execute("UPDATE leases SET owner = 'author-1'")
            conn.execute("INSERT INTO outbox (idempotency_key) VALUES ('forged')")
        return "written"
    attempt("write database", write_database)
    attempt("list checkout .git", lambda: os.listdir(paths["control_git"]))
    # A guessed reviewer token over /mcp, and a webhook signed with a guessed secret.
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "guess", "version": "0"}}}).encode()
    for guess in ("tok-reviewer", "tok-reviewer-1", paths["reviewer_login"]):
        status = post(f"{base}/mcp", body, {"Authorization": f"Bearer {guess}", "Content-Type": "application/json",
                                            "Accept": "application/json, text/event-stream"})
        say("guess reviewer token", {"status": status})
    hook = json.dumps({"action": "closed", "number": 1, "issue": {"number": 1}}).encode()
    signature = hmac.new(b"guessed-secret", hook, hashlib.sha256).hexdigest()
    status = post(f"{base}/webhook", hook, {"Content-Type": "application/json", "X-Gitea-Event": "issues",
                                            "X-Gitea-Delivery": "forged-1", "X-Gitea-Signature": signature})
    say("forged webhook", {"status": status})
    return 0


def main(argv: list[str]) -> int:
    command, url, argument = argv[1], argv[2], argv[3]
    if command == "work":
        return work(f"{url}/mcp", int(argument))
    return attack(url, json.loads(argument))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
