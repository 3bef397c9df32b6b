"""The bootstrap transition with 1, 300, 1,000 worktrees and branches already in the control checkout, this code
and an earlier revision side by side in one run (issue 19, item 3 "flat").

    .venv/bin/python -m bench.bootstrap_scale [--sizes 1,300,1000] [--repeat 7] [--before REV] [--files 100]
                                              [--tmpdir DIR] [--json]

Set-up (not timed): the Gitea emulator in its own process (``bench.bootstrap --serve-emulator``, ``--files``
generated files), one SQLite database and one control checkout under /dev/shm, shared by two worker processes:
**after** runs this working tree's code, **before** runs ``--before`` (default ``main``), extracted with
``git archive`` into the temporary folder (this module is copied beside it to drive it). Nothing else differs.

For each size the control checkout is first filled up (untimed) to that many registered worktrees, each on its own
branch (``git worktree add -b``); the transitions' own worktrees stay and count. Then ``--repeat`` interleaved pairs
(before first on even repeats, after first on odd ones): each side bootstraps a fresh issue (an emulator issue and a
lease of its own) through ``bootstrap_issue_worktree`` and reports its wall time; beside them, at the same size,
a plain ``git worktree add -b`` (then removed, untimed), which grows with the worktrees too (git reads every
registration to refuse a path or a branch in use).

Printed: per size the medians (before, after, the plain add), after/before, and each side's growth from the first
size to the last (median at the last size / median at the first). The machine's load average is printed at the
start and at the end. Exit 0 when every transition completed, 1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench import positive_int

PROJECT = Path(__file__).resolve().parents[1]
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _settings_doc(root: Path, base_url: str) -> dict[str, Any]:
    from bench.bootstrap import AUTHOR, BOT, OWNER, REPO, TOKEN

    return {
        "webhook": {"secrets": ["bench-secret-0123456789"]},
        "database": {"path": str(root / "foreman.db")},
        "gitea": {"url": base_url, "token": TOKEN, "bot_login": BOT},
        "repository": {"owner": OWNER, "name": REPO, "checkout_root": str(root / "checkouts")},
        "roster": {AUTHOR: ["author"]},
    }


async def worker(root: Path, base_url: str) -> None:
    """One side: read ``run`` lines on stdin, bootstrap a fresh issue for each, answer one JSON line."""
    import aiohttp

    import bot
    from bench.bootstrap import AUTHOR, OWNER, OWNER_TOKEN, REPO, TOKEN
    from bot.config import Settings
    from bot.gitea import GiteaClient
    from bot.verbs.bootstrap import BootstrapContext, bootstrap_issue_worktree, ensure_control_checkout
    from state.db import Database, utcnow
    from state.leases import LeaseStore

    settings = Settings.model_validate(_settings_doc(root, base_url))
    db = await Database.open(settings.database.path, synchronous=settings.database.synchronous)
    session = aiohttp.ClientSession()
    loop = asyncio.get_running_loop()
    try:
        gitea = GiteaClient(session, base_url=base_url, token=TOKEN, owner=OWNER, repo=REPO)
        as_owner = GiteaClient(session, base_url=base_url, token=OWNER_TOKEN, owner=OWNER, repo=REPO)
        ctx = BootstrapContext(db=db, settings=settings, gitea=gitea, bot_login=settings.gitea.bot_login)
        prepared = await ensure_control_checkout(ctx)
        print(json.dumps({"ready": bool(prepared["ok"]), "code": str(Path(bot.__file__).parents[1]),
                          "detail": prepared}, default=str), flush=True)
        leases = LeaseStore(db)
        while (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "run":
            number = (await as_owner.create_issue(f"Scale task {time.time_ns()}")).number
            async with db.transaction() as conn:
                await leases.acquire(conn, repo=ctx.repo, issue_number=number, owner=AUTHOR, role="author",
                                     action="implement", ttl=timedelta(hours=2), now=utcnow(), actor="bench",
                                     fingerprint=None, request={})
            started = time.perf_counter()
            result = await bootstrap_issue_worktree(ctx, issue_number=number, caller=AUTHOR)
            elapsed = time.perf_counter() - started
            print(json.dumps({"ms": round(elapsed * 1000, 2), "status": result.status, "issue": number,
                              "error": None if result.status == "completed" else result.to_dict()}, default=str),
                  flush=True)
    finally:
        await session.close()
        await db.close()


class Side:
    """A worker process running one revision's code."""

    def __init__(self, name: str, tree: Path, root: Path, base_url: str) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(tree)}
        env.pop("FOREMAN_FAULT_AFTER_PHASE", None)
        env.pop("FOREMAN_FAULT_AFTER_STEP", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bootstrap_scale", "--worker", str(root), "--base-url", base_url],
            cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} worker stopped")
        doc: dict[str, Any] = json.loads(line)
        return doc

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:3])} failed: {done.stderr}")
    return done.stdout


