"""One run of the intake benchmark as a deployed service sees it (bench/intake.py is its command line).

Set-up (untimed): the Gitea emulator in a process of its own (``bench.intake_gitea``: ``demo/widgets``, its issues),
``foreman serve`` configured with it (the served repository, the bot's token, a webhook secret, the given SQLite
``synchronous``), the bare endpoint (``bench.intake --serve-bare``), and with ``--mcp N`` the MCP sessions
(``bench.intake_mcp``: N sessions over ``/mcp``, each active every period). Every request of the run is built and
signed beforehand: unique ~6.4 KB ``issues`` deliveries (``label_updated``, one in four ``opened``, one in eight
``status:ready``) about the served repository's issues, from the real payloads in ``$FOREMAN_SHARED/gitea/payloads``
(a built-in one otherwise).

Rounds: a warm-up (both targets, then the service's worker drained), then per round the same N requests to bare,
then to foreman, driven by ``wrk -t1 -c<connections>`` (or the aiohttp client). While foreman's round runs its
worker processes what the door stores (the handlers, their database writes, the outbox's Gitea calls); at the end of
the round the benchmark reads how many rows were stored and how many finished (the backlog), then waits until the
worker has drained and reports how long that took, so the backlog never runs during the next bare round.

Checks (exit 1): every answer 202; every 202 a stored row (wrk's last in-flight requests, sent after its count was
reached, may be stored too: unique deliveries of the run, counted, never more than were sent); every stored row
finished ``done`` (none failed, none left queued); with ``--mcp``, every session call answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.database import Target as DatabaseTarget
from bench.database import exists, rows
from bench.intake import (
    REPO_ROOT,
    SECRET,
    SHARED,
    BenchError,
    Options,
    Target,
    _child_env,
    builtin_payload,
    free_port,
    percentile,
    send_round,
    sign,
)
from bench.intake_gitea import issue_body, load_issue_templates, served_template
from bench.intake_wrk import MARGIN, run_wrk, write_requests
from bot.config_writer import merged, write_config
from bot.demo_harness import AUTHOR, CONTROLLER, OWNER, REPO

TARGET_RATIO = 0.4  # intake throughput at least 0.4x the bare endpoint's, while its worker processes ...
TARGET_P99_MS = 50.0  # ... with a p99 latency under 50 ms (issue 35's targets)
EVENT = "issues"
MCP_PERIOD_S = 10.0  # each MCP session's calls: one round every 10 s (bench/agents.py's default period)
Request = tuple[bytes, dict[str, str]]


def issue_templates(gitea_url: str, payload: str | None) -> tuple[list[dict[str, Any]], str]:
    """The ``issues`` templates for the served repository: the real ``label_updated`` and ``opened`` payloads, else
    the built-in one (``builtin_payload``'s issue, repository and sender as a ``label_updated``)."""
    folder = SHARED / "gitea" / "payloads"
    found = None if payload == "builtin" else load_issue_templates(folder)
    if found is None:
        base = builtin_payload()
        doc = {"action": "label_updated", "number": 1, "issue": base["issue"], "repository": base["repository"],
               "sender": base["sender"]}
        return [served_template(doc, gitea_url)], "builtin"
    return [served_template(t, gitea_url) for t in found], str(folder)


def make_issue_requests(templates: list[dict[str, Any]], numbers: list[int], run_tag: str, start: int,
                        count: int) -> list[Request]:
    out: list[Request] = []
    for seq in range(start, start + count):
        template = templates[-1] if len(templates) > 1 and seq % 4 == 1 else templates[0]
        body = issue_body(template, seq, numbers[seq % len(numbers)], run_tag)
        out.append((body, {"Content-Type": "application/json", "X-Gitea-Event": EVENT, "X-Gitea-Event-Type": EVENT,
                           "X-Gitea-Delivery": str(uuid.uuid4()), "X-Gitea-Signature": sign(body)}))
    return out


# --- the processes ----------------------------------------------------------------------------------------------------
@dataclass
class Line:
    """A child speaking lines: one JSON (or ``ready``) line on stdout, a line on stdin to end its work."""

    proc: asyncio.subprocess.Process
    name: str

    @classmethod
    async def start(cls, name: str, argv: list[str], log: Path) -> Line:
        with log.open("ab") as err:
            proc = await asyncio.create_subprocess_exec(*argv, cwd=str(REPO_ROOT), env=_child_env(),
                                                        stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE, stderr=err, limit=2**24)
        return cls(proc, name)

    async def line(self, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        except TimeoutError:
            raise BenchError(f"{self.name}: no answer within {timeout_s:.0f}s") from None
        if not raw:
            raise BenchError(f"{self.name} exited ({await self.proc.wait()}) before it answered; see its log")
        return raw.decode()

    def tell(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"stop\n")

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


def write_config_for(workdir: Path, port: int, options: Options, gitea: dict[str, Any],
                     mcp_tokens: dict[str, str], database_url: str | None) -> tuple[Path, DatabaseTarget]:
    db_path = workdir / "foreman.db"
    database: dict[str, Any] = {"synchronous": options.synchronous}
    database.update({"path": db_path} if database_url is None else {"url": database_url})
    roster: dict[str, list[str]] = {CONTROLLER: ["controller"], AUTHOR: ["author"]}
    # The sessions' identities review: as authors, each ready issue would go to one of them (a lease, a worktree).
    roster.update({login: ["reviewer"] for login in mcp_tokens})
    document: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port},
        "webhook": {"secrets": [SECRET]},
        "database": database,
        "gitea": {"url": gitea["url"], "token": gitea["tokens"][gitea["bot"]], "bot_login": gitea["bot"]},
        "repository": {"owner": OWNER, "name": REPO, "checkout_root": workdir / "checkouts"},
        "roster": roster,
    }
    if mcp_tokens:
        document["mcp"] = {"token_digests": {login: f"sha256:{hashlib.sha256(token.encode()).hexdigest()}"
                                             for login, token in mcp_tokens.items()}}
    if options.service_config:
        document = merged(document, json.loads(options.service_config))
    config = workdir / "foreman.toml"
    write_config(config, document)
    return config, db_path if database_url is None else database_url


