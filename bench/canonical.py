"""Canonical Issue State parser benchmark: adversarial lines of 1 KB to 1 MB, and how the time grows.

    .venv/bin/python -m bench.canonical [--repeat 5] [--json]

For each size the parser (``parse_any_length``: ``parse_comment`` without its length bound, which refuses comments over
``MAX_COMMENT_CHARS`` unread) parses each adversarial shape, best of ``--repeat``. The same-run baseline is the
least any line-based reader does with the same text: split it into lines and strip each. Printed per size: the
parser's worst shape, the baseline, their ratio, and the growth from the previous size (linear: ~the size ratio,
quadratic: its square). Memory per size (sizes run smallest first): the process's peak RSS after the size
(``getrusage``), and the peak of what one more, untimed parse of the worst shape allocates (tracemalloc), with its
growth from the previous size. Exit 1 if the growth from 1 KB to 1 MB is more than 2x linear; 0 otherwise.
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import TypedDict

from bot.core.canonical import HEADING_TEXT, MAX_COMMENT_CHARS, parse_any_length, parse_comment

SIZES = (1_000, 10_000, 100_000, 1_000_000)
SHAPES: dict[str, Callable[[int], str]] = {
    # A 48 KB comment once seen in the wild: an ATX heading with a long run of blanks not closed by '#'.
    "atx_blank_run": lambda n: "# a" + " " * n + "x",
    "atx_blank_hash_runs": lambda n: "# a" + " \t" * (n // 2) + "#x",
    "heading_hash_tail": lambda n: f"## {HEADING_TEXT}" + " #" * (n // 2),
    "key_line": lambda n: f"## {HEADING_TEXT}\nSTATE:" + " " * n + "x",
    "related_prs": lambda n: f"## {HEADING_TEXT}\nRELATED_PRS: " + "#1 ," * (n // 4),
    "many_headings": lambda n: (f"## {HEADING_TEXT}\n" * (n // 25)),
    "fences": lambda n: "```\n" * (n // 4),
}


class Row(TypedDict):
    size: int
    worst_shape: str
    parser_ms: float
    baseline_ms: float
    ratio: float
    bounded_ms: float
    shapes_ms: dict[str, float]
    peak_rss_mib: float
    parse_alloc_peak_mib: float


def _split_and_strip(text: str) -> list[str]:
    return [line.rstrip() for line in text.split("\n")]


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def memory(text: str) -> tuple[float, float]:
    """The process's peak RSS so far (MiB), and the peak that one more, untimed parse of ``text`` allocates (MiB)."""
    tracemalloc.start()
    try:
        parse_any_length(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, peak / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for size in SIZES:
        per_shape: dict[str, float] = {}
        baseline = 0.0
        for name, make in SHAPES.items():
            text = make(size)
            per_shape[name] = best(functools.partial(parse_any_length, text), args.repeat)
            baseline = max(baseline, best(functools.partial(_split_and_strip, text), args.repeat))
        worst = max(per_shape, key=lambda k: per_shape[k])
        worst_text = SHAPES[worst](size)
        bounded = best(functools.partial(parse_comment, worst_text), args.repeat)
        rss_mib, alloc_mib = memory(worst_text)
        rows.append({"size": size, "worst_shape": worst, "parser_ms": per_shape[worst] * 1000,
                     "baseline_ms": baseline * 1000, "ratio": per_shape[worst] / baseline if baseline else 0.0,
                     "bounded_ms": bounded * 1000, "shapes_ms": {k: v * 1000 for k, v in per_shape.items()},
                     "peak_rss_mib": round(rss_mib, 1), "parse_alloc_peak_mib": round(alloc_mib, 3)})
    growth = rows[-1]["parser_ms"] / rows[0]["parser_ms"]
    size_ratio = SIZES[-1] / SIZES[0]
    alloc_growth = rows[-1]["parse_alloc_peak_mib"] / rows[0]["parse_alloc_peak_mib"] if rows[0][
        "parse_alloc_peak_mib"] else 0.0
    if args.json:
        print(json.dumps({"rows": rows, "growth": growth, "size_ratio": size_ratio,
                          "alloc_growth": alloc_growth, "max_comment_chars": MAX_COMMENT_CHARS}))
    else:
        print(f"{'size':>9} {'worst shape':<20} {'parser ms':>10} {'split+strip ms':>15} {'ratio':>7} "
              f"{'growth':>8} {'parse_comment ms':>17} {'peak RSS MiB':>13} {'parse alloc MiB':>16} {'growth':>7}")
        previous: Row | None = None
        for row in rows:
            step = "" if previous is None else f"{row['parser_ms'] / previous['parser_ms']:.1f}x"
            alloc_step = "" if previous is None or not previous["parse_alloc_peak_mib"] else (
                f"{row['parse_alloc_peak_mib'] / previous['parse_alloc_peak_mib']:.1f}x")
            print(f"{row['size']:>9} {row['worst_shape']:<20} {row['parser_ms']:>10.3f} {row['baseline_ms']:>15.3f} "
                  f"{row['ratio']:>6.1f}x {step:>8} {row['bounded_ms']:>17.3f} {row['peak_rss_mib']:>13.1f} "
                  f"{row['parse_alloc_peak_mib']:>16.3f} {alloc_step:>7}")
            previous = row
        print(f"growth 1 KB -> 1 MB: {growth:.0f}x for {size_ratio:.0f}x the input (linear: {size_ratio:.0f}x, "
              f"quadratic: {size_ratio ** 2:.0f}x); parse_comment refuses over {MAX_COMMENT_CHARS} characters unread")
        print(f"memory: the worst shape's parse allocates {alloc_growth:.0f}x more at 1 MB than at 1 KB; peak RSS"
              f" {rows[0]['peak_rss_mib']:.1f} -> {rows[-1]['peak_rss_mib']:.1f} MiB")
    return 0 if growth <= 2 * size_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
