"""Agents hold only their own token: a real `foreman serve` (as the service's user, ``UMask=0077``) and an author
agent on a Unix user of its own, created here, holding the URL of ``/mcp``, its token and its worktree.

The agent (tests/agent_as_user.py, the system's Python with the standard library only) is allocated work by the
service, locks, writes a file as its own user, publishes and opens the pull request through ``/mcp``. As the same
user, each bypass of issue 28 fails: the config, the token and secret files and the database cannot be read or
opened, the control checkout's ``.git`` cannot be listed, a guessed reviewer token is refused 401, a webhook signed
with a guessed secret is refused.
"""

from __future__ import annotations

import asyncio
import grp
import hashlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.config_writer import write_config
from tests.conftest import REPO_ROOT
from tests.gitea_fixtures import OWNER, REPO, LiveEmulator, live_emulator, seed_foreman
from tests.serve_support import serve_process
from tests.support import HANG_S, SECRET, eventually, free_port, serve_config

SYSTEM_PYTHON = "/usr/bin/python3"
ROSTER = {"author-1": ["author"], "rev-1": ["reviewer"], "merge-1": ["merger"]}
GITEA_TOKENS = {login: f"tok-gitea-{login}-{secrets.token_hex(4)}" for login in ROSTER}
AGENT_TOKEN = f"tok-agent-{secrets.token_hex(16)}"
REVIEWER_TOKEN = f"tok-rev-{secrets.token_hex(16)}"
STEP_S = 180.0  # a hang detector: the agent's whole life on a loaded machine


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "creating a Unix user for the agent needs root (CI runs as root)"
    for tool in ("useradd", "userdel", "runuser"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"{SYSTEM_PYTHON} (the agent's Python) is not installed"
    return None


pytestmark = [pytest.mark.skipif(_why_not() is not None, reason=_why_not() or ""), pytest.mark.process,
              pytest.mark.slow]


@contextmanager
def agent_user() -> Iterator[str]:
    """A Unix user (and its own group) of the agent, removed afterwards."""
    name = f"fa{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                    "--user-group", name], check=True, capture_output=True, timeout=HANG_S)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True, timeout=HANG_S)


def as_agent(user: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``tests/agent_as_user.py`` run as ``user`` by the system's Python, its standard library only."""
    script = Path(REPO_ROOT) / "tests" / "agent_as_user.py"
    return subprocess.run(
        [shutil.which("runuser") or "runuser", "-u", user, "--", SYSTEM_PYTHON, "-I", "-B", "-c", script.read_text(),
         *args],
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})}, cwd="/", capture_output=True, text=True,
        timeout=STEP_S, check=False)


