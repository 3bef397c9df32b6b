"""Webhook intake benchmark: `foreman serve` as deployed (its worker processing what the door stores, a Gitea
answering it) versus a bare aiohttp endpoint, same load, same run.

    .venv/bin/python -m bench.intake [--requests N] [--concurrency 32] [--rounds 2] [--mcp [N]] [--client wrk|aiohttp]
                                     [--synchronous FULL|NORMAL] [--database-url URL] [--json] [--keep]

The load is ``wrk`` (one thread, ``--concurrency`` connections; bench/intake_wrk.py, its Lua script walks requests
built and signed beforehand), or with ``--client aiohttp`` one aiohttp client in this process. Each request is a
unique ~6.4 KB Gitea ``issues`` delivery about the repository the service serves; the service is configured with the
Gitea emulator in a process of its own (bench/intake_gitea.py), so its handlers run and its outbox calls Gitea.
``--mcp N`` (N = 1,000 when given alone) keeps N MCP sessions over ``/mcp`` open and active on the same service
throughout (bench/intake_mcp.py). The run itself, its rounds and checks: bench/intake_run.py.

Exit status: 0 when the run was valid (a missed performance target is reported, not fatal); 1 on an
error (a non-202 answer, a lost or unfinished row, a failed session call, a process that would not start or stop);
2 on bad usage (a bad ``--payload``, or ``wrk`` missing without ``--client aiohttp``).
See docs/benchmarks.md for what the figures mean and the numbers measured on the team machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import hashlib
import hmac
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench import positive_int
from bench.database import scratch_schema

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FOREMAN_SHARED", str(REPO_ROOT.parent / "shared")))
DEFAULT_PAYLOAD = SHARED / "gitea" / "payloads" / "issue_comment-created--go-playground.json"
SECRET = "bench-secret-0123456789abcdef"
EVENT = "issue_comment"

TARGET_RATIO = 0.5  # intake throughput at least half the bare endpoint's ...
TARGET_P99_MS = 50.0  # ... with a p99 latency under 50 ms (the issue's targets)

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


# --- payloads and the bare endpoint (in its own subprocess) -----------------------------------------------------------
def _builtin_user(login: str = "example", uid: int = 1) -> dict[str, Any]:
    return {
        "id": uid, "login": login, "full_name": "", "email": f"{login}@example.com",
        "avatar_url": "http://localhost:3000/avatar/23463b99b62a72f26ed677cc556c44e8", "language": "",
        "is_admin": False, "last_login": "0001-01-01T00:00:00Z", "created": "2022-03-09T16:14:22+09:00",
        "restricted": False, "active": False, "prohibit_login": False, "location": "", "website": "", "description": "",
        "visibility": "public", "followers_count": 0, "following_count": 0, "starred_repos_count": 0, "username": login,
    }


def builtin_payload() -> dict[str, Any]:
    """A Gitea 1.16-shaped issue_comment/created payload (~6.4 KB pretty-printed), for when ../shared is absent."""
    base = "http://localhost:3000"
    return {
        "action": "created",
        "issue": {
            "id": 1,
            "url": f"{base}/api/v1/repos/example/example/issues/1",
            "html_url": f"{base}/example/example/issues/1",
            "number": 1,
            "user": _builtin_user(),
            "original_author": "",
            "original_author_id": 0,
            "title": "example",
            "body": "",
            "ref": "",
            "labels": [],
            "milestone": None,
            "assignee": _builtin_user(),
            "assignees": [_builtin_user()],
            "state": "open",
            "is_locked": False,
            "comments": 0,
            "created_at": "2022-03-09T16:19:00+09:00",
            "updated_at": "2022-03-09T16:20:44+09:00",
            "closed_at": None,
            "due_date": None,
            "pull_request": None,
            "repository": {"id": 1, "name": "example", "owner": "example", "full_name": "example/example"},
        },
        "comment": {
            "id": 2,
            "html_url": f"{base}/example/example/issues/1#issuecomment-2",
            "pull_request_url": "",
            "issue_url": f"{base}/example/example/issues/1",
            "user": _builtin_user(),
            "original_author": "",
            "original_author_id": 0,
            "body": "example",
            "created_at": "2022-03-09T16:20:44+09:00",
            "updated_at": "2022-03-09T16:20:44+09:00",
        },
        "repository": {
            "id": 1,
            "owner": _builtin_user(),
            "name": "example",
            "full_name": "example/example",
            "description": "",
            "empty": True,
            "private": False,
            "fork": False,
            "template": False,
            "parent": None,
            "mirror": False,
            "size": 76,
            "html_url": f"{base}/example/example",
            "ssh_url": "git@localhost:example/example.git",
            "clone_url": f"{base}/example/example.git",
            "original_url": "",
            "website": "",
            "stars_count": 0,
            "forks_count": 0,
            "watchers_count": 1,
            "open_issues_count": 1,
            "open_pr_counter": 0,
            "release_counter": 0,
            "default_branch": "master",
            "archived": False,
            "created_at": "2022-03-09T16:14:29+09:00",
            "updated_at": "2022-03-09T16:14:29+09:00",
            "permissions": {"admin": True, "push": True, "pull": True},
            "has_issues": True,
            "internal_tracker": {"enable_time_tracker": True, "allow_only_contributors_to_track_time": True,
                                 "enable_issue_dependencies": True},
            "has_wiki": True, "has_pull_requests": True, "has_projects": True, "ignore_whitespace_conflicts": False,
            "allow_merge_commits": True, "allow_rebase": True, "allow_rebase_explicit": True,
            "allow_squash_merge": True, "default_merge_style": "merge",
            "avatar_url": "",
            "internal": False,
            "mirror_interval": "",
            "mirror_updated": "0001-01-01T00:00:00Z",
            "repo_transfer": None,
        },
        "sender": _builtin_user(),
        "is_pull": False,
    }


def load_template(path: str | None) -> tuple[dict[str, Any], str]:
    """The payload to vary: the given file, else the shared go-playground sample, else the built-in one."""
    if path == "builtin":
        return builtin_payload(), "builtin"
    candidate = Path(path) if path else DEFAULT_PAYLOAD
    if path is None and not candidate.is_file():
        return builtin_payload(), "builtin"
    doc = json.loads(candidate.read_bytes())
    if not isinstance(doc, dict) or not isinstance(doc.get("comment"), dict):
        raise ValueError(f"{candidate} is not an issue_comment payload (no 'comment' object)")
    return doc, str(candidate)


def make_body(template: dict[str, Any], run_tag: str, seq: int) -> bytes:
    """A unique body: its own comment id, URL and text; Gitea's 2-space layout, no trailing newline."""
    doc = copy.deepcopy(template)
    comment = doc["comment"]
    comment_id = 1_000_000 + seq
    comment["id"] = comment_id
    html_url = comment.get("html_url") or ""
    comment["html_url"] = f"{html_url.split('#', 1)[0]}#issuecomment-{comment_id}"
    comment["body"] = f"benchmark comment {seq} of run {run_tag}: /status please"
    return json.dumps(doc, indent=2).encode()


