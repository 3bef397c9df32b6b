"""Many agents: N MCP sessions, each an identity of its own, heartbeating their leases and posting state while
webhooks arrive at a fixed rate, against one real `foreman serve`: over HTTP (serve's ``/mcp``, the default) or, as
the baseline where it still fits in memory, over stdio (one ``foreman mcp`` process per session).

    .venv/bin/python -m bench.agents [--transport http|stdio] [--sessions 100] [--seconds 60] [--rate 50]
                                     [--period 10] [--drivers K] [--json] [--keep]

Set-up (not timed), ``bot.demo.open_harness`` as bench/e2e.py uses it: the Gitea emulator in this process (a real
bare repository over smart HTTP), a real ``foreman serve`` subprocess (SQLite, WAL, synchronous NORMAL, on /dev/shm)
whose roster has ``--sessions`` authors (``author-1`` ... ``author-N``, each a Gitea account with write access and a
foreman MCP token of its own: over HTTP the config holds only its digest, ``[mcp.token_digests]``); the repository
webhook (``issues`` and ``issue_comment``); N issues, labelled ``status:ready`` by the maintainer ``SETUP_WAVE`` at a
time, so that foreman's auto-allocation leases one to each idle author and bootstraps its worktree (the product's own
door); the benchmark waits until N live leases, N completed bootstraps and an empty outbox. Over HTTP one probe
session (``author-1``, read-only calls) then pays serve's lazy imports of the MCP server, and serve's RSS is read
before and after the agents' sessions open. Then, still untimed, the children:

- the **agents drivers** (``--driver``, processes of their own so that the emulator in this one does not share their
  event loop). Over HTTP: a lean client, one shared ``aiohttp.ClientSession`` per driver speaking raw JSON-RPC
  (``initialize``, ``notifications/initialized``, then ``tools/list`` and ``tools/call``, each POST with the
  session's ``Authorization: Bearer``, ``Mcp-Session-Id`` and ``MCP-Protocol-Version``; a DELETE at the end): the
  SDK's client costs a task group and an httpx client per session, which at 1,000 sessions would measure the client.
  One driver per ``SESSIONS_PER_DRIVER`` sessions (``--drivers``). Over stdio: one ``foreman mcp`` subprocess per
  author through the MCP SDK's stdio client (``ClientSession`` over ``stdio_client``), started a few at a time. Every
  session initialized, then one untimed ``tools/list`` and ``gitea_heartbeat_lease``;
- the **load generator** (``python -m bench.harness load``): its signed bodies built before the window.

Timed window, ``--seconds`` long, every child starting at the same wall-clock second:

- each session, at its own phase (session i starts at i / N of a period), every ``--period`` seconds: ``tools/list``
  (the baseline), ``gitea_heartbeat_lease`` on its issue, ``gitea_post_issue_state`` (a new state each round, so
  each is queued: an evidence comment that foreman's outbox posts, reads back and verifies, whose own
  ``issue_comment`` webhook comes back to serve);
- ``--rate`` signed ``issue_comment`` deliveries per second (bench/intake.py's bodies, ~6.5 KB, for a repository
  foreman does not serve: stored with the configured sync before the 202, then routed ``ignored`` by the worker) to
  ``foreman serve``, and the same delivery at the same tick to a bare aiohttp endpoint (``bench.intake
  --serve-bare``), on an open-loop schedule.

Baselines, same run, same processes, same moment: ``tools/list`` through the same session (the transport, the
client and the server's MCP layer without the verb: no database, no Gitea), and the bare endpoint's answer to the
same webhook (the same HTTP stack and client, without verification and storage).

Targets (the issue's): every tool's p99 under 100 ms; no webhook answered later than 1 s; memory per session under
1 MiB (serve's RSS growth while the sessions opened, divided by N; over stdio plus each ``foreman mcp``'s peak RSS).
Printed PASS or MISS beside the baselines, with serve's event loop lag (the largest since its start, before and after
the window, the histogram's counts within the window), serve's RSS at each step (``VmRSS``), peak RSS (serve; the mcp
processes' sum and max; the children; this process), CPU seconds used in the window (``/proc/<pid>/stat`` utime +
stime), the failed calls by kind and a few answers of each tool (real tool results, not errors).

Checks (exit 1 if one fails): every tool call answered without error; every webhook 202 (both targets) and every
delivery stored; each lease still live with one heartbeat event per heartbeat call; the outbox drained with every
entry done, and each issue holds every state comment its author queued; the sessions were ended only after every
webhook of the window was answered (N processes ending at once take the machine for a moment: ending them while the
window's last webhooks were in flight made those answers late at both targets alike). Exit 2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.database import footprint
from bench.e2e import _query, finished, run_root, summary
from bench.harness import children_of, machine_busy_s, own_peak_rss_mib, peak_rss_kib, rss_kib
from bench.intake import process_cpu_s
from bot.core.evidence import find_marker
from bot.demo import open_harness
from bot.demo_harness import MAINTAINER, OWNER, REPO, LoopHarness, StepFailed, _subprocess_env

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TARGET_TOOL_P99_MS = 100.0
TARGET_WEBHOOK_MAX_MS = 1000.0
TOOLS = ("gitea_heartbeat_lease", "gitea_post_issue_state")
BASELINE = "tools/list"
TARGET_SERVE_RSS_PER_SESSION_MIB = 1.0
TRANSPORTS = ("http", "stdio")
STARTING_AT_ONCE = {"stdio": 6,  # foreman mcp processes importing at the same time while the sessions start (2 cores)
                    "http": 32}  # sessions opening at once over HTTP (each principal's first request builds its server)
SESSIONS_PER_DRIVER = 500  # over HTTP, one driver process per 500 sessions (``--drivers`` to choose)
PROTOCOL_VERSION = "2025-06-18"  # the initialize handshake's (Streamable HTTP with MCP-Protocol-Version)
SETUP_WAVE = 25  # issues labelled status:ready at a time during the set-up (see _set_up)
SAMPLES = 3  # answers kept per tool, shown in the report: real tool results, not errors


# --- the agents driver (a child process) ------------------------------------------------------------------------------


def _state(login: str, n: int, round_no: int) -> dict[str, Any]:
    return {
        "state": "in-progress",
        "who_is_next": "author",
        "next_action": f"{login} keeps working on #{n}",
        "next_prompt": f"#{n}: carry on with the change on the issue branch.",
        "what_happened": f"{login} heartbeated its lease (round {round_no})",
        "why": "bench.agents: an agent reports progress every period",
        "related_prs": [],
        "blockers": "none",
        "validation": "none yet",
    }


class CallFailed(Exception):
    """A call that got no tool result: ``kind`` is ``refused`` (an HTTP status other than the protocol's) or
    ``error`` (a JSON-RPC error)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class StdioCalls:
    """The calls of one session through the MCP SDK's stdio client (``ClientSession`` over ``stdio_client``)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    async def list_tools(self) -> int:
        return len((await self.session.list_tools()).tools)

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
        result = await self.session.call_tool(tool, arguments)
        doc = result.structured_content
        return not result.is_error and isinstance(doc, dict), doc


class LeanSession:
    """One MCP session over Streamable HTTP, spoken as raw JSON-RPC POSTs through an ``aiohttp.ClientSession``
    shared by every session of the driver: ``initialize``, ``notifications/initialized``, then requests, each with
    the session's ``Authorization``, ``Mcp-Session-Id`` and ``MCP-Protocol-Version`` headers; ended by a DELETE.
    (The SDK's own client costs a task group, memory streams and an httpx client per session: at 1,000 sessions the
    driver, not the server, would be measured.) Answers are read as JSON (serve answers ``json_response``) or, should
    a server stream them, from the last ``data:`` line of the event stream."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str) -> None:
        self.http, self.url, self._id = http, url, 0
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
                        "Content-Type": "application/json"}

    async def _post(self, message: dict[str, Any]) -> tuple[int, Any, Any]:
        async with self.http.post(self.url, data=json.dumps(message).encode(), headers=self.headers) as resp:
            raw = await resp.read()
            if resp.status == 202 or not raw:
                return resp.status, None, resp.headers
            if resp.content_type == "text/event-stream":
                data = [line[5:].strip() for line in raw.decode().splitlines() if line.startswith("data:")]
                raw = data[-1].encode() if data else b"null"
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = raw[:200].decode("utf-8", "replace")
            return resp.status, doc, resp.headers

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        self._id += 1
        status, doc, _ = await self._post({"jsonrpc": "2.0", "id": self._id, "method": method, "params": params})
        if status != 200:
            raise CallFailed("refused", f"HTTP {status}: {json.dumps(doc)[:250]}")
        if not isinstance(doc, dict) or "result" not in doc:
            raise CallFailed("error", f"JSON-RPC {json.dumps(doc)[:250]}")
        result: dict[str, Any] = doc["result"]
        return result

    async def open(self) -> None:
        self._id += 1
        status, doc, headers = await self._post({"jsonrpc": "2.0", "id": self._id, "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "bench.agents", "version": "1"}}})
        session_id = headers.get("Mcp-Session-Id") if headers is not None else None
        if status != 200 or not isinstance(doc, dict) or "result" not in doc or not session_id:
            raise CallFailed("refused", f"initialize: HTTP {status}: {json.dumps(doc)[:250]}")
        self.headers["Mcp-Session-Id"] = session_id
        self.headers["MCP-Protocol-Version"] = doc["result"]["protocolVersion"]
        status, doc, _ = await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if status != 202:
            raise CallFailed("refused", f"notifications/initialized: HTTP {status}: {json.dumps(doc)[:250]}")

    async def list_tools(self) -> int:
        return len((await self.request("tools/list", {}))["tools"])

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
        result = await self.request("tools/call", {"name": tool, "arguments": arguments})
        doc = result.get("structuredContent")
        return not result.get("isError") and isinstance(doc, dict), doc

    async def close(self) -> None:
        with contextlib.suppress(aiohttp.ClientError):
            async with self.http.delete(self.url, headers=self.headers) as resp:
                await resp.read()


async def _one_call(calls_of: Any, login: str, tool: str, arguments: dict[str, Any] | None, round_no: int,
                    samples: list[dict[str, Any]]) -> dict[str, Any]:
    """One timed call; a failed one is recorded with its kind (``refused``: an HTTP status; ``error``: a JSON-RPC
    error; ``tool``: a tool's error result; ``broken``: the session itself failed)."""
    began = time.perf_counter()
    record: dict[str, Any] = {"login": login, "tool": tool, "round": round_no}
    try:
        if arguments is None:
            record["ok"] = await calls_of.list_tools() > 0
        else:
            ok, doc = await calls_of.call(tool, arguments)
            record["ok"] = ok
            if not ok:
                record["kind"], record["error"] = "tool", json.dumps(doc, sort_keys=True)[:300]
            else:
                if tool == "gitea_post_issue_state":
                    record["queued"] = bool(doc.get("queued", True))
                if sum(1 for s in samples if s["tool"] == tool) < SAMPLES:
                    samples.append({"login": login, "tool": tool, "keys": sorted(doc),
                                    "answer": json.dumps(doc, sort_keys=True)[:400]})
    except CallFailed as exc:
        record["ok"], record["kind"], record["error"] = False, exc.kind, str(exc)[:300]
    except Exception as exc:  # a broken session is a failed call, reported
        record["ok"], record["kind"], record["error"] = False, "broken", f"{type(exc).__name__}: {exc}"[:300]
    record["ms"] = (time.perf_counter() - began) * 1000.0
    return record


async def _timed_rounds(calls_of: Any, spec: dict[str, Any], agent: dict[str, Any], epoch: float,
                        calls: list[dict[str, Any]], samples: list[dict[str, Any]]) -> None:
    """Session ``index``'s rounds from ``epoch`` + index/N of a period, one per period: the baseline, then the tools."""
    login, n, period = agent["login"], agent["issue"], spec["period"]
    offset = agent["index"] / spec["total"] * period
    round_no = 0
    while (at := offset + round_no * period) < spec["seconds"]:
        await asyncio.sleep(max(0.0, epoch + at - time.time()))
        for tool, arguments in ((BASELINE, None), ("gitea_heartbeat_lease", {"issue_number": n}),
                                ("gitea_post_issue_state", {"issue_number": n, "state": _state(login, n, round_no)})):
            calls.append(await _one_call(calls_of, login, tool, arguments, round_no, samples))
        round_no += 1


async def _warm_up(calls_of: Any, agent: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    """One untimed round trip of each kind: a ``foreman mcp`` process's first call pays its lazy imports and opens
    the database (over HTTP: the principal's first request builds its server); an agent pays that once, the window
    measures the steady state. The warm-up heartbeat is a real one and is counted by the checks."""
    await calls_of.list_tools()
    warm = await _one_call(calls_of, agent["login"], "gitea_heartbeat_lease", {"issue_number": agent["issue"]}, -1, [])
    calls.append({**warm, "warmup": True, "ms": 0.0})


class _Run:
    """What every session of a driver shares: the gate on sessions opening at once, the events of the window."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.calls: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.gate = asyncio.Semaphore(spec["starting_at_once"])
        self.started, self.done = asyncio.Event(), asyncio.Event()
        self.go: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.ready = 0

    def up(self) -> None:
        self.gate.release()
        self.ready += 1
        if self.ready == len(self.spec["agents"]):
            self.started.set()


async def _stdio_agent(run: _Run, agent: dict[str, Any], errlog: Any) -> None:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    spec = run.spec
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "bot", "--config", spec["config"], "mcp"],
        env=_subprocess_env({"FOREMAN_MCP_TOKEN": agent["token"]}), cwd=spec["root"])
    await run.gate.acquire()
    holding = True
    try:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            calls_of = StdioCalls(session)
            await _warm_up(calls_of, agent, run.calls)
            holding = False
            run.up()
            await _timed_rounds(calls_of, spec, agent, await run.go, run.calls, run.samples)
            await run.done.wait()  # every process stays up until the driver has read the peak RSS of all
    finally:
        if holding:
            run.gate.release()


async def _http_agent(run: _Run, agent: dict[str, Any], http: aiohttp.ClientSession) -> None:
    session = LeanSession(http, run.spec["url"], agent["token"])
    await run.gate.acquire()
    holding = True
    try:
        await session.open()
        await _warm_up(session, agent, run.calls)
        holding = False
        run.up()
        await _timed_rounds(session, run.spec, agent, await run.go, run.calls, run.samples)
        await run.done.wait()
        await session.close()
    finally:
        if holding:
            run.gate.release()


async def _lag_monitor(box: dict[str, float]) -> None:
    while True:
        before = time.perf_counter()
        await asyncio.sleep(0.02)
        box["max_s"] = max(box["max_s"], time.perf_counter() - before - 0.02)


async def _drive(spec: dict[str, Any]) -> dict[str, Any]:
    run = _Run(spec)
    lag = {"max_s": 0.0}
    http_transport = spec["transport"] == "http"
    async with contextlib.AsyncExitStack() as stack:
        errlog = stack.enter_context(Path(spec["root"], "mcp.log").open("a", encoding="utf-8"))
        if http_transport:  # one connection pool for every session of this driver
            http = await stack.enter_async_context(aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=60), connector=aiohttp.TCPConnector(limit=0)))
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(_http_agent(run, agent, http) if http_transport
                                     else _stdio_agent(run, agent, errlog)) for agent in spec["agents"]]
        waiting = asyncio.create_task(run.started.wait())
        await asyncio.wait([waiting, *tasks], return_when=asyncio.FIRST_COMPLETED)
        if not run.started.is_set():  # a session ended before every one was up: its error is the answer
            await asyncio.gather(*tasks)
            raise RuntimeError("a session ended before the window")
        startup_s = time.perf_counter() - t0
        print(f"ready {startup_s:.3f}", flush=True)
        line = (await asyncio.to_thread(sys.stdin.readline)).split()
        monitor = asyncio.create_task(_lag_monitor(lag))
        cpu_before = {pid: process_cpu_s(pid) or 0.0 for pid in children_of(os.getpid())}
        run.go.set_result(float(line[1]))
        timed = len(spec["agents"])  # the warm-up heartbeats
        while len(run.calls) - timed < 3 * spec["expected_rounds"] and not any(t.done() for t in tasks):
            await asyncio.sleep(0.05)
        monitor.cancel()
        mcp = children_of(os.getpid())
        peaks = [peak_rss_kib(pid) for pid in mcp]
        cpu = sum((process_cpu_s(pid) or 0.0) - cpu_before.get(pid, 0.0) for pid in mcp)
        # The sessions stay up until the parent has every webhook's answer: N processes ending at once take the
        # machine for a moment, which would land on the window's last webhooks (both targets' answers, alike).
        await asyncio.to_thread(sys.stdin.readline)
        ended_at = time.time()
        run.done.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [f"{type(r).__name__}: {r}"[:300] for r in results if isinstance(r, BaseException)]
    return {"calls": run.calls, "samples": run.samples, "startup_s": startup_s, "mcp_processes": len(mcp),
            "mcp_peak_rss_kib": peaks, "mcp_cpu_s": cpu, "driver_lag_max_ms": lag["max_s"] * 1000.0,
            "driver_peak_rss_mib": own_peak_rss_mib(), "session_failures": failures, "sessions_ended_at": ended_at}


def _driver_main(spec_path: Path) -> int:
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    print(json.dumps(asyncio.run(_drive(spec))), flush=True)
    return EXIT_OK


# --- the run ----------------------------------------------------------------------------------------------------------


def _session_rounds(index: int, sessions: int, seconds: float, period: float) -> int:
    """How many rounds session ``index`` of ``sessions`` makes: from index/N of a period, then every period."""
    offset = index / sessions * period
    return int((seconds - offset) // period) + (1 if (seconds - offset) % period > 0 else 0)


def _rounds(sessions: int, seconds: float, period: float) -> int:
    """How many rounds the sessions make together: session i's rounds start at i/N of a period, then every period."""
    return sum(_session_rounds(i, sessions, seconds, period) for i in range(sessions))


def _merged(drivers: list[dict[str, Any]]) -> dict[str, Any]:
    """The drivers' documents as one: calls and samples together, the slowest start, the earliest end."""
    return {
        "calls": [c for d in drivers for c in d["calls"]], "samples": [s for d in drivers for s in d["samples"]],
        "startup_s": max(d["startup_s"] for d in drivers), "mcp_processes": sum(d["mcp_processes"] for d in drivers),
        "mcp_peak_rss_kib": [k for d in drivers for k in d["mcp_peak_rss_kib"]],
        "mcp_cpu_s": sum(d["mcp_cpu_s"] for d in drivers),
        "driver_lag_max_ms": max(d["driver_lag_max_ms"] for d in drivers),
        "driver_peak_rss_mib": sum(d["driver_peak_rss_mib"] for d in drivers),
        "session_failures": [f for d in drivers for f in d["session_failures"]],
        "sessions_ended_at": min(d["sessions_ended_at"] for d in drivers),
    }


def failed_calls(calls: list[dict[str, Any]]) -> dict[str, int]:
    """Failed calls (warm-ups included) by kind: ``refused`` (an HTTP status), ``error`` (JSON-RPC), ``tool`` (an
    error result), ``broken`` (the session failed)."""
    kinds = Counter(c.get("kind", "broken") for c in calls if not c["ok"])
    return {"total": sum(kinds.values()), **{k: kinds.get(k, 0) for k in ("refused", "error", "tool", "broken")}}


class Child:
    """A child process speaking lines: ``ready ...`` on stdout, ``go EPOCH`` on stdin, one JSON document at the end."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process) -> None:
        self.name, self.proc = name, proc

    @classmethod
    async def start(cls, name: str, argv: list[str], env: dict[str, str], stderr: Any) -> Child:
        # The result is one JSON line of every call and answer: megabytes at full size, past asyncio's 64 KiB.
        proc = await asyncio.create_subprocess_exec(*argv, env=env, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=stderr, limit=2**28)
        return cls(name, proc)

    async def ready(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        try:
            line = (await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)).decode()
        except TimeoutError:
            raise StepFailed(self.name, f"not ready within {timeout_s:.0f}s") from None
        if not line.startswith("ready"):
            raise StepFailed(self.name, f"exited ({await self.proc.wait()}) before it was ready: {line[:300]!r}")
        return line

    def go(self, epoch: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"go {epoch:.6f}\n".encode())

    def release(self) -> None:
        """The agents driver may end its sessions now (the window's webhooks are all answered)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"release\n")

    async def result(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except TimeoutError:
            self.proc.kill()
            raise StepFailed(self.name, f"no result within {timeout_s:.0f}s") from None
        if self.proc.returncode != 0 or not line:
            raise StepFailed(self.name, f"exited with {self.proc.returncode} (see its log)")
        doc: dict[str, Any] = json.loads(line)
        return doc

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


async def _get(h: LoopHarness, path: str) -> str:
    async with h.http.get(h.webhook_url.removesuffix("/webhook") + path) as resp:
        return await resp.text()


def _lag_histogram(metrics: str) -> dict[str, float]:
    """``foreman_event_loop_lag_seconds`` bucket counts by upper bound, from Prometheus text."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith("foreman_event_loop_lag_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            out[bound] = float(line.rsplit(" ", 1)[1])
    return out


async def _serve_view(h: LoopHarness) -> dict[str, Any]:
    ready = json.loads(await _get(h, "/readyz"))
    return {"lag_max_s": ready["checks"]["event_loop"]["lag_max_s"], "histogram": _lag_histogram(
        await _get(h, "/metrics"))}


async def _until(step: str, probe: Any, timeout_s: float, message: str, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while (found := await probe()) is None:
        if time.monotonic() > deadline:
            raise StepFailed(step, message)
        await asyncio.sleep(every_s)
    return found


async def _set_up(h: LoopHarness, logins: list[str], timeout_s: float) -> dict[str, int]:
    """N issues, each labelled status:ready: auto-allocation leases one to each author and bootstraps it. Labelled
    ``SETUP_WAVE`` at a time, the next wave once the last is leased: every allocation reads each ready issue (its
    duplicate assessment, its dependencies), so 1,000 ready at once would make the set-up quadratic (about 3 s per
    lease at 1,000 on this machine, against a fraction of a second in waves)."""
    await h.start_serve(timeout_s)
    await h.register_hook(("issues", "issue_comment"))
    numbers = [int((await h.api(MAINTAINER, "POST", "/issues", {"title": f"Agent issue {i + 1}", "body": "bench"})
                    )["number"]) for i in range(len(logins))]

    def live() -> list[dict[str, Any]]:
        return _query(h, "SELECT l.owner, l.issue_number FROM leases l JOIN bootstrap_journal j"
                         " ON j.lease_id = l.lease_id WHERE l.status = 'live' AND j.phase = 'completed'")

    for at in range(0, len(numbers), SETUP_WAVE):
        wave = numbers[at:at + SETUP_WAVE]
        for n in wave:
            await h.api(MAINTAINER, "POST", f"/issues/{n}/labels", {"labels": ["status:ready"]})

        async def wave_leased(expected: int = at + len(wave)) -> bool | None:
            return True if len(live()) >= expected else None

        await _until("setup", wave_leased, timeout_s + 2.0 * len(wave), f"issues {wave[0]}-{wave[-1]} were never"
                     " all leased and bootstrapped")

    async def leased() -> dict[str, int] | None:
        found = live()
        pending = _query(h, "SELECT COUNT(*) AS c FROM outbox WHERE status != 'done'")[0]["c"]
        queued = _query(h, "SELECT COUNT(*) AS c FROM deliveries WHERE status IN ('queued', 'processing')")[0]["c"]
        if len(found) < len(logins) or pending or queued:
            return None
        return {row["owner"]: int(row["issue_number"]) for row in found}

    owned: dict[str, int] = await _until("setup", leased, timeout_s + 2.0 * len(logins), f"{len(logins)} live"
                                         " bootstrapped leases and an idle outbox never came")
    if sorted(owned) != sorted(logins) or len(set(owned.values())) != len(logins):
        raise StepFailed("setup", f"the leases are not one per author: {owned}")
    return owned


def answer_errors(driver: dict[str, Any], load: dict[str, Any], stored_ids: set[str]) -> list[str]:
    """What the children saw go wrong: a tool call refused or broken, a session that died, a webhook answered
    other than 202 (by either target), a delivery foreman answered but did not store."""
    errors: list[str] = []
    bad = [c for c in driver["calls"] if not c["ok"]]
    errors.extend(f"{c['login']} {c['tool']} round {c['round']}: {c.get('error')}" for c in bad[:10])
    if len(bad) > 10:
        errors.append(f"... {len(bad)} failed tool calls in all")
    errors.extend(driver["session_failures"])
    for name, answers in load["answers"].items():
        statuses = Counter(status for status, _ in answers)
        if set(statuses) != {202}:
            errors.append(f"webhooks to {name}: answers {dict(sorted(statuses.items()))}")
    if driver["sessions_ended_at"] < load["answered_at"]:
        errors.append("the sessions ended before every webhook of the window was answered")
    ids = load["delivery_ids"]
    stored = len(set(ids) & stored_ids)
    if stored != len(ids):
        errors.append(f"{stored} of {len(ids)} webhooks stored")
    return errors


def _check(h: LoopHarness, owned: dict[str, int], driver: dict[str, Any], load: dict[str, Any],
           errors: list[str]) -> None:
    calls = driver["calls"]
    stored = {r["delivery_id"] for r in _query(h, "SELECT delivery_id FROM deliveries")}
    errors.extend(answer_errors(driver, load, stored))
    beats = Counter(c["login"] for c in calls if c["tool"] == "gitea_heartbeat_lease" and c["ok"])
    posts = Counter(c["login"] for c in calls if c["tool"] == "gitea_post_issue_state" and c["ok"] and c["queued"])
    for login, n in owned.items():
        leases = _query(h, "SELECT lease_id, status FROM leases WHERE issue_number = ?", (n,))
        if [r["status"] for r in leases] != ["live"]:
            errors.append(f"#{n}: leases {[tuple(r.values()) for r in leases]}")
            continue
        events = _query(h, "SELECT COUNT(*) AS c FROM lease_events WHERE lease_id = ? AND kind = 'heartbeat'",
                        (leases[0]["lease_id"],))[0]["c"]
        if events != beats[login]:
            errors.append(f"#{n}: {events} heartbeat events for {beats[login]} heartbeats")
        comments = h.emulator.issue(OWNER, REPO, n).comments
        states = sum(1 for c in comments if (find_marker(c.body) or "").startswith("state:"))
        if states != posts[login]:
            errors.append(f"#{n}: {states} state comments for {posts[login]} queued states")
    pending = _query(h, "SELECT idempotency_key, status FROM outbox WHERE status != 'done'")
    errors.extend(f"outbox {r['idempotency_key']} is {r['status']}" for r in pending[:10])


def _token_digest(token: str) -> str:
    return f"sha256:{hashlib.sha256(token.encode()).hexdigest()}"


async def _probe_session(h: LoopHarness, token: str) -> None:
    """One session opened and ended before the agents' (as ``author-1``, read-only calls only): the first request to
    ``/mcp`` pays serve's lazy imports, which are no session's cost."""
    session = LeanSession(h.http, h.mcp_url, token)
    await session.open()
    await session.list_tools()
    ok, doc = await session.call("gitea_get_runtime_context", {})
    await session.close()
    if not ok:
        raise StepFailed("probe", f"gitea_get_runtime_context over /mcp answered {json.dumps(doc)[:300]}")


async def bench(sessions: int, seconds: float, rate: float, period: float, timeout_s: float, root: Path,
                transport: str = "http", drivers: int | None = None) -> dict[str, Any]:
    logins = [f"author-{i}" for i in range(1, sessions + 1)]
    tokens = {login: f"mcp-{login}-{secrets.token_hex(12)}" for login in logins}
    # Over HTTP the config holds only each token's digest ([mcp.token_digests]), as a deployment's does; the stdio
    # processes read the config too, so they keep [mcp.tokens] as before.
    mcp = ({"token_digests": {login: _token_digest(token) for login, token in tokens.items()}} if transport == "http"
           else {"tokens": {token: login for login, token in tokens.items()}})
    overlay = {"roster": {login: ["author"] for login in logins}, "mcp": mcp}
    if drivers is None:
        drivers = 1 if transport == "stdio" else -(-sessions // SESSIONS_PER_DRIVER)
    drivers = max(1, min(drivers, sessions))
    errors: list[str] = []
    doc: dict[str, Any] = {"sessions": sessions, "seconds": seconds, "rate": rate, "period": period,
                           "transport": transport, "drivers": drivers,
                           "client": "MCP SDK stdio_client + ClientSession, one foreman mcp per session"
                           if transport == "stdio" else "lean JSON-RPC over one shared aiohttp ClientSession per"
                           " driver (initialize, notifications/initialized, tools/list, tools/call; DELETE at the end)"}
    async with open_harness(root, config=overlay) as h:
        for login in logins[1:]:  # author-1 is the demo's own account
            h.emulator.add_user(login, token=f"gitea-{login}-{secrets.token_hex(12)}")
            h.emulator.set_permission(OWNER, REPO, login, "write")
        setup_began = time.monotonic()
        owned = await _set_up(h, logins, timeout_s)
        doc["setup_s"] = time.monotonic() - setup_began
        assert h.serve is not None
        serve_pid = h.serve.pid
        rss_at_setup = rss_kib(serve_pid)
        if transport == "http":
            await _probe_session(h, tokens[logins[0]])
        rss_before_sessions, cpu_before_sessions = rss_kib(serve_pid), process_cpu_s(serve_pid) or 0.0
        env = _subprocess_env({"BENCH_LOAD_SECRET": h.webhook_secret})
        bare_port = _free_port()
        agents: list[dict[str, Any]] = [{"login": lg, "token": tokens[lg], "issue": owned[lg], "index": i}
                                        for i, lg in enumerate(logins)]
        children: list[Child] = []
        with (root / "children.log").open("w", encoding="utf-8") as log:
            bare = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.intake", "--serve-bare", "--port", str(bare_port), env=env, stderr=log)
            for k in range(drivers):
                mine = agents[k::drivers]
                spec_path = root / f"driver-{k + 1}.json"
                spec_path.write_text(json.dumps({
                    "transport": transport, "config": str(h.config_path), "root": str(root), "url": h.mcp_url,
                    "seconds": seconds, "period": period, "starting_at_once": STARTING_AT_ONCE[transport],
                    "total": sessions, "agents": mine, "expected_rounds": sum(
                        _session_rounds(a["index"], sessions, seconds, period) for a in mine)}), encoding="utf-8")
                spec_path.chmod(0o600)
                name = "agents driver" if drivers == 1 else f"agents driver {k + 1}"
                children.append(await Child.start(name, [sys.executable, "-m", "bench.agents", "--driver",
                                                         str(spec_path)], env, log))
            load = await Child.start("load generator", [
                sys.executable, "-m", "bench.harness", "load", "--url", h.webhook_url, "--bare-url",
                f"http://127.0.0.1:{bare_port}/webhook", "--rate", str(rate), "--seconds", str(seconds)], env, log)
            try:
                startups = [float((await c.ready(timeout_s + 3.0 * sessions)).split()[1]) for c in children]
                doc["mcp_startup_s"] = max(startups)
                rss_after_sessions = rss_kib(serve_pid)
                doc["serve_cpu_s_opening_sessions"] = (process_cpu_s(serve_pid) or 0.0) - cpu_before_sessions
                await load.ready(timeout_s)
                await _until("bare", lambda: _bare_up(h, bare_port), timeout_s, "the bare endpoint never answered")
                before = await _serve_view(h)
                ours = {"serve": serve_pid, **{c.name: c.proc.pid for c in children}, "load generator": load.proc.pid,
                        "bare endpoint": bare.pid, "this process (emulator)": os.getpid()}
                rss_before, cpu_before = rss_kib(serve_pid), {k: process_cpu_s(v) or 0.0 for k, v in ours.items()}
                busy_before, span_began = machine_busy_s(), time.monotonic()
                log_at = h.serve_log.stat().st_size
                db_before = footprint(h.database_url or h.db_path)["bytes"]
                load_before = os.getloadavg()
                epoch = time.time() + 1.0
                for child in children:
                    child.go(epoch)
                load.go(epoch)
                rss_series = []
                while time.time() < epoch + seconds:
                    await asyncio.sleep(min(5.0, max(0.05, epoch + seconds - time.time())))
                    rss_series.append(rss_kib(serve_pid) / 1024.0)
                cpu_s = {k: (process_cpu_s(v) or 0.0) - cpu_before[k] for k, v in ours.items()}
                busy_s, span_s = machine_busy_s() - busy_before, time.monotonic() - span_began
                load_doc = await load.result(timeout_s + seconds)
                after = await _serve_view(h)
                doc["load_average"] = {"before": load_before, "after": os.getloadavg()}
                holds = [line for line in h.serve_log.read_text(encoding="utf-8")[log_at:].splitlines()
                         if "event loop was held" in line]
                rss_after = rss_kib(serve_pid)
                for child in children:
                    child.release()  # only now: the sessions' ending is not part of the window
                driver_doc = _merged([await c.result(timeout_s + seconds) for c in children])
            finally:
                for child in children:
                    await child.stop()
                await load.stop()
                if bare.returncode is None:
                    bare.terminate()
                    await bare.wait()

        async def drained() -> bool | None:
            pending = _query(h, "SELECT COUNT(*) AS c FROM outbox WHERE status NOT IN ('done', 'parked',"
                                " 'verification_failed')")[0]["c"]
            queued = _query(h, "SELECT COUNT(*) AS c FROM deliveries WHERE status IN ('queued', 'processing')")
            return True if not pending and not queued[0]["c"] else None

        drain_began = time.monotonic()
        await _until("drain", drained, timeout_s + seconds, "the outbox and inbox never drained")
        doc["drain_s"] = time.monotonic() - drain_began
        _check(h, owned, driver_doc, load_doc, errors)
        # Gitea's own webhooks (labels, assignees, the state comments coming back): reported, as bench/e2e.py --life
        # does; a delivery foreman did not answer 2xx is an event only its catch-up pass can bring back.
        sent = await h.emulator.drain_webhooks()
        doc["gitea_webhooks"] = {"sent": len(sent), "not_2xx": [f"{d.event_type} {d.status} {d.error or ''}".strip()
                                                                 for d in sent if not d.ok][:10]}
        doc["serve_peak_rss_kib"] = peak_rss_kib(serve_pid)
        doc["database_bytes"] = {"before_window": db_before, "after_drain": footprint(h.database_url or h.db_path)[
            "bytes"]}
    doc.update(_figures(driver_doc, load_doc, before, after, holds))
    mcp_sum = sum(driver_doc["mcp_peak_rss_kib"]) / 1024.0
    doc["rss_mib"] = {
        "serve_peak": doc.pop("serve_peak_rss_kib") / 1024.0, "serve_after_setup": rss_at_setup / 1024.0,
        "serve_before_sessions": rss_before_sessions / 1024.0, "serve_after_sessions": rss_after_sessions / 1024.0,
        "serve_before_window": rss_before / 1024.0, "serve_after_window": rss_after / 1024.0,
        "serve_every_5s": rss_series, "mcp_sum": mcp_sum,
        "mcp_max": max(driver_doc["mcp_peak_rss_kib"], default=0) / 1024.0,
        "driver": driver_doc["driver_peak_rss_mib"], "load_generator": load_doc["peak_rss_mib"],
        "bench_process_with_emulator": own_peak_rss_mib(),
    }
    # Memory per session: serve's growth while the sessions opened (and, over stdio, each session's own process).
    growth = (rss_after_sessions - rss_before_sessions) / 1024.0 / sessions
    doc["memory_per_session_mib"] = {"serve_growth": growth, "serve_growth_to_window_end": (
        rss_after - rss_before_sessions) / 1024.0 / sessions, "session_processes": mcp_sum / sessions,
        "all": growth + mcp_sum / sessions}
    doc["targets"][f"memory per session < {TARGET_SERVE_RSS_PER_SESSION_MIB:.0f} MiB"] = (
        doc["memory_per_session_mib"]["all"] < TARGET_SERVE_RSS_PER_SESSION_MIB)
    doc["mcp_processes"] = driver_doc["mcp_processes"]
    doc["failed_calls"] = failed_calls(driver_doc["calls"])
    doc["sample_answers"] = driver_doc["samples"][:2 * SAMPLES]
    cpu_s["all foreman mcp"] = driver_doc["mcp_cpu_s"]
    # What the machine did in the window besides this benchmark: the other sessions' work on the same two cores.
    doc["cpu_s_in_window"] = {**cpu_s, "machine busy": busy_s, "others": busy_s - sum(cpu_s.values())}
    doc["cpu_span_s"] = span_s  # the window and the second before it
    doc["ok"], doc["errors"] = not errors, errors[:30]
    doc["measured_at"] = datetime.now().astimezone().isoformat(timespec="seconds")
    return doc


def _free_port() -> int:
    from bench.intake import free_port

    return free_port()


async def _bare_up(h: LoopHarness, port: int) -> bool | None:
    with contextlib.suppress(aiohttp.ClientError):
        async with h.http.get(f"http://127.0.0.1:{port}/healthz") as resp:
            return True if resp.status == 200 else None
    return None


def _figures(driver: dict[str, Any], load: dict[str, Any], before: dict[str, Any], after: dict[str, Any],
             holds: list[str]) -> dict[str, Any]:
    calls = [c for c in driver["calls"] if not c.get("warmup")]
    tools = {tool: summary([c["ms"] for c in calls if c["tool"] == tool] or [0.0]) for tool in (*TOOLS, BASELINE)}
    webhooks = {name: summary([ms for _, ms in got] or [0.0]) for name, got in load["answers"].items()}
    window = {bound: count - before["histogram"].get(bound, 0.0) for bound, count in after["histogram"].items()}
    over = {f"over_{bound}s": window["+Inf"] - count for bound, count in window.items() if bound in ("0.05", "0.1")}
    targets = {f"{tool} p99 < {TARGET_TOOL_P99_MS:.0f} ms": tools[tool]["p99"] < TARGET_TOOL_P99_MS for tool in TOOLS}
    targets[f"no webhook answered later than {TARGET_WEBHOOK_MAX_MS / 1000:.0f} s"] = (
        webhooks["foreman"]["max"] < TARGET_WEBHOOK_MAX_MS)
    return {
        "tool_ms": tools,
        "tool_p99_over_baseline": {tool: tools[tool]["p99"] / tools[BASELINE]["p99"] for tool in TOOLS},
        "webhook_ms": webhooks,
        "webhook_p99_over_bare": webhooks["foreman"]["p99"] / webhooks["bare"]["p99"],
        "serve_event_loop": {"lag_max_since_start_s": {"before_window": before["lag_max_s"],
                                                       "after_window": after["lag_max_s"]},
                             "samples_in_window": window.get("+Inf", 0.0), **over, "held_over_50ms_logged": len(holds)},
        "load_schedule_slip_ms_max": load["schedule_slip_ms_max"],
        "driver_lag_max_ms": driver["driver_lag_max_ms"],
        "targets": targets,
    }


def text(doc: dict[str, Any]) -> str:
    tools, hooks, lag, rss = doc["tool_ms"], doc["webhook_ms"], doc["serve_event_loop"], doc["rss_mib"]
    verdicts = doc["targets"]

    def row(name: str, s: dict[str, float]) -> str:
        return f"{name}: n {s['n']}, p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms, max {s['max']:.1f} ms"

    keys = list(verdicts)
    since = lag["lag_max_since_start_s"]
    per, failed = doc["memory_per_session_mib"], doc["failed_calls"]
    serve_cpu = doc["cpu_s_in_window"]["serve"]
    how = (f"over HTTP (foreman serve's /mcp, {doc['drivers']} driver process{'es' if doc['drivers'] > 1 else ''},"
           " lean JSON-RPC client)" if doc["transport"] == "http" else "over stdio (one foreman mcp process each)")
    return "\n".join([
        f"many agents {how}: {doc['sessions']} sessions, each every {doc['period']:.0f} s: tools/list,"
        f" gitea_heartbeat_lease, gitea_post_issue_state; {doc['rate']:.0f} signed webhooks/s; {doc['seconds']:.0f} s",
        f"set-up {doc['setup_s']:.1f} s ({doc['sessions']} leases through auto-allocation, bootstrapped), sessions"
        f" opened in {doc['mcp_startup_s']:.1f} s ({doc['mcp_processes']} foreman mcp processes; serve's CPU while"
        f" they opened {doc['serve_cpu_s_opening_sessions']:.1f} s); load average"
        f" {doc['load_average']['before'][0]:.2f} before, {doc['load_average']['after'][0]:.2f} after",
        "  " + row("baseline tools/list", tools[BASELINE]),
        *(f"  {row(tool, tools[tool])}  ({doc['tool_p99_over_baseline'][tool]:.1f}x the baseline's p99)"
          f"  p99 < {TARGET_TOOL_P99_MS:.0f} ms: {'PASS' if verdicts[keys[i]] else 'MISS'}"
          for i, tool in enumerate(TOOLS)),
        "  " + row("webhook bare endpoint", hooks["bare"]),
        f"  {row('webhook foreman serve', hooks['foreman'])}  ({doc['webhook_p99_over_bare']:.1f}x bare p99)"
        f"  none later than 1 s: {'PASS' if verdicts[keys[2]] else 'MISS'}",
        f"serve's event loop: max lag since start {since['before_window'] * 1000:.0f} ms before the window,"
        f" {since['after_window'] * 1000:.0f} ms after; in the window {lag['samples_in_window']:.0f} samples,"
        f" {lag.get('over_0.05s', 0):.0f} over 50 ms, {lag.get('over_0.1s', 0):.0f} over 100 ms"
        f" ({lag['held_over_50ms_logged']} holds logged)",
        f"clients' own loops: load schedule slip max {doc['load_schedule_slip_ms_max']:.1f} ms, agents driver lag max"
        f" {doc['driver_lag_max_ms']:.1f} ms",
        "CPU seconds in the window: " + ", ".join(f"{k} {v:.1f}" for k, v in doc["cpu_s_in_window"].items())
        + f" (of {(os.cpu_count() or 1) * doc['cpu_span_s']:.0f} core-seconds: {doc['cpu_span_s']:.1f} s on"
        f" {os.cpu_count()} cores)",
        f"serve: {serve_cpu:.1f} CPU seconds in the window ({serve_cpu / doc['cpu_span_s'] * 100:.0f}% of one core)",
        f"serve's RSS: {rss['serve_after_setup']:.1f} MiB after set-up, {rss['serve_before_sessions']:.1f} before"
        f" the sessions, {rss['serve_after_sessions']:.1f} with them open, {rss['serve_before_window']:.1f} before"
        f" the window, {rss['serve_after_window']:.1f} after (peak {rss['serve_peak']:.1f})",
        f"memory per session: serve's growth {per['serve_growth'] * 1024:.0f} KiB while they opened"
        f" ({per['serve_growth_to_window_end'] * 1024:.0f} KiB to the window's end), session processes"
        f" {per['session_processes']:.1f} MiB: {per['all']:.3f} MiB  < {TARGET_SERVE_RSS_PER_SESSION_MIB:.0f} MiB:"
        f" {'PASS' if verdicts[keys[-1]] else 'MISS'}",
        f"peak RSS: foreman mcp sum {rss['mcp_sum']:.0f} MiB, max {rss['mcp_max']:.0f} MiB; driver"
        f" {rss['driver']:.0f}, load generator {rss['load_generator']:.0f}, this process (emulator)"
        f" {rss['bench_process_with_emulator']:.0f} MiB",
        f"failed calls: {failed['total']} (refused {failed['refused']}, JSON-RPC errors {failed['error']}, tool"
        f" errors {failed['tool']}, broken sessions {failed['broken']})",
        *(f"  answer of {a['tool']} to {a['login']}: {a['answer'][:160]}" for a in doc["sample_answers"][:2]),
        f"Gitea's own webhooks to serve (set-up included): {doc['gitea_webhooks']['sent']} sent,"
        f" {len(doc['gitea_webhooks']['not_2xx'])} not answered 2xx {doc['gitea_webhooks']['not_2xx']}",
        f"outbox and inbox drained {doc['drain_s']:.1f} s after the window; the database grew from"
        f" {doc['database_bytes']['before_window'] / 2**20:.1f} to {doc['database_bytes']['after_drain'] / 2**20:.1f}"
        " MiB (file and WAL)",
        "checks: every call ok, every webhook 202 and stored, leases live with one event per heartbeat, every state"
        f" comment posted, outbox done: {'PASS' if doc['ok'] else 'FAIL'}",
        *(f"  {error}" for error in doc["errors"]),
    ])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.agents", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=100, help="MCP sessions, one author (identity) each")
    parser.add_argument("--transport", choices=TRANSPORTS, default="http",
                        help="http: sessions of foreman serve's /mcp (default); stdio: one foreman mcp process each")
    parser.add_argument("--drivers", type=int, default=None,
                        help=f"driver processes (default: one per {SESSIONS_PER_DRIVER} sessions over HTTP, one over"
                             " stdio)")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the timed window")
    parser.add_argument("--rate", type=float, default=50.0, help="signed webhooks per second during the window")
    parser.add_argument("--period", type=float, default=10.0, help="seconds between one session's rounds")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a set-up step may take")
    parser.add_argument("--tmpdir", type=Path, default=None, help="where everything goes (default /dev/shm)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the directory (config, database, logs)")
    parser.add_argument("--driver", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.driver is not None:
        return _driver_main(args.driver)
    if (args.sessions < 1 or args.seconds <= 0 or args.rate <= 0 or args.period <= 0 or args.timeout <= 0
            or (args.drivers is not None and args.drivers < 1)):
        parser.print_usage(sys.stderr)
        print("python -m bench.agents: --sessions, --seconds, --rate, --period, --timeout and --drivers must be"
              " positive", file=sys.stderr)
        return EXIT_USAGE
    root = run_root("bench-agents-", args.tmpdir)
    try:
        doc = asyncio.run(bench(args.sessions, args.seconds, args.rate, args.period, args.timeout, root,
                                args.transport, args.drivers))
    except (StepFailed, ExceptionGroup, OSError, ValueError) as exc:  # a child that failed: one line, no traceback
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        print(f"bench.agents failed: {exc} (files kept in {root})", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(doc, indent=2, sort_keys=True) if args.json else text(doc))
    return finished(doc, root, keep=args.keep or not doc["ok"])


if __name__ == "__main__":
    sys.exit(main())
