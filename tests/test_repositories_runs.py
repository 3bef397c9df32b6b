"""A run of one served repository acts for that repository only: its evidence, its `foreman mcp`, its commands."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.catalog import open_door
from bot.cli import main
from bot.config import Settings, load_settings
from bot.config_writer import write_config
from bot.core.errors import EnvelopeError
from bot.core.verbs import TOOLS
from bot.mcp_server import open_runtimes, run_binding_of
from bot.verbs.runs.broker import Broker, run_evidence_key
from bot.verbs.runs.inspect import run_teardown
from bot.verbs.runs.start import host_identity, start_run
from bot.verbs.runtime import VerbRuntime, caller_for, no_bootstrap
from bot.worker import Worker
from state.db import Database
from state.grants import GrantStore
from state.outbox import OutboxIntent, OutboxRepositoryUnknown, OutboxStore
from tests.conftest import REPO_ROOT
from tests.support import HANG_S, Started, eventually, payload, wait_status, webhook_headers
from tests.test_grants import REPO, _lease_and_worktree
from tests.test_grants_mcp import cli, grants_config

pytestmark = [pytest.mark.process]

WIDGETS = "acme/widgets"  # served first; the runs below are of REPO (org/repo), served second


def two_repositories(tmp_path: Path, *, served: tuple[str, ...] = (WIDGETS, REPO), name: str = "two.toml") -> Path:
    """The grants test config serving ``served`` as [[repositories]] (widgets first), one database."""
    doc = tomllib.loads(grants_config(tmp_path).read_text(encoding="utf-8"))
    doc.pop("repository")
    doc["repositories"] = [{"owner": key.split("/")[0], "name": key.split("/")[1]} for key in served]
    return write_config(tmp_path / name, doc)


async def started_run(settings: Settings) -> tuple[str, str]:
    """A run sealed for REPO's issue 8 (its lease and worktree registered): (run id, run token)."""
    await _lease_and_worktree(settings.database.path)
    db = await Database.open(settings.database.path, synchronous="NORMAL")
    try:
        started = await start_run(db, settings.for_repository(REPO), issue_number=8, sealed_by="test")
    finally:
        await db.close()
    assert started.grant.repo == REPO
    return started.run_id, started.token


