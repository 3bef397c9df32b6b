"""`foreman allocate --candidates-json` does each piece of work once, and exactly as before: the candidates are
validated once (the decision reads the rows of the normalized tuple back), the output is json.dumps' text whoever
writes it, and the command runs without cyclic collections (issue 35, bench/allocate_cli.py)."""

from __future__ import annotations

import dataclasses
import enum
import gc
import json
import random
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot.cli import allocate as allocate_module
from bot.cli import main
from bot.cli.indented_json import MAX_DEPTH, dumps_indented, holds_only_plain_values
from bot.core.allocator import (
    AllocationRequest,
    Candidate,
    InputError,
    RankingPolicy,
    decide,
    normalize_candidates,
    normalized_candidates,
)
from bot.core.allocator import candidates as candidates_module
from bot.core.allocator import validate as validate_module
from bot.core.allocator.candidates import LabelSets, normalize_rows
from bot.core.allocator.records import RankedCandidate, ranked_dicts
from tests.test_cli_lists import _config
from tests.test_fuzz_candidates import Gen

NOW = datetime(2026, 7, 21, 12, 0, tzinfo=UTC)


def _records(count: int, seed: int = 35) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    labels = ["priority:p0", "priority:p1", "kind:bug", "area:api", "status:ready"]
    return [
        {"issue_number": number, "title": f"Issue {number}", "labels": rng.sample(labels, rng.randint(0, 3)),
         "created_at": f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T10:00:00{rng.choice(['Z', '+05:30'])}",
         "depends_on": [rng.randint(1, count + 50)] if rng.random() < 0.1 and number > 1 else []}
        for number in rng.sample(range(1, count * 3), count)
    ]


@pytest.fixture
def full_validations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The issue numbers the full, problem-collecting validator was run on."""
    seen: list[int] = []
    real = validate_module.candidate_from_record

    def counting(record: Any, index: int, input_name: str) -> Any:
        seen.append(index)
        return real(record, index, input_name)

    monkeypatch.setattr("bot.core.allocator.candidates.candidate_from_record", counting)
    yield seen


def test_normalized_candidates_are_decided_on_without_validating_them_again(full_validations: list[int]) -> None:
    """The CLI normalizes its file, the decision normalizes its request again: the second time read every candidate
    through the full validator (about as long as the rest of the command over 10k candidates)."""
    text = json.dumps(_records(300))
    normalized = normalized_candidates(text)
    assert isinstance(normalized, tuple) and list(normalized) == normalize_candidates(text)
    assert full_validations == []
    on_normalized = decide(AllocationRequest(owner="me", candidates=normalized), RankingPolicy(), [], NOW)
    assert full_validations == []  # the rows were read back, not made again
    on_text = decide(AllocationRequest(owner="me", candidates=text), RankingPolicy(), [], NOW)
    on_plain_tuple = decide(AllocationRequest(owner="me", candidates=tuple(normalized)), RankingPolicy(), [], NOW)
    assert len(full_validations) == 300  # a plain tuple of Candidate objects is validated as before
    assert on_normalized.to_dict() == on_text.to_dict() == on_plain_tuple.to_dict()
    assert on_normalized.fingerprint is not None


def test_a_plain_tuple_of_candidates_is_still_validated_in_full() -> None:
    """Only the normalizer's own tuple is trusted: Candidate objects built by a caller are checked as records."""
    bad = (Candidate(issue_number=0), Candidate(issue_number=5, labels=("",)))
    with pytest.raises(InputError):
        normalize_rows(bad)
    assert decide(AllocationRequest(owner="me", candidates=bad), RankingPolicy(), [], NOW).kind == "invalid"


def test_the_rows_read_back_are_the_rows_normalizing_again_makes() -> None:
    normalized = normalized_candidates(_records(200, seed=7))
    rows, label_sets = normalize_rows(normalized)
    again, again_sets = normalize_rows(tuple(normalized))
    assert [r[:2] + r[3:] for r in rows] == [r[:2] + r[3:] for r in again]
    assert [label_sets.sets[r[2]] for r in rows] == [again_sets.sets[r[2]] for r in again]
    assert rows is not list(normalized.rows) and rows == list(normalized.rows)  # a fresh list: the caller's to keep


