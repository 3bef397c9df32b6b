"""The one way tests run a real `foreman serve` (or tests/crash_service.py): ``serve_process``, a context manager that
starts it, waits for /healthz as a hang detector and always stops and reaps it; ``ServeProcess`` for a test that
stops and starts it itself; ``Served`` for a service in front of the live Gitea emulator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sqlite3
import sys
import tomllib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bot.config_writer import Document, merged, write_config
from tests.conftest import REPO_ROOT
from tests.gitea_fixtures import LiveEmulator, live_emulator, scratch_dir
from tests.support import HANG_S, SECRET, eventually, free_port, serve_config, webhook_headers

#: Hang detectors, never timings (``tests.support.HANG_S``): a Python process's start, a condition that is a moment's
#: work when idle, a stop.
HEALTHY_S = WAIT_S = STOP_S = HANG_S
#: How much of the service's stderr a failure shows.
TAIL_CHARS = 4000


def _configured_port(config: Path | None) -> int | None:
    """``[server] port`` of an existing config file, if it names one."""
    if config is None or not config.is_file():
        return None
    port = tomllib.loads(config.read_text(encoding="utf-8")).get("server", {}).get("port")
    return int(port) if port else None


class ServeProcess:
    """One service subprocess (`python -m bot serve`, or tests/crash_service.py) and its files in ``workdir``:
    the config (written from ``overrides`` when no ``config`` is given), the SQLite database, stderr. Its port is
    ``port``, else the given config's, else a free one."""

    def __init__(
        self, workdir: Path, *, module: str = "bot", config: Path | None = None,
        overrides: Document | None = None, port: int | None = None, umask: int | None = None,
    ) -> None:
        self.workdir = workdir
        self.module = module
        self.port = port or _configured_port(config) or free_port()
        self.umask = umask
        self.db = workdir / "foreman.db"
        self.log = workdir / "handlers.log"
        self.gate = workdir / "gate"
        self.stderr = workdir / "stderr.log"
        self.config = config or self._write_config(overrides or {})
        self.proc: asyncio.subprocess.Process | None = None

    def _write_config(self, overrides: Document) -> Path:
        return write_config(self.workdir / "foreman.toml", merged({
            "server": {"port": self.port, "shutdown_grace_s": 1.0},
            "webhook": {"secrets": [SECRET]},
            "database": {"path": self.db},
            "worker": {"poll_interval_s": 0.05, "claim_ttl_s": 0.6, "backoff_base_s": 0.05},
        }, overrides))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hook_url(self) -> str:
        """Where Gitea's webhooks go."""
        return f"{self.url}/webhook"

    def serve_document(self, gitea_url: str, *overrides: Document) -> dict[str, Any]:
        """Its foreman.toml against Gitea at ``gitea_url`` (``tests.support.serve_config``), checkouts in its folder."""
        return serve_config(self.port, self.db, gitea_url, self.workdir, *overrides)

    def tail(self) -> str:
        """The end of the service's stderr (its log), for a failure's message."""
        return self.stderr.read_text(errors="replace")[-TAIL_CHARS:] if self.stderr.exists() else ""

    async def serve(self, env: Mapping[str, str] | None = None) -> None:
        """`foreman serve --config <its config>`, healthy (see ``start``)."""
        await self.start("serve", "--config", str(self.config), env=env)

    async def start(self, *args: str, env: Mapping[str, str] | None = None, healthy_s: float = HEALTHY_S) -> None:
        """``python -m <module> ARGS`` (the config file alone when no ARGS), returned once /healthz answers 200.
        A start that fails (the process exits, never answers within ``healthy_s``, or the wait is cancelled) kills
        and reaps the process itself: no caller can leak it, wherever its own ``try`` begins."""
        argv = [sys.executable, "-m", self.module, *(args or (str(self.config),))]
        full_env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "CRASH_LOG": str(self.log),
            "CRASH_GATE": str(self.gate),
            **(env or {}),
        }
        try:
            with self.stderr.open("ab") as err:
                self.proc = await asyncio.create_subprocess_exec(
                    *argv, cwd=self.workdir, env=full_env, stdout=asyncio.subprocess.DEVNULL, stderr=err,
                    umask=-1 if self.umask is None else self.umask,
                )
            await self.wait_healthy(healthy_s)
        except BaseException:
            await self.stop(graceful=False)
            raise

    async def wait_healthy(self, timeout: float = HEALTHY_S) -> None:
        """Until /healthz answers 200, polling; fails at once if the process exits, and after ``timeout`` (a hang
        detector) with its stderr tail."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while True:
                assert self.proc is not None
                if self.proc.returncode is not None:
                    raise AssertionError(f"service exited {self.proc.returncode}; stderr tail:\n{self.tail()}")
                if loop.time() > deadline:
                    raise AssertionError(f"service never became healthy within {timeout:.0f} s; stderr tail:\n"
                                         f"{self.tail()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(f"{self.url}/healthz") as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.05)

    async def kill(self) -> None:
        """SIGKILL, reaped: a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def terminate(self, timeout: float = STOP_S) -> int:
        """SIGTERM and its exit code; killed (and the test failed) if it has not exited within ``timeout``."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout=timeout)
        except TimeoutError:
            await self.stop(graceful=False)
            raise AssertionError(f"service did not stop within {timeout:.0f} s of SIGTERM; stderr tail:\n"
                                 f"{self.tail()}") from None

    async def stop(self, *, graceful: bool = False) -> None:
        """Whatever state it is in, no process is left: SIGTERM first when ``graceful`` (SIGKILL if it outlives
        ``STOP_S``), else SIGKILL; reaped either way. Nothing to do when it never started or has exited."""
        if self.proc is None or self.proc.returncode is not None:
            return
        if graceful:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), timeout=STOP_S)
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()

    async def post(self, body: bytes, delivery: str) -> int:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                self.hook_url, data=body, headers=webhook_headers(body, delivery=delivery)
            ) as resp:
                return resp.status

    def lines(self) -> list[str]:
        """tests/crash_service.py's handler log."""
        return self.log.read_text().splitlines() if self.log.exists() else []

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A query of the service's SQLite database (waiting out the service's write lock as a hang detector)."""
        with sqlite3.connect(self.db, timeout=WAIT_S) as conn:
            return conn.execute(sql, params).fetchall()

    def status(self, delivery: str) -> tuple[str, int] | None:
        rows = self.rows("SELECT status, attempts FROM deliveries WHERE delivery_id = ?", (delivery,))
        return (rows[0][0], rows[0][1]) if rows else None

    async def wait_for(self, predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> float:
        """Until ``predicate()`` (or what it returns, when that is awaitable) holds, polling; the seconds it took.
        After ``timeout`` (a hang detector, never a timing) the test fails naming ``what``, with the handler log and
        the stderr tail."""
        def detail() -> str:
            log = f"handler log: {self.lines()}; " if self.log.exists() else ""
            return f"{log}stderr tail:\n{self.tail()}"

        return await eventually(predicate, what, timeout, poll_s=0.05, detail=detail)


async def run_foreman(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = HANG_S,
) -> tuple[int, str, str]:
    """`python -m bot ARGS` run to its end: its exit code, stdout and stderr. Its environment is this one's without
    the FOREMAN_* variables (the command line says what it runs on), with ``env`` laid over it. ``timeout`` is a hang
    detector: a process that outlives it (or a test cancelled meanwhile) is killed and reaped, never left behind."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, cwd=cwd, env={**clean, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@asynccontextmanager