def _registered(checkout: Path) -> int:
    root = checkout / ".git" / "worktrees"
    return len(os.listdir(root)) if root.is_dir() else 0


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run(sizes: list[int], repeat: int, before: str, files: int, tmpdir: Path | None) -> dict[str, Any]:
    shm = Path("/dev/shm")  # noqa: S108 (tmpfs, DESIGN §4; the directory itself is made by mkdtemp)
    root = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=tmpdir or (shm if shm.is_dir() else None)))
    doc: dict[str, Any] = {"sizes": sizes, "repeat": repeat, "before": before, "files": files, "tmpdir": str(root),
                           "load_start": _load(), "errors": []}
    errors: list[str] = doc["errors"]
    old = root / "before"
    old.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", before], cwd=PROJECT, capture_output=True,
                             check=False)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {before} failed: {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    shutil.copy(Path(__file__), old / "bench" / "bootstrap_scale.py")
    doc["before_commit"] = _git(PROJECT, "rev-parse", "--verify", f"{before}^{{commit}}").strip()
    doc["after_commit"] = _git(PROJECT, "rev-parse", "HEAD").strip() + (
        " + uncommitted changes" if _git(PROJECT, "status", "--porcelain", "--untracked-files=no").strip() else "")
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.bootstrap", "--serve-emulator", str(root / "gitea"), "--files", str(files)],
        cwd=PROJECT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    sides: list[Side] = []
    try:
        assert server.stdout is not None
        base_url = json.loads(server.stdout.readline())["base_url"]
        sides = [Side("after", PROJECT, root, base_url)]
        sides.append(Side("before", old, root, base_url))
        for side in sides:
            if not side.hello.get("ready"):
                errors.append(f"{side.name}: {side.hello}")
                return doc
        doc["code"] = {side.name: side.hello["code"] for side in sides}
        by_name = {side.name: side for side in sides}
        checkout = root / "checkouts" / "bench" / "widgets"
        (checkout / "branches").mkdir(exist_ok=True)
        base = _git(checkout, "rev-parse", "HEAD").strip()
        filled = 0
        rows: list[dict[str, Any]] = []
        for size in sizes:
            started = time.perf_counter()
            while _registered(checkout) < size:
                _git(checkout, "worktree", "add", "--quiet", "-b", f"fill-{filled}",
                     str(checkout / "branches" / f"fill-{filled}"), base)
                filled += 1
            fill_s = time.perf_counter() - started
            samples: dict[str, list[float]] = {"before": [], "after": [], "plain_add": []}
            at_start = _registered(checkout)
            for i in range(repeat):
                for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                    answer = by_name[name].run()
                    if answer["status"] != "completed":
                        errors.append(f"{name} at {size}: {answer['error']}")
                    samples[name].append(answer["ms"])
                plain = checkout / "branches" / f"plain-{size}-{i}"
                t0 = time.perf_counter()
                _git(checkout, "worktree", "add", "--quiet", "-b", f"plain-{size}-{i}", str(plain), base)
                samples["plain_add"].append(round((time.perf_counter() - t0) * 1000, 2))
                _git(checkout, "worktree", "remove", "--force", str(plain))
                _git(checkout, "branch", "-D", f"plain-{size}-{i}")
            medians = {name: round(statistics.median(values), 2) for name, values in samples.items()}
            rows.append({"size": size, "worktrees_at_start": at_start, "worktrees_at_end": _registered(checkout),
                         "fill_s": round(fill_s, 1), "median_ms": medians, "samples_ms": samples,
                         "after_over_before": round(medians["after"] / medians["before"], 3),
                         "load": _load()})
        doc["rows"] = rows
        first, last = rows[0]["median_ms"], rows[-1]["median_ms"]
        doc["growth_last_over_first"] = {name: round(last[name] / first[name], 3) for name in first}
        return doc
    finally:
        doc["load_end"] = _load()
        doc["ok"] = not errors and "rows" in doc
        for side in sides:
            side.close()
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)


def render_text(doc: dict[str, Any]) -> str:
    if "rows" not in doc:
        return f"benchmark failed: {doc['errors']}"
    dirty = " + changes" if "+" in doc["after_commit"] else ""
    lines = [
        f"before: {doc['before']} ({doc['before_commit'][:10]}), after: {doc['after_commit'][:10]}{dirty};"
        f" {doc['files']} files; {doc['repeat']} interleaved pairs per size; load average at start {doc['load_start']}",
        f"{'worktrees':>10} {'before ms':>10} {'after ms':>10} {'after/before':>13} {'plain add ms':>13}  load",
    ]
    for row in doc["rows"]:
        m = row["median_ms"]
        lines.append(f"{row['worktrees_at_start']:>10} {m['before']:>10} {m['after']:>10}"
                     f" {row['after_over_before']:>12}x {m['plain_add']:>13}  {row['load']}")
    growth = doc["growth_last_over_first"]
    lines.append(f"growth, last size over first (median): before {growth['before']}x, after {growth['after']}x,"
                 f" plain add {growth['plain_add']}x")
    checks = "PASS" if doc["ok"] else "FAIL " + "; ".join(doc["errors"])
    lines.append(f"load average at end {doc['load_end']}; checks: {checks}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.bootstrap_scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,300,1000", help="registered worktrees (each with a branch) per step")
    parser.add_argument("--repeat", type=positive_int, default=7, help="interleaved pairs per size")
    parser.add_argument("--before", default="main", help="the revision to compare with (git archive of it)")
    parser.add_argument("--files", type=positive_int, default=100, help="files in the generated repository")
    parser.add_argument("--tmpdir", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--base-url", default="", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker is not None:
        asyncio.run(worker(args.worker, args.base_url))
        return EXIT_OK
    try:
        sizes = [int(part) for part in args.sizes.split(",") if part.strip()]
    except ValueError:
        parser.error("--sizes takes comma-separated integers")
    if not sizes or min(sizes) < 1 or sizes != sorted(sizes):
        parser.error("--sizes must be increasing and at least 1")
    doc = run(sizes, args.repeat, args.before, args.files, args.tmpdir)
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return EXIT_OK if doc["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