def test_label_sets_of_indexes_each_set_where_it_was() -> None:
    made = LabelSets()
    for labels in (("b", "a"), ("c",), ("a", "b", "a"), ()):
        made.canonical(labels)
    rebuilt = LabelSets.of(made.sets)
    assert rebuilt.sets == made.sets
    assert all(rebuilt.canonical(labels) == k for k, labels in enumerate(made.sets))


def _outcome(raw: object) -> object:
    """What normalizing ``raw`` ends in: the candidates, or every problem of the refusal."""
    try:
        return normalize_candidates(raw)
    except InputError as exc:
        return exc.envelope.to_dict()


def test_a_text_decoded_by_orjson_normalizes_exactly_as_by_the_strict_decoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick decoding takes only texts whose every record takes the fast path; whatever it takes or leaves, the
    candidates and the refusals (their words included) are the strict path's, over the fuzz campaign's texts."""
    gen = Gen(3535)
    texts = [gen.text() for _ in range(1500)] + [json.dumps(_records(40, seed)) for seed in range(30)] + [
        '[{"issue_number": 1}, {"issue_number": 1}]', '[{"issue_number": 9223372036854775808}]',
        '[{"issue_number": 1, "title": "\\ud800"}]', '{"issue_number": 1, "labels": [["x"]]}', '"[]"', "[1]",
        '[{"issue_number": 2, "number": 2}]', '[{"issue_number": 1, "created_at": "2026-01-02T03:04:05z"}]',
    ]
    quick = [_outcome(text) for text in texts]
    taken = sum(candidates_module._quick_rows(text) is not None for text in texts)
    monkeypatch.setattr(candidates_module, "_quick_rows", lambda text: None)
    assert [_outcome(text) for text in texts] == quick
    assert taken >= 30  # the quick path did take the valid ones


@pytest.mark.parametrize(
    "text",
    [
        '[{"issue_number": 1, "issue_number": 2}]',
        '[{"issue_number": 1, "title": "a", "title": "a"}]',
        '{"issue_number": 1, "labels": ["x"], "labels": ["x"]}',
        '[{"issue_number": 1, "title": "x", "title": "\\u003a"}]',  # the dropped colon made up by an escaped one
        '[{"issue_number": 1, "title": "x", "title": "\\u003A"}]',
    ],
)
def test_a_repeated_key_is_refused_whichever_decoder_reads_it(text: str) -> None:
    """orjson keeps one of a repeated key's values silently: the text must go to the decoder that reports it."""
    with pytest.raises(InputError, match="more than once"):
        normalize_candidates(text)


def test_ranked_dicts_are_each_ranked_candidates_to_dict() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    ranked = [RankedCandidate(1, 617, "priority:p0", when), RankedCandidate(2, 5, None, None, "lease-1")]
    assert ranked_dicts(ranked) == [r.to_dict() for r in ranked]
    assert list(ranked_dicts(ranked)[0]) == list(ranked[0].to_dict())  # the keys in the same order


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int


PLAIN_DOCS: list[Any] = [
    {}, [], None, True, 0, "x", {"b": [1, {"c": None}], "a": {"d": [], "e": {}}}, [[[]]], (1, 2), {"t": (1, "a")},
    {"ctl": "".join(chr(c) for c in range(32)) + '"\\/'}, {"k" + chr(c): c for c in range(32, 127)},
    2**63 - 1, -(2**63), 2**64 - 1, [{"rank": i, "issue_number": i * 7, "x": None, "y": "s"} for i in range(50)],
]
#: json's text differs from orjson's for each of these: json must write them.
JSON_ONLY_DOCS: list[Any] = [
    {"f": 1.0}, {"f": 1e16}, {"f": 1e-7}, {"f": float("nan")}, {"f": float("inf")}, [0.1, 2.5e-300],
    {"del": "\x7f"}, {"\x7f": 1}, {"u": "é"}, {"é": 1}, {"e": "\U0001f600"}, {"s": "\ud800"},
    {1: "int key"}, {None: 1}, {"big": 2**64}, {"neg": -(2**63) - 1},
    {"enum": Colour.RED}, {"uuid": uuid.UUID(int=5)}, {"when": datetime(2026, 1, 2, tzinfo=UTC)},
    {"dc": Point(1)}, {"set": {1}}, {"bytes": b"x"}, Colour.RED, 1.5,
]


