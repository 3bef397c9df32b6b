"""Fixed-seed fuzz of candidates_json (normalizer and CLI parser): it normalizes or is refused typed, with bounded work.

Work is counted, not timed (tests/work_count.py): each call makes at most MAX_CALLS_PER_INPUT function calls, whatever
the input (a 10,000-character string, 60,000 nested brackets, a 6,000-digit integer), and a refusal quotes the input
only in short: no problem text over MAX_PROBLEM_CHARS characters.
"""

from __future__ import annotations

import functools
import json
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from bot.cli.allocate import parse_candidates_option
from bot.core.allocator import Candidate, InputError, normalize_candidates, normalize_exclusions
from bot.core.errors import EnvelopeError
from tests.work_count import counted

pytestmark = [pytest.mark.slow]

SEED = 20261212
#: 8,000 inputs (16,000 calls): with this seed every class of input (``CLASSES``) appears at least 4 times, which
#: the test asserts; the 20,000 run before held the same classes, only more repetitions of each.
INPUTS = 8_000
# The most any input of this corpus takes today is about 1,300 calls (1,850 over 20,000 inputs: a document of a few
# records); work that grows with the length of a string or the depth of nesting (a per-character loop, a recursion)
# runs into the tens of thousands.
MAX_CALLS_PER_INPUT = 4_000
MAX_PROBLEM_CHARS = 400
FIELDS = ("issue_number", "number", "title", "labels", "created_at", "depends_on", "ready")
TOKENS = ("[", "]", "{", "}", ",", ":", '"', "NaN", "Infinity", "-Infinity", "null", "true", "1e999", "-0", "\\u",
          "\\ud800", "0x10", "1.0", "01", " ", "\n", "\x00", "\u2028", "\ufeff")


NUMBERS = ("111", "-99", "NaN", "Infinity", "-Infinity", "1e999", "1E400", "-0", "0", "9223372036854775808", "1.0",
           "017")
WHERES = ('{"issue_number": %s}', '[{"issue_number": 1, "depends_on": [%s]}]', "[%s]",
          '{"issue_number": 1, "ready": %s}', "%s")
DEPTHS = (5, 50, 900, 1_100, 5_000)
TEXT_DEPTHS = (10, 999, 1_000, 1_001, 5_000, 60_000)
OPENERS = ("[", '{"a":', '[{"issue_number":1,"labels":')
#: Every class of input the generator makes (``Gen.seen``): each kind of each choice, every deep text (depth, opener,
#: closed or not) and every odd number in every place.
CLASSES: frozenset[tuple[object, ...]] = frozenset({
    *(("text", kind) for kind in range(5)),  # deep, odd number, token soup, mutated JSON, JSON of a document
    *(("deep", depth, opener, closed) for depth in TEXT_DEPTHS for opener in OPENERS for closed in (False, True)),
    *(("number", number, where) for number in NUMBERS for where in WHERES),
    *(("document", kind) for kind in range(3)),  # a value, a record, a list of records
    *(("value", kind) for kind in range(5)),  # list, object, deep nesting, not JSON at all, scalar
    *(("nested", depth) for depth in DEPTHS),
    *(("integer", kind) for kind in range(4)),  # edge, over the int-str limit, 30 digits, small
    *(("string", kind) for kind in range(4)),  # any code point, long, date-like, label-like
    *(("mutate", op) for op in range(3)),
    ("candidate",),  # a Candidate object among the records
})


