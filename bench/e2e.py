"""End-to-end loop benchmark: a `status:ready` label event to the verified evidence comment, issue after issue.

    .venv/bin/python -m bench.e2e [--life] [--issues 200] [--baseline-samples 10] [--timeout 60] [--json] [--keep]
    .venv/bin/python -m bench.e2e --gitea-process --first-comment --issues 30

``--life`` times each issue's whole life instead (bench/e2e_life.py; docs/benchmarks.md says what it measures).
``--database-url URL`` runs the loop once more with foreman on PostgreSQL (a schema of its own at URL), after the
SQLite run, and reports both.

Set-up (not timed), the same as ``foreman demo`` (``bot.demo.open_harness``): the Gitea emulator in this process on
loopback, with a real bare repository, users and the status labels; a real ``foreman serve`` subprocess (SQLite in
WAL mode, synchronous NORMAL, on /dev/shm when it exists) on the defaults: auto-allocation to the next idle roster
author (the roster's only one, ``author-1``) with the bootstrap run as part of the allocation, proven before the
lease; the repository webhook registered by the maintainer; ``--issues`` issues
opened up front (their ``opened`` webhooks handled before the clock starts); and ``foreman mcp`` for the author.

Timed, one issue at a time (the one author holds at most ``max_leases_per_author = 1`` lease, so auto-allocation
serves issues in turn):

1. the maintainer labels the issue ``status:ready`` (the clock starts just before that API call);
2. foreman receives the signed webhook, records the candidate, allocates (lease, label, assignee, evidence), runs
   the server-side bootstrap (branch, registered worktree) and posts the bootstrap's evidence comment, which its
   outbox reads back and verifies; the **latency** ends at that verification (the outbox's ``sent_at``);
3. the author releases the lease through MCP and the release's evidence comment is verified (part of the
   **throughput** figure, issues per minute over the whole sequence, not of the latency).

The breakdown of each latency comes from foreman's own timestamps (lease committed, allocation evidence verified,
bootstrap completed). Beside the figures, measured in the same run and interleaved with the loop: one ``git
worktree add -b`` in the same control checkout, and one comment POST + GET to the emulator (with the hook off, so
foreman does no work for it); the ratio is the loop's p50 over the sum of the two medians.

``--gitea-process``: the Gitea emulator runs in a process of its own (``python -m bench.harness gitea``) instead of
this one, so that this process only drives (labels, polls foreman's database, MCP) and what is measured is foreman
and its Gitea "from outside". Its bare comment POST + GET goes to the same emulator process, on a repository of its
own without a hook (``demo/baseline``). ``--first-comment``: the latency ends at the **first verified bot comment**,
the allocation's evidence comment (its outbox entry ``<lease>:evidence`` read back and verified: ``sent_at``),
instead of the bootstrap's; each issue still goes through its bootstrap and its release before the next label. The
bare operations are the same (``git worktree add`` + a comment POST + GET). The issue-35 target uses both:
``--gitea-process --first-comment --issues 30``. ``--request-log`` (with ``--gitea-process`` and ``--keep``): the
emulator process logs every request it answers to ``gitea-requests.log`` (a profile's Gitea calls per issue).

Checks (exit 1 if any fails): every issue has exactly one lease (released by the author), one completed bootstrap,
one worktree, and exactly one comment per evidence marker; every outbox entry is done; no delivery failed.
Exit status 2 for bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.database import rows, scratch_schema
from bench.harness import GITEA_REQUEST_LOG_ENV
from bot import gitops
from bot.config_writer import merged, write_config
from bot.core.evidence import find_marker
from bot.demo import _config as demo_serve_config
from bot.demo import open_harness, scratch_root
from bot.demo_harness import (
    AUTHOR,
    LIFE_ROSTER,
    MAINTAINER,
    OWNER,
    REPO,
    LoopHarness,
    StepFailed,
    _subprocess_env,
    call_tool,
    mcp_session,
    until,
)
from state.db import from_db_time

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Issue 19 item 3: the loop's p50 at most 3x the bare operations it needs, and flat over the run (the last fifth's
#: p50 at most 1.25x the first fifth's).
RATIO_TARGET, FLAT_TARGET = 3.0, 1.25


def _query(h: LoopHarness, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """Rows from foreman's database, read-only (foreman serve keeps writing): its SQLite file or PostgreSQL."""
    return rows(h.database_url or h.db_path, sql, params)