def sign(body: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def make_requests(template: dict[str, Any], run_tag: str, start: int, count: int) -> list[tuple[bytes, dict[str, str]]]:
    requests = []
    for seq in range(start, start + count):
        body = make_body(template, run_tag, seq)
        requests.append(
            (
                body,
                {
                    "Content-Type": "application/json",
                    "X-Gitea-Event": EVENT,
                    "X-Gitea-Event-Type": EVENT,
                    "X-Gitea-Delivery": str(uuid.uuid4()),
                    "X-Gitea-Signature": sign(body),
                },
            )
        )
    return requests


def serve_bare(host: str, port: int) -> int:
    """Reads the body and answers 202, nothing else: the ceiling for the same HTTP stack and client."""

    async def webhook(request: web.Request) -> web.Response:
        await request.read()
        delivery = request.headers.get("X-Gitea-Delivery", "")
        return web.json_response({"delivery": delivery, "status": "queued"}, status=202)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=5 * 1024 * 1024 + 1024)
    app.router.add_post("/webhook", webhook)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host=host, port=port, access_log=None, print=None)  # SIGTERM: graceful exit
    return EXIT_OK


# --- targets and load -------------------------------------------------------------------------------------------------
class BenchError(Exception):
    """The run is invalid (not merely slow)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process, all threads (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_memory_kb(pid: int) -> dict[str, int] | None:
    """VmRSS (resident now) and VmHWM (peak resident) of a process in KiB (Linux /proc); None elsewhere."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name] = int(value.split()[0])
    return found if len(found) == 2 else None