def filed_under(database: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(database) as conn:
        return [(str(r[0]), str(r[1])) for r in conn.execute("SELECT idempotency_key, repo FROM outbox ORDER BY id")]


@asynccontextmanager
async def aborted_run(tmp_path: Path, reason: str) -> AsyncIterator[tuple[Settings, str, Database, Broker]]:
    """Two served repositories and a run on the second, aborted for ``reason``: the settings, the run, the database
    (closed afterwards) and the run's broker."""
    settings = load_settings(two_repositories(tmp_path), environ={})
    run_id, _ = await started_run(settings)
    db = await Database.open(settings.database.path, synchronous="NORMAL")
    try:
        broker = Broker(GrantStore(db), run_id, host=lambda: host_identity(settings.database.path))
        assert (await broker.abort(reason)).ok
        yield settings, run_id, db, broker
    finally:
        await db.close()


async def test_a_runs_evidence_is_filed_under_its_grants_repository_outside_any_door(tmp_path: Path) -> None:
    """The broker closes a run outside every door (the run-bound `foreman mcp`, `foreman run abort`): the run's
    evidence is filed under its grant's repository, the second served one, never under none (which the sender
    would have posted on the first repository's issue of the same number)."""
    async with aborted_run(tmp_path, "operator stop") as (settings, run_id, db, broker):
        view = settings.for_repository(REPO)
        runtime = open_door(db=db, settings=view, bot_login="foreman-bot", bootstrap_factory=no_bootstrap)
        caller = caller_for(view, "author-1", "mcp")

        async def run_tool(tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
            result = await runtime.call(TOOLS[tool].name, caller, arguments)  # the door: the release's own entries
            return result.ok, result.doc

        assert (await run_teardown(broker, run_tool))["ok"]  # closes the run: its evidence, outside the door
    entries = filed_under(settings.database.path)
    assert (run_evidence_key(run_id), REPO) in entries and {repo for _, repo in entries} == {REPO}, entries


async def test_an_entry_with_no_repository_is_refused_and_nothing_is_stored(tmp_path: Path) -> None:
    """A door that names no repository fails loudly: enqueue refuses, and no entry of no repository is stored."""
    db = await Database.open(tmp_path / "f.db")
    try:
        with pytest.raises(OutboxRepositoryUnknown):
            await OutboxStore(db).add(OutboxIntent("k", 1, "labels", {"add": ["x"]}))
        assert await OutboxStore(db).every_entry() == []
        assert await OutboxStore(db).add(OutboxIntent("k", 1, "labels", {"add": ["x"]}), repo=WIDGETS)
        assert [e.repo for e in await OutboxStore(db).every_entry()] == [WIDGETS]
    finally:
        await db.close()


async def test_a_run_token_binds_through_its_grants_repositorys_runtime(tmp_path: Path) -> None:
    """Served both repositories (widgets first), a run of the second is bound through the second's runtime
    (its roster and policy), not the first's."""
    settings = load_settings(two_repositories(tmp_path), environ={})
    _, token = await started_run(settings)
    async with open_runtimes(settings, settings.repository_keys(), bootstrap_factory=no_bootstrap) as runtimes:
        bound = await run_binding_of(runtimes, token)
        assert bound is not None
        runtime, binding = bound
        assert runtime is runtimes[REPO] and runtime.settings.repo_key == REPO
        assert binding.grant.repo == REPO


async def test_a_run_of_a_repository_not_served_here_is_refused_not_bound_to_the_first(tmp_path: Path) -> None:
    """`foreman --repository acme/widgets mcp` given a run token of org/repo: refused with the command that
    serves the run, never bound through widgets' runtime."""
    settings = load_settings(two_repositories(tmp_path), environ={})
    _, token = await started_run(settings)
    async with open_runtimes(settings, [WIDGETS], bootstrap_factory=no_bootstrap) as runtimes:
        with pytest.raises(EnvelopeError) as refused:
            await run_binding_of(runtimes, token)
    envelope = refused.value.envelope
    assert envelope.error == "invalid_input" and REPO in envelope.message
    assert envelope.exact_next_action == f"foreman --repository {REPO} mcp"


async def test_the_real_foreman_mcp_refuses_a_run_of_a_repository_it_does_not_serve(tmp_path: Path) -> None:
    """The process: exit 2, the typed refusal on stderr naming the command that serves the run."""
    config = two_repositories(tmp_path)
    _, token = await started_run(load_settings(config, environ={}))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "bot", "--config", str(config), "--repository", WIDGETS, "mcp"],
        env={"FOREMAN_MCP_TOKEN": token, "PATH": "/usr/bin:/bin"}, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=HANG_S, check=False,
    )
    assert done.returncode == 2, done.stderr
    [line] = [x for x in done.stderr.splitlines() if x.startswith("{")]
    refusal = json.loads(line)
    assert refusal["error"] == "invalid_input" and refusal["exact_next_action"] == f"foreman --repository {REPO} mcp"


