"""The intake benchmark's MCP sessions: N sessions over Streamable HTTP (``/mcp``) open and active on the same
``foreman serve`` while the webhook rounds run; a process of its own (``python -m bench.intake_mcp SPEC``).

Each session is bench/agents.py's ``LeanSession`` (raw JSON-RPC over one shared ``aiohttp.ClientSession``): opened
``STARTING_AT_ONCE`` at a time (``initialize``, ``notifications/initialized``, one ``tools/list`` and one read verb,
untimed: a principal's first calls build its server), then, at its own
phase of ``period`` (session i at i/N of it), every period one ``tools/list`` (the session's transport and serve's
MCP layer, as bench/agents.py's baseline call). ``gitea_get_runtime_context`` (the read verb of the warm-up) reads
Gitea on every call (the default branch; a reviewer's waiting work): 1,000 sessions calling it every 10 s made ~200
Gitea requests a second that timed out in serve's Gitea client, so it is not in the period (bench/agents.py's
sessions heartbeat leases, which this benchmark does not set up). The process prints ``ready <seconds>`` once
every session is open, keeps them active until a line arrives on stdin, ends them (DELETE) and prints one JSON line:
the calls made, the failed ones (a few of their errors) and the calls' p50 / p99 in ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.agents import STARTING_AT_ONCE, LeanSession, _token_digest

READ_VERB = "gitea_get_runtime_context"
token_digest = _token_digest  # the config's [mcp.token_digests] value for a bearer token


async def _active(session: LeanSession, index: int, total: int, period: float, stop: asyncio.Event,
                  calls: list[tuple[bool, float, str]]) -> None:
    await asyncio.sleep(index / total * period)
    while not stop.is_set():
        began = time.perf_counter()
        for name in ("tools/list",):
            started = time.perf_counter()
            try:
                ok = await session.list_tools() > 0 if name == "tools/list" else (await session.call(name, {}))[0]
                error = "" if ok else f"{name}: a tool error"
            except Exception as exc:  # a failed call is counted and reported, the session goes on
                ok, error = False, f"{name}: {type(exc).__name__}: {exc}"[:200]
            calls.append((ok, (time.perf_counter() - started) * 1000.0, error))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, period - (time.perf_counter() - began)))


async def drive(spec: dict[str, Any]) -> dict[str, Any]:
    tokens: list[str] = spec["tokens"]
    period = float(spec["period"])
    gate = asyncio.Semaphore(STARTING_AT_ONCE["http"])
    stop = asyncio.Event()
    calls: list[tuple[bool, float, str]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), connector=connector) as http:
        sessions = [LeanSession(http, spec["url"], token) for token in tokens]

        async def open_one(session: LeanSession) -> None:
            async with gate:  # opened and warmed: a principal's first calls build its server (not the window's cost)
                await session.open()
                await session.list_tools()
                ok, doc = await session.call(READ_VERB, {})
                if not ok:
                    raise RuntimeError(f"{READ_VERB} answered {json.dumps(doc)[:300]}")

        began = time.perf_counter()
        await asyncio.gather(*(open_one(s) for s in sessions))
        print(f"ready {time.perf_counter() - began:.3f}", flush=True)
        tasks = [asyncio.create_task(_active(s, i, len(sessions), period, stop, calls))
                 for i, s in enumerate(sessions)]
        await asyncio.to_thread(sys.stdin.readline)
        stop.set()
        await asyncio.gather(*tasks)
        await asyncio.gather(*(s.close() for s in sessions))
    times = sorted(ms for _, ms, _ in calls)
    failed = [error for ok, _, error in calls if not ok]

    def pct(p: float) -> float | None:
        return round(times[min(len(times) - 1, int(len(times) * p / 100))], 2) if times else None

    return {"sessions": len(sessions), "calls": len(calls), "failed": len(failed), "errors": sorted(set(failed))[:5],
            "p50_ms": pct(50), "p99_ms": pct(99)}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    print(json.dumps(asyncio.run(drive(spec))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
