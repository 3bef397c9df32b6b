"""Webhook intake of two `foreman serve` replicas on one PostgreSQL database, beside one replica, same run.

    .venv/bin/python -m bench.replicas [--requests 3000] [--rounds 2] [--concurrency 32] [--database-url URL] [--json]

One PostgreSQL schema (created for the run, dropped after unless ``--keep``) and two `foreman serve` processes
configured alike on it (replica A and replica B, each its own port). Rounds alternate: **one** (A alone runs;
``--concurrency`` connections send it ``--requests`` signed, unique ~6 KB ``issue_comment`` deliveries) and **two**
(B started beside A; the same number of requests, the connections split half to each: 16 + 16 by default), the
order swapped every other pair (one, two, two, one, ...). After each round the replicas' workers drain what was
stored before the next starts; B is stopped (SIGTERM) after each two-replica round.

Printed: each kind's accepted deliveries per second (202 answers over the round's wall time, all its rounds
together), p50 and p99 of the answers, and the ratio two / one with PASS or MISS against the target (>= 1.0x:
two replicas take at least what one does, no collapse under the one advisory lock every write takes; issue 35).

Checks (exit 1 if any fails; a missed target is reported, not fatal; 2 on bad usage): every answer was 202; every
202 is one stored row (its delivery id, exactly once) and nothing else was stored; every stored delivery was
processed exactly once across both replicas (claimed once: ``attempts`` 1, and settled); both replicas exited 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import positive_int
from bench.database import rows, scratch_schema
from bench.e2e import percentile, run_root
from bot.config_writer import write_config

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FOREMAN_SHARED", str(REPO_ROOT.parent / "shared")))
PAYLOAD = SHARED / "gitea" / "payloads" / "issue_comment-created--go-playground.json"
SECRET = "bench-replicas-secret-0123456789"
DEFAULT_URL = os.environ.get("FOREMAN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
#: Issue 35: two replicas' intake at least one replica's, same total load, same run.
TARGET_RATIO = 1.0
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class BenchFailed(Exception):
    """The run is invalid (not merely slow)."""


# --- the deliveries ---------------------------------------------------------------------------------------------------
def template() -> dict[str, Any]:
    """Gitea's issue_comment/created sample from ../shared, else a minimal one of the same shape."""
    if PAYLOAD.is_file():
        doc: dict[str, Any] = json.loads(PAYLOAD.read_bytes())
        return doc
    user = {"id": 1, "login": "example", "username": "example", "email": "example@example.com"}
    repo = {"id": 1, "name": "example", "full_name": "example/example", "owner": user, "default_branch": "main",
            "html_url": "http://localhost:3000/example/example"}
    issue_url = "http://localhost:3000/example/example/issues/1"
    issue = {"id": 1, "number": 1, "title": "example", "body": "", "state": "open", "labels": [], "user": user,
             "html_url": issue_url, "pull_request": None}
    comment = {"id": 2, "body": "example", "user": user, "html_url": f"{issue_url}#issuecomment-2"}
    return {"action": "created", "issue": issue, "comment": comment, "repository": repo, "sender": user,
            "is_pull": False}


def requests(base: dict[str, Any], run_tag: str, start: int, count: int) -> list[tuple[str, bytes, dict[str, str]]]:
    """``count`` signed deliveries, each its own comment id and body: (delivery id, body, headers)."""
    made = []
    for seq in range(start, start + count):
        doc = json.loads(json.dumps(base))
        doc["comment"]["id"] = 1_000_000 + seq
        doc["comment"]["body"] = f"replicas benchmark comment {seq} of run {run_tag}"
        body = json.dumps(doc, indent=2).encode()
        delivery = str(uuid.uuid4())
        made.append((delivery, body, {
            "Content-Type": "application/json", "X-Gitea-Event": "issue_comment",
            "X-Gitea-Event-Type": "issue_comment", "X-Gitea-Delivery": delivery,
            "X-Gitea-Signature": hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest(),
        }))
    return made


