"""Shared world for the bootstrap tests: seeded emulator, leases, context, the CLI, byte-for-byte snapshots."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from bot.catalog import open_door
from bot.config import Settings
from bot.config_writer import Document, merged, write_config
from bot.core.bootstrap import branch_for
from bot.gitea import GiteaClient
from bot.verbs.bootstrap import BootstrapContext, BootstrapResult, ensure_control_checkout
from bot.verbs.bootstrap.faults import FAULT_EXIT_CODE, FAULT_PHASE_ENV
from bot.verbs.bootstrap.refusals import refused_result
from bot.verbs.runtime import Caller, VerbRuntime, WorktreeBootstrap, caller_for
from bot.verbs.worktree import BootstrapService
from state.db import Database, utcnow
from state.leases import Lease, LeaseStore
from tests.conftest import REPO_ROOT
from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS, LiveEmulator, live_emulator, scratch_dir
from tests.serve_support import run_foreman
from tests.support import emulator_sections, make_settings, offline_config

ROSTER = {"alice": ["author"], "bob": ["author"], "carol": ["reviewer"], "ctl": ["controller"]}
#: What the repository holds besides the README (nested, binary, and a file that stays untouched).
FILES: dict[str, str | bytes] = {
    "src/app.py": "print('widgets')\n",
    "src/pkg/util.py": "VALUE = 1\n",
    "docs/guide.md": "# Guide\n\nRead me.\n",
    "data/blob.bin": bytes(range(256)) * 4,
    ".gitignore": "*.log\n",
}


def git(cwd: Path, *args: str, check: bool = True) -> str:
    """A git command for the test's own set-up and inspection (never used by the code under test)."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {done.stderr}")
    return done.stdout.strip()


def one_commit_checkout(path: Path) -> Path:
    """A new repository at ``path``: one commit (a README) on main, ``branches/`` excluded (as the control
    checkout's worktrees are)."""
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    (path / "README.md").write_text("# r\n", encoding="utf-8")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "init")
    (path / ".git" / "info" / "exclude").write_text("/branches/\n", encoding="utf-8")
    return path


def tree_snapshot(root: Path, *, skip: frozenset[str] = frozenset()) -> dict[str, str]:
    """Every entry under ``root`` (not following links) with its kind, mode and content hash."""
    found: dict[str, str] = {}
    if not os.path.lexists(root):
        return found
    for current, dirs, names in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(current, root)
        dirs[:] = [d for d in sorted(dirs) if os.path.normpath(os.path.join(rel_dir, d)) not in skip]
        for name in [*dirs, *names]:
            full = os.path.join(current, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel in skip:
                continue
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                found[rel] = f"link {os.readlink(full)}"
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = f"dir {oct(info.st_mode & 0o777)}"
            else:
                digest = hashlib.sha256(Path(full).read_bytes()).hexdigest()
                found[rel] = f"file {oct(info.st_mode & 0o777)} {digest}"
    return found


def checkout_snapshot(checkout: Path) -> dict[str, Any]:
    """The control checkout as AC6 means it: working tree (bytes), HEAD, index, status, default branch."""
    return {
        "tree": tree_snapshot(checkout, skip=frozenset({".git", "branches"})),
        "HEAD": (checkout / ".git" / "HEAD").read_text(encoding="utf-8"),
        "head_sha": git(checkout, "rev-parse", "HEAD"),
        "main": git(checkout, "rev-parse", "refs/heads/main"),
        "index": hashlib.sha256((checkout / ".git" / "index").read_bytes()).hexdigest(),
        "status": git(checkout, "--no-optional-locks", "status", "--porcelain", "--untracked-files=all"),
    }


def worktree_entries(checkout: Path) -> list[dict[str, str]]:
    """``git worktree list --porcelain`` as dicts (the main worktree included)."""
    out = git(checkout, "worktree", "list", "--porcelain")
    entries: list[dict[str, str]] = []
    for block in out.split("\n\n"):
        entry: dict[str, str] = {}
        for line in block.splitlines():
            key, _, value = line.partition(" ")
            entry[key] = value
        if entry:
            entries.append(entry)
    return entries


@dataclass
class BootstrapWorld:
    """The bootstrap tests' world: the seeded emulator with FILES on main, settings, a database and a bootstrap
    context, and no service (tests/world.py's World is the one with a running service)."""

    live: LiveEmulator
    root: Path
    settings: Settings
    db: Database
    ctx: BootstrapContext
    gitea: GiteaClient

    @property
    def checkout(self) -> Path:
        return self.ctx.checkout_path

    @property
    def bare(self) -> Path:
        return self.live.emulator.repo(OWNER, REPO).path

    def issue(self, title: str = "Polish the widgets") -> int:
        return self.live.emulator.create_issue(OWNER, REPO, title=title, author="alice").number

    def branch(self, number: int, title: str = "Polish the widgets") -> str:
        return branch_for(number, title)

    def path(self, number: int, title: str = "Polish the widgets") -> Path:
        return self.checkout / "branches" / self.branch(number, title)

    def main_sha(self) -> str:
        return git(self.bare, "rev-parse", "refs/heads/main")

    def move_main(self) -> str:
        """Someone merges into the default branch on Gitea."""
        return self.live.emulator.create_branch(OWNER, REPO, "main", files={f"merged-{uuid.uuid4().hex[:6]}.txt": "x"})

    async def lease(self, number: int, owner: str = "alice", ttl_s: float = 3600) -> Lease:
        async with self.db.transaction() as conn:
            return await LeaseStore(self.db).acquire(
                conn, repo=self.ctx.repo, issue_number=number, owner=owner, role="author", action="implement",
                ttl=timedelta(seconds=ttl_s), now=utcnow(), actor="ctl", fingerprint=None, request={},
            )

    async def release(self, lease: Lease) -> None:
        async with self.db.transaction() as conn:
            await LeaseStore(self.db).release(conn, lease.lease_id, actor="ctl", reason="test", now=utcnow())

    async def bootstrap(self, number: int, caller: str = "alice", **options: Any) -> BootstrapResult:
        """The bootstrap verb as an MCP call of ``caller`` would run it: through the door."""
        arguments = {"issue_number": number, **{k: v for k, v in options.items() if v is not None}}
        return await bootstrap_through_door(self.ctx, caller_for(self.settings, caller, "mcp"), arguments)


    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.settings.database.path) as conn:
            return conn.execute(sql, params).fetchall()

    def config_file(self, *overrides: Document) -> Path:
        """This world's settings as a foreman.toml for the CLI, ``overrides`` laid over them (written each call)."""
        return write_config(self.root / "foreman.toml", merged(
            offline_config(self.settings.database.path, {"database": {"synchronous": "NORMAL"}}),
            emulator_sections(self.live.base_url),
            {"repository": {"checkout_root": self.settings.repository.checkout_root}, "roster": ROSTER},
            *overrides,
        ))

    async def cli(self, *args: str, env: Mapping[str, str] | None = None) -> tuple[int, dict[str, Any] | None, str]:
        """``python -m bot bootstrap ... --json`` as a separate process: (exit status, JSON doc or None, stderr)."""
        code, out, err = await run_foreman("bootstrap", "--config", str(self.config_file()), "--json", *args,
                                           cwd=REPO_ROOT, env=env)
        return code, json.loads(out) if out.strip() else None, err

    async def cli_dies_after(self, number: int, phase: str) -> None:
        """alice's bootstrap of ``number`` by the CLI, the process dying right after ``phase`` (its fault exit)."""
        code, _, err = await self.cli("--issue", str(number), "--owner", "alice", env={FAULT_PHASE_ENV: phase})
        assert code == FAULT_EXIT_CODE, err[-800:]


