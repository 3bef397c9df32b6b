"""Allocator dry-run benchmark: one decide(...) over n candidates against loading its inputs (docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import itertools
import json
import math
import os
import pstats
import random
import resource
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from bench import positive_int
from bench.allocate_data import (
    DEPENDS_SHARE,
    EXCLUDED_SHARE,
    LEASED_SHARE,
    NOW,
    OWNER,
    RESUME_OWNER,
    Loaded,
    build_database,
    load,
)
from bot.core.allocator import (
    AllocationDecision,
    AllocationRequest,
    RankingPolicy,
    ResumeDecision,
    decide,
    forget_instants,
)

DEFAULT_SIZES = (1_000, 10_000, 100_000)
DEFAULT_REPEAT = 5
DEFAULT_SEED = 617

TARGET_SIZE = 10_000
TARGET_DECIDE_MS = 50.0  # one dry-run (select and resume) over 10k candidates under 50 ms ...
GROWTH_TOLERANCE = 1.25  # ... and growth "close to n log n": at most 1.25x the n log n expectation

MIN_SIZE = 20

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
T = TypeVar("T")


# --- reference and checks ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    kind: str
    issue_number: int
    lease_id: str | None
    ranked: int
    excluded: int
    foreign: int
    dependency_open: int


def reference(loaded: Loaded, excluded: Sequence[int], owner: str, policy: RankingPolicy) -> Expected:
    """What ``decide`` must answer, computed independently and plainly from the same inputs."""
    excluded_set = set(excluded)
    live = [lease for lease in loaded.leases if lease.expires_at > NOW]
    foreign = {lease.issue_number for lease in live if lease.owner != owner}
    own = {lease.issue_number: lease.lease_id for lease in live if lease.owner == owner}
    open_numbers = set(loaded.open_issue_numbers)
    eligible: list[tuple[int, datetime, int]] = []
    counts = {"excluded": 0, "foreign": 0, "dependency_open": 0}
    for c in loaded.candidates:
        number = c["issue_number"]
        if number in excluded_set:
            counts["excluded"] += 1
        elif number in foreign:
            counts["foreign"] += 1
        elif number not in own and any(d in open_numbers for d in c["depends_on"]):
            counts["dependency_open"] += 1
        else:
            labels = policy.priority_labels
            rank = next((i for i, label in enumerate(labels) if label in c["labels"]), len(labels))
            eligible.append((rank, datetime.fromisoformat(c["created_at"].upper()).astimezone(UTC), number))
    owned = sorted(n for n in own if n not in excluded_set and n not in foreign)
    if owned:
        return Expected("resume", owned[0], own[owned[0]], len(eligible), **counts)
    return Expected("select", min(eligible)[2], None, len(eligible), **counts)


def check_decision(decision: AllocationDecision, expected: Expected, excluded: Sequence[int]) -> dict[str, list[str]]:
    """The problems with one decision, by check: ``excluded`` (an excluded issue chosen or ranked) and
    ``reference`` (kind, chosen issue, ranked and skip counts differ from :func:`reference`)."""
    problems: dict[str, list[str]] = {"excluded": [], "reference": []}
    excluded_set = set(excluded)
    chosen = decision.issue_number
    if chosen in excluded_set:
        problems["excluded"].append(f"excluded issue #{chosen} was chosen")
    ranked_excluded = [r.issue_number for r in decision.ranked if r.issue_number in excluded_set]
    if ranked_excluded:
        problems["excluded"].append(f"{len(ranked_excluded)} excluded issue(s) ranked, e.g. #{ranked_excluded[0]}")
    ref = problems["reference"]
    if decision.kind != expected.kind:
        ref.append(f"decision is {decision.kind!r}, expected {expected.kind!r}")
    if chosen != expected.issue_number:
        ref.append(f"chose #{chosen}, the reference chose #{expected.issue_number}")
    if isinstance(decision, ResumeDecision) and decision.lease.lease_id != expected.lease_id:
        ref.append(f"resumed lease {decision.lease.lease_id}, expected {expected.lease_id}")
    if len(decision.ranked) != expected.ranked:
        ref.append(f"{len(decision.ranked)} ranked, the reference has {expected.ranked}")
    reasons = _skip_counts(decision)
    for reason, want in (
        ("excluded_by_controller", expected.excluded),
        ("foreign_claim", expected.foreign),
        ("dependency_open", expected.dependency_open),
    ):
        if reasons.get(reason, 0) != want:
            ref.append(f"{reasons.get(reason, 0)} skipped as {reason}, expected {want}")
    unexpected = set(reasons) - {"excluded_by_controller", "foreign_claim", "dependency_open"}
    if unexpected:
        ref.append(f"unexpected skip reasons {sorted(unexpected)}")
    return problems


def _skip_counts(decision: AllocationDecision) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in decision.skipped:
        counts[s.reason] = counts.get(s.reason, 0) + 1
    return counts


def _shape(decision: AllocationDecision) -> tuple[Any, ...]:
    return (decision.kind, decision.issue_number, tuple(r.issue_number for r in decision.ranked))


# --- measuring --------------------------------------------------------------------------------------------------------


def timed(
    fn: Callable[[], T], repeat: int, gc_off: bool = False, before: Callable[[], None] | None = None
) -> tuple[list[float], T]:
    """Run ``fn`` ``repeat`` times (a full collection before each); the samples in ms and the last result.

    ``gc_off`` suspends the cyclic garbage collector while a sample runs (diagnostic: ``--gc-off``); ``before`` runs
    untimed before each sample (``forget_instants``: a first allocation, with nothing remembered)."""
    samples: list[float] = []
    result: T | None = None
    for _ in range(repeat):
        if before is not None:
            before()
        gc.collect()
        if gc_off:
            gc.disable()
        try:
            started = time.perf_counter()
            result = fn()
            samples.append((time.perf_counter() - started) * 1000.0)
        finally:
            gc.enable()
    assert result is not None
    return samples, result


def _figure(samples: Sequence[float]) -> dict[str, Any]:
    return {
        "median": round(statistics.median(samples), 3),
        "min": round(min(samples), 3),
        "samples": [round(s, 3) for s in samples],
    }


@dataclass(frozen=True)
class Options:
    sizes: list[int]
    repeat: int = DEFAULT_REPEAT
    seed: int = DEFAULT_SEED
    tmpdir: str | None = None
    profile: Path | None = None
    gc_off: bool = False


def run_size(n: int, options: Options, workdir: Path, profile: Path | None = None) -> dict[str, Any]:
    repeat, seed = options.repeat, options.seed
    policy = RankingPolicy()
    path = workdir / f"allocate-{n}.sqlite3"
    started = time.perf_counter()
    data = build_database(path, n, seed)
    setup_s = time.perf_counter() - started

    conn = sqlite3.connect(path)
    try:
        load_samples, loaded = timed(lambda: load(conn), repeat, options.gc_off)
    finally:
        conn.close()

    scenarios: dict[str, Any] = {}
    errors: list[str] = []
    for name, owner in (("select", OWNER), ("resume", RESUME_OWNER)):
        request = AllocationRequest(
            owner=owner,
            candidates=loaded.candidates,
            exclude_issue_numbers=data.excluded,
            open_issue_numbers=loaded.open_issue_numbers,
        )
        fingerprints: set[str | None] = set()

        def dry_run(
            request: AllocationRequest = request, fingerprints: set[str | None] = fingerprints
        ) -> AllocationDecision:
            decision = decide(request, policy, loaded.leases, NOW)
            fingerprints.add(decision.fingerprint)
            return decision

        # Interleaved: a first dry run over these issues (nothing remembered: cold), then a repeated one (warm: the
        # created_at texts were read before, as on a proof, an apply or the next run over the same issues).
        samples: list[float] = []
        cold_samples: list[float] = []
        for _ in range(repeat):
            cold, decision = timed(dry_run, 1, options.gc_off, before=forget_instants)
            warm, decision = timed(dry_run, 1, options.gc_off)
            cold_samples += cold
            samples += warm
        if repeat == 1:  # the stability check needs a second run on the same input
            dry_run()
        expected = reference(loaded, data.excluded, owner, policy)
        problems = check_decision(decision, expected, data.excluded)

        # Same inputs again, but every list in another order: the decision and fingerprint must not move.
        rng = random.Random(seed + n)
        shuffled_candidates = list(loaded.candidates)
        rng.shuffle(shuffled_candidates)
        shuffled_excluded = list(data.excluded)
        rng.shuffle(shuffled_excluded)
        shuffled_leases = list(loaded.leases)
        rng.shuffle(shuffled_leases)
        shuffled = decide(
            AllocationRequest(
                owner=owner,
                candidates=shuffled_candidates,
                exclude_issue_numbers=shuffled_excluded,
                open_issue_numbers=loaded.open_issue_numbers,
            ),
            policy,
            shuffled_leases,
            NOW,
        )
        repeats_stable = len(fingerprints) == 1
        shuffle_stable = shuffled.fingerprint == decision.fingerprint and _shape(shuffled) == _shape(decision)
        problems["fingerprint"] = []
        if not decision.fingerprint or not repeats_stable:
            problems["fingerprint"].append("fingerprint missing or different between two runs on the same input")
        if not shuffle_stable:
            problems["fingerprint"].append(
                "fingerprint or decision changed when candidates, exclusions and leases were shuffled"
            )
        found = [p for group in problems.values() for p in group]
        errors += [f"n={n} {name}: {p}" for p in found]
        scenarios[name] = {
            "decide_ms": _figure(samples),
            "cold_ms": _figure(cold_samples),
            "decision": decision.kind,
            "issue_number": decision.issue_number,
            "fingerprint": decision.fingerprint,
            "ranked": len(decision.ranked),
            "skipped": _skip_counts(decision),
            "checks": {
                "no_excluded_chosen_or_ranked": not problems["excluded"],
                "matches_reference": not problems["reference"],
                "fingerprint_stable_repeat": bool(decision.fingerprint) and repeats_stable,
                "fingerprint_stable_shuffled": shuffle_stable,
                "passed": not found,
            },
        }

    memory = _memory(request_for(loaded, data.excluded), loaded)

    profile_rows = None
    if profile is not None:
        request = AllocationRequest(
            owner=OWNER,
            candidates=loaded.candidates,
            exclude_issue_numbers=data.excluded,
            open_issue_numbers=loaded.open_issue_numbers,
        )
        profile_rows = profile_decide(request, loaded, profile)
    path.unlink(missing_ok=True)

    load_ms = statistics.median(load_samples)
    decide_ms = scenarios["select"]["decide_ms"]["median"]
    return {
        "n": n,
        "excluded": len(data.excluded),
        "foreign_leases": len(data.foreign_leased),
        "resume_owner_lease_issue": data.own_lease_issue,
        "live_leases": len(loaded.leases),
        "lease_rows": data.lease_rows,
        "with_depends_on": data.with_deps,
        "setup_s": round(setup_s, 2),
        "memory": memory,
        "load_ms": _figure(load_samples),
        "decide_ms": scenarios["select"]["decide_ms"],
        "ratio_decide_load": round(decide_ms / load_ms, 2) if load_ms > 0 else None,
        "scenarios": scenarios,
        "profile": profile_rows,
        "errors": errors,
        "ok": not errors,
    }


def request_for(loaded: Loaded, excluded: Sequence[int]) -> AllocationRequest:
    return AllocationRequest(
        owner=OWNER, candidates=loaded.candidates, exclude_issue_numbers=excluded,
        open_issue_numbers=loaded.open_issue_numbers,
    )


def _memory(request: AllocationRequest, loaded: Loaded) -> dict[str, float]:
    """Peak RSS of the process so far (sizes run smallest first, so it is this size's peak) and the peak of what
    one more, untimed decide allocates on top of its inputs (tracemalloc), in MiB."""
    gc.collect()
    tracemalloc.start()
    try:
        decision = decide(request, RankingPolicy(), loaded.leases, NOW)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del decision
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_rss_mib": round(rss_kib / 1024, 1), "decide_alloc_peak_mib": round(peak / 2**20, 2)}


def growth(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """t(kn)/t(n) for consecutive sizes next to the n log n expectation k*log(kn)/log(n) (and linear, k)."""
    rows = []
    for small, big in itertools.pairwise(results):
        k = big["n"] / small["n"]
        expected = k * math.log(big["n"]) / math.log(small["n"])
        measured = big["decide_ms"]["median"] / small["decide_ms"]["median"]
        load_growth = big["load_ms"]["median"] / small["load_ms"]["median"]
        alloc_growth = big["memory"]["decide_alloc_peak_mib"] / max(small["memory"]["decide_alloc_peak_mib"], 1e-9)
        rows.append(
            {
                "from": small["n"],
                "to": big["n"],
                "decide_growth": round(measured, 2),
                "n_log_n_expects": round(expected, 2),
                "linear_expects": round(k, 2),
                "load_growth": round(load_growth, 2),
                "decide_alloc_growth": round(alloc_growth, 2),
                "result": "PASS" if measured <= expected * GROWTH_TOLERANCE else "MISS",
            }
        )
    return rows


def profile_decide(request: AllocationRequest, loaded: Loaded, out: Path) -> list[dict[str, Any]]:
    """cProfile one more decide (not timed); stats to ``out``, the 15 functions with the most own time."""
    profiler = cProfile.Profile()
    gc.collect()
    profiler.enable()
    decide(request, RankingPolicy(), loaded.leases, NOW)
    profiler.disable()
    profiler.dump_stats(str(out))
    stats = pstats.Stats(profiler, stream=io.StringIO())
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in raw.values())
    rows: list[dict[str, Any]] = [
        {
            "function": f"{Path(filename).name}:{line}({func})",
            "calls": calls,
            "tottime_ms": round(tottime * 1000, 1),
            "cumtime_ms": round(cumtime * 1000, 1),
            "tottime_share": round(tottime / total, 3) if total else None,
        }
        for (filename, line, func), (_primitive, calls, tottime, cumtime, _callers) in raw.items()
    ]
    rows.sort(key=lambda r: r["tottime_ms"], reverse=True)
    return rows[:15]


def run(options: Options) -> dict[str, Any]:
    sizes, profile = options.sizes, options.profile
    wall_started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench-allocate-", dir=options.tmpdir))
    try:
        results = [run_size(n, options, workdir, profile if n == max(sizes) else None) for n in sizes]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    profile_rows = next((r.pop("profile") for r in results if r.get("profile")), None)
    for r in results:
        r.pop("profile", None)
    errors = [e for r in results for e in r["errors"]]
    target_row = next((r for r in results if r["n"] == TARGET_SIZE), None)
    target_value = target_row["decide_ms"]["median"] if target_row else None
    resume_value = target_row["scenarios"]["resume"]["decide_ms"]["median"] if target_row else None
    cold_value = target_row["scenarios"]["select"]["cold_ms"]["median"] if target_row else None
    resume_cold_value = target_row["scenarios"]["resume"]["cold_ms"]["median"] if target_row else None
    target_load = target_row["load_ms"]["median"] if target_row else None
    growth_rows = growth(results)
    return {
        "settings": {
            "sizes": list(sizes),
            "repeat": options.repeat,
            "seed": options.seed,
            "gc_off": options.gc_off,
            "excluded_share": EXCLUDED_SHARE,
            "foreign_leased_share": LEASED_SHARE,
            "depends_on_share": DEPENDS_SHARE,
            "now": NOW.isoformat(),
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "sqlite": sqlite3.sqlite_version,
        },
        "sizes": results,
        "growth": growth_rows,
        "targets": {
            "decide_10k_ms": _ms_target(target_value, target_load),
            "resume_10k_ms": _ms_target(resume_value, target_load),
            "decide_cold_10k_ms": _ms_target(cold_value, target_load),
            "resume_cold_10k_ms": _ms_target(resume_cold_value, target_load),
            "growth_n_log_n": {
                "target": f"<= {GROWTH_TOLERANCE} x n log n expectation",
                "value": [g["decide_growth"] for g in growth_rows],
                "result": None
                if not growth_rows
                else ("PASS" if all(g["result"] == "PASS" for g in growth_rows) else "MISS"),
            },
        },
        "checks_passed": not errors,
        "profile": None if profile is None else {"path": str(profile), "n": max(sizes), "top": profile_rows},
        "wall_s": round(time.perf_counter() - wall_started, 2),
        "errors": errors,
        "ok": not errors,
    }


def _ms_target(value: float | None, baseline: float | None) -> dict[str, Any]:
    """The 10k target with the same run's load baseline beside it (the machine is shared: the ratio travels)."""
    return {
        "target": f"< {TARGET_DECIDE_MS}",
        "value": value,
        "baseline_load_ms": baseline,
        "ratio_to_load": round(value / baseline, 2) if value is not None and baseline else None,
        "result": None if value is None else ("PASS" if value < TARGET_DECIDE_MS else "MISS"),
    }


# --- output -----------------------------------------------------------------------------------------------------------


def _size_label(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else str(n)


def render_text(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [
        f"allocator dry-run benchmark: sizes {', '.join(_size_label(n) for n in s['sizes'])}; median of"
        f" {s['repeat']} run(s){' with the GC off' if s['gc_off'] else ''}; {s['excluded_share']:.0%} excluded,"
        f" {s['foreign_leased_share']:.0%} leased to"
        f" foreign owners, {s['depends_on_share']:.0%} with depends_on; {s['cpus']} CPUs, Python {s['python']},"
        f" SQLite {s['sqlite']}",
        "",
        f"{'n':>8} {'load ms':>9} {'decide ms':>10} {'(min)':>9} {'decide/load':>11} {'resume ms':>10}"
        f" {'cold ms':>8} {'resume cold':>11} {'ranked':>7}"
        f" {'excl/foreign/dep skipped':>24} {'checks':>7} {'peak RSS MiB':>12} {'decide alloc MiB':>16}",
    ]
    for r in doc["sizes"]:
        sel = r["scenarios"]["select"]
        skipped = sel["skipped"]
        skip_text = (
            f"{skipped.get('excluded_by_controller', 0)}/{skipped.get('foreign_claim', 0)}"
            f"/{skipped.get('dependency_open', 0)}"
        )
        lines.append(
            f"{r['n']:>8} {r['load_ms']['median']:>9.2f} {r['decide_ms']['median']:>10.2f}"
            f" {r['decide_ms']['min']:>9.2f}"
            f" {str(r['ratio_decide_load']) + 'x':>11} {r['scenarios']['resume']['decide_ms']['median']:>10.2f}"
            f" {sel['cold_ms']['median']:>8.2f} {r['scenarios']['resume']['cold_ms']['median']:>11.2f}"
            f" {sel['ranked']:>7} {skip_text:>24} {'PASS' if r['ok'] else 'FAIL':>7}"
            f" {r['memory']['peak_rss_mib']:>12.1f} {r['memory']['decide_alloc_peak_mib']:>16.2f}"
        )
    if doc["growth"]:
        lines += ["", f"{'growth':>14} {'decide t(kn)/t(n)':>18} {'n log n expects':>16} {'linear':>7} {'load':>6}"
                      f" {'alloc':>6}"]
        for g in doc["growth"]:
            step = f"{_size_label(g['from'])} -> {_size_label(g['to'])}"
            lines.append(
                f"{step:>14} {g['decide_growth']:>18.2f} {g['n_log_n_expects']:>16.2f} {g['linear_expects']:>7.2f}"
                f" {g['load_growth']:>6.2f} {g['decide_alloc_growth']:>6.2f}  {g['result']}"
            )
    t = doc["targets"]
    lines.append("")
    for label, key in (("decide", "decide_10k_ms"), ("resume", "resume_10k_ms"),
                       ("decide (cold)", "decide_cold_10k_ms"), ("resume (cold)", "resume_cold_10k_ms")):
        d10 = t[key]
        lines.append(
            f"target {label} at 10k {d10['target']} ms: {d10['result'] or 'n/a (10000 not in --sizes)'}"
            + (f" ({d10['value']} ms; load baseline {d10['baseline_load_ms']} ms, {d10['ratio_to_load']}x)"
               if d10["value"] is not None else "")
        )
    lines += [
        f"target growth {t['growth_n_log_n']['target']}: {t['growth_n_log_n']['result'] or 'n/a (one size)'}",
        "correctness (no excluded issue chosen or ranked, reference decision, fingerprint stable over repeats and"
        f" shuffled order): {'PASS' if doc['checks_passed'] else 'FAIL'}",
    ]
    if doc["profile"]:
        p = doc["profile"]
        lines += ["", f"cProfile of one decide at n={p['n']} (stats in {p['path']}), by own time:"]
        lines += [
            f"  {row['tottime_ms']:>9.1f} ms {row['tottime_share']:>6.1%} {row['calls']:>9}  {row['function']}"
            for row in p["top"]
        ]
    lines.append(f"wall time {doc['wall_s']} s")
    if doc["errors"]:
        lines += ["", "ERRORS:"] + [f"  {e}" for e in doc["errors"]]
    return "\n".join(lines)


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not sizes or any(n < MIN_SIZE for n in sizes):
        raise argparse.ArgumentTypeError(f"each size must be at least {MIN_SIZE}")
    return sorted(set(sizes))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.allocate", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=_sizes, default=list(DEFAULT_SIZES), help="candidate counts, comma-separated")
    parser.add_argument("--repeat", type=positive_int, default=DEFAULT_REPEAT, help="timed runs per figure (median)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the generated issues and leases")
    parser.add_argument("--tmpdir", help="where the temp databases go (default: the system temp dir)")
    parser.add_argument("--profile", metavar="PATH", help="cProfile one more decide at the largest size, stats to PATH")
    parser.add_argument(
        "--gc-off", action="store_true", help="suspend the cyclic garbage collector while a sample runs (diagnostic)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    options = Options(
        sizes=args.sizes,
        repeat=args.repeat,
        seed=args.seed,
        tmpdir=args.tmpdir,
        profile=Path(args.profile).resolve() if args.profile else None,
        gc_off=args.gc_off,
    )
    doc = run(options)
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return EXIT_OK if doc["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