def inbox(target: DatabaseTarget) -> dict[str, int]:
    found = rows(target, "SELECT status, COUNT(*) AS n FROM deliveries GROUP BY status")
    return {str(r["status"]): int(r["n"]) for r in found}


async def gitea_requests(gitea_url: str) -> dict[str, int]:
    async with aiohttp.ClientSession() as http, http.get(f"{gitea_url}/_bench/requests") as resp:
        doc: dict[str, int] = await resp.json()
        return doc


@contextlib.asynccontextmanager
async def sampled(pid: int | None, out: Path | None) -> Any:
    """py-spy (``--nonblocking``: the service is never paused) sampling ``pid`` into ``out`` (raw folded stacks,
    every thread) while the block runs; nothing without ``out``."""
    if out is None or pid is None or (shutil.which("py-spy") is None and not Path(sys.executable).with_name(
            "py-spy").exists()):
        yield
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    proc = await asyncio.create_subprocess_exec(spy, "record", "--nonblocking", "--threads", "-r", "250", "-f", "raw",
                                                "-p", str(pid), "-o", str(out), stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        await asyncio.sleep(0.5)  # py-spy attached
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


async def drain(target: DatabaseTarget, timeout_s: float) -> float:
    started = time.perf_counter()
    while True:
        counts = inbox(target)
        if not counts.get("queued") and not counts.get("processing"):
            return time.perf_counter() - started
        if time.perf_counter() - started > timeout_s:
            raise BenchError(f"the worker did not drain the inbox within {timeout_s:.0f}s: {counts}")
        await asyncio.sleep(0.05)


# --- rounds -----------------------------------------------------------------------------------------------------------
@dataclass
class Round:
    target: str
    requests: int
    seconds: float
    statuses: dict[int, int]
    p50_ms: float
    p99_ms: float
    server_cpu_s: float | None
    sent: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def accepted_per_s(self) -> float:
        return self.statuses.get(202, 0) / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        cpu = None if self.server_cpu_s is None else round(self.server_cpu_s * 1000 / max(1, self.requests), 4)
        return {"requests": self.requests, "sent": self.sent, "seconds": round(self.seconds, 4),
                "accepted_per_s": round(self.accepted_per_s, 1), "p50_ms": round(self.p50_ms, 3),
                "p99_ms": round(self.p99_ms, 3), "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
                "server_cpu_ms_per_request": cpu, **self.extra}


async def one_round(target: Target, client: str, requests: list[Request], count: int, connections: int,
                    requests_file: Path | None) -> Round:
    cpu0 = target.cpu_s()
    if client == "wrk":
        assert requests_file is not None
        result = await run_wrk(target.url, requests_file, count, connections)
        cpu1 = target.cpu_s()
        if result.socket_errors and any(result.socket_errors.values()):
            raise BenchError(f"wrk to {target.name}: socket errors {result.socket_errors}")
        return Round(target.name, result.answered, result.seconds, result.statuses, result.p50_ms, result.p99_ms,
                     None if cpu0 is None or cpu1 is None else cpu1 - cpu0, result.sent)
    done = await send_round(target, requests[:count], connections)
    return Round(target.name, done.requests, done.seconds, done.statuses, percentile(done.latencies_ms, 50),
                 percentile(done.latencies_ms, 99), done.server_cpu_s, done.requests)


def aggregate(rounds: list[Round]) -> dict[str, Any]:
    requests = sum(r.requests for r in rounds)
    seconds = sum(r.seconds for r in rounds)
    statuses: dict[int, int] = {}
    for r in rounds:
        for code, n in r.statuses.items():
            statuses[code] = statuses.get(code, 0) + n
    cpu = [r.server_cpu_s for r in rounds]
    return {"requests": requests, "seconds": round(seconds, 4),
            "accepted_per_s": round(statuses.get(202, 0) / seconds, 1) if seconds else None,
            # the rounds' own percentiles: the worst round's p99 is the figure held to the target
            "p50_ms": round(max(r.p50_ms for r in rounds), 3), "p99_ms": round(max(r.p99_ms for r in rounds), 3),
            "statuses": {str(k): v for k, v in sorted(statuses.items())}, "all_202": set(statuses) == {202},
            "server_cpu_ms_per_request": None if None in cpu else round(
                sum(c or 0.0 for c in cpu) * 1000 / max(1, requests), 4),
            "rounds": [r.summary() for r in rounds]}


async def run_deployed(options: Options, database_url: str | None = None) -> dict[str, Any]:
    run_tag = uuid.uuid4().hex[:12]
    workdir = Path(tempfile.mkdtemp(prefix="foreman-bench-", dir=options.tmpdir))
    errors: list[str] = []
    processes: list[Line] = []
    targets: list[Target] = []
    results: dict[str, list[Round]] = {"bare": [], "foreman": []}
    sessions_doc: dict[str, Any] | None = None
    wall = time.perf_counter()
    mcp_tokens = {f"author-{i}": f"mcp-author-{i}-{secrets.token_hex(12)}" for i in range(2, options.mcp + 2)}
    built: set[str] = set()
    sent_to_foreman = accepted = 0
    load_before = os.getloadavg()
    settings: dict[str, Any] = {}
    db_path: DatabaseTarget = workdir / "foreman.db"
    try:
        gitea = await Line.start("gitea", [sys.executable, "-m", "bench.intake_gitea", "--port", "0", "--issues",
                                           str(options.issues), "--users", str(options.mcp + 1), "--dir",
                                           str(workdir / "gitea")], workdir / "gitea.log")
        processes.append(gitea)
        gitea_doc = json.loads(await gitea.line(60))
        templates, source = issue_templates(gitea_doc["url"], options.payload)
        foreman_port, bare_port = free_port(), free_port()
        config, db_path = write_config_for(workdir, foreman_port, options, gitea_doc, mcp_tokens, database_url)
        bare = Target("bare", [sys.executable, "-m", "bench.intake", "--serve-bare", "--port", str(bare_port)],
                      bare_port, workdir / "bare.log")
        foreman = Target("foreman", [sys.executable, "-m", "bot", "--config", str(config), "serve"], foreman_port,
                         workdir / "foreman.log")
        targets = [bare, foreman]
        await asyncio.gather(bare.start(), foreman.start())
        settings.update(payload=source, payload_bytes=len(issue_body(templates[0], 0, 1, run_tag)),
                        foreman_pid=foreman.proc.pid if foreman.proc else None)
        if options.mcp:
            spec = workdir / "mcp.json"
            spec.write_text(json.dumps({"url": f"http://127.0.0.1:{foreman_port}/mcp", "period": MCP_PERIOD_S,
                                        "tokens": list(mcp_tokens.values())}), encoding="utf-8")
            spec.chmod(0o600)
            sessions = await Line.start("mcp sessions", [sys.executable, "-m", "bench.intake_mcp", str(spec)],
                                        workdir / "mcp.log")
            processes.append(sessions)
            ready = await sessions.line(300 + options.mcp * 3.0)
            settings["mcp_sessions_open_s"] = float(ready.split()[1])
        seq = 0
        numbers: list[int] = gitea_doc["issues"]
        requests_file = workdir / "requests.bin" if options.client == "wrk" else None

        def batch(count: int) -> list[Request]:
            nonlocal seq
            made = make_issue_requests(templates, numbers, run_tag, seq, count + (MARGIN if requests_file else 0))
            seq += len(made)
            built.update(h["X-Gitea-Delivery"] for _, h in made)
            if requests_file is not None:
                write_requests(requests_file, made)
            return made

        stages = [("warm-up", options.warmup)] if options.warmup else []
        stages += [(str(i), options.requests) for i in range(1, options.rounds + 1)]
        for label, count in stages:
            made = batch(count)
            for target in targets:
                before = await gitea_requests(gitea_doc["url"]) if target is foreman else {}
                spied = Path(options.py_spy) / f"round-{label}.txt" if options.py_spy and target is foreman else None
                async with sampled(settings["foreman_pid"], spied):
                    result = await one_round(target, options.client, made, count, options.concurrency,
                                             requests_file)
                if set(result.statuses) != {202}:
                    errors.append(f"{target.name} round {label}: answers {result.statuses}")
                if target is foreman:
                    sent_to_foreman += result.sent
                    accepted += result.statuses.get(202, 0)
                    at_end = inbox(db_path)
                    finished = sum(n for s, n in at_end.items() if s not in ("queued", "processing"))
                    result.extra.update(stored_at_end=sum(at_end.values()), finished_at_end=finished)
                    spied = Path(options.py_spy) / f"drain-{label}.txt" if options.py_spy else None
                    async with sampled(settings["foreman_pid"], spied):
                        result.extra["drain_s"] = round(await drain(db_path, 300), 3)
                    result.extra["gitea_requests"] = _delta(await gitea_requests(gitea_doc["url"]), before)
                if label != "warm-up":
                    results[target.name].append(result)
        if options.mcp:
            processes[-1].tell()
            sessions_doc = json.loads(await processes[-1].line(120))
            if sessions_doc["failed"]:
                errors.append(f"MCP sessions: {sessions_doc['failed']} failed calls: {sessions_doc['errors']}")
    except (BenchError, aiohttp.ClientError, OSError, ValueError) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        for target in targets:
            try:
                code = await target.stop()
            except BenchError as exc:
                errors.append(str(exc))
            else:
                if code not in (0, None):
                    errors.append(f"{target.name} exited with {code} after SIGTERM:\n{target.log_tail()}")
        for child in reversed(processes):
            await child.stop()
    by_status: dict[str, int] = {}
    own: dict[str, int] = {}
    if exists(db_path):
        # The run's deliveries, and foreman's own besides them (a verb's auto-allocation trigger; catch-up's
        # deliveries for what it read back from Gitea after foreman's own label writes): every one must finish.
        for r in rows(db_path, "SELECT delivery_id, status FROM deliveries"):
            tally = by_status if r["delivery_id"] in built else own
            tally[str(r["status"])] = tally.get(str(r["status"]), 0) + 1
        ours = sum(by_status.values())
        if not accepted <= ours <= sent_to_foreman:
            errors.append(f"{ours} rows stored for {accepted} accepted of {sent_to_foreman} sent")
        if set(by_status) - {"done"} or set(own) - {"done"}:
            errors.append(f"stored rows not done: the run's {by_status}, foreman's own {own}")
    bare_doc = aggregate(results["bare"]) if results["bare"] else None
    foreman_doc = aggregate(results["foreman"]) if results["foreman"] else None
    ratio = None
    if bare_doc and foreman_doc and bare_doc["accepted_per_s"]:
        ratio = round(foreman_doc["accepted_per_s"] / bare_doc["accepted_per_s"], 3)
    p99 = foreman_doc["p99_ms"] if foreman_doc else None
    settings.update(client=options.client, requests_per_round=options.requests, rounds=options.rounds,
                    warmup=options.warmup, connections=options.concurrency, synchronous=options.synchronous,
                    database="sqlite" if database_url is None else "postgresql", mcp_sessions=options.mcp,
                    issues=options.issues, cpus=os.cpu_count(), python=sys.version.split()[0],
                    workdir=str(workdir))

    def verdict(ok: bool | None) -> str | None:
        return None if ok is None or errors else ("PASS" if ok else "MISS")

    doc: dict[str, Any] = {
        "settings": settings, "bare": bare_doc, "foreman": foreman_doc, "ratio": ratio, "mcp": sessions_doc,
        "rows": {"sent": sent_to_foreman, "accepted": accepted, "by_status": by_status, "foreman_own": own},
        "targets": {
            "throughput_ratio": {"target": f">= {TARGET_RATIO}", "value": ratio,
                                 "result": verdict(None if ratio is None else ratio >= TARGET_RATIO)},
            "p99_ms": {"target": f"< {TARGET_P99_MS}", "value": p99,
                       "result": verdict(None if p99 is None else p99 < TARGET_P99_MS)},
        },
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "wall_s": round(time.perf_counter() - wall, 2), "errors": errors,
        "ok": not errors and bare_doc is not None and foreman_doc is not None,
    }
    if not options.keep and doc["ok"]:
        shutil.rmtree(workdir, ignore_errors=True)
        settings["workdir"] = None
    return doc


def render(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [
        f"intake benchmark ({s['client']}): {s['rounds']} round(s) x {s['requests_per_round']} requests per target"
        f" (+{s['warmup']} warm-up), {s['connections']} connections, {s.get('payload_bytes')} B issues deliveries"
        f" for the served repository from {s.get('payload')}, {s['database']}, synchronous={s['synchronous']},"
        f" a Gitea (emulator, {s['issues']} issues), MCP sessions: {s['mcp_sessions']}, {s['cpus']} CPUs",
        f"load average before {doc['load_average']['before']}, after {doc['load_average']['after']}",
        "",
        f"{'target':<8} {'round':>5} {'accepted/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'srv cpu ms/req':>14}"
        f" {'stored':>7} {'finished':>8} {'drain s':>8}  gitea requests (round + drain)",
    ]
    for name in ("bare", "foreman"):
        d = doc[name]
        if d is None:
            continue
        for i, r in enumerate(d["rounds"], 1):
            cpu = r["server_cpu_ms_per_request"]
            gitea = ", ".join(f"{k} {v}" for k, v in r.get("gitea_requests", {}).items())
            lines.append(
                f"{name:<8} {i:>5} {r['accepted_per_s']:>10.1f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}"
                f" {'-' if cpu is None else f'{cpu:.3f}':>14} {r.get('stored_at_end', '-'):>7}"
                f" {r.get('finished_at_end', '-'):>8} {r.get('drain_s', '-'):>8}  {gitea if name == 'foreman' else ''}")
        cpu = d["server_cpu_ms_per_request"]
        lines.append(f"{name:<8} {'all':>5} {d['accepted_per_s']:>10.1f} {d['p50_ms']:>8.2f} {d['p99_ms']:>8.2f}"
                     f" {'-' if cpu is None else f'{cpu:.3f}':>14}")
    rows_doc = doc["rows"]
    lines += ["", f"foreman: {rows_doc['accepted']} accepted of {rows_doc['sent']} sent; stored rows by status"
                  f" {rows_doc['by_status']}; foreman's own deliveries {rows_doc['foreman_own']}"]
    if doc["mcp"]:
        m = doc["mcp"]
        lines.append(f"MCP sessions: {m['sessions']} open (in {s.get('mcp_sessions_open_s')} s), {m['calls']} calls"
                     f" during the run, {m['failed']} failed, p50 {m['p50_ms']} ms, p99 {m['p99_ms']} ms")
    t = doc["targets"]
    lines += [
        f"ratio foreman/bare (accepted/s): {doc['ratio']}",
        f"target throughput ratio {t['throughput_ratio']['target']}: {t['throughput_ratio']['result'] or 'n/a'}",
        f"target p99 {t['p99_ms']['target']} ms: {t['p99_ms']['result'] or 'n/a'} ({t['p99_ms']['value']} ms)",
        f"wall time {doc['wall_s']} s",
    ]
    if doc["errors"]:
        lines += ["", "ERRORS:"] + [f"  {e}" for e in doc["errors"]]
    if s.get("workdir"):
        lines.append(f"kept: {s['workdir']}")
    return "\n".join(lines)
