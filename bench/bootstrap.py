"""Worktree bootstrap benchmark: the full journaled transition versus plain ``git worktree add -b``, same run.

    .venv/bin/python -m bench.bootstrap [--files 10000] [--repeat 15] [--concurrent 10] [--tmpdir DIR] [--json]

Set-up (not timed): a Gitea emulator in its own process (as Gitea is), on loopback, whose repository holds
``--files`` generated files (100 per directory); the service's SQLite database (WAL, synchronous=FULL as shipped);
and the control checkout, cloned from the ``clone_url`` the API reports. Everything lives under /dev/shm when it
exists (DESIGN §4).

Measured for each repeat on a fresh issue, as an interleaved pair (the baseline first on even repeats, the
transition first on odd ones; the transition's artifacts stay registered), each side right after an untimed
worktree removal (which slows the next add a little):

- **baseline**: ``git worktree add -b <branch>-plain branches/<branch>-plain <base>`` in the control checkout,
  ``<branch>`` the name the transition derives for that issue (then removed again, untimed);
- **transition**: ``bootstrap_issue_worktree`` for the issue's lease owner: the Gitea reads (repository, issue,
  base branch, issue branch), the fetch, the seven journal phases with their read-after-write proofs, the lease
  binding and the evidence comment queued in the outbox.

Both figures are medians over ``--repeat`` runs; the target (at most 1.3) is on the median of the per-pair ratios
transition/baseline (each pair measured back to back), printed beside the ratio of the two medians. Peak RSS of
this process is printed too, with the number of worktrees it registered (it grows with them).
Then ``--concurrent`` different issues are bootstrapped at once (one ``asyncio.gather``) and the wall time is
set beside ``--concurrent`` times the single-transition median.

Exit status: 0 when every transition completed and every check passed (a missed ratio target is reported, not
fatal); 1 when a check failed; 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp

from bench import positive_int
from bot.config import Settings
from bot.core.bootstrap import branch_for
from bot.emulator import Emulator, start_emulator
from bot.gitea import GiteaClient, GiteaNotFound
from bot.gitops.control import ControlCheckout
from bot.gitops.environment import git_env
from bot.verbs.bootstrap import BootstrapContext, bootstrap_issue_worktree, ensure_control_checkout
from state.db import Database, utcnow
from state.leases import LeaseStore

OWNER, REPO, BOT, AUTHOR = "bench", "widgets", "foreman-bot", "author-1"
TOKEN = "tok-bench-bot-0001"
OWNER_TOKEN = "tok-bench-owner-0001"
TARGET_RATIO = 1.3
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class Options:
    files: int
    repeat: int
    concurrent: int
    tmpdir: Path | None


def generated_files(count: int) -> dict[str, str]:
    """``count`` small text files, 100 per directory, so the tree looks like a source repository."""
    return {f"pkg{i // 100:03d}/module_{i:05d}.py": f"# module {i}\nVALUE = {i}\n" for i in range(count)}


def commit_fast(bare: Path, branch: str, files: dict[str, str]) -> None:
    """One commit adding ``files`` on top of ``branch``, through ``git fast-import`` (seconds faster than
    writing 10,000 blobs one by one); the emulator reads branches from the bare repository, so it sees it."""
    chunks = [f"commit refs/heads/{branch}\ncommitter Bench <bench@example.invalid> 1767225600 +0000\n"
              f"data 15\nGenerated files\nfrom refs/heads/{branch}^0\n"]
    for name, content in files.items():
        data = content.encode()
        chunks.append(f"M 100644 inline {name}\ndata {len(data)}\n{content}\n")
    stream = "".join(chunks).encode()
    done = subprocess.run(["git", "fast-import", "--quiet"], cwd=bare, input=stream, capture_output=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git fast-import failed: {done.stderr.decode(errors='replace')}")


def _tmp_root(explicit: Path | None) -> Path:
    shm = Path("/dev/shm")  # noqa: S108 (tmpfs, DESIGN §4; the directory itself is made by mkdtemp)
    base = explicit or (shm if shm.is_dir() else None)
    return Path(tempfile.mkdtemp(prefix="bench-bootstrap-", dir=base))


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 2)


def _peak_rss() -> dict[str, float]:
    """Peak resident memory of this process (the service's side: transitions, SQLite, the HTTP client), in MiB.

    The children's figure (RUSAGE_CHILDREN) is no use here: a git process forked from this one counts this
    process's pages until it execs, so it reads as this process's own peak."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {"service": round(own, 1)}


def _stats(samples: list[float]) -> dict[str, Any]:
    return {"median": _ms(statistics.median(samples)), "min": _ms(min(samples)), "max": _ms(max(samples)),
            "n": len(samples)}


async def serve_emulator(root: Path, files: int) -> None:
    """The emulator process: seed, serve on loopback, print ``{"base_url": ...}``, stop when stdin closes."""
    emulator = Emulator(root)
    emulator.add_user(OWNER, token=OWNER_TOKEN)
    emulator.add_user(BOT, token=TOKEN)
    emulator.add_user(AUTHOR, token="tok-bench-author")
    repo = emulator.create_repo(OWNER, REPO, files={"README.md": "# bench\n"})
    commit_fast(repo.path, "main", generated_files(files))
    emulator.set_permission(OWNER, REPO, BOT, "admin")
    runner, base_url = await start_emulator(emulator)
    print(json.dumps({"base_url": base_url}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()
    await emulator.aclose()


async def run(options: Options) -> dict[str, Any]:
    root = _tmp_root(options.tmpdir)
    errors: list[str] = []
    doc: dict[str, Any] = {"files": options.files, "repeat": options.repeat, "concurrent": options.concurrent,
                           "tmpdir": str(root), "errors": errors}
    setup_started = time.perf_counter()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.bootstrap", "--serve-emulator", str(root / "gitea"), "--files",
        str(options.files), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    assert server.stdout is not None and server.stdin is not None
    line = await server.stdout.readline()
    if not line:
        errors.append("the emulator process did not start")
        doc["ok"] = False
        return doc
    base_url = json.loads(line)["base_url"]
    settings = Settings.model_validate({
        "webhook": {"secrets": ["bench-secret-0123456789"]},
        "database": {"path": str(root / "foreman.db")},
        "gitea": {"url": base_url, "token": TOKEN, "bot_login": BOT},
        "repository": {"owner": OWNER, "name": REPO, "checkout_root": str(root / "checkouts")},
        "roster": {AUTHOR: ["author"]},
    })
    db = await Database.open(settings.database.path, synchronous=settings.database.synchronous)
    session = aiohttp.ClientSession()
    try:
        gitea = GiteaClient(session, base_url=base_url, token=TOKEN, owner=OWNER, repo=REPO)
        as_owner = GiteaClient(session, base_url=base_url, token=OWNER_TOKEN, owner=OWNER, repo=REPO)
        ctx = BootstrapContext(db=db, settings=settings, gitea=gitea, bot_login=BOT)
        prepared = await ensure_control_checkout(ctx)
        if not prepared["ok"]:
            errors.append(f"control checkout: {prepared}")
            return doc
        doc["setup_s"] = round(time.perf_counter() - setup_started, 2)
        # The baseline's git holds the repository's worktree registrations as foreman's does: unguarded, the
        # concurrent plain adds below can kill each other (git takes no lock while it writes a registration).
        git = ControlCheckout(ctx.checkout_path, env=git_env(BOT), timeout_s=600).git
        base = str(prepared["head_sha"])
        leases = LeaseStore(db)

        async def new_issue(title: str) -> int:
            number = (await as_owner.create_issue(title)).number
            async with db.transaction() as conn:
                await leases.acquire(conn, repo=ctx.repo, issue_number=number, owner=AUTHOR, role="author",
                                     action="implement", ttl=timedelta(hours=2), now=utcnow(), actor="bench",
                                     fingerprint=None, request={})
            return number

        def baseline(branch: str) -> float:
            path = ctx.checkout_path / "branches" / branch
            started = time.perf_counter()
            git.run("worktree", "add", "--quiet", "-b", branch, str(path), base)
            elapsed = time.perf_counter() - started
            git.run("worktree", "remove", "--force", str(path))
            git.run("branch", "-D", branch)
            return elapsed

        async def transition(number: int) -> float:
            started = time.perf_counter()
            result = await bootstrap_issue_worktree(ctx, issue_number=number, caller=AUTHOR)
            elapsed = time.perf_counter() - started
            if result.status != "completed":
                errors.append(f"#{number}: {result.to_dict()}")
            elif result.proof["head_sha"] != base or not result.proof["created"]["worktree"]:
                errors.append(f"#{number}: unexpected proof {result.proof}")
            return elapsed

        base_samples: list[float] = []
        full_samples: list[float] = []
        (ctx.checkout_path / "branches").mkdir(exist_ok=True)
        for i in range(options.repeat):
            title = f"Benchmark task {i}"
            number = await new_issue(title)
            branch = branch_for(number, title)
            # Interleaved pairs, the order alternating (baseline first on even repeats, the transition first on odd
            # ones), so a drift of the shared machine's load and any order effect fall on both sides alike. Each
            # timed add follows the removal of a worktree (which costs the next add on the same file system ~10 ms):
            # an untimed scratch add + remove before each side puts both in the same position.
            for side in ((0, 1) if i % 2 == 0 else (1, 0)):
                await asyncio.to_thread(baseline, f"bench-scratch-{i}-{side}")
                if side == 0:
                    # the issue's own branch name plus a suffix: the transition may have taken the name already
                    base_samples.append(await asyncio.to_thread(baseline, f"{branch}-plain"))
                else:
                    full_samples.append(await transition(number))
        doc["baseline_ms"] = _stats(base_samples)
        doc["transition_ms"] = _stats(full_samples)
        ratio = statistics.median(full_samples) / statistics.median(base_samples)
        pairs = sorted(f / b for f, b in zip(full_samples, base_samples, strict=True))
        paired = statistics.median(pairs)
        doc["ratio"] = round(ratio, 3)
        # The verdict is on the median of the per-pair ratios: each pair was measured back to back.
        doc["paired_ratio"] = {"median": round(paired, 3), "min": round(pairs[0], 3), "max": round(pairs[-1], 3)}
        doc["target"] = {"ratio_at_most": TARGET_RATIO, "on": "paired_ratio.median",
                         "result": "PASS" if paired <= TARGET_RATIO else "MISS"}

        # Same-run latency of the Gitea reads a transition makes (the emulator's, in its own process).
        api: dict[str, list[float]] = {"get_repo": [], "get_issue": [], "get_branch": [], "get_branch_404": []}
        for _ in range(max(3, options.repeat)):
            for name, call in (("get_repo", gitea.get_repo()), ("get_issue", gitea.get_issue(1)),
                               ("get_branch", gitea.get_branch("main"))):
                started = time.perf_counter()
                await call
                api[name].append(time.perf_counter() - started)
            started = time.perf_counter()
            try:
                await gitea.get_branch("no-such-branch")
            except GiteaNotFound:
                pass
            api["get_branch_404"].append(time.perf_counter() - started)
        doc["gitea_read_ms"] = {name: _ms(statistics.median(samples)) for name, samples in api.items()}

        # The same number of plain `git worktree add -b` at once (threads), as the concurrency baseline.
        def plain_add(i: int) -> None:
            git.run("worktree", "add", "--quiet", "-b", f"bench-par-{i}",
                    str(ctx.checkout_path / "branches" / f"bench-par-{i}"), base)

        started = time.perf_counter()
        await asyncio.gather(*(asyncio.to_thread(plain_add, i) for i in range(options.concurrent)))
        plain_wall = time.perf_counter() - started
        for i in range(options.concurrent):
            git.run("worktree", "remove", "--force", str(ctx.checkout_path / "branches" / f"bench-par-{i}"))
            git.run("branch", "-D", f"bench-par-{i}")

        numbers = [await new_issue(f"Concurrent task {i}") for i in range(options.concurrent)]
        started = time.perf_counter()
        results = await asyncio.gather(*(bootstrap_issue_worktree(ctx, issue_number=n, caller=AUTHOR)
                                         for n in numbers))
        wall = time.perf_counter() - started
        failed = [r.to_dict() for r in results if r.status != "completed"]
        errors.extend(f"concurrent #{d['issue_number']}: {d.get('error')} {d.get('message')}" for d in failed)
        paths = {r.proof.get("worktree_path") for r in results}
        if len(paths) != options.concurrent:
            errors.append(f"concurrent: {len(paths)} distinct worktrees for {options.concurrent} issues")
        serial = statistics.median(full_samples) * options.concurrent
        doc["concurrent_result"] = {
            "issues": options.concurrent,
            "completed": options.concurrent - len(failed),
            "wall_ms": _ms(wall),
            "serial_estimate_ms": _ms(serial),
            "speedup": round(serial / wall, 2) if wall > 0 else None,
            "plain_worktree_add_wall_ms": _ms(plain_wall),
            "ratio_to_plain": round(wall / plain_wall, 3) if plain_wall > 0 else None,
        }
        count = len([e for e in git.run("worktree", "list", "--porcelain").split("\n\n") if "/branches/" in e])
        doc["registered_worktrees"] = count
        doc["peak_rss_mib"] = _peak_rss()
        if count != options.repeat + options.concurrent:
            errors.append(f"{count} worktrees registered, expected {options.repeat + options.concurrent}")
        return doc
    finally:
        doc["ok"] = not errors
        await session.close()
        await db.close()
        server.stdin.close()
        try:
            await asyncio.wait_for(server.wait(), timeout=10)
        except TimeoutError:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)


def render_text(doc: dict[str, Any]) -> str:
    if "transition_ms" not in doc:
        return f"benchmark failed: {doc['errors']}"
    b, t, c = doc["baseline_ms"], doc["transition_ms"], doc["concurrent_result"]
    lines = [
        f"repository: {doc['files']} files; {doc['repeat']} repeats (set-up {doc.get('setup_s')} s,"
        f" tmp {doc['tmpdir']})",
        f"git worktree add -b (baseline) ms: median {b['median']}  min {b['min']}  max {b['max']}",
        f"full bootstrap transition ms:      median {t['median']}  min {t['min']}  max {t['max']}",
        f"transition/baseline: median of the pairs {doc['paired_ratio']['median']}x (pairs"
        f" {doc['paired_ratio']['min']}-{doc['paired_ratio']['max']}x; ratio of the medians {doc['ratio']}x)"
        f"  target <= {TARGET_RATIO}x: {doc['target']['result']}",
        f"{c['issues']} concurrent bootstraps: {c['completed']} completed in {c['wall_ms']} ms"
        f" (serial estimate {c['serial_estimate_ms']} ms, speedup {c['speedup']}x;"
        f" {c['issues']} plain worktree adds at once: {c['plain_worktree_add_wall_ms']} ms,"
        f" ratio {c['ratio_to_plain']}x)",
        "Gitea (emulator) reads, median ms: " + ", ".join(f"{k} {v}" for k, v in doc["gitea_read_ms"].items()),
        f"peak RSS MiB: service {doc['peak_rss_mib']['service']} ({doc['registered_worktrees']} worktrees registered)",
        f"checks: {'PASS' if doc['ok'] else 'FAIL ' + '; '.join(doc['errors'])}",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.bootstrap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=positive_int, default=10_000, help="files in the generated repository")
    parser.add_argument("--repeat", type=positive_int, default=15, help="interleaved pairs of timed runs (medians)")
    parser.add_argument("--concurrent", type=positive_int, default=10, help="issues bootstrapped at once")
    parser.add_argument("--tmpdir", type=Path, default=None, help="where repositories go (default /dev/shm)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-emulator", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.serve_emulator is not None:
        asyncio.run(serve_emulator(args.serve_emulator, args.files))
        return EXIT_OK
    os.environ.pop("FOREMAN_FAULT_AFTER_PHASE", None)
    os.environ.pop("FOREMAN_FAULT_AFTER_STEP", None)
    doc = asyncio.run(run(Options(args.files, args.repeat, args.concurrent, args.tmpdir)))
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return EXIT_OK if doc["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