@asynccontextmanager
async def open_bootstrap_world(
    *,
    clone: bool = True,
    clone_protocol: str = "http",
    emulator: Mapping[str, Any] | None = None,
    repository: Mapping[str, Any] | None = None,
    token: str | None = None,
    **bootstrap: Any,
) -> AsyncIterator[BootstrapWorld]:
    """A seeded emulator with FILES on main, a database, settings, and (``clone``) the control checkout.

    The control checkout is cloned over git smart HTTP with the bot's token (``clone_protocol="http"``, the
    emulator's ``git http-backend``), as from a real Gitea; ``clone_protocol="file"`` keeps the bare repository's
    ``file://`` URL. ``token`` replaces the bot's token (settings and client); ``repository`` adds keys to
    ``[repository]`` (``clone_url``, ``clone_url_rewrite``)."""
    async with live_emulator(clone_protocol=clone_protocol, **(emulator or {})) as live:
        live.emulator.create_branch(OWNER, REPO, "main", files=FILES, message="Add the widgets")
        root = scratch_dir("bootstrap-")  # under /dev/shm when it exists (DESIGN §4): small repositories on tmpfs
        settings = make_settings(root, roster=ROSTER, bootstrap={"lock_wait_s": 20.0, **bootstrap}, **merged(
            emulator_sections(live.base_url),
            {"gitea": {"token": token or TOKENS[BOT]}, "repository": {"checkout_root": str(root / "checkouts")}},
            {"repository": repository or {}},
        ))
        db = await Database.open(settings.database.path, synchronous="NORMAL")
        gitea = live.client(BOT) if token is None else GiteaClient(
            live.session, base_url=live.base_url, token=token, owner=OWNER, repo=REPO, backoff_base_s=0.005,
            timeout_s=5.0)
        ctx = BootstrapContext(db=db, settings=settings, gitea=gitea, bot_login=BOT)
        try:
            if clone:
                prepared = await ensure_control_checkout(ctx)
                assert prepared["ok"], prepared
            yield BootstrapWorld(live, root, settings, db, ctx, gitea)
        finally:
            await db.close()
            shutil.rmtree(root, ignore_errors=True)


async def bootstrap_through_door(ctx: BootstrapContext, caller: Caller, arguments: Mapping[str, object]) -> (
    BootstrapResult
):
    """The bootstrap verb through a door over ``ctx`` (its Gitea, clock and caches), as an MCP call runs it: the
    transition's typed result, or the door's refusal as a refused one."""
    async def over_ctx(runtime: VerbRuntime[Any]) -> WorktreeBootstrap | None:
        return BootstrapService(ctx)

    door = open_door(ctx.db, ctx.settings, ctx.gitea, bot_login=ctx.bot_login or "", clock=ctx.clock,
                     bootstrap_factory=over_ctx)
    result = await door.call("bootstrap_issue_worktree", caller, arguments)
    if isinstance(result.outcome, BootstrapResult):
        return result.outcome
    issue, key = arguments.get("issue_number"), arguments.get("idempotency_key")
    assert result.refusal is not None, result.doc
    return refused_result(issue if isinstance(issue, int) else 0, result.refusal, key if isinstance(key, str) else None)
