"""Webhook intake benchmark: `foreman serve` versus a bare aiohttp endpoint, same load, same run.

    .venv/bin/python -m bench.intake [--requests N] [--concurrency 32] [--rounds 2] [--database-url URL] [--json]

Both targets run as subprocesses on loopback; one aiohttp client (this process) sends signed, unique ~6 KB
Gitea ``issue_comment`` deliveries to them in alternation (warm-up, then bare, foreman, bare, foreman ...).
Every round sends the very same requests to both targets. After a foreman round (but the last) the benchmark
waits until the service's worker has drained what it stored, so that backlog never runs during a bare round.
After the service is stopped, its database is opened read-only and the stored rows counted. ``--database-url``
runs the same benchmark once more with the service on PostgreSQL (a schema of its own there), after the SQLite run.

Exit status: 0 when the run was valid (a missed performance target is reported, not fatal); 1 on an
error (a non-202 answer, a missing row, a target that would not start or stop); 2 on bad usage.
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
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench import positive_int
from bench.database import Target as DatabaseTarget
from bench.database import exists, rows, scratch_schema
from bot.config_writer import write_config

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FOREMAN_SHARED", str(REPO_ROOT.parent / "shared")))
DEFAULT_PAYLOAD = SHARED / "gitea" / "payloads" / "issue_comment-created--go-playground.json"
SECRET = "bench-secret-0123456789abcdef"
EVENT = "issue_comment"

TARGET_RATIO = 0.5  # intake throughput at least half the bare endpoint's ...
TARGET_P99_MS = 50.0  # ... with a p99 latency under 50 ms (the targets)

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


def write_foreman_config(
    workdir: Path, port: int, synchronous: str, database_url: str | None
) -> tuple[Path, DatabaseTarget]:
    """The service's config: SQLite in ``workdir``, or PostgreSQL at ``database_url``; returns where it stores."""
    db_path = workdir / "foreman.db"
    config = workdir / "foreman.toml"
    database: dict[str, Any] = {"synchronous": synchronous}
    database.update({"path": db_path} if database_url is None else {"url": database_url})
    write_config(config, {
        "server": {"host": "127.0.0.1", "port": port},
        "webhook": {"secrets": [SECRET]},
        "database": database,
        "repository": {"checkout_root": workdir / "checkouts"},
    })
    return config, db_path if database_url is None else database_url


def count_rows(target: DatabaseTarget) -> tuple[int, dict[str, int]]:
    total = rows(target, "SELECT COUNT(*) AS n FROM deliveries")[0]["n"]
    grouped = rows(target, "SELECT status, COUNT(*) AS n FROM deliveries GROUP BY status")
    by_status = {r["status"]: r["n"] for r in grouped}
    return int(total), {str(k): int(v) for k, v in by_status.items()}


def pending_rows(target: DatabaseTarget) -> int:
    found = rows(target, "SELECT COUNT(*) AS n FROM deliveries WHERE status IN ('queued', 'processing')")
    return int(found[0]["n"])


async def wait_drained(target: DatabaseTarget, timeout_s: float) -> float:
    """Wait until the service's worker has settled everything stored so far; returns the seconds waited."""
    started = time.perf_counter()
    while pending_rows(target) > 0:
        if time.perf_counter() - started > timeout_s:
            raise BenchError(f"the worker did not drain the inbox within {timeout_s:.0f}s")
        await asyncio.sleep(0.05)
    return time.perf_counter() - started


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