@pytest.mark.parametrize("doc", PLAIN_DOCS + JSON_ONLY_DOCS, ids=repr)
def test_the_output_is_json_dumps_text_whoever_writes_it(doc: Any) -> None:
    assert dumps_indented(doc) == json.dumps(doc, indent=2, sort_keys=True, default=str)


@pytest.mark.parametrize("doc", JSON_ONLY_DOCS[:6] + JSON_ONLY_DOCS[16:], ids=repr)
def test_floats_and_objects_are_never_taken_as_plain(doc: Any) -> None:
    assert not holds_only_plain_values(doc) and not holds_only_plain_values([{"a": [doc]}])


def test_random_documents_are_written_as_json_writes_them() -> None:
    rng = random.Random(3535)
    alphabet = ["a", "Z", "0", ":", " ", '"', "\\", "\n", "\x01", "\x7f", "é", "\u2028", "\U0001f600"]

    def value(depth: int) -> Any:
        kind = rng.randrange(9 if depth < 6 else 6)
        if kind == 0:
            return None
        if kind == 1:
            return rng.random() < 0.5
        if kind == 2:
            return rng.choice([0, -1, 7, 2**63 - 1, 2**64 - 1, 2**64, -(2**63)])
        if kind == 3:
            letters = alphabet[:9] if rng.random() < 0.8 else alphabet
            return "".join(rng.choice(letters) for _ in range(rng.randrange(6)))
        if kind == 4:
            return rng.choice([0.5, 1e16, -0.0, 3.0])
        if kind == 5:
            return rng.choice(["plain", "text"])
        if kind in (6, 7):
            return {"".join(rng.choice(alphabet[:5]) for _ in range(rng.randrange(1, 4))): value(depth + 1)
                    for _ in range(rng.randrange(4))}
        return [value(depth + 1) for _ in range(rng.randrange(4))]

    fast = 0
    for _ in range(3000):
        doc = value(0)
        assert dumps_indented(doc) == json.dumps(doc, indent=2, sort_keys=True, default=str), doc
        fast += holds_only_plain_values(doc)
    assert fast > 500  # orjson wrote a good share of them


def test_cycles_and_deep_nesting_are_left_to_json() -> None:
    looped: list[Any] = []
    looped += [looped, looped]
    assert not holds_only_plain_values(looped)
    with pytest.raises(ValueError, match="Circular"):
        dumps_indented(looped)
    deep: list[Any] = []
    node = deep
    for _ in range(MAX_DEPTH + 5):
        node.append([])
        node = node[0]
    assert not holds_only_plain_values(deep)
    assert dumps_indented(deep) == json.dumps(deep, indent=2, sort_keys=True)


@pytest.mark.parametrize("enabled", [True, False])
def test_allocate_runs_without_cyclic_collections_and_restores_the_collector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], enabled: bool
) -> None:
    """With the collector running, 10k candidates set off collections that walk every object the process imported
    (about a third of what they added to the command)."""
    path = tmp_path / "candidates.json"
    path.write_text(json.dumps(_records(3000)), encoding="utf-8")
    config = str(_config(tmp_path))
    assert main(["--config", config, "allocate", "--candidates-json", "[]", "--json"]) == 0  # the database made
    capsys.readouterr()
    collections: list[int] = []
    command = allocate_module._allocate.__code__

    def count(phase: str, info: dict[str, int]) -> None:
        """A collection while the command runs (the configuration is read before it, by main)."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_code is not command:
            frame = frame.f_back  # type: ignore[assignment]
        if phase == "start" and frame is not None:
            collections.append(info["generation"])

    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    gc.callbacks.append(count)
    try:
        code = main(["--config", config, "allocate", "--candidates-json", f"@{path}", "--json"])
        assert gc.isenabled() is enabled
    finally:
        gc.callbacks.remove(count)
        (gc.enable if was else gc.disable)()
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["decision"] == "select" and doc["considered"] == 3000
    assert collections == []
