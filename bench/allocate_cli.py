"""`foreman allocate --candidates-json @FILE` from outside: what n candidates add to the command (docs/benchmarks.md).

The command runs as an operator runs it, a real process per run (``python -m bot --config CFG allocate
--candidates-json @FILE --json``, a dry run on an offline configuration: SQLite, no Gitea), once with a file of n
candidates and once with a file of 1 (the first of the same n). Its marginal cost is t(n) - t(1): what the n
candidates add, the start-up (imports, configuration, database) taken out. The baseline, in the same run and
measured the same way: a process that loads the same two files and type-checks every record
(``python -m bench.candidates_typecheck FILE``, standard library only; its docstring lists the checks), t(n) - t(1)
again. The four processes run interleaved, ``--repeat`` times each, in a rotating order; each figure is a median.
Target (issue 35): the command's marginal cost at most 4x the baseline's, printed PASS or MISS beside it.

Every run's output is checked: exit 0, a ``select`` decision over all n candidates, choosing the issue
bench/allocate.py's independent reference chooses with as many ranked, printed exactly as ``json.dumps(indent=2,
sort_keys=True)`` prints it; the baseline checked all n records.

Wall-clock is the target's clock; each process's CPU time (user + system, from the kernel's accounting of the
child) is printed beside it as the cross-check that a busy machine disturbs least.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import positive_int

DEFAULT_SIZE = 10_000
DEFAULT_REPEAT = 10
DEFAULT_SEED = 617
TARGET_RATIO = 4.0
OWNER = "author-1"
#: A process that does not end in this long has hung (a 10k run takes well under a second on a quiet machine).
PROCESS_TIMEOUT_S = 300.0

EXIT_OK, EXIT_FAILED = 0, 1


@dataclass(frozen=True)
class Workload:
    """The files and configuration one run uses (under one temporary directory)."""

    root: Path
    config: Path
    files: dict[int, Path]  # candidate count -> candidates file
    expected: Any  # bench.allocate.Expected of the n-candidate file
    n: int


def build_workload(root: Path, n: int, seed: int) -> Workload:
    """n candidates from bench/allocate_data.py's generator (the allocator benchmark's data), 1 of them alone, and an
    offline foreman configuration whose only author receives the dry run."""
    from bench.allocate import reference
    from bench.allocate_data import Loaded, build_database, load
    from bot.config_writer import write_config
    from bot.core.allocator import RankingPolicy

    source = root / "source.sqlite3"
    build_database(source, n, seed)
    conn = sqlite3.connect(source)
    try:
        loaded = load(conn)
    finally:
        conn.close()
    source.unlink()
    files = {}
    for count in (1, n):
        path = root / f"candidates-{count}.json"
        path.write_text(json.dumps(loaded.candidates[:count]), encoding="utf-8")
        files[count] = path
    config = write_config(root / "foreman.toml", {
        "webhook": {"secrets": ["bench-allocate-cli-secret-0123456789"]},
        "database": {"path": str(root / "foreman.db")},
        "roster": {OWNER: ["author"]},
    })
    # No leases and no exclusions in the foreman database: every candidate is open, nothing is leased.
    plain = Loaded(loaded.candidates, [], frozenset(c["issue_number"] for c in loaded.candidates))
    return Workload(root, config, files, reference(plain, [], OWNER, RankingPolicy()), n)


def command_argv(work: Workload, count: int) -> list[str]:
    return [sys.executable, "-m", "bot", "--config", str(work.config), "allocate",
            "--candidates-json", f"@{work.files[count]}", "--json"]


def baseline_argv(work: Workload, count: int) -> list[str]:
    return [sys.executable, "-m", "bench.candidates_typecheck", str(work.files[count])]


@dataclass
class Sample:
    wall_ms: float
    cpu_ms: float
    stdout: str
    stderr: str
    returncode: int


def run_process(argv: list[str]) -> Sample:
    """One process to its end: its wall-clock time and its CPU time (user + system, children's accounting)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FOREMAN_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=PROCESS_TIMEOUT_S, check=False)
    wall = (time.perf_counter() - started) * 1000.0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000.0
    return Sample(wall, cpu, done.stdout, done.stderr, done.returncode)


def check_command(sample: Sample, work: Workload, count: int) -> list[str]:
    """What is wrong with one run of the command (nothing: a valid select over the file, printed as json does)."""
    if sample.returncode != 0:
        return [f"allocate over {count} exited {sample.returncode}: {sample.stderr.strip()[-300:]}"]
    try:
        doc = json.loads(sample.stdout)
    except ValueError:
        return [f"allocate over {count} printed no JSON document"]
    problems = []
    if doc.get("decision") != "select" or doc.get("considered") != count or doc.get("owner") != OWNER:
        problems.append(f"allocate over {count}: {doc.get('decision')} over {doc.get('considered')}, expected select"
                        f" over {count} for {OWNER}")
    if json.dumps(doc, indent=2, sort_keys=True) + "\n" != sample.stdout:
        problems.append(f"allocate over {count}: the output is not json.dumps(indent=2, sort_keys=True) of itself")
    if count == work.n:
        want = work.expected
        if doc.get("issue_number") != want.issue_number or len(doc.get("ranked", ())) != want.ranked:
            problems.append(f"allocate over {count} chose #{doc.get('issue_number')} with"
                            f" {len(doc.get('ranked', ()))} ranked; the reference chooses #{want.issue_number} with"
                            f" {want.ranked}")
        if len(doc.get("fingerprint") or "") != 64:
            problems.append(f"allocate over {count}: no fingerprint")
    return problems


def check_baseline(sample: Sample, count: int) -> tuple[list[str], float | None]:
    """What is wrong with one baseline run, and the milliseconds it measured in-process."""
    try:
        doc = json.loads(sample.stdout)
    except ValueError:
        doc = {}
    if sample.returncode != 0 or doc.get("records") != count:
        return [f"type-check of {count} failed: {sample.stdout.strip()[:200]} {sample.stderr.strip()[-200:]}"], None
    return [], float(doc["ms"])


def _median(samples: Sequence[float]) -> float:
    return round(statistics.median(samples), 2)


def measure(work: Workload, repeat: int) -> dict[str, Any]:
    """``repeat`` rounds of the four processes, the order rotating each round; their medians and the verdict."""
    runs = [("command", 1), ("command", work.n), ("baseline", 1), ("baseline", work.n)]
    walls: dict[tuple[str, int], list[float]] = {key: [] for key in runs}
    cpus: dict[tuple[str, int], list[float]] = {key: [] for key in runs}
    inside: list[float] = []
    errors: list[str] = []
    # untimed: the database is created and migrated, the files and the interpreter are in the page cache
    for kind, count in runs:
        run_process(command_argv(work, count) if kind == "command" else baseline_argv(work, count))
    for round_index in range(repeat):
        shift = round_index % len(runs)
        for kind, count in runs[shift:] + runs[:shift]:
            if kind == "command":
                sample = run_process(command_argv(work, count))
                errors += check_command(sample, work, count)
            else:
                sample = run_process(baseline_argv(work, count))
                found, ms = check_baseline(sample, count)
                errors += found
                if ms is not None and count == work.n:
                    inside.append(ms)
            walls[(kind, count)].append(sample.wall_ms)
            cpus[(kind, count)].append(sample.cpu_ms)

    def figures(clock: dict[tuple[str, int], list[float]]) -> dict[str, Any]:
        medians = {f"{kind}_{count}": _median(clock[(kind, count)]) for kind, count in runs}
        command = round(medians[f"command_{work.n}"] - medians["command_1"], 2)
        baseline = round(medians[f"baseline_{work.n}"] - medians["baseline_1"], 2)
        # a marginal cost at or below zero is the machine's noise, not a figure: no ratio, no verdict
        ratio = round(command / baseline, 2) if baseline > 0 and command > 0 else None
        fastest = {f"{kind}_{count}": round(min(clock[(kind, count)]), 2) for kind, count in runs}
        command_min = round(fastest[f"command_{work.n}"] - fastest["command_1"], 2)
        baseline_min = round(fastest[f"baseline_{work.n}"] - fastest["baseline_1"], 2)
        return {
            "medians_ms": medians,
            # the same from each process's fastest run: what the machine's load disturbed least (a cross-check)
            "fastest_ms": fastest,
            "fastest_ratio": round(command_min / baseline_min, 2) if baseline_min > 0 and command_min > 0 else None,
            "samples_ms": {f"{kind}_{count}": [round(s, 1) for s in clock[(kind, count)]] for kind, count in runs},
            "command_marginal_ms": command,
            "baseline_marginal_ms": baseline,
            "ratio": ratio,
            "result": None if ratio is None else ("PASS" if ratio <= TARGET_RATIO else "MISS"),
        }

    return {
        "wall": figures(walls),
        "cpu": figures(cpus),
        "baseline_in_process_ms": _median(inside) if inside else None,
        "errors": sorted(set(errors)),
    }


def run(n: int, repeat: int, seed: int, tmpdir: str | None) -> dict[str, Any]:
    started = time.perf_counter()
    load_before = os.getloadavg()
    from bench.e2e import run_root

    root = run_root("bench-allocate-cli-", None if tmpdir is None else Path(tmpdir))  # default: on tmpfs
    try:
        work = build_workload(root, n, seed)
        figures = measure(work, repeat)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    wall = figures["wall"]
    return {
        "benchmark": "allocate_cli",
        "settings": {"n": n, "repeat": repeat, "seed": seed, "cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "load_average": {"before": [round(x, 2) for x in load_before],
                         "after": [round(x, 2) for x in os.getloadavg()]},
        **figures,
        "target": {
            "name": f"allocate --candidates-json @FILE, marginal cost of {n} candidates over 1",
            "target": f"<= {TARGET_RATIO}x the baseline's (load and type-check the same file)",
            "ratio": wall["ratio"],
            "result": wall["result"],
        },
        "wall_s": round(time.perf_counter() - started, 1),
        "ok": not figures["errors"],
    }


def render_text(doc: dict[str, Any]) -> str:
    s, n = doc["settings"], doc["settings"]["n"]
    lines = [
        f"foreman allocate --candidates-json @FILE, from outside: {n} candidates against 1; median of {s['repeat']}"
        f" interleaved run(s) of each process; {s['cpus']} CPUs, Python {s['python']}; load average"
        f" {doc['load_average']['before'][0]} before, {doc['load_average']['after'][0]} after",
        "",
        f"{'clock':>6} {'command 1':>10} {'command n':>10} {'marginal':>9} {'baseline 1':>11} {'baseline n':>11}"
        f" {'marginal':>9} {'ratio':>7}",
    ]
    for clock in ("wall", "cpu"):
        f = doc[clock]
        m = f["medians_ms"]
        lines.append(
            f"{clock:>6} {m['command_1']:>10.1f} {m[f'command_{n}']:>10.1f} {f['command_marginal_ms']:>9.1f}"
            f" {m['baseline_1']:>11.1f} {m[f'baseline_{n}']:>11.1f} {f['baseline_marginal_ms']:>9.1f}"
            f" {_times(f['ratio']):>7}  {f['result'] or 'n/a'}  (fastest runs: {_times(f['fastest_ratio'])})"
        )
    t = doc["target"]
    lines += [
        "",
        f"baseline measured in-process (load and type-check {n}): {doc['baseline_in_process_ms']} ms",
        f"target {t['name']} {t['target']}: {t['result'] or 'n/a'} ({_times(t['ratio'])}, wall-clock; cpu"
        f" {_times(doc['cpu']['ratio'])})",
        f"correctness (exit 0, select over every candidate as the reference chooses, output as json prints it, the"
        f" baseline checked every record): {'PASS' if doc['ok'] else 'FAIL'}",
        f"wall time {doc['wall_s']} s",
    ]
    if doc["errors"]:
        lines += ["", "ERRORS:"] + [f"  {e}" for e in doc["errors"]]
    return "\n".join(lines)


def _times(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio}x"


def _size(text: str) -> int:
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError("must be at least 2 (1 candidate is the other run)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.allocate_cli", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--size", type=_size, default=DEFAULT_SIZE, help="candidates in the large file")
    parser.add_argument("--repeat", type=positive_int, default=DEFAULT_REPEAT, help="runs of each process (median)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the generated candidates")
    parser.add_argument("--tmpdir", help="where the files and the database go (default: /dev/shm)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    doc = run(args.size, args.repeat, args.seed, args.tmpdir)
    print(json.dumps(doc, indent=2) if args.json else render_text(doc))
    return EXIT_OK if doc["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