# --- the replicas -----------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Replica:
    name: str
    root: Path
    database_url: str
    checkouts: Path
    port: int = field(default_factory=free_port)
    proc: asyncio.subprocess.Process | None = None
    exit_codes: list[int | None] = field(default_factory=list)
    worker: dict[str, Any] | None = None  # a [worker] table, when the run sets one

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/webhook"

    @property
    def log(self) -> Path:
        return self.root / f"{self.name}.log"

    async def start(self, timeout_s: float) -> None:
        config = self.root / f"{self.name}.toml"
        write_config(config, {
            "server": {"host": "127.0.0.1", "port": self.port},
            "webhook": {"secrets": [SECRET]},
            "database": {"url": self.database_url},
            "repository": {"checkout_root": self.checkouts},
            **({} if self.worker is None else {"worker": self.worker}),
        })
        env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
        with self.log.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "--config", str(config), "serve", cwd=str(REPO_ROOT), env=env,
                stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while True:
                if self.proc.returncode is not None:
                    raise BenchFailed(f"replica {self.name} exited with {self.proc.returncode}: {self.tail()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(f"http://127.0.0.1:{self.port}/healthz") as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise BenchFailed(f"replica {self.name} not healthy after {timeout_s:.0f} s: {self.tail()}")
                await asyncio.sleep(0.05)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM and wait (killed after ``timeout_s``: recorded as an exit of None)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                self.exit_codes.append(None)
                return
        self.exit_codes.append(proc.returncode)

    def tail(self) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-8:])
        except OSError:
            return "(no log)"


# --- the load ---------------------------------------------------------------------------------------------------------
@dataclass
class Round:
    kind: str  # "one" or "two"
    seconds: float
    latencies_ms: list[float]
    accepted: list[str]  # delivery ids answered 202
    refused: dict[int, int]  # other answers by status
    backlog: int = 0  # stored deliveries not yet processed when the round's last answer came


async def send(plan: Sequence[tuple[str, int]], batch: Sequence[tuple[str, bytes, dict[str, str]]], kind: str
               ) -> Round:
    """``plan``: (replica URL, connections) pairs; the requests are dealt to them in turn (round-robin), each
    replica's share sent over its own connections, all at once."""
    shares: list[list[tuple[str, bytes, dict[str, str]]]] = [list(batch[k::len(plan)]) for k in range(len(plan))]
    latencies: list[float] = []
    accepted: list[str] = []
    refused: dict[int, int] = {}
    timeout = aiohttp.ClientTimeout(total=60)

    async def one_replica(url: str, connections: int, share: list[tuple[str, bytes, dict[str, str]]]) -> None:
        pending = iter(share)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections), timeout=timeout) as http:

            async def worker() -> None:
                for delivery, body, headers in pending:
                    began = time.perf_counter()
                    async with http.post(url, data=body, headers=headers) as resp:
                        await resp.read()
                    latencies.append((time.perf_counter() - began) * 1000.0)
                    if resp.status == 202:
                        accepted.append(delivery)
                    else:
                        refused[resp.status] = refused.get(resp.status, 0) + 1

            await asyncio.gather(*(worker() for _ in range(connections)))

    began = time.perf_counter()
    await asyncio.gather(*(one_replica(url, n, share) for (url, n), share in zip(plan, shares, strict=True)))
    return Round(kind, time.perf_counter() - began, latencies, accepted, refused)


def _backlog(url: str) -> int:
    return int(rows(url, "SELECT COUNT(*) AS n FROM deliveries WHERE status IN ('queued', 'processing')")[0]["n"])


async def drained(url: str, timeout_s: float) -> None:
    """Until no stored delivery is queued or being processed (the workers of whichever replicas run)."""
    deadline = time.monotonic() + timeout_s
    while _backlog(url):
        if time.monotonic() > deadline:
            raise BenchFailed(f"the workers did not drain the inbox within {timeout_s:.0f} s")
        await asyncio.sleep(0.1)