def steps(done: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, (done.returncode, done.stdout, done.stderr)
    return lines


async def label_ready(live: LiveEmulator, number: int) -> None:
    async with aiohttp.ClientSession() as http, http.post(
        f"{live.base_url}/api/v1/repos/{OWNER}/{REPO}/issues/{number}/labels",
        json={"labels": ["status:ready"]}, headers=live.auth("alice"),
    ) as resp:
        assert resp.status == 200, await resp.text()


async def test_an_agent_on_its_own_unix_user_works_through_mcp_and_reaches_nothing_else() -> None:
    scratch = Path(tempfile.mkdtemp(prefix="foreman-agent-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    os.chmod(scratch, 0o711)  # noqa: S103 (search only:) the agent may pass through to its worktree, never list what is here
    try:
        with agent_user() as user:
            await _agent_life(scratch, user)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


async def _agent_life(scratch: Path, user: str) -> None:
    credentials = scratch / "credentials"
    credentials.mkdir(mode=0o700)
    (credentials / "rev-1.mcp").write_text(REVIEWER_TOKEN)
    (credentials / "rev-1.gitea").write_text(GITEA_TOKENS["rev-1"])
    (credentials / "webhook-secret").write_text(SECRET)
    port = free_port()
    database = scratch / "var" / "foreman.db"
    async with live_emulator() as live:
        emu = live.emulator
        seed_foreman(emu, GITEA_TOKENS, writers=ROSTER)
        number = emu.create_issue(OWNER, REPO, title="Work for the agent", author="alice").number
        config = write_config(scratch / "foreman.toml", serve_config(port, database, live.base_url, scratch, {
            "roster": ROSTER,
            # The agent's token is held only as its digest; the reviewer's is a credential file.
            "mcp": {"token_digests": {"author-1": "sha256:" + hashlib.sha256(AGENT_TOKEN.encode()).hexdigest()},
                    "token_files": {"rev-1": credentials / "rev-1.mcp"}},
            "gitea": {"identity_token_files": {"rev-1": credentials / "rev-1.gitea"}},
            "bootstrap": {"on_allocate": "run", "worktree_groups": {"author-1": user}},
        }))
        os.chmod(config, 0o600)
        emu.add_hook(OWNER, REPO, url=f"http://127.0.0.1:{port}/webhook", secret=SECRET,
                     events=["issues", "issue_comment", "pull_request"])
        async with serve_process(scratch, config=config, umask=0o077, serve=True, graceful=True) as served:
            url = served.url
            await label_ready(live, number)
            done = await asyncio.to_thread(as_agent, user, "work", url, str(number),
                                           env={"FOREMAN_MCP_TOKEN": AGENT_TOKEN})
            answers = {step["step"]: step["doc"] for step in steps(done)}
            assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
            assert answers["context"]["identity"]["login"] == "author-1", answers["context"]
            worktree = Path(answers["wrote"]["path"])
            note = worktree / "agent-note.txt"
            assert note.stat().st_uid == pwd.getpwnam(user).pw_uid  # written by the agent's own user
            assert note.stat().st_gid == grp.getgrnam(user).gr_gid  # in the worktree's group (set-group-id)
            assert not answers["publish"]["is_error"] and not answers["open_pr"]["is_error"], answers
            [pull] = await live.client().list_pulls(state="all")
            assert f"#{number}" in f"{pull.title} {pull.body}", pull
            paths = {
                "config": str(config),
                "mcp_token_file": str(credentials / "rev-1.mcp"),
                "identity_token_file": str(credentials / "rev-1.gitea"),
                "webhook_secret_file": str(credentials / "webhook-secret"),
                "database": str(database),
                "control_git": str(scratch / "checkouts" / OWNER / REPO / ".git"),
                "reviewer_login": "rev-1",
            }
            # The review queue hands the PR's review to rev-1 by itself (off the agent's path): settled first.
            await eventually(lambda: any(row[1:] == ("rev-1", "live") for row in _leases(database)),
                             "the review queue leased the review to rev-1", detail=lambda: _leases(database))
            leases_before = _leases(database)
            attacked = await asyncio.to_thread(as_agent, user, "attack", url, json.dumps(paths))
        outcomes = steps(attacked)
        for outcome in outcomes:
            step, doc = outcome["step"], outcome["doc"]
            if step.startswith(("read ", "write ", "list ")):
                assert doc["refused"] and doc["exception"] in ("PermissionError", "OperationalError"), outcome
            elif step == "guess reviewer token":
                assert doc["status"] == 401, outcome
            elif step == "forged webhook":
                assert doc["status"] in (401, 403), outcome
        assert {o["step"] for o in outcomes} >= {"read config", "read mcp_token_file", "read identity_token_file",
                                                  "read webhook_secret_file", "write database",
                                                  "list checkout .git", "guess reviewer token", "forged webhook"}
        assert _leases(database) == leases_before  # nothing the agent tried moved a lease
        assert not _outbox_has(database, "forged")


def _leases(database: Path) -> list[tuple[Any, ...]]:
    import sqlite3

    with sqlite3.connect(database) as conn:
        return [tuple(row) for row in conn.execute("SELECT issue_number, owner, status FROM leases ORDER BY id")]


def _outbox_has(database: Path, key: str) -> bool:
    import sqlite3

    with sqlite3.connect(database) as conn:
        return conn.execute("SELECT 1 FROM outbox WHERE idempotency_key = ?", (key,)).fetchone() is not None