def _child_env() -> dict[str, str]:
    # The temp config is the whole configuration: no FOREMAN_* override from the caller leaks in.
    return {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}


@dataclass
class Target:
    name: str
    argv: list[str]
    port: int
    log_path: Path
    proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/webhook"

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def start(self, timeout_s: float = 30.0) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, cwd=str(REPO_ROOT), env=_child_env(), stdout=log, stderr=log
            )
        deadline = time.monotonic() + timeout_s
        health = f"http://127.0.0.1:{self.port}/healthz"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while True:
                if self.proc.returncode is not None:
                    raise BenchError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(health) as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise BenchError(f"{self.name} not healthy after {timeout_s:.0f}s:\n{self.log_tail()}")
                await asyncio.sleep(0.05)

    async def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM and wait; returns the exit code (killed after timeout_s: an error)."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return proc.returncode if proc else None
        proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise BenchError(f"{self.name} did not stop within {timeout_s:.0f}s of SIGTERM; killed") from None

    def cpu_s(self) -> float | None:
        return process_cpu_s(self.proc.pid) if self.proc is not None else None

    def memory_kb(self) -> dict[str, int] | None:
        return process_memory_kb(self.proc.pid) if self.proc is not None else None


@dataclass
class RoundResult:
    target: str
    requests: int
    seconds: float
    latencies_ms: list[float]
    statuses: dict[int, int]
    bad_answers: list[str]
    server_cpu_s: float | None
    client_cpu_s: float
    drain_s: float | None = None
    memory_kb: dict[str, int] | None = None  # the target's VmRSS / VmHWM right after the round


    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "seconds": round(self.seconds, 4),
            "deliveries_per_s": round(self.statuses.get(202, 0) / self.seconds, 1),  # accepted (202) per second
            "p50_ms": round(percentile(self.latencies_ms, 50), 3),
            "p99_ms": round(percentile(self.latencies_ms, 99), 3),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "server_cpu_ms_per_request": _per_request_ms(self.server_cpu_s, self.requests),
            "client_cpu_ms_per_request": _per_request_ms(self.client_cpu_s, self.requests),
            "worker_drain_s": None if self.drain_s is None else round(self.drain_s, 3),
            "rss_mib": _mib(self.memory_kb, "VmRSS"),
            "peak_rss_mib": _mib(self.memory_kb, "VmHWM"),
        }


def _mib(memory_kb: dict[str, int] | None, name: str) -> float | None:
    return None if memory_kb is None else round(memory_kb[name] / 1024, 1)


def _per_request_ms(cpu_s: float | None, requests: int) -> float | None:
    return None if cpu_s is None else round(cpu_s * 1000 / requests, 4)


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (the value below which pct % of the samples fall)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil(n * pct / 100)
    return ordered[int(rank) - 1]


async def send_round(target: Target, requests: Sequence[tuple[bytes, dict[str, str]]], concurrency: int) -> RoundResult:
    """`concurrency` workers over one session (TCPConnector(limit=concurrency)) send every request once."""
    latencies = [0.0] * len(requests)
    codes = [0] * len(requests)
    bad: list[str] = []
    indexes = iter(range(len(requests)))
    timeout = aiohttp.ClientTimeout(total=60)

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in indexes:
            body, headers = requests[i]
            started = time.perf_counter()
            async with session.post(target.url, data=body, headers=headers) as resp:
                answer = await resp.read()
            latencies[i] = (time.perf_counter() - started) * 1000
            codes[i] = resp.status
            if resp.status != 202 and len(bad) < 3:
                text = f"{resp.status} {answer[:200].decode(errors='replace')}"
                if text not in bad:
                    bad.append(text)

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        cpu0, client0 = target.cpu_s(), time.process_time()
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
        cpu1, client1 = target.cpu_s(), time.process_time()
    memory = target.memory_kb()
    statuses: dict[int, int] = {}
    for code in codes:
        statuses[code] = statuses.get(code, 0) + 1
    server_cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    return RoundResult(
        target.name, len(requests), seconds, latencies, statuses, bad, server_cpu, client1 - client0, memory_kb=memory
    )