# --- the run ----------------------------------------------------------------------------------------------------------
def kinds(rounds: int) -> list[str]:
    """``rounds`` of each kind, alternating, the order swapped each pair: one, two, two, one, one, two, ..."""
    order: list[str] = []
    for k in range(rounds):
        order += ["one", "two"] if k % 2 == 0 else ["two", "one"]
    return order


async def run(args: argparse.Namespace, url: str, root: Path) -> dict[str, Any]:
    checkouts = root / "checkouts"
    worker = None if args.burst_per_s is None else {"intake_burst_per_s": args.burst_per_s}
    a = Replica("replica-a", root, url, checkouts, worker=worker)
    b = Replica("replica-b", root, url, checkouts, worker=worker)
    base, tag = template(), uuid.uuid4().hex[:10]
    done: list[Round] = []
    errors: list[str] = []
    seq = 0
    try:
        await a.start(args.timeout)
        if args.warmup:
            await send([(a.url, args.concurrency)], requests(base, tag, seq, args.warmup), "warm-up")
            seq += args.warmup
            await drained(url, args.timeout)
        for kind in kinds(args.rounds):
            batch = requests(base, tag, seq, args.requests)
            seq += args.requests
            if kind == "two":
                await b.start(args.timeout)
                if args.warmup:  # B as warm as A: the same unmeasured deliveries first
                    await send([(b.url, args.concurrency)], requests(base, tag, seq, args.warmup), "warm-up")
                    seq += args.warmup
                    await drained(url, args.timeout)
                half = args.concurrency // 2
                plan = [(a.url, args.concurrency - half), (b.url, half)]
            else:
                plan = [(a.url, args.concurrency)]
            done.append(await send(plan, batch, kind))
            done[-1].backlog = _backlog(url)
            await drained(url, args.timeout)
            if kind == "two":
                await b.stop()
    except (BenchFailed, aiohttp.ClientError, TimeoutError) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        for replica in (b, a):
            await replica.stop()
    errors += check(url, done, seq, a, b)
    return report(args, done, errors)


def check(url: str, done: Sequence[Round], sent: int, *replicas: Replica) -> list[str]:
    """Every 202 one stored row, nothing else stored, every row processed once; both replicas exited 0."""
    errors = [f"round {k + 1} ({r.kind}): answers other than 202: {r.refused}" for k, r in enumerate(done)
              if r.refused]
    accepted = [d for r in done for d in r.accepted]
    stored = rows(url, "SELECT delivery_id, status, attempts FROM deliveries")
    ids = [r["delivery_id"] for r in stored]
    measured = set(accepted)
    if len(measured) != len(accepted):
        errors.append("a delivery id was answered 202 twice")
    missing = measured - set(ids)
    if missing:
        errors.append(f"{len(missing)} deliveries answered 202 are not stored (e.g. {sorted(missing)[0]})")
    if len(ids) != len(set(ids)):
        errors.append("a delivery is stored twice")
    if len(stored) > sent:
        errors.append(f"{len(stored)} rows stored for {sent} deliveries sent")
    unsettled = [r for r in stored if r["status"] in ("queued", "processing", "failed")]
    twice = [r for r in stored if r["attempts"] != 1]
    if unsettled:
        errors.append(f"{len(unsettled)} stored deliveries not processed (e.g. {unsettled[0]})")
    if twice:
        errors.append(f"{len(twice)} stored deliveries claimed other than once (e.g. {twice[0]})")
    for replica in replicas:
        if any(code != 0 for code in replica.exit_codes):
            errors.append(f"{replica.name} exited {replica.exit_codes}: {replica.tail()}")
    return errors


def _kind(done: Sequence[Round], kind: str) -> dict[str, Any]:
    chosen = [r for r in done if r.kind == kind]
    seconds = sum(r.seconds for r in chosen)
    latencies = [x for r in chosen for x in r.latencies_ms]
    accepted = sum(len(r.accepted) for r in chosen)
    return {
        "rounds": len(chosen), "accepted": accepted, "seconds": round(seconds, 3),
        "deliveries_per_s": round(accepted / seconds, 1) if seconds else 0.0,
        "p50_ms": round(percentile(latencies, 50), 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 99), 2) if latencies else None,
        "per_round_per_s": [round(len(r.accepted) / r.seconds, 1) for r in chosen],
        # How much of the work the workers left for after the round (stood aside for the burst, or were slower).
        "backlog_at_end": [r.backlog for r in chosen],
    }


