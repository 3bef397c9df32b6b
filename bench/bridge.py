"""What an agent's MCP process costs: the stdio bridge (`foreman mcp --url`) beside the in-process `foreman mcp` and
a minimal SDK Streamable HTTP client, in the same run.

    .venv/bin/python -m bench.bridge [--runs 5] [--json]

Set-up (not timed): a config in a temporary directory (SQLite, one controller identity in ``[mcp.tokens]``, no
Gitea) and a real ``foreman serve`` on a free loopback port, serving ``/mcp``. Then ``--runs`` rounds; each round
starts every contender once, one after the other (so a busy moment of the machine falls on all of them alike):

- ``bridge``: ``python -m bot mcp --url http://127.0.0.1:PORT/mcp`` with ``FOREMAN_MCP_TOKEN``; on its stdin
  ``initialize``, ``notifications/initialized`` and ``tools/list``, written at once;
- ``bridge_script``: the same through the ``foreman`` console script beside this interpreter (when installed);
- ``old``: the in-process ``python -m bot --config C mcp`` (loads the config, opens the SQLite database), the same
  three messages;
- ``sdk``: ``python -c ...``: the official SDK's ``streamable_http_client`` and ``ClientSession`` with the bearer in
  an ``httpx2`` client, ``initialize`` then ``list_tools`` against the same ``/mcp``, one line printed;
- ``python``: the floor, ``python -c`` that prints one line (the interpreter's own start and memory).

For each: the wall time from just before the process is spawned to the moment its ``tools/list`` answer (or line)
is read, and its peak resident set (``VmHWM`` of /proc/<pid>/status, read at that moment, the process still
alive); then its stdin is closed and it exits. Printed: the median, min and max of each, and PASS or MISS for the
issue's targets (the bridge under 40 MiB and under 0.5 s). Exit 1 if a contender did not answer, listed other tools
than the others (the controller's: some, the same for all) or exited non-zero; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import peak_rss_kib
from bench.intake import free_port
from bot.config_writer import write_config

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKEN = "tok-bench-bridge-controller"
TARGET_MIB = 40.0
TARGET_S = 0.5
#: A hang detector for one contender's answer, never a timing.
ANSWER_TIMEOUT_S = 60.0

_MESSAGES = [
    {"jsonrpc": "2.0", "id": 1, "method": "initialize",
     "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
]
_STDIO_INPUT = b"".join(json.dumps(message).encode() + b"\n" for message in _MESSAGES)

SDK_CLIENT = """
import asyncio, os, sys
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main():
    headers = {"Authorization": "Bearer " + os.environ["FOREMAN_MCP_TOKEN"]}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \\
            streamable_http_client(sys.argv[1], http_client=http) as (read, write), \\
            ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        print(json.dumps({"tools": len(listed.tools)}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

import json
asyncio.run(main())
"""

FLOOR = "import sys; print('{\"tools\": 0}', flush=True); sys.stdin.readline()"


@dataclass(frozen=True)
class Contender:
    """One way to reach the tool list: its command, its standard input, and how its answer line is recognized."""

    name: str
    argv: list[str]
    stdin: bytes
    tools_in: Callable[[dict[str, Any]], int | None]


@dataclass(frozen=True)
class Sample:
    seconds: float
    peak_mib: float
    tools: int


def _listed(doc: dict[str, Any]) -> int | None:
    """The number of tools in a ``tools/list`` answer (id 2), else None (another line)."""
    if doc.get("id") != 2:
        return None
    return len(doc.get("result", {}).get("tools", [])) if "result" in doc else -1


def _printed(doc: dict[str, Any]) -> int | None:
    return doc.get("tools") if isinstance(doc.get("tools"), int) else None


def contenders(url: str, config: Path) -> list[Contender]:
    python = sys.executable
    found = [
        Contender("bridge", [python, "-m", "bot", "mcp", "--url", url], _STDIO_INPUT, _listed),
        Contender("old", [python, "-m", "bot", "--config", str(config), "mcp"], _STDIO_INPUT, _listed),
        Contender("sdk", [python, "-c", SDK_CLIENT, url], b"", _printed),
        Contender("python", [python, "-c", FLOOR], b"", _printed),
    ]
    script = Path(python).parent / "foreman"
    if script.exists():
        found.insert(1, Contender("bridge_script", [str(script), "mcp", "--url", url], _STDIO_INPUT, _listed))
    return found


def run_once(contender: Contender, env: dict[str, str]) -> Sample:
    """Start the contender, wait for its answer line; the time to it and the peak RSS then. Raises RuntimeError
    when it exits or stays silent."""
    started = time.perf_counter()
    proc = subprocess.Popen(contender.argv, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        if contender.stdin:
            proc.stdin.write(contender.stdin)
            proc.stdin.flush()
        fd, pending = proc.stdout.fileno(), b""
        deadline = started + ANSWER_TIMEOUT_S
        while True:
            left = deadline - time.perf_counter()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise RuntimeError(f"{contender.name}: no answer within {ANSWER_TIMEOUT_S:.0f} s")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"{contender.name}: exited {proc.wait()} before answering")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            tools = next((n for line in lines if line.strip() and (n := contender.tools_in(json.loads(line)))
                          is not None), None)
            if tools is not None:
                seconds = time.perf_counter() - started
                peak = peak_rss_kib(proc.pid) / 1024.0
                break
        proc.stdin.close()
        code = proc.wait(timeout=ANSWER_TIMEOUT_S)
        if code != 0:
            raise RuntimeError(f"{contender.name}: exited {code}")
        return Sample(seconds, peak, tools)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def foreman_serve(root: Path) -> Iterator[tuple[str, Path]]:
    """A real ``foreman serve`` with ``/mcp`` on a free port: its MCP URL and its config; stopped on exit."""
    port = free_port()
    config = write_config(root / "foreman.toml", {
        "webhook": {"secrets": ["bench-bridge-webhook-secret"]},
        "database": {"path": str(root / "foreman.db"), "synchronous": "NORMAL"},
        "server": {"port": port, "shutdown_grace_s": 1.0},
        "gitea": {"bot_login": "foreman-bot"},
        "repository": {"owner": "acme", "name": "widgets", "checkout_root": str(root / "checkouts")},
        "roster": {"controller-bot": ["controller"]},
        "mcp": {"tokens": {TOKEN: "controller-bot"}},
    })
    with (root / "serve.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bot", "--config", str(config), "serve"], cwd=root,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"foreman serve did not start: {(root / 'serve.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
                    if resp.status == 200:
                        break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", config
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=ANSWER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def summary(samples: Sequence[Sample]) -> dict[str, Any]:
    seconds = [s.seconds for s in samples]
    peaks = [s.peak_mib for s in samples]
    return {"runs": len(samples), "tools": sorted({s.tools for s in samples}),
            "seconds_median": statistics.median(seconds), "seconds_min": min(seconds), "seconds_max": max(seconds),
            "peak_mib_median": statistics.median(peaks), "peak_mib_min": min(peaks), "peak_mib_max": max(peaks)}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="rounds (every contender once each); default 5")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "FOREMAN_MCP_TOKEN": TOKEN,
           "PYTHONPATH": str(REPO_ROOT)}
    root = Path(tempfile.mkdtemp(prefix="bench-bridge-"))
    failures: list[str] = []
    samples: dict[str, list[Sample]] = {}
    try:
        with foreman_serve(root) as (url, config):
            everyone = contenders(url, config)
            for contender in everyone:  # one untimed start each: the page cache and .pyc files warm for all
                with contextlib.suppress(RuntimeError):
                    run_once(contender, env)
            for _ in range(args.runs):
                for contender in everyone:
                    try:
                        samples.setdefault(contender.name, []).append(run_once(contender, env))
                    except RuntimeError as exc:
                        failures.append(str(exc))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results = {name: summary(runs) for name, runs in samples.items() if runs}
    listed = {name: r["tools"] for name, r in results.items() if name != "python"}
    if len({tuple(tools) for tools in listed.values()}) != 1 or any(t[0] <= 0 for t in listed.values()):
        failures.append(f"the contenders listed different tools: {listed}")
    bridge = results.get("bridge")
    verdict = {
        "rss": bridge is not None and bridge["peak_mib_median"] < TARGET_MIB,
        "start": bridge is not None and bridge["seconds_median"] < TARGET_S,
    }
    if args.json:
        print(json.dumps({"results": results, "targets": {"peak_mib": TARGET_MIB, "seconds": TARGET_S},
                          "pass": verdict, "failures": failures}, indent=2))
    else:
        print(f"{'contender':<14} {'runs':>4} {'to tools/list s (median, min-max)':>36} "
              f"{'peak RSS MiB (median, min-max)':>34}")
        for name, r in results.items():
            print(f"{name:<14} {r['runs']:>4} {r['seconds_median']:>14.3f} ({r['seconds_min']:.3f}-"
                  f"{r['seconds_max']:.3f}) {r['peak_mib_median']:>16.1f} ({r['peak_mib_min']:.1f}-"
                  f"{r['peak_mib_max']:.1f})")
        print(f"bridge: peak RSS under {TARGET_MIB:.0f} MiB {'PASS' if verdict['rss'] else 'MISS'}; "
              f"first tools/list under {TARGET_S} s {'PASS' if verdict['start'] else 'MISS'}")
        for failure in failures:
            print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