async def serve_process(
    workdir: Path, *, serve: bool = False, env: Mapping[str, str] | None = None, graceful: bool = False,
    **options: Any,
) -> AsyncIterator[ServeProcess]:
    """A ``ServeProcess`` in ``workdir`` (``options``: its module, config or overrides, port, umask), started with
    `foreman serve --config <its config>` when ``serve`` (healthy before the body runs); however the body ends, the
    process is stopped and reaped (SIGKILL, or SIGTERM first when ``graceful``)."""
    proc = ServeProcess(workdir, **options)
    try:
        if serve:
            await proc.serve(env)
        yield proc
    finally:
        await proc.stop(graceful=graceful)


@asynccontextmanager
async def served_emulator(prefix: str, **emulator_options: Any) -> AsyncIterator[tuple[LiveEmulator, ServeProcess]]:
    """The live Gitea emulator and a `foreman serve` not started yet, its files in a scratch folder
    (``proc.workdir``): all of it gone afterwards, the process stopped whatever happens."""
    async with scratch(prefix) as root, live_emulator(**emulator_options) as live, serve_process(root) as proc:
        yield live, proc


@asynccontextmanager
async def scratch(prefix: str) -> AsyncIterator[Path]:
    """A fresh scratch folder (tmpfs where there is one), removed afterwards."""
    root = scratch_dir(prefix)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Served:
    """A `foreman serve` (``proc``) in front of the live Gitea emulator, with its files under ``root``."""

    def __init__(self, live: LiveEmulator, proc: ServeProcess, root: Path | None = None) -> None:
        self.live, self.emu, self.proc = live, live.emulator, proc
        self.root = root or proc.workdir

    def db(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.proc.rows(sql, params)

    async def wait(self, predicate: Callable[[], object], what: str, timeout: float = WAIT_S) -> float:
        return await self.proc.wait_for(predicate, what, timeout)

    async def get(self, path: str) -> tuple[int, str]:
        async with aiohttp.ClientSession() as session, session.get(f"{self.proc.url}{path}") as resp:
            return resp.status, await resp.text()

    async def readyz(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(f"{self.proc.url}/readyz") as resp:
            doc: dict[str, Any] = await resp.json()
            return doc

    async def cli(self, *args: str) -> tuple[int, str, str]:
        """`foreman --config <the service's config> ARGS` as an operator runs it beside the service: its exit code,
        stdout and stderr."""
        return await run_foreman("--config", str(self.proc.config), *args, cwd=self.proc.workdir)