def report(args: argparse.Namespace, done: Sequence[Round], errors: list[str]) -> dict[str, Any]:
    one, two = _kind(done, "one"), _kind(done, "two")
    ratio = two["deliveries_per_s"] / one["deliveries_per_s"] if one["deliveries_per_s"] else 0.0
    return {
        "requests_per_round": args.requests, "rounds_per_kind": args.rounds, "concurrency": args.concurrency,
        "order": [r.kind for r in done], "one": one, "two": two, "ratio": round(ratio, 3), "target": TARGET_RATIO,
        "pass": ratio >= TARGET_RATIO and not errors, "load_average": os.getloadavg(), "errors": errors[:20],
        "ok": not errors and bool(done),
    }


def text(doc: dict[str, Any]) -> str:
    one, two = doc["one"], doc["two"]
    half = doc["concurrency"] // 2
    lines = [
        f"replicas: webhook intake on one PostgreSQL database, {doc['rounds_per_kind']} round(s) of"
        f" {doc['requests_per_round']} signed deliveries per kind, order {', '.join(doc['order'])}"
        f" (load average {' '.join(f'{v:.1f}' for v in doc['load_average'])})",
        f"  one replica  ({doc['concurrency']} connections): {one['deliveries_per_s']:.0f} deliveries/s,"
        f" p50 {one['p50_ms']} ms, p99 {one['p99_ms']} ms (rounds {one['per_round_per_s']};"
        f" left unprocessed at the end {one['backlog_at_end']})",
        f"  two replicas ({doc['concurrency'] - half}+{half} connections): {two['deliveries_per_s']:.0f}"
        f" deliveries/s, p50 {two['p50_ms']} ms, p99 {two['p99_ms']} ms (rounds {two['per_round_per_s']};"
        f" left unprocessed at the end {two['backlog_at_end']})",
        f"ratio two / one: {doc['ratio']:.2f}x (target >= {doc['target']}x): {'PASS' if doc['pass'] else 'MISS'}",
        "checks: every answer 202, every 202 one stored row, every row processed once across the replicas,"
        f" both exited 0: {'PASS' if doc['ok'] else 'FAIL'}",
        *(f"  {e}" for e in doc["errors"]),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=positive_int, default=3000, help="deliveries per round")
    parser.add_argument("--rounds", type=positive_int, default=2, help="rounds of each kind (one, two), alternating")
    parser.add_argument("--concurrency", type=int, default=32, help="connections in all (split half to each of two)")
    parser.add_argument("--warmup", type=int, default=300, help="unmeasured deliveries to replica A first")
    parser.add_argument("--database-url", metavar="URL", default=DEFAULT_URL,
                        help=f"the PostgreSQL server (a schema of its own for the run; default {DEFAULT_URL})")
    parser.add_argument("--burst-per-s", type=float, default=None, metavar="RATE",
                        help="the replicas' worker.intake_burst_per_s (default: foreman's own)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a start or a drain may take")
    parser.add_argument("--tmpdir", type=Path, default=None, help="where the configs and logs go (default /dev/shm)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the files and the schema")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.concurrency < 2 or args.warmup < 0 or args.timeout <= 0:
        parser.print_usage(sys.stderr)
        print("python -m bench.replicas: --concurrency at least 2, --warmup not negative, --timeout positive",
              file=sys.stderr)
        return EXIT_USAGE
    root = run_root("bench-replicas-", args.tmpdir)
    with scratch_schema(args.database_url, keep=args.keep) as url:
        doc = asyncio.run(run(args, url, root))
    print(json.dumps(doc, indent=2) if args.json else text(doc))
    if args.keep or not doc["ok"]:
        print(f"files kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return EXIT_OK if doc["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