#: foreman's key of the demo repository: every read below names it, so that it is an indexed look-up (the benchmark
#: polls while the loop runs; a scan that grows with the issues would load the machine it measures).
REPO_KEY = f"{OWNER}/{REPO}".lower()


def _outbox_done(h: LoopHarness, key: str) -> dict[str, Any] | None:
    rows = _query(h, "SELECT status, result_json, sent_at FROM outbox WHERE repo = ? AND idempotency_key = ?",
                  (REPO_KEY, key))
    if rows and rows[0]["status"] in ("verification_failed", "parked"):
        raise StepFailed("outbox", f"foreman's outbox entry {key} ended {rows[0]['status']}")
    return rows[0] if rows and rows[0]["status"] == "done" else None


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.4999)))
    return ordered[rank - 1]


def run_root(prefix: str, tmpdir: Path | None) -> Path:
    """Where a run keeps its files: a new folder under ``tmpdir`` when given, else a scratch folder."""
    if tmpdir is None:
        return scratch_root(prefix)
    tmpdir.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=tmpdir))


def finished(doc: dict[str, Any], root: Path, *, keep: bool) -> int:
    """A run's exit code; its files kept (and where said) when ``keep``, else removed."""
    if keep:
        print(f"files kept in {root}", file=sys.stderr)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return EXIT_OK if doc["ok"] else EXIT_FAILED


def p50_of(samples: Sequence[Any], **fields: str) -> dict[str, float]:
    """The median (nearest rank) of each of the samples' fields, by name: ``name=field``."""
    return {name: percentile([getattr(s, field) for s in samples], 50) for name, field in fields.items()}


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


@dataclass
class Sample:
    issue: int
    label_ms: float  # the maintainer's label POST, as the API answered it
    lease_ms: float  # lease committed (leases.acquired_at)
    allocation_evidence_ms: float  # the allocation's evidence comment verified
    bootstrap_ms: float  # bootstrap journal reached `completed`
    evidence_ms: float  # the bootstrap's evidence comment verified: the latency
    release_ms: float  # the author's gitea_release_lease through MCP, answered
    serve_hwm_kib: int = 0  # foreman serve's peak RSS so far (VmHWM), read after the issue
    serve_rss_kib: int = 0  # foreman serve's RSS now (VmRSS)


@dataclass
class Run:
    samples: list[Sample] = field(default_factory=list)
    worktree_add_ms: list[float] = field(default_factory=list)
    comment_post_get_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    gitea_process: bool = False  # the emulator ran in its own process


@dataclass(frozen=True, slots=True)
class BareComment:
    """Where the bare comment POST + GET goes: an issue nobody hooks (``repo``), or the loop's scratch issue with
    the hook switched off (the emulator in this process)."""

    repo: str
    issue: int


