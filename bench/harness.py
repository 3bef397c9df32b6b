"""Helpers the benchmarks share: peak memory of a process, signed webhooks sent at a fixed rate from a process
of their own, and the demo's Gitea emulator in a process of its own.

    BENCH_LOAD_SECRET=S .venv/bin/python -m bench.harness load --url URL [--bare-url URL] --rate 50 --seconds 60
    .venv/bin/python -m bench.harness gitea --root DIR

``load`` (a child of bench/agents.py) prints ``ready`` once its bodies are built and signed, waits for one line on
stdin (``go EPOCH``: the wall-clock second to start at), then sends ``--rate`` deliveries per second for
``--seconds`` on a fixed schedule (the k-th at EPOCH + k / rate, whatever the answers before it took: an open loop,
so a slow answer cannot slow the load down), the same delivery to ``--bare-url`` at the same tick when given, and
prints one JSON document: every answer's status and latency per target, how late the schedule ran (this process's
own loop), its peak RSS.

``gitea`` (a child of bench/e2e.py --gitea-process) serves what ``foreman demo`` seeds (``demo/widgets``, private,
cloned over git smart HTTP with the bot's token; the users and the status labels) plus ``demo/baseline`` with one
issue and no hook (where the bare comment POST + GET goes, so that foreman does no work for it), under ``--root``;
prints one JSON line (``url``, ``tokens``, ``baseline_repo``, ``baseline_issue``) and serves until its stdin closes
or it is terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench.intake import EVENT, load_template, make_body, sign

# --- memory -----------------------------------------------------------------------------------------------------------


def _status_kib(pid: int, key: str) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith(key)), 0)


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident set (``VmHWM``, KiB; 0 once it is gone or off Linux)."""
    return _status_kib(pid, "VmHWM:")


def rss_kib(pid: int) -> int:
    """The process's resident set now (``VmRSS``, KiB)."""
    return _status_kib(pid, "VmRSS:")


def own_peak_rss_mib() -> float:
    """This process's peak resident set so far, MiB: ``VmHWM`` of its own image (``getrusage`` where /proc is not:
    Linux carries ``ru_maxrss`` across fork and exec, so a child started by a large process would report its
    parent's size at the fork)."""
    return peak_rss_kib(os.getpid()) / 1024.0 or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy since boot, all cores (``/proc/stat``: all but idle and iowait)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text(encoding="utf-8").split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


# --- webhooks at a fixed rate -----------------------------------------------------------------------------------------


def signed_requests(secret: str, count: int, run_tag: str) -> list[tuple[bytes, dict[str, str]]]:
    """``count`` unique ``issue_comment`` deliveries (bench/intake.py's bodies, ~6.5 KB), signed with ``secret``."""
    template, _ = load_template(None)
    out = []
    for seq in range(count):
        body = make_body(template, run_tag, seq)
        out.append((body, {"Content-Type": "application/json", "X-Gitea-Event": EVENT, "X-Gitea-Event-Type": EVENT,
                           "X-Gitea-Delivery": str(uuid.uuid4()), "X-Gitea-Signature": sign(body, secret)}))
    return out


async def _send(http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
                sink: list[tuple[int, float]]) -> None:
    started = time.perf_counter()
    try:
        async with http.post(url, data=body, headers=headers) as resp:
            await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError):
        status = 0
    sink.append((status, (time.perf_counter() - started) * 1000.0))


async def paced_load(urls: dict[str, str], requests: Sequence[tuple[bytes, dict[str, str]]], rate: float,
                     start_epoch: float) -> dict[str, Any]:
    """Send ``requests`` to every url at ``rate`` per second from ``start_epoch``: answers and schedule slip."""
    answers: dict[str, list[tuple[int, float]]] = {name: [] for name in urls}
    slip_ms: list[float] = []
    tasks: list[asyncio.Task[None]] = []
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.sleep(max(0.0, start_epoch - time.time()))
        t0 = time.perf_counter()
        for k, (body, headers) in enumerate(requests):
            due = t0 + k / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            slip_ms.append((time.perf_counter() - due) * 1000.0)
            for name, url in urls.items():
                tasks.append(asyncio.create_task(_send(http, url, body, headers, answers[name])))
        sent_s = time.perf_counter() - t0
        await asyncio.gather(*tasks)
        answered_at = time.time()
    return {
        "answered_at": answered_at,
        "answers": {name: [[status, round(ms, 3)] for status, ms in got] for name, got in answers.items()},
        "delivery_ids": [headers["X-Gitea-Delivery"] for _, headers in requests],
        "schedule_slip_ms_max": max(slip_ms, default=0.0),
        "sent_s": sent_s,
        "peak_rss_mib": own_peak_rss_mib(),
    }