async def test_a_runs_own_commands_act_for_its_grants_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`foreman run abort/teardown` need no --repository with two served repositories: they act for the run's
    grant's repository (the teardown releases org/repo's lease through org/repo's view); an explicit --repository
    of another repository is refused, and nothing happens."""
    config = str(two_repositories(tmp_path))
    settings = load_settings(Path(config), environ={})
    run_id, _ = await started_run(settings)
    code, doc = await asyncio.to_thread(cli, ["--repository", WIDGETS, "run", "abort", run_id, "--config", config,
                                              "--json"], capsys)
    assert code == 1 and doc["error"] == "invalid_input" and doc["repository"] == REPO, doc
    assert doc["exact_next_action"].startswith(f"foreman run abort {run_id}")
    assert filed_under(settings.database.path) == []  # the run is not closed
    code, doc = await asyncio.to_thread(cli, ["run", "abort", run_id, "--config", config, "--json"], capsys)
    assert code == 0 and doc["ok"], doc
    code, doc = await asyncio.to_thread(cli, ["run", "teardown", run_id, "--config", config, "--json"], capsys)
    assert code == 0 and doc["ok"], doc
    with sqlite3.connect(settings.database.path) as conn:
        assert conn.execute("SELECT repo, status FROM leases").fetchall() == [(REPO, "released")]
    assert {repo for _, repo in filed_under(settings.database.path)} == {REPO}


async def test_a_run_of_a_repository_the_config_does_not_serve_is_refused_and_named_by_grants(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config that no longer serves the run's repository: `foreman run abort` refuses (naming it), and
    `foreman grants` marks the run as of a repository not served (no teardown loop runs it)."""
    settings = load_settings(two_repositories(tmp_path), environ={})
    run_id, _ = await started_run(settings)
    only_widgets = str(two_repositories(tmp_path, served=(WIDGETS,), name="widgets.toml"))
    code, doc = await asyncio.to_thread(cli, ["run", "abort", run_id, "--config", only_widgets, "--json"], capsys)
    assert code == 1 and doc["error"] == "invalid_input" and REPO in doc["message"], doc
    code, doc = await asyncio.to_thread(cli, ["grants", "--config", only_widgets, "--json"], capsys)
    assert code == 0
    [entry] = doc["runs"]
    assert entry["repository_served"] is False
    assert await asyncio.to_thread(main, ["grants", "--config", only_widgets]) == 0
    assert f"REPOSITORY {REPO} NOT SERVED" in capsys.readouterr().out


async def test_each_repositorys_teardown_loop_acts_for_its_repository(
    tmp_path: Path, start: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service started with two repositories: the second's teardown loop tears down its aborted run, and
    the loop's task acts for that repository (what each door entered from it, and anything it files, sees)."""
    async with aborted_run(tmp_path, "stopped while the service was down") as (settings, run_id, _, _):
        pass
    seen: list[tuple[str, str]] = []
    door = VerbRuntime.call

    async def recording(self: VerbRuntime, verb_name: str, caller: Any, arguments: Any, **kwargs: Any) -> Any:
        seen.append((self.settings.repo_key, self.repo))  # the door of the run's repository, filing under it
        return await door(self, verb_name, caller, arguments, **kwargs)

    monkeypatch.setattr(VerbRuntime, "call", recording)
    service, _client = await start(settings)
    loop = service.repositories[REPO].run_teardowns
    assert loop is not None
    await eventually(lambda: loop.passes >= 1, "the teardown loop's first pass", poll_s=0.01)
    assert seen == [(REPO, REPO)]
    record = await GrantStore(service.db).run(run_id)
    assert record is not None and record.state.teardown == "done"


async def test_the_worker_runs_each_delivery_with_its_repositorys_dependencies(
    tmp_path: Path, start: Started, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deliveries through the real intake and worker, one per served repository (the second first): each
    delivery's handlers run with the dependencies (and door) of the repository the payload names, never the first
    served one."""
    settings = load_settings(two_repositories(tmp_path), environ={})
    seen: list[str] = []
    handlers = Worker.run_handlers

    async def recording(self: Worker, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs["deps"].settings.repo_key)  # the dependencies (and door) of the payload's repository
        return await handlers(self, *args, **kwargs)

    monkeypatch.setattr(Worker, "run_handlers", recording)
    service, client = await start(settings)
    widgets = {"id": 2, "name": "widgets", "full_name": "acme/widgets", "owner": {"login": "acme"}}
    for body in (payload("opened", number=3), payload("opened", number=3, repository=widgets)):
        headers = webhook_headers(body)
        resp = await client.post("/webhook", data=body, headers=headers)
        assert resp.status == 202, await resp.text()
        await wait_status(service, headers["X-Gitea-Delivery"], "done")
    assert seen == [REPO, WIDGETS]
