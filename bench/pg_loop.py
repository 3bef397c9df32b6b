"""The controller loop on PostgreSQL beside SQLite, in the same run: is a server database's loop within 1.3x?

    .venv/bin/python -m bench.pg_loop [--issues 200] [--rounds 2] [--database-url URL] [--json] [--keep]
    .venv/bin/python -m bench.pg_loop --count [--issues 20]

The loop is bench/e2e.py's (its ``bench``, unchanged): a ``status:ready`` label to the verified evidence comment
of the bootstrap, one issue at a time, each released through MCP before the next, against the Gitea emulator and a
real ``foreman serve``. Here it runs ``--issues`` issues on each backend, split into ``--rounds`` halves (or
thirds...) that alternate, the order swapped each round (SQLite, PostgreSQL; PostgreSQL, SQLite; ...), so that a
change in the machine's load falls on both. Each half is a fresh harness: SQLite as bench.e2e sets it up, or
PostgreSQL at ``--database-url`` in a schema of its own (dropped after, unless ``--keep``).

Printed: each backend's p50/p99 of the latency (label to verified evidence) over all its halves, each half's p50,
the ratio PostgreSQL p50 / SQLite p50 and PASS or MISS against the target (<= 1.3x; issue 35). Exit 1 when a check
of the loop failed (bench.e2e's: one lease, one bootstrap, one worktree, one comment per marker...), else 0 (a
missed target is reported, not fatal); 2 on bad usage.

``--count``: instead of timing, the PostgreSQL loop run twice through a counting proxy (bench/pg_wire.py), with one
issue and with ``1 + --issues``: the difference over ``--issues`` is what one issue costs, per process (foreman
serve, foreman mcp, this benchmark's polling): round trips, statements, transactions, savepoints, and the
statements foreman serve sends most.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import positive_int
from bench.database import scratch_schema
from bench.e2e import Run, bench, finished, percentile, run_root, summary
from bench.pg_wire import SessionCounts, WireCounter
from bot.demo_harness import StepFailed

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Issue 35: the loop's p50 on PostgreSQL at most 1.3x SQLite's, same run.
TARGET_RATIO = 1.3
DEFAULT_URL = os.environ.get("FOREMAN_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "postgresql")


def _one_half(backend: str, issues: int, args: argparse.Namespace, root: Path, counter: WireCounter | None = None
              ) -> Run:
    if backend == "sqlite":
        return asyncio.run(bench(issues, args.baseline_samples, args.timeout, root))
    with scratch_schema(args.database_url, keep=args.keep) as url:
        served = url if counter is None else counter.url_through(url)
        return asyncio.run(bench(issues, args.baseline_samples, args.timeout, root, served))


def halves(issues: int, rounds: int) -> list[int]:
    """``issues`` split into ``rounds`` parts as even as may be (each at least one)."""
    return [issues // rounds + (1 if k < issues % rounds else 0) for k in range(rounds)]


def run_interleaved(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    latencies: dict[str, list[float]] = {name: [] for name in BACKENDS}
    parts: list[dict[str, Any]] = []
    errors: list[str] = []
    for k, size in enumerate(halves(args.issues, args.rounds)):
        order = BACKENDS if k % 2 == 0 else BACKENDS[::-1]
        for backend in order:
            run = _one_half(backend, size, args, root / f"{backend}-{k}")
            values = [s.evidence_ms for s in run.samples]
            latencies[backend] += values
            errors += [f"{backend} round {k + 1}: {e}" for e in run.errors]
            parts.append({"round": k + 1, "backend": backend, "issues": size, "p50_ms": percentile(values, 50),
                          "throughput_per_min": size * 60.0 / run.wall_s if run.wall_s else 0.0})
    return report(latencies, parts, errors, args)


def report(latencies: dict[str, list[float]], parts: list[dict[str, Any]], errors: list[str],
           args: argparse.Namespace) -> dict[str, Any]:
    sqlite, postgres = summary(latencies["sqlite"]), summary(latencies["postgresql"])
    ratio = postgres["p50"] / sqlite["p50"]
    return {
        "issues_per_backend": args.issues, "rounds": args.rounds, "sqlite_ms": sqlite, "postgresql_ms": postgres,
        "parts": parts, "ratio": ratio, "target": TARGET_RATIO, "pass": ratio <= TARGET_RATIO,
        "load_average": os.getloadavg(), "errors": errors[:20], "ok": not errors,
    }


def text(doc: dict[str, Any]) -> str:
    s, p = doc["sqlite_ms"], doc["postgresql_ms"]
    lines = [
        f"pg_loop: the e2e loop (label -> verified evidence comment), {doc['issues_per_backend']} issues per backend"
        f" in {doc['rounds']} alternating rounds (load average {' '.join(f'{v:.1f}' for v in doc['load_average'])})",
        f"  SQLite      p50 {s['p50']:.0f} ms, p99 {s['p99']:.0f} ms (n {s['n']})",
        f"  PostgreSQL  p50 {p['p50']:.0f} ms, p99 {p['p99']:.0f} ms (n {p['n']})",
        "  rounds: " + "; ".join(f"{x['round']} {x['backend']} p50 {x['p50_ms']:.0f} ms"
                                 f" ({x['throughput_per_min']:.0f} issues/min)" for x in doc["parts"]),
        f"ratio PostgreSQL / SQLite p50: {doc['ratio']:.2f}x (target <= {doc['target']}x):"
        f" {'PASS' if doc['pass'] else 'MISS'}",
        f"checks (bench.e2e's, every issue of every round): {'PASS' if doc['ok'] else 'FAIL'}",
        *(f"  {e}" for e in doc["errors"]),
    ]
    return "\n".join(lines)


# --- --count: statements and round trips per issue --------------------------------------------------------------------
def _by_process(counts: dict[int | None, SessionCounts]) -> dict[str, SessionCounts]:
    merged: dict[str, SessionCounts] = {}
    for c in counts.values():
        merged.setdefault(c.name, SessionCounts(name=c.name)).add(c)
    return merged


def run_counted(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The PostgreSQL loop with 1 and with 1 + issues issues through the counting proxy: per issue, the difference."""
    totals: list[dict[str, SessionCounts]] = []
    errors: list[str] = []
    for k, size in enumerate((1, 1 + args.issues)):
        counter = WireCounter(*_host_port(args.database_url)).start()
        try:
            run = _one_half("postgresql", size, args, root / f"count-{k}", counter)
        finally:
            counter.stop()
        errors += run.errors
        totals.append(_by_process(counter.counts()))
    per_issue: dict[str, dict[str, float]] = {}
    fields = ("round_trips", "statements", "transactions", "savepoints")
    for name, big in totals[1].items():
        small = totals[0].get(name, SessionCounts())
        per_issue[name] = {f: (getattr(big, f) - getattr(small, f)) / args.issues for f in fields}
    serve_big, serve_small = totals[1].get("foreman serve", SessionCounts()), totals[0].get("foreman serve",
                                                                                              SessionCounts())
    top = (serve_big.by_text - serve_small.by_text).most_common(25)
    shapes = (serve_big.by_transaction - serve_small.by_transaction).most_common(25)
    return {"issues": args.issues, "per_issue": per_issue,
            "serve_top_statements_per_issue": [(round(n / args.issues, 2), sql) for sql, n in top],
            "serve_top_transactions_per_issue": [(round(n / args.issues, 2), list(t)) for t, n in shapes],
            "load_average": os.getloadavg(), "errors": errors[:20], "ok": not errors}


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 5432