def _load_main(args: argparse.Namespace) -> int:
    urls = {"foreman": args.url, **({"bare": args.bare_url} if args.bare_url else {})}
    secret = os.environ.get("BENCH_LOAD_SECRET", "")
    if not secret:
        print("bench.harness load: set BENCH_LOAD_SECRET to the webhook secret (never on the command line)",
              file=sys.stderr)
        return 2
    requests = signed_requests(secret, max(1, round(args.rate * args.seconds)), uuid.uuid4().hex[:12])
    print("ready", flush=True)
    line = sys.stdin.readline().split()
    if len(line) != 2 or line[0] != "go":
        print(f"bench.harness load: expected 'go EPOCH' on stdin, got {line!r}", file=sys.stderr)
        return 2
    doc = asyncio.run(paced_load(urls, requests, args.rate, float(line[1])))
    print(json.dumps(doc), flush=True)
    return 0


#: When set, the ``gitea`` process appends one line per request to this file: the wall-clock start, the method,
#: the path, the status, the milliseconds it took and the client (a profile's Gitea calls per issue).
GITEA_REQUEST_LOG_ENV = "BENCH_GITEA_REQUEST_LOG"


def _request_logger(path: Path) -> Any:
    from aiohttp import web

    handle = path.open("a", encoding="utf-8", buffering=1)

    @web.middleware
    async def logged(request: web.Request, handler: Any) -> Any:
        started, began = time.time(), time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            agent = request.headers.get("User-Agent", "")[:20].replace(" ", "_")
            handle.write(f"{started:.6f} {request.method} {request.path_qs} {status}"
                         f" {(time.perf_counter() - began) * 1000.0:.2f} {agent}\n")

    return logged


#: The repository of the bare comment POST + GET beside demo/widgets (no hook: foreman never hears of it).
BASELINE_REPO = "baseline"


async def serve_gitea(root: Path) -> int:
    """``gitea``: the demo's emulator on loopback until stdin closes (or SIGTERM/SIGINT)."""
    import signal

    from bot.demo import seed_demo
    from bot.demo_harness import LIFE_USERS, MAINTAINER, OWNER, REPO, USERS
    from bot.emulator import Emulator, start_emulator

    emu = Emulator(root / "gitea", clone_protocol="http")
    tokens = seed_demo(emu, USERS + LIFE_USERS)
    emu.repo(OWNER, REPO).private = True
    emu.create_repo(OWNER, BASELINE_REPO, files={"README.md": "baseline\n"})
    emu.set_permission(OWNER, BASELINE_REPO, MAINTAINER, "admin")
    scratch = emu.create_issue(OWNER, BASELINE_REPO, title="The bare comment POST + GET", author=MAINTAINER).number
    request_log = os.environ.get(GITEA_REQUEST_LOG_ENV)
    if request_log:
        emu.app.middlewares.append(_request_logger(Path(request_log)))
    runner, url = await start_emulator(emu)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    loop.add_reader(sys.stdin.fileno(), lambda: stopped.set() if not os.read(sys.stdin.fileno(), 4096) else None)
    try:
        print(json.dumps({"url": url, "tokens": tokens, "baseline_repo": BASELINE_REPO,
                          "baseline_issue": scratch}), flush=True)
        await stopped.wait()
    finally:
        loop.remove_reader(sys.stdin.fileno())
        await runner.cleanup()
        await emu.aclose()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    load = sub.add_parser("load", help="signed webhooks at a fixed rate (a child of a benchmark)")
    load.add_argument("--url", required=True)
    load.add_argument("--bare-url", default=None)
    load.add_argument("--rate", type=float, required=True)
    load.add_argument("--seconds", type=float, required=True)
    gitea = sub.add_parser("gitea", help="the demo's Gitea emulator in this process (a child of bench/e2e.py)")
    gitea.add_argument("--root", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "gitea":
        return asyncio.run(serve_gitea(args.root))
    if args.rate <= 0 or args.seconds <= 0:
        parser.error("--rate and --seconds must be positive")
    return _load_main(args)


if __name__ == "__main__":
    sys.exit(main())
