"""Fuzz campaign over every MCP tool: a fixed seed, a bounded time, every answer a success or a typed envelope."""

# Generated argument objects, weighted toward near-valid values and the hostile ones (integers past int64 and past
# 4,300 digits, NaN/Infinity, deep nesting, lone surrogates, very long strings), go through the code path the server
# uses: ``Verb.check_arguments`` (what ``VerbRuntime.call`` validates with) for the whole corpus, counted per input and
# compared with a stock Draft 2020-12 validator of the published schema; then a few hundred of them, and unlisted tool
# names, through full dispatch (the in-process MCP server over a real SQLite runtime). Asserted: no uncaught
# exception, every answer a success or a typed envelope, and bounded validation work, counted rather than timed:
# the function calls validation makes (sys.setprofile) stay within a base plus a few per JSON value received, and
# no integer is ever printed past 640 digits (the interpreter's limit is lowered while validating, so a str() of
# a hostile 5,000-digit integer raises instead of taking milliseconds).

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pydantic_core
import pytest
from mcp import Client

from bot.catalog import open_door
from bot.core.errors import ErrorKind
from bot.core.verb_params import Param
from bot.core.verbs import VERBS, Verb
from bot.core.vocabulary import MAX_ISSUE_NUMBER
from bot.mcp_server import build_server, resolve_identity
from bot.verbs.runtime import no_bootstrap
from state.db import Database
from tests.test_mcp_server import mcp_settings
from tests.test_verbs_table import CANARY, KIND_PROBES, LONE, VALID_STATE, base_arguments, nested, schema_verdict
from tests.work_count import counted, json_values

pytestmark = [pytest.mark.slow]

SEED = 20260712
CORPUS = 25_000
DISPATCHED = 1000
# Validation work: at most this many function calls, plus so many per JSON value in the arguments (the largest
# valid call, 2,000 candidates, makes about 11 per value; the hostile ones are refused at the screen in a few).
MAX_VALIDATION_CALLS = 6_000
MAX_CALLS_PER_VALUE = 16
TOOLS: list[Verb] = [verb for verb in VERBS.values() if verb.executable]
KINDS: frozenset[str] = frozenset(ErrorKind.__args__)  # type: ignore[attr-defined]