def counted_text(doc: dict[str, Any]) -> str:
    lines = [f"pg_loop --count: PostgreSQL traffic per issue of the e2e loop (difference of a 1-issue and a"
             f" {1 + doc['issues']}-issue run, over {doc['issues']}), load average"
             f" {' '.join(f'{v:.1f}' for v in doc['load_average'])}"]
    for name, c in sorted(doc["per_issue"].items()):
        lines.append(f"  {name:<16} round trips {c['round_trips']:7.1f}  statements {c['statements']:7.1f}"
                     f"  transactions {c['transactions']:6.1f}  savepoints {c['savepoints']:6.1f}")
    lines.append("foreman serve's most frequent statements per issue:")
    lines += [f"  {n:7.2f}  {sql}" for n, sql in doc["serve_top_statements_per_issue"]]
    lines.append("foreman serve's most frequent transactions per issue (their statements, in order):")
    lines += [f"  {n:7.2f}  " + " | ".join(t) for n, t in doc["serve_top_transactions_per_issue"]]
    lines.append(f"checks: {'PASS' if doc['ok'] else 'FAIL'}")
    lines += [f"  {e}" for e in doc["errors"]]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_loop", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--issues", type=positive_int, default=200, help="issues per backend (all rounds together)")
    parser.add_argument("--rounds", type=positive_int, default=2, help="alternating parts per backend")
    parser.add_argument("--database-url", metavar="URL", default=DEFAULT_URL,
                        help=f"the PostgreSQL server (a schema of its own per round; default {DEFAULT_URL})")
    parser.add_argument("--baseline-samples", type=positive_int, default=1,
                        help="bench.e2e's bare-operation samples per round (not used by this target)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds one issue may take")
    parser.add_argument("--count", action="store_true", help="count PostgreSQL round trips per issue instead")
    parser.add_argument("--tmpdir", type=Path, default=None, help="where everything goes (default /dev/shm)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--keep", action="store_true", help="keep the files and the PostgreSQL schemas")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.rounds > args.issues and not args.count) or args.timeout <= 0:
        parser.print_usage(sys.stderr)
        print("python -m bench.pg_loop: --rounds at most --issues (but with --count), and --timeout positive",
              file=sys.stderr)
        return EXIT_USAGE
    root = run_root("bench-pg-loop-", args.tmpdir)
    try:
        doc = run_counted(args, root) if args.count else run_interleaved(args, root)
    except (StepFailed, ExceptionGroup) as exc:
        print(f"bench.pg_loop failed: {exc} (files kept in {root})", file=sys.stderr)
        return EXIT_FAILED
    shown = counted_text if args.count else text
    print(json.dumps(doc, indent=2, default=list) if args.json else shown(doc))
    return finished(doc, root, keep=args.keep or not doc["ok"])


if __name__ == "__main__":
    sys.exit(main())