# --- the run (bench/intake_run.py) -----------------------------------------------------------------------------------
@dataclass
class Options:
    requests: int
    concurrency: int
    rounds: int
    warmup: int
    payload: str | None
    synchronous: str
    tmpdir: str | None
    keep: bool
    client: str = "wrk"
    mcp: int = 0
    issues: int = 50
    py_spy: str | None = None
    service_config: str | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.intake", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=positive_int, default=5000, help="requests per round per target")
    parser.add_argument("--concurrency", type=positive_int, default=32, help="connections (wrk -c, client workers)")
    parser.add_argument("--rounds", type=positive_int, default=2, help="measured rounds per target (alternated)")
    parser.add_argument("--warmup", type=int, default=500, help="unmeasured requests per target first")
    parser.add_argument("--client", choices=("wrk", "aiohttp"), default="wrk",
                        help="the load generator: wrk (one thread; the default) or an aiohttp client in this process")
    parser.add_argument("--mcp", type=int, nargs="?", const=1000, default=0, metavar="N",
                        help="keep N MCP sessions over /mcp open and active on the service (N = 1000 when omitted)")
    parser.add_argument("--issues", type=positive_int, default=50, help="open issues in the served repository")
    parser.add_argument("--payload", choices=("builtin",),
                        help="'builtin': the built-in issues body instead of $FOREMAN_SHARED/gitea/payloads' ones")
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL", help="service's SQLite mode")
    parser.add_argument("--tmpdir", help="where the temp database goes (default: the system temp dir)")
    parser.add_argument("--database-url", metavar="URL",
                        help="also run on PostgreSQL at URL (a schema of its own there), after the SQLite run")
    parser.add_argument("--py-spy", metavar="DIR", help="sample the service with py-spy --nonblocking during each"
                        " foreman round and each drain, raw folded stacks into DIR (round-N.txt, drain-N.txt)")
    parser.add_argument("--service-config", metavar="JSON", help="laid over the service's config, e.g."
                        ' \'{"worker": {"max_stand_aside_s": 5}}\' (experiments)')
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (database, logs, config)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser


async def _stoppable(run: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """The run, cancelled by SIGTERM or SIGINT: its cleanup stops every process it started before the exit."""
    task = asyncio.ensure_future(run)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serve_bare:
        return serve_bare("127.0.0.1", args.port)
    from bench.intake_run import render, run_deployed  # it imports this module
    from bench.intake_wrk import wrk_path

    if args.client == "wrk" and wrk_path() is None:
        print("wrk is not installed: apt-get install -y wrk, or run with --client aiohttp", file=sys.stderr)
        return EXIT_USAGE
    options = Options(
        requests=args.requests, concurrency=args.concurrency, rounds=args.rounds, warmup=max(0, args.warmup),
        payload=args.payload, synchronous=args.synchronous, tmpdir=args.tmpdir, keep=args.keep, client=args.client,
        mcp=max(0, args.mcp), issues=args.issues, py_spy=str(Path(args.py_spy).resolve()) if args.py_spy else None,
        service_config=args.service_config,
    )
    try:
        doc = asyncio.run(_stoppable(run_deployed(options)))
    except asyncio.CancelledError:
        print("interrupted (SIGTERM or SIGINT): every process the run started was stopped", file=sys.stderr)
        return EXIT_ERROR
    if args.database_url is None:
        print(json.dumps(doc, indent=2) if args.json else render(doc))
        return EXIT_OK if doc["ok"] else EXIT_ERROR
    with scratch_schema(args.database_url, keep=args.keep) as url:
        on_postgres = asyncio.run(_stoppable(run_deployed(options, url)))
    both = {"sqlite": doc, "postgresql": on_postgres, "ok": doc["ok"] and on_postgres["ok"]}
    if args.json:
        print(json.dumps(both, indent=2))
    else:
        print("SQLite\n" + render(doc) + "\n\nPostgreSQL\n" + render(on_postgres))
    return EXIT_OK if both["ok"] else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