def memory_kib(pid: int | None) -> tuple[int, int]:
    """(VmHWM, VmRSS) of a live process in KiB, from /proc; (0, 0) where there is no /proc or no process."""
    found = {"VmHWM": 0, "VmRSS": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text(encoding="ascii").splitlines():
            name, _, value = line.partition(":")
            if name in found:
                found[name] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return found["VmHWM"], found["VmRSS"]


def _ms(db_time: str, t0: float) -> float:
    return (from_db_time(db_time).timestamp() - t0) * 1000.0


async def _one_issue(h: LoopHarness, session: Any, n: int, timeout_s: float) -> Sample:
    t0 = time.time()
    await h.api(MAINTAINER, "POST", f"/issues/{n}/labels", {"labels": ["status:ready"]})
    label_ms = (time.time() - t0) * 1000.0

    async def evidence() -> tuple[Any, Any] | None:
        journal = _query(
            h,
            "SELECT idempotency_key, lease_id, updated_at AS completed_at, outcome, error_json FROM bootstrap_journal"
            " WHERE repo = ? AND issue_number = ? AND outcome IN ('completed', 'compensated')",
            (REPO_KEY, n),
        )
        if journal and journal[0]["outcome"] == "compensated":
            raise StepFailed("bootstrap", f"#{n}: {journal[0]['error_json']}")
        sent = _outbox_done(h, f"{journal[0]['idempotency_key']}:evidence") if journal else None
        if sent is None:
            return None
        lease = _query(h, "SELECT acquired_at FROM leases WHERE lease_id = ?", (journal[0]["lease_id"],))
        allocation = _outbox_done(h, f"{journal[0]['lease_id']}:evidence")
        return ({**journal[0], "sent_at": sent["sent_at"]}, lease[0]) if allocation is not None else None

    row, lease = await until("evidence", evidence, timeout_s, f"#{n}: no verified evidence comment")
    allocation = _outbox_done(h, f"{row['lease_id']}:evidence")
    assert allocation is not None
    released_at = time.monotonic()
    await call_tool(session, "release", "gitea_release_lease", issue_number=n, reason="done")
    release_ms = (time.monotonic() - released_at) * 1000.0

    async def release_verified() -> Any:
        return _outbox_done(h, f"{row['lease_id']}:release")

    await until("release", release_verified, timeout_s, f"#{n}: the release was never verified")
    return Sample(
        issue=n,
        label_ms=label_ms,
        lease_ms=_ms(lease["acquired_at"], t0),
        allocation_evidence_ms=_ms(allocation["sent_at"], t0),
        bootstrap_ms=_ms(row["completed_at"], t0),
        evidence_ms=_ms(row["sent_at"], t0),
        release_ms=release_ms,
    )


async def _baselines(h: LoopHarness, run: Run, bare: BareComment, k: int) -> None:
    """One plain ``git worktree add -b`` in the control checkout, and one comment POST + GET that foreman does no
    work for (the hook off, or a repository without one)."""
    path = h.root / "baseline" / f"wt-{k}"
    # Under the control checkout's worktree registry, as foreman's own git commands there (bot/gitops.py): a plain
    # add beside one of foreman's can kill both (git's unlocked registrations).
    registry = gitops.WorktreeRegistry(h.checkout / ".git", wait_s=60)

    def git(*args: str) -> None:
        with registry.held(args):
            subprocess.run(["git", *args], cwd=h.checkout, check=True, capture_output=True)

    started = time.perf_counter()
    git("worktree", "add", "-q", "-b", f"bench-baseline-{k}", str(path), "main")
    run.worktree_add_ms.append((time.perf_counter() - started) * 1000.0)
    git("worktree", "remove", "--force", str(path))
    # update-ref, not `branch -D`: that rewrites .git/config (to drop the branch's section), which would make
    # foreman read the control checkout's origin from git again (ControlCheckout.origin_url).
    git("update-ref", "-d", f"refs/heads/bench-baseline-{k}")
    if h.in_process is None:  # a repository with no hook: nothing to switch off
        run.comment_post_get_ms.append(await _comment_post_get(h, bare, k))
        return
    hook = next(hook for hook in h.emulator.repo(OWNER, REPO).hooks if hook.id == h.hook_id)
    hook.active = False
    try:
        run.comment_post_get_ms.append(await _comment_post_get(h, bare, k))
    finally:
        hook.active = True


async def _comment_post_get(h: LoopHarness, bare: BareComment, k: int) -> float:
    """One comment POST and its GET as the maintainer, in ms."""
    base = f"{h.gitea_url}/api/v1/repos/{OWNER}/{bare.repo}"
    headers = {"Authorization": f"token {h.tokens[MAINTAINER]}"}
    started = time.perf_counter()
    async with h.http.post(f"{base}/issues/{bare.issue}/comments", json={"body": f"baseline {k}"},
                           headers=headers) as resp:
        posted = await resp.json()
        if resp.status >= 300:
            raise StepFailed("baseline", f"the bare comment POST answered {resp.status}: {posted}")
    async with h.http.get(f"{base}/issues/comments/{posted['id']}", headers=headers) as resp:
        read = await resp.json()
    took = (time.perf_counter() - started) * 1000.0
    if read.get("body") != f"baseline {k}":
        raise StepFailed("baseline", f"the bare comment read back as {read}")
    return took


async def _check(h: LoopHarness, issues: Sequence[int], run: Run) -> None:
    for n in issues:
        leases = _query(h, "SELECT owner, status FROM leases WHERE repo = ? AND issue_number = ?", (REPO_KEY, n))
        if [(r["owner"], r["status"]) for r in leases] != [(AUTHOR, "released")]:
            run.errors.append(f"#{n}: leases {[tuple(r) for r in leases]}")
        journal = _query(h, "SELECT phase, worktree_path FROM bootstrap_journal WHERE repo = ? AND issue_number = ?",
                         (REPO_KEY, n))
        if [r["phase"] for r in journal] != ["completed"] or not Path(journal[0]["worktree_path"], ".git").is_file():
            run.errors.append(f"#{n}: bootstrap {[tuple(r) for r in journal]}")
            continue
        bodies = ([c.body for c in h.emulator.issue(OWNER, REPO, n).comments] if h.in_process is not None else
                  [str(c.get("body") or "") for c in await h.comments(n)])
        markers = Counter(find_marker(body) for body in bodies)
        evidence = [m for m in markers if m and m.endswith((":evidence", ":release"))]
        if len(evidence) != 3 or any(markers[m] != 1 for m in markers):
            run.errors.append(f"#{n}: comments {dict(markers)}")
    pending = _query(h, "SELECT idempotency_key, status FROM outbox WHERE status != 'done'")
    run.errors.extend(f"outbox {r['idempotency_key']} is {r['status']}" for r in pending)
    failed = _query(h, "SELECT delivery_id FROM deliveries WHERE status = 'failed'")
    run.errors.extend(f"delivery {r['delivery_id']} failed" for r in failed)


@asynccontextmanager
async def open_process_harness(root: Path, *, config: dict[str, Any] | None = None, timeout_s: float = 60.0,
                               request_log: bool = False) -> AsyncIterator[tuple[LoopHarness, BareComment]]:
    """The demo's harness with the emulator in a process of its own (``python -m bench.harness gitea``), stopped
    (stdin closed, then terminated, then killed) whatever happens. ``request_log``: it logs every request to
    ``gitea-requests.log`` (keep the files with ``--keep``)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / "gitea.log").open("w", encoding="utf-8") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.harness", "gitea", "--root", str(root), cwd=root,
            env=_subprocess_env({GITEA_REQUEST_LOG_ENV: str(root / "gitea-requests.log")} if request_log else None),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log)
    http: aiohttp.ClientSession | None = None
    h: LoopHarness | None = None
    try:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
        except TimeoutError:
            raise StepFailed("gitea", f"the emulator process did not start within {timeout_s:.0f}s") from None
        if not line:
            raise StepFailed("gitea", f"the emulator process exited: {(root / 'gitea.log').read_text()[-800:]}")
        info = json.loads(line)
        http = aiohttp.ClientSession()
        h = LoopHarness(
            root=root, in_process=None, runner=None, gitea_url=info["url"], http=http, tokens=info["tokens"],
            mcp_tokens={login: f"mcp-{login}-{secrets.token_hex(12)}" for login in LIFE_ROSTER},
            webhook_secret=secrets.token_hex(24), config_path=root / "foreman.toml", db_path=root / "foreman.db",
            checkout=root / "checkouts" / OWNER / REPO, serve_log=root / "serve.log", gitea_process=proc)
        write_config(h.config_path, merged(demo_serve_config(h), config or {}),
                     comment="written by bench.e2e --gitea-process")
        yield h, BareComment(info["baseline_repo"], int(info["baseline_issue"]))
    finally:
        if h is not None:
            await h.stop()
        if http is not None:
            await http.close()
        await _stop_process(proc)


async def _stop_process(proc: asyncio.subprocess.Process) -> None:
    """Close its stdin (it stops), else terminate it, else kill it; wait for it in every case."""
    if proc.stdin is not None:
        proc.stdin.close()
    for stop in (None, proc.terminate, proc.kill):
        if proc.returncode is not None:
            return
        if stop is not None:
            stop()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            continue


@asynccontextmanager
async def _harness(root: Path, database_url: str | None, gitea_process: bool, timeout_s: float,
                   request_log: bool = False) -> AsyncIterator[tuple[LoopHarness, BareComment | None]]:
    """The loop's harness: the emulator in this process (the demo's), or in its own."""
    database = None if database_url is None else {"database": {"url": database_url}}
    if gitea_process:
        async with open_process_harness(root, config=database, timeout_s=timeout_s, request_log=request_log) as (
                h, bare):
            yield h, bare
    else:
        async with open_harness(root, config=database) as h:
            yield h, None


async def bench(
    issues: int, baseline_samples: int, timeout_s: float, root: Path, database_url: str | None = None, *,
    gitea_process: bool = False, request_log: bool = False,
) -> Run:
    run = Run(gitea_process=gitea_process)
    async with _harness(root, database_url, gitea_process, timeout_s, request_log) as (h, own_bare):
        await h.start_serve(timeout_s)
        await h.register_hook()
        numbers = []
        for i in range(issues + 1):
            created = await h.api(MAINTAINER, "POST", "/issues", {"title": f"Loop issue {i + 1}", "body": "bench"})
            numbers.append(int(created["number"]))
        scratch, numbers = numbers[-1], numbers[:-1]
        bare = own_bare or BareComment(REPO, scratch)

        async def opened() -> bool | None:
            rows = _query(h, "SELECT COUNT(*) AS c FROM deliveries WHERE action = 'opened' AND status = 'done'")
            return True if rows[0]["c"] == issues + 1 else None

        await until("setup", opened, timeout_s + issues * 0.1, "the opened webhooks were never all handled")
        every = max(1, issues // max(1, baseline_samples))
        with (root / "mcp.log").open("w", encoding="utf-8") as errlog:
            async with mcp_session(h, errlog) as session:
                started = time.monotonic()
                pid = h.serve.pid if h.serve is not None else None
                for i, n in enumerate(numbers):
                    sample = await _one_issue(h, session, n, timeout_s)
                    sample.serve_hwm_kib, sample.serve_rss_kib = memory_kib(pid)
                    run.samples.append(sample)
                    if i == 0 or (i % every == 0 and len(run.worktree_add_ms) < baseline_samples):
                        pause = time.monotonic()
                        await _baselines(h, run, bare, len(run.worktree_add_ms))
                        started += time.monotonic() - pause  # the baselines are not part of the loop's wall time
                run.wall_s = time.monotonic() - started
        while len(run.worktree_add_ms) < baseline_samples:
            await _baselines(h, run, bare, len(run.worktree_add_ms))
        await _check(h, numbers, run)
    return run


def report(run: Run, issues: int, *, first_comment: bool = False) -> dict[str, Any]:
    """The figures; ``first_comment``: the latency ends at the allocation's evidence comment verified (the first
    verified bot comment) instead of the bootstrap's."""

    def ends(sample: Sample) -> float:
        return sample.allocation_evidence_ms if first_comment else sample.evidence_ms

    latency = summary([ends(s) for s in run.samples])
    bare_wt = statistics.median(run.worktree_add_ms)
    bare_comment = statistics.median(run.comment_post_get_ms)
    size = len(run.samples)
    fifths = [part for k in range(5) if (part := run.samples[k * size // 5 : (k + 1) * size // 5])]
    by_fifth = [percentile([ends(s) for s in part], 50) for part in fifths]
    flat = by_fifth[-1] / by_fifth[0]
    ratio = latency["p50"] / (bare_wt + bare_comment)
    return {
        "issues": issues,
        "latency_ends_at": "allocation_evidence_verified" if first_comment else "bootstrap_evidence_verified",
        "gitea_process": run.gitea_process,
        "ok": not run.errors,
        "errors": run.errors[:20],
        "latency_ms": latency,
        "breakdown_p50_ms": {
            **p50_of(run.samples, label_post_answered="label_ms", lease_committed="lease_ms",
                     allocation_evidence_verified="allocation_evidence_ms", bootstrap_completed="bootstrap_ms"),
            "bootstrap_evidence_verified": percentile([s.evidence_ms for s in run.samples], 50),
        },
        "release_ms": summary([s.release_ms for s in run.samples]),
        # p50 of each fifth of the run, in order: does the loop slow down as issues (and worktrees) accumulate?
        "latency_p50_by_fifth_ms": by_fifth,
        "bootstrap_p50_by_fifth_ms": [percentile([s.bootstrap_ms - s.lease_ms for s in part], 50) for part in fifths],
        "lease_p50_by_fifth_ms": [percentile([s.lease_ms for s in part], 50) for part in fifths],
        # foreman serve's peak RSS (VmHWM) and RSS at the end of each fifth: does its memory grow with the work?
        "serve_hwm_by_fifth_kib": [part[-1].serve_hwm_kib for part in fifths],
        "serve_rss_by_fifth_kib": [part[-1].serve_rss_kib for part in fifths],
        "flat_ratio": flat,
        "flat_target": FLAT_TARGET,
        "flat_pass": flat <= FLAT_TARGET,
        "ratio_target": RATIO_TARGET,
        "ratio_pass": ratio <= RATIO_TARGET,
        "wall_s": run.wall_s,
        "throughput_per_min": issues * 60.0 / run.wall_s if run.wall_s else 0.0,
        "bare_ms": {
            "git_worktree_add": summary(run.worktree_add_ms),
            "comment_post_get": summary(run.comment_post_get_ms),
            "sum_of_medians": bare_wt + bare_comment,
        },
        "ratio_p50_to_bare": ratio,
        "measured_at": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def text(doc: dict[str, Any]) -> str:
    lat, brk, bare = doc["latency_ms"], doc["breakdown_p50_ms"], doc["bare_ms"]
    first = doc["latency_ends_at"] == "allocation_evidence_verified"
    where = "Gitea emulator in its own process" if doc["gitea_process"] else "Gitea emulator in this process"
    return "\n".join([
        f"e2e loop: {doc['issues']} issues, one at a time (auto-allocation for one author; the author releases each"
        f" lease through MCP before the next label); {where}",
        "label event -> " + ("first verified bot comment (the allocation's evidence)" if first else
                             "verified evidence comment")
        + f": p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms"
        f" (mean {lat['mean']:.0f}, min {lat['min']:.0f}, max {lat['max']:.0f})",
        f"  p50 milestones: label POST answered {brk['label_post_answered']:.0f} ms, lease committed"
        f" {brk['lease_committed']:.0f} ms, allocation evidence verified {brk['allocation_evidence_verified']:.0f}"
        f" ms, bootstrap completed {brk['bootstrap_completed']:.0f} ms, bootstrap evidence verified"
        f" {brk['bootstrap_evidence_verified']:.0f} ms",
        f"throughput: {doc['throughput_per_min']:.1f} issues/minute ({doc['issues']} issues in {doc['wall_s']:.1f} s,"
        f" each including its release through MCP; release call p50 {doc['release_ms']['p50']:.0f} ms)",
        f"same-run bare operations (medians of {bare['git_worktree_add']['n']}): git worktree add"
        f" {bare['git_worktree_add']['p50']:.1f} ms, comment POST+GET {bare['comment_post_get']['p50']:.1f} ms;"
        f" sum {bare['sum_of_medians']:.1f} ms",
        f"ratio loop p50 / bare: {doc['ratio_p50_to_bare']:.1f}x (target <= {doc['ratio_target']:.0f}x):"
        f" {'PASS' if doc['ratio_pass'] else 'MISS'}",
        "p50 latency by fifth of the run: " + ", ".join(f"{v:.0f}" for v in doc["latency_p50_by_fifth_ms"])
        + " ms (lease committed: " + ", ".join(f"{v:.0f}" for v in doc["lease_p50_by_fifth_ms"])
        + " ms; the bootstrap, lease to completed: "
        + ", ".join(f"{v:.0f}" for v in doc["bootstrap_p50_by_fifth_ms"]) + " ms)",
        f"flat: last fifth / first fifth p50 {doc['flat_ratio']:.2f}x (target <= {doc['flat_target']:.2f}x):"
        f" {'PASS' if doc['flat_pass'] else 'MISS'}",
        "foreman serve memory at the end of each fifth: peak RSS (VmHWM) "
        + ", ".join(f"{v / 1024:.1f}" for v in doc["serve_hwm_by_fifth_kib"]) + " MiB; RSS "
        + ", ".join(f"{v / 1024:.1f}" for v in doc["serve_rss_by_fifth_kib"]) + " MiB",
        "checks: one lease, one bootstrap, one worktree and one comment per evidence marker per issue; outbox all"
        f" done; no failed delivery: {'PASS' if doc['ok'] else 'FAIL'}",
        *(f"  {error}" for error in doc["errors"]),
    ])


def _both(doc: dict[str, Any]) -> str:
    return f"SQLite\n{text(doc['sqlite'])}\n\nPostgreSQL\n{text(doc['postgresql'])}"


def _first_failure(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--issues", type=int, default=200, help="issues run through the loop, one at a time")
    parser.add_argument("--life", action="store_true", help="the whole life: label -> merged -> torn down")
    parser.add_argument("--baseline-samples", type=int, default=10, help="samples of each bare operation")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one issue may take")
    parser.add_argument("--tmpdir", type=Path, default=None, help="where everything goes (default /dev/shm)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the directory (config, database, logs)")
    parser.add_argument("--database-url", metavar="URL",
                        help="also run on PostgreSQL at URL (a schema of its own there), after the SQLite run")
    parser.add_argument("--gitea-process", action="store_true",
                        help="the Gitea emulator in a process of its own (this one only drives)")
    parser.add_argument("--request-log", action="store_true",
                        help="with --gitea-process: log every Gitea request to gitea-requests.log (use --keep)")
    parser.add_argument("--first-comment", action="store_true",
                        help="the latency ends at the first verified bot comment (the allocation's evidence)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.issues < 1 or args.baseline_samples < 1 or args.timeout <= 0:
        parser.print_usage(sys.stderr)
        print("python -m bench.e2e: --issues, --baseline-samples and --timeout must be positive", file=sys.stderr)
        return EXIT_USAGE
    root = run_root("bench-e2e-", args.tmpdir)
    try:
        if args.life:
            from bench.e2e_life import bench_life, life_report, life_text  # it imports this module's helpers

            life = asyncio.run(bench_life(args.issues, args.baseline_samples, args.timeout, root))
            doc, errors, shown = life_report(life, args.issues), life.errors, life_text
        else:
            run = asyncio.run(bench(args.issues, args.baseline_samples, args.timeout, root,
                                    gitea_process=args.gitea_process, request_log=args.request_log))
            doc, errors, shown = report(run, args.issues, first_comment=args.first_comment), run.errors, text
            if args.database_url is not None:
                with scratch_schema(args.database_url, keep=args.keep) as url:
                    on_pg = asyncio.run(bench(args.issues, args.baseline_samples, args.timeout, root / "pg", url,
                                              gitea_process=args.gitea_process))
                pg_doc = report(on_pg, args.issues, first_comment=args.first_comment)
                doc, errors = {"sqlite": doc, "postgresql": pg_doc, "ok": doc["ok"] and pg_doc["ok"]}, [
                    *errors, *on_pg.errors]
                shown = _both
    except (StepFailed, ExceptionGroup) as exc:  # a step that fails inside an MCP session comes in a group
        print(f"bench.e2e failed: {_first_failure(exc)} (files kept in {root})", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(doc, indent=2, sort_keys=True) if args.json else shown(doc))
    return finished(doc, root, keep=args.keep or bool(errors))


if __name__ == "__main__":
    sys.exit(main())