def aggregate(rounds: Sequence[RoundResult]) -> dict[str, Any]:
    requests = sum(r.requests for r in rounds)
    seconds = sum(r.seconds for r in rounds)
    latencies = [x for r in rounds for x in r.latencies_ms]
    statuses: dict[int, int] = {}
    for r in rounds:
        for code, n in r.statuses.items():
            statuses[code] = statuses.get(code, 0) + n
    server_cpu = [r.server_cpu_s for r in rounds]
    first, last = rounds[0].memory_kb, rounds[-1].memory_kb
    return {
        "requests": requests,
        "seconds": round(seconds, 4),
        "deliveries_per_s": round(statuses.get(202, 0) / seconds, 1) if seconds else None,
        "p50_ms": round(percentile(latencies, 50), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
        "max_ms": round(max(latencies), 3) if latencies else None,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "all_202": set(statuses) == {202},
        "server_cpu_ms_per_request": (
            None if None in server_cpu else _per_request_ms(sum(c or 0.0 for c in server_cpu), requests)
        ),
        "client_cpu_ms_per_request": _per_request_ms(sum(r.client_cpu_s for r in rounds), requests),
        # Peak resident memory over the whole run so far (the kernel's high-water mark), and how the resident
        # memory after round 1 compares with the resident memory after the last round.
        "peak_rss_mib": _mib(last, "VmHWM"),
        "rss_first_round_mib": _mib(first, "VmRSS"),
        "rss_last_round_mib": _mib(last, "VmRSS"),
        "rss_growth_mib": None if first is None or last is None else round((last["VmRSS"] - first["VmRSS"]) / 1024, 1),
        "rounds": [r.summary() for r in rounds],
    }


# --- the run ----------------------------------------------------------------------------------------------------------
@dataclass
class Options:
    requests: int
    concurrency: int
    rounds: int
    warmup: int
    payload: str | None
    synchronous: str
    tmpdir: str | None
    profile: str | None
    keep: bool


async def run(
    options: Options, template: dict[str, Any], payload_source: str, database_url: str | None = None
) -> dict[str, Any]:
    """One benchmark run: on SQLite, or on PostgreSQL at ``database_url`` (a schema of its own there)."""
    run_tag = uuid.uuid4().hex[:12]
    sample = make_body(template, run_tag, 0)
    workdir = Path(tempfile.mkdtemp(prefix="foreman-bench-", dir=options.tmpdir))
    foreman_port = free_port()
    config_path, db_path = write_foreman_config(workdir, foreman_port, options.synchronous, database_url)
    foreman_argv = [sys.executable]
    if options.profile:
        foreman_argv += ["-m", "cProfile", "-o", options.profile]
    foreman_argv += ["-m", "bot", "--config", str(config_path), "serve"]
    bare_port = free_port()
    bare = Target(
        "bare",
        [sys.executable, "-m", "bench.intake", "--serve-bare", "--port", str(bare_port)],
        bare_port,
        workdir / "bare.log",
    )
    foreman = Target("foreman", foreman_argv, foreman_port, workdir / "foreman.log")
    results: dict[str, list[RoundResult]] = {"bare": [], "foreman": []}
    errors: list[str] = []
    sent_to_foreman = 0
    seq = 0
    wall_started = time.perf_counter()
    try:
        await asyncio.gather(bare.start(), foreman.start())
        # Warm-up: not measured, but the foreman's warm-up rows are stored and counted like the others.
        if options.warmup:
            warm = make_requests(template, run_tag, seq, options.warmup)
            seq += options.warmup
            for target in (bare, foreman):
                warmed = await send_round(target, warm, options.concurrency)
                if set(warmed.statuses) != {202}:
                    errors.append(f"{target.name} warm-up answers {warmed.statuses}: {warmed.bad_answers}")
            sent_to_foreman += options.warmup
            await wait_drained(db_path, 60)
        for round_no in range(1, options.rounds + 1):
            batch = make_requests(template, run_tag, seq, options.requests)
            seq += options.requests
            for target in (bare, foreman):  # bare, foreman, bare, foreman ...: the same requests to both
                result = await send_round(target, batch, options.concurrency)
                if target is foreman:
                    sent_to_foreman += len(batch)
                    if round_no < options.rounds:  # the worker's backlog must not run during the next bare round
                        result.drain_s = await wait_drained(db_path, 120)
                if set(result.statuses) != {202}:
                    errors.append(f"{target.name}: non-202 answers {result.statuses}: {result.bad_answers}")
                results[target.name].append(result)
            del batch
    except (BenchError, aiohttp.ClientError, TimeoutError) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        for target in (bare, foreman):
            try:
                code = await target.stop()
            except BenchError as exc:
                errors.append(str(exc))
            else:
                if code not in (0, None):
                    errors.append(f"{target.name} exited with {code} after SIGTERM:\n{target.log_tail()}")
    stored, rows_by_status = 0, dict[str, int]()
    if exists(db_path):
        stored, rows_by_status = count_rows(db_path)
    if stored != sent_to_foreman:
        errors.append(f"foreman stored {stored} rows for {sent_to_foreman} requests sent")
    bare_doc = aggregate(results["bare"]) if results["bare"] else None
    foreman_doc = aggregate(results["foreman"]) if results["foreman"] else None
    ratio = None
    if bare_doc and foreman_doc and bare_doc["deliveries_per_s"]:
        ratio = round(foreman_doc["deliveries_per_s"] / bare_doc["deliveries_per_s"], 3)
    if foreman_doc is not None:
        foreman_doc.update(rows_expected=sent_to_foreman, rows_stored=stored, rows_by_status=rows_by_status)
    p99 = foreman_doc["p99_ms"] if foreman_doc else None
    settings: dict[str, Any] = {
        "requests_per_round": options.requests,
        "rounds": options.rounds,
        "warmup": options.warmup,
        "concurrency": options.concurrency,
        "payload": payload_source,
        "payload_bytes": len(sample),
        "synchronous": options.synchronous,
        "database": "sqlite" if database_url is None else "postgresql",
        "workdir": str(workdir),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "aiohttp": aiohttp.__version__,
    }
    doc: dict[str, Any] = {
        "settings": settings,
        "bare": bare_doc,
        "foreman": foreman_doc,
        "ratio": ratio,
        "targets": {
            "throughput_ratio": {
                "target": f">= {TARGET_RATIO}",
                "value": ratio,
                "result": None if ratio is None or errors else ("PASS" if ratio >= TARGET_RATIO else "MISS"),
            },
            "p99_ms": {
                "target": f"< {TARGET_P99_MS}",
                "value": p99,
                "result": None if p99 is None or errors else ("PASS" if p99 < TARGET_P99_MS else "MISS"),
            },
        },
        "wall_s": round(time.perf_counter() - wall_started, 2),
        "errors": errors,
        "ok": not errors and bare_doc is not None and foreman_doc is not None,
    }
    if not options.keep and doc["ok"]:
        shutil.rmtree(workdir, ignore_errors=True)
        settings["workdir"] = None
    return doc


def render_text(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [
        f"intake benchmark: {s['rounds']} round(s) x {s['requests_per_round']} requests per target"
        f" (+{s['warmup']} warm-up), concurrency {s['concurrency']}, {s['payload_bytes']} B bodies"
        f" from {s['payload']}, {s['database']}, synchronous={s['synchronous']}, {s['cpus']} CPUs",
        "",
        f"{'target':<8} {'round':>5} {'deliveries/s':>12} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'srv cpu ms/req':>14} {'cli cpu ms/req':>14} {'drain s':>8} {'rss MiB':>8} {'peak MiB':>8}",
    ]

    def row(name: str, label: str, d: dict[str, Any]) -> str:
        cpu = d.get("server_cpu_ms_per_request")
        client = d["client_cpu_ms_per_request"]
        drain = d.get("worker_drain_s")
        rss, peak = d.get("rss_mib", d.get("rss_last_round_mib")), d.get("peak_rss_mib")
        return (
            f"{name:<8} {label:>5} {d['deliveries_per_s']:>12.1f} {d['p50_ms']:>8.2f} {d['p99_ms']:>8.2f}"
            f" {'-' if cpu is None else f'{cpu:.3f}':>14} {client:>14.3f}"
            f" {'-' if drain is None else f'{drain:.2f}':>8}"
            f" {'-' if rss is None else f'{rss:.1f}':>8} {'-' if peak is None else f'{peak:.1f}':>8}"
        )

    for name in ("bare", "foreman"):
        d = doc[name]
        if d is None:
            continue
        for i, r in enumerate(d["rounds"], 1):
            lines.append(row(name, str(i), r))
        lines.append(row(name, "all", d))
    if doc["foreman"] is not None:
        f = doc["foreman"]
        lines += [
            "",
            f"foreman answers: {f['statuses']}; rows stored {f['rows_stored']} of {f['rows_expected']}"
            f" ({f['rows_by_status']})",
        ]
    for name in ("bare", "foreman"):
        d = doc[name]
        if d is not None and d["rss_growth_mib"] is not None:
            lines.append(
                f"{name} memory: peak RSS {d['peak_rss_mib']} MiB; RSS after round 1 {d['rss_first_round_mib']} MiB,"
                f" after the last {d['rss_last_round_mib']} MiB (growth {d['rss_growth_mib']:+.1f} MiB)"
            )
    t = doc["targets"]
    lines += [
        f"ratio foreman/bare (throughput): {doc['ratio']}",
        f"target throughput ratio {t['throughput_ratio']['target']}: {t['throughput_ratio']['result'] or 'n/a'}",
        f"target p99 {t['p99_ms']['target']} ms: {t['p99_ms']['result'] or 'n/a'} ({t['p99_ms']['value']} ms)",
        f"wall time {doc['wall_s']} s",
    ]
    if doc["errors"]:
        lines += ["", "ERRORS:"] + [f"  {e}" for e in doc["errors"]]
    if doc["settings"]["workdir"]:
        lines.append(f"kept: {doc['settings']['workdir']}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.intake", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=positive_int, default=5000, help="requests per round per target")
    parser.add_argument("--concurrency", type=positive_int, default=32, help="client workers = connections")
    parser.add_argument("--rounds", type=positive_int, default=2, help="measured rounds per target (alternated)")
    parser.add_argument("--warmup", type=int, default=500, help="unmeasured requests per target first")
    parser.add_argument(
        "--payload",
        help=f"issue_comment JSON to vary (default {DEFAULT_PAYLOAD} if present, else 'builtin')",
    )
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="FULL", help="service's SQLite mode")
    parser.add_argument("--tmpdir", help="where the temp database goes (default: the system temp dir)")
    parser.add_argument("--database-url", metavar="URL",
                        help="also run on PostgreSQL at URL (a schema of its own there), after the SQLite run")
    parser.add_argument("--profile", metavar="PATH", help="run the service under cProfile, stats to PATH")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (database, logs, config)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--serve-bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serve_bare:
        return serve_bare("127.0.0.1", args.port)
    options = Options(
        requests=args.requests,
        concurrency=args.concurrency,
        rounds=args.rounds,
        warmup=max(0, args.warmup),
        payload=args.payload,
        synchronous=args.synchronous,
        tmpdir=args.tmpdir,
        profile=str(Path(args.profile).resolve()) if args.profile else None,
        keep=args.keep,
    )
    try:
        template, payload_source = load_template(options.payload)
    except (OSError, ValueError) as exc:
        print(json.dumps({"error": "bad_payload", "message": str(exc)}), file=sys.stderr)
        return EXIT_USAGE
    doc = asyncio.run(run(options, template, payload_source))
    if args.database_url is None:
        print(json.dumps(doc, indent=2) if args.json else render_text(doc))
        return EXIT_OK if doc["ok"] else EXIT_ERROR
    with scratch_schema(args.database_url, keep=args.keep) as url:
        on_postgres = asyncio.run(run(options, template, payload_source, url))
    both = {"sqlite": doc, "postgresql": on_postgres, "ok": doc["ok"] and on_postgres["ok"]}
    if args.json:
        print(json.dumps(both, indent=2))
    else:
        print("SQLite\n" + render_text(doc) + "\n\nPostgreSQL\n" + render_text(on_postgres))
    return EXIT_OK if both["ok"] else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