class Gen:
    """Seeded generator of hostile values and texts; ``seen`` is the classes of input it made (``CLASSES``)."""

    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.seen: set[tuple[object, ...]] = set()

    def integer(self) -> int:
        r = self.r
        kind = r.randrange(8)
        self.seen.add(("integer", min(kind, 3)))
        if kind == 0:
            edges: list[int] = [0, -1, 1, 2**63 - 1, 2**63, -(2**63), 2**64]
            return r.choice(edges)
        if kind == 1:
            huge: int = 10 ** r.randrange(4_301, 6_000) - 1  # over the int-str limit
            return huge * r.choice([1, -1])
        if kind == 2:
            return r.randrange(-(10**30), 10**30)
        return r.randrange(1, 5_000)

    def string(self) -> str:
        r = self.r
        kind = r.randrange(6)
        self.seen.add(("string", min(kind, 3)))
        if kind == 0:
            return "".join(chr(r.randrange(0x10FFFF)) for _ in range(r.randrange(20)))  # surrogates included
        if kind == 1:
            return "x" * r.randrange(10_000)
        if kind == 2:
            return r.choice(["2026-07-20T21:35:15-05:00", "2026-02-30T00:00:00Z", "2026-07-20", "", "617", "NaN"])
        return r.choice(["priority:p0", "status:ready", "bug", "", " ", "\u0661\u0662"])

    def nested(self, depth: int) -> Any:
        """A scalar inside ``depth`` levels, each a list or an object (a seeded coin each). The coins are the bits of
        one ``getrandbits`` call: one ``random()`` call per level made this the campaign's costliest step."""
        self.seen.add(("nested", depth))
        value: Any = self.scalar()
        for coin in format(self.r.getrandbits(depth), f"0{depth}b"):
            value = [value] if coin == "1" else {"k": value}
        return value

    def scalar(self) -> Any:
        r = self.r
        return r.choice([
            None, True, False, self.integer(), r.random() * 1e6, float("nan"), float("inf"), -float("inf"),
            self.string(), 3.0,
        ])

    def value(self, depth: int = 0) -> Any:
        r = self.r
        kind = r.randrange(10)
        self.seen.add(("value", kind if kind in (2, 3) or (kind < 2 and depth < 3) else 4))
        if kind == 0 and depth < 3:
            return [self.value(depth + 1) for _ in range(r.randrange(5))]
        if kind == 1 and depth < 3:
            return {self.key(): self.value(depth + 1) for _ in range(r.randrange(4))}
        if kind == 2:
            return self.nested(r.choice(DEPTHS))
        if kind == 3:
            return r.choice([set(), (1, 2), b"bytes", frozenset({1}), object()])
        return self.scalar()

    def key(self) -> Any:
        r = self.r
        return r.choice([*FIELDS, *FIELDS, "depend_on", "", "x" * 200, self.integer(), None, 1.5])

    def record(self) -> Any:
        r = self.r
        rec: dict[Any, Any] = {"issue_number": r.randrange(1, 1_000)}
        for _ in range(r.randrange(6)):
            fld = r.choice(FIELDS)
            rec[fld] = r.choice([
                self.value(),
                [self.integer() for _ in range(r.randrange(4))],
                [self.string() for _ in range(r.randrange(4))],
                self.integer(),
                self.string(),
            ])
        if r.random() < 0.2:
            rec[self.key()] = self.value()
        if r.random() < 0.05:
            self.seen.add(("candidate",))
            return Candidate(issue_number=r.randrange(1, 1_000), title=self.string()[:50])
        return rec

    def document(self) -> Any:
        r = self.r
        kind = r.randrange(4)
        self.seen.add(("document", min(kind, 2)))
        if kind == 0:
            return self.value()
        if kind == 1:
            return self.record()
        return [self.record() for _ in range(r.randrange(6))]

    def text(self) -> str:
        r = self.r
        kind = r.randrange(7)
        self.seen.add(("text", min(kind, 4)))
        if kind == 0:  # deep nesting of brackets or objects, closed or not
            depth = r.choice(TEXT_DEPTHS)
            opener, closer = r.choice([("[", "]"), ('{"a":', "}"), ('[{"issue_number":1,"labels":', "}]")])
            closed = r.random() < 0.5
            self.seen.add(("deep", depth, opener, closed))
            return opener * depth + (closer * depth if closed else "")
        if kind == 1:  # huge or odd numbers in otherwise valid records
            number = r.choice(["1" * r.randrange(4_290, 6_000), "-" + "9" * 4_400, "NaN", "Infinity", "-Infinity",
                               "1e999", "1E400", "-0", "0", "9223372036854775808", "1.0", "017"])
            where = r.choice(WHERES)
            self.seen.add(("number", number if len(number) < 30 else number[:3], where))  # the long ones: 111, -99
            return where % number
        if kind == 2:  # token soup
            return "".join(r.choice(TOKENS) for _ in range(r.randrange(1, 60)))
        document = self.document()
        try:
            text = json.dumps(document, allow_nan=True, default=str)
        except (TypeError, ValueError, RecursionError):
            text = "[]"
        if kind == 3 and text:  # mutate: flip, insert or delete characters
            chars = list(text)
            for _ in range(r.randrange(1, 6)):
                at = r.randrange(len(chars) + 1)
                op = r.randrange(3)
                self.seen.add(("mutate", op))
                if op == 0 and chars:
                    chars[min(at, len(chars) - 1)] = r.choice(TOKENS)
                elif op == 1:
                    chars.insert(at, r.choice(TOKENS))
                elif chars:
                    del chars[min(at, len(chars) - 1)]
            text = "".join(chars)
        return text


def _run(call: Callable[[], object]) -> tuple[int, str | None]:
    """The function calls ``call`` made and what is wrong with how it ended (None: normalized or refused typed)."""
    _, raised, calls = counted(call, int_digits=None)  # the decoder meets the integer limit itself: left as it is
    if raised is None:
        return calls, None
    if isinstance(raised, InputError | EnvelopeError):
        if raised.envelope.error != "invalid_input":
            return calls, f"envelope {raised.envelope.error}"
        doc = raised.envelope.to_dict()
        problems = [str(p.get("problem", "")) for p in doc.get("details", {}).get("problems", [])]
        longest = max([len(doc["message"]) // 6, *map(len, problems)])  # the message lists up to five problems
        if longest > MAX_PROBLEM_CHARS:
            return calls, f"a problem text of {longest} characters quotes too much of the input"
        return calls, None
    return calls, f"{type(raised).__name__}: {str(raised)[:120]}"


def test_fuzz_candidates_json_normalizes_or_refuses_typed_with_bounded_work() -> None:
    gen = Gen(SEED)
    failures: list[str] = []
    most = 0
    started = time.perf_counter()
    for index in range(INPUTS):
        if index % 3 == 0:
            raw: Any = gen.document()
            calls: list[tuple[str, Callable[[], object]]] = [
                ("normalize_candidates(object)", functools.partial(normalize_candidates, raw)),
                ("normalize_exclusions(object)", functools.partial(normalize_exclusions, raw)),
            ]
        else:
            text = gen.text()
            calls = [
                ("normalize_candidates(text)", functools.partial(normalize_candidates, text)),
                ("parse_candidates_option(text)", functools.partial(parse_candidates_option, text)),
            ]
        for name, call in calls:
            work, failure = _run(call)
            most = max(most, work)
            if failure is None and work > MAX_CALLS_PER_INPUT:
                failure = f"{work} function calls (at most {MAX_CALLS_PER_INPUT})"
            if failure is not None:
                failures.append(f"#{index} {name}: {failure}")
    assert failures == [], f"{len(failures)} failures: {failures[:10]}"
    assert gen.seen == CLASSES, f"classes never made: {sorted(CLASSES - gen.seen, key=str)}"
    elapsed = time.perf_counter() - started
    print(f"\nfuzz: {INPUTS} inputs, {2 * INPUTS} calls in {elapsed:.1f} s; most work {most} calls")