class Generator:
    """Argument objects for one tool: mostly the valid call with one to three arguments changed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def integer(self) -> object:
        r = self.rng
        return r.choice([
            0, 1, 2, -1, 617, MAX_ISSUE_NUMBER, MAX_ISSUE_NUMBER + 1, -MAX_ISSUE_NUMBER, 2**64, 2**64 + 1,
            r.randint(1, 10**6), r.randint(-(10**6), 0), r.randint(1, MAX_ISSUE_NUMBER),
            10 ** r.randint(19, 6000), -(10 ** r.randint(19, 6000)),
            float(r.randint(1, 999)), r.randint(1, 999) + 0.5, 1e300, -0.0, float("nan"), float("inf"),
            float("-inf"), True, False, str(r.randint(1, 999)),
        ])

    def text(self) -> str:
        r = self.rng
        base = r.choice(["done", "author-1", "k-1", "a" * 40, "0" * 64, "implement", "ready", "x"])
        piece = r.choice(["\n", "\r", " ", "@", "\t", LONE, "\udfff", "é", "\u2028", "\x00", "#", ":", "\ufeff"])
        at = r.randint(0, len(base))
        choice = r.random()
        if choice < 0.3:
            return base[:at] + piece + base[at:]
        if choice < 0.4:
            return base * r.randint(1, 30_000)
        if choice < 0.45:
            return "x" * r.choice([199, 200, 201, 599, 600, 601, 1_000_001, 2_000_001])
        if choice < 0.5:
            return ""
        return base

    def candidate(self) -> dict[str, Any]:
        r = self.rng
        record: dict[str, Any] = dict(r.choice(CANARY))
        record["issue_number"] = r.randint(1, 5000)
        if r.random() < 0.3:
            record[r.choice(["issue_number", "number", "title", "labels", "created_at", "depends_on", "ready",
                             "bogus"])] = self.value(0)
        return record

    def candidates(self) -> object:
        r = self.rng
        records = [self.candidate() for _ in range(r.randint(0, 6))]
        roll = r.random()
        if roll < 0.4:
            return records
        try:
            text = json.dumps(records)
        except (ValueError, RecursionError):  # a 6,000-digit integer or a 5,000-deep value has no JSON text here
            return records
        if roll < 0.7:
            return text
        if roll < 0.85:  # corrupt the text
            at = r.randint(0, len(text))
            return text[:at] + r.choice(["", "]", "{", "NaN", "Infinity", '"', LONE, ",", "1" * 5000]) + text[at:]
        return records[0] if records else {}

    def state(self) -> object:
        r = self.rng
        state: dict[str, Any] = dict(VALID_STATE)
        for _ in range(r.randint(0, 3)):
            key = r.choice([*VALID_STATE, "extra", "last_updated_by", "colour"])
            roll = r.random()
            if roll < 0.2:
                state.pop(key, None)
            elif roll < 0.4 and key == "related_prs":
                state[key] = [self.integer() for _ in range(r.randint(0, 4))]
            elif roll < 0.5:
                state["extra"] = {r.choice(["RISK", "risk", "STATE", "A" * 101, LONE]): self.text()}
            else:
                state[key] = self.text() if r.random() < 0.7 else self.value(0)
        return state

    def value(self, depth: int) -> object:
        """Any JSON-ish value, hostile ones included."""
        r = self.rng
        roll = r.random()
        if roll < 0.25:
            return self.integer()
        if roll < 0.5:
            return self.text()
        if roll < 0.6:
            return r.choice([None, True, False, {}, []])
        if roll < 0.7:
            return nested(r.choice([1, 2, 5, 17, 100, 1000, 5000]), r.choice(["list", "object"]))
        if roll < 0.85 and depth < 3:
            return [self.value(depth + 1) for _ in range(r.randint(0, 4))]
        if depth < 3:
            return {self.text()[:20]: self.value(depth + 1) for _ in range(r.randint(0, 3))}
        return self.integer()

    def near_valid(self, param: Param) -> object:
        r = self.rng
        if r.random() < 0.35:
            return r.choice(KIND_PROBES[param.kind])[1]
        kind = param.kind
        if kind == "issue_number":
            return self.integer()
        if kind == "issue_numbers":
            return [self.integer() for _ in range(r.randint(0, 5))] if r.random() < 0.8 else json.dumps([1, 2])
        if kind == "candidates":
            return self.candidates()
        if kind == "state":
            return self.state()
        if kind == "boolean":
            return r.choice([True, False, 0, 1, "true", None])
        if kind == "choice":
            return r.choice([*param.choices, "", "IMPLEMENT", param.choices[0] + "\n"])
        return self.text()

    def arguments(self, verb: Verb) -> dict[str, Any]:
        r = self.rng
        arguments: dict[str, Any] = base_arguments(verb) if r.random() < 0.8 else {}
        if verb.params:
            for param in r.sample(verb.params, r.randint(1, min(3, len(verb.params)))):
                arguments[param.name] = self.near_valid(param) if r.random() < 0.7 else self.value(0)
        roll = r.random()
        if roll < 0.05:
            arguments[r.choice(["caller", "owner", "role", "ttl", LONE, "x" * 1000])] = self.value(0)
        elif roll < 0.1 and arguments:
            arguments.pop(r.choice(list(arguments)))
        return arguments


def _depth(value: object, limit: int = 200) -> int:
    depth, frontier = 0, [value]
    while frontier and depth <= limit:
        frontier = [c for v in frontier for c in (v if isinstance(v, list) else v.values() if isinstance(v, dict)
                                                  else ())]
        depth += 1
    return depth


def _counted(verb: Verb, arguments: dict[str, Any]) -> tuple[list[dict[str, str]], int]:
    """The problems ``check_arguments`` finds (it must not raise, whatever the value) and the function calls it made."""
    result, raised, calls = counted(lambda: verb.check_arguments(arguments))
    if raised is not None:
        raise raised
    assert result is not None
    return result[1], calls


def _client_can_send(arguments: dict[str, Any]) -> bool:
    try:
        pydantic_core.to_jsonable_python(arguments)
    except (UnicodeEncodeError, ValueError):
        return False
    return True


def _typed(doc: dict[str, Any], is_error: bool) -> bool:
    if not is_error:
        return "verb" in doc and "error" not in doc
    return (
        doc.get("error") in KINDS
        and all(isinstance(doc.get(k), str) and doc[k] for k in ("message", "remediate", "exact_next_action"))
    )


def test_fuzz_every_tool_through_validation_and_dispatch(tmp_path: Path) -> None:
    started = time.perf_counter()
    generator = Generator(SEED)
    corpus: list[tuple[Verb, dict[str, Any]]] = []
    verdicts: Counter[str] = Counter()
    most_calls = 0
    compared = 0
    for index in range(CORPUS):
        verb = TOOLS[index % len(TOOLS)]
        arguments = generator.arguments(verb)
        corpus.append((verb, arguments))
        problems, calls = _counted(verb, arguments)
        most_calls = max(most_calls, calls)
        bound = MAX_VALIDATION_CALLS + MAX_CALLS_PER_VALUE * json_values(arguments)
        assert calls <= bound, (verb.tool, calls, bound, str(arguments)[:200])
        assert all(set(p) == {"argument", "problem"} and isinstance(p["problem"], str) for p in problems)
        verdicts["accepted" if not problems else "refused"] += 1
        if _depth(arguments) < 100:  # the stock validator recurses; deeper values are screened, never validated
            assert schema_verdict(verb.input_schema(), arguments) == (not problems), (verb.tool, str(arguments)[:300])
            compared += 1
    validated_at = time.perf_counter()

    dispatched: Counter[str] = Counter()

    async def dispatch() -> None:
        settings = mcp_settings(tmp_path)
        db = await Database.open(settings.database.path, synchronous="NORMAL")
        runtime = open_door(db=db, settings=settings, bot_login="foreman-bot", bootstrap_factory=no_bootstrap)
        try:
            for token in ("tok-controller", "tok-author-1"):
                async with Client(build_server(runtime, resolve_identity(settings, token))) as client:
                    # What the SDK client itself cannot serialize (nesting past its limit, a lone surrogate in a
                    # key) stays validation-only.
                    shallow = [(v, a) for v, a in corpus if _depth(a) < 200 and _client_can_send(a)]
                    picks = random.Random(SEED + len(token)).sample(shallow, DISPATCHED // 2)
                    names = [(v.tool, a) for v, a in picks] + [
                        (name, {"issue_number": 1})
                        for name in ("release_lease", "gitea_merge", "gitea_open_pr", "GITEA_LOCK_ISSUE", "gitea_")
                    ]
                    for name, arguments in names:
                        result = await client.call_tool(name, arguments)
                        doc = result.structured_content
                        assert doc is not None and _typed(doc, bool(result.is_error)), (name, doc)
                        assert doc.get("error") != "unavailable", (name, str(arguments)[:300], doc)
                        dispatched[doc.get("error", "ok")] += 1
        finally:
            await db.close()

    import anyio

    anyio.run(dispatch)
    total = time.perf_counter() - started
    print(
        f"\nfuzz: {CORPUS} argument objects over {len(TOOLS)} tools in {validated_at - started:.1f}s "
        f"({dict(verdicts)}; {compared} compared with the published schema), most calls in one validation "
        f"{most_calls}; {sum(dispatched.values())} dispatched through the MCP server ({dict(dispatched)}); "
        f"total {total:.1f}s"
    )
    assert verdicts["accepted"] > CORPUS // 10 and verdicts["refused"] > CORPUS // 10
