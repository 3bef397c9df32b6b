"""The allocator's fast paths give exactly what the plain code gives: constructors, fingerprint text, rank keys, GC."""

from __future__ import annotations

import dataclasses
import functools
import gc
import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from bot.core.allocator import (
    AllocationRequest,
    Candidate,
    InputError,
    LiveLease,
    RankedCandidate,
    RankingPolicy,
    Skipped,
    decide,
    forget_instants,
)
from bot.core.allocator import candidates as candidates_module
from bot.core.allocator.candidates import LabelSets, Row, _row_of, normalize_candidates
from bot.core.allocator.fingerprint import candidate_rows_digest, relevant_label_texts, utc_micros
from bot.core.allocator.records import new_candidate, new_skipped
from bot.core.allocator.screen import rank as _rank
from bot.core.digest import fingerprint_digest
from bot.core.vocabulary import MAX_ISSUE_NUMBER
from tests.work_count import counted, lines_executed

NOW = datetime(2026, 7, 21, 12, 0, tzinfo=UTC)


def _fields(value: object) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}  # type: ignore[arg-type]


def test_slot_constructors_equal_the_generated_init_field_for_field() -> None:
    """A field added to one of these classes and not to its fast constructor fails here (unset slot)."""
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    args = (617, "title", ("a", "b"), when, (3, 5), False, ("rev",), "dup")
    fast = new_candidate(*args)
    names = [f.name for f in dataclasses.fields(Candidate)]
    assert len(names) == len(args)
    plain = Candidate(**dict(zip(names, args, strict=True)))  # type: ignore[arg-type]
    assert fast == plain and hash(fast) == hash(plain) and _fields(fast) == _fields(plain)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.title = "changed"  # type: ignore[misc]

    assert len(dataclasses.fields(Skipped)) == 3
    assert new_skipped(617, "not_ready", "x") == Skipped(617, "not_ready", "x")


def _random_candidates(rng: random.Random, count: int) -> list[Candidate]:
    labels = ["priority:p0", "priority:p3", "kind:bug", "área:ünïcode", "protected", "emoji-\U0001f600", 'quo"te\\']
    out = []
    for number in rng.sample(range(1, 10**6), count):
        when = None
        if rng.random() < 0.8:
            when = datetime(rng.randint(1, 9999), rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                            rng.randint(0, 59), rng.randint(0, 59), rng.choice([0, rng.randint(0, 999_999)]),
                            tzinfo=timezone(timedelta(minutes=rng.choice([0, 330, -300, 540]))))
        out.append(Candidate(
            issue_number=number,
            labels=tuple(sorted(set(rng.sample(labels, rng.randint(0, 3))))),
            created_at=when,
            depends_on=tuple(sorted(rng.sample(range(1, 50), rng.randint(0, 2)))),
            ready=rng.random() < 0.9,
            barred_owners=("me",) if rng.random() < 0.1 else (),
        ))
    return sorted(out, key=lambda c: c.issue_number)


def _rows(candidates: list[Candidate]) -> tuple[list[Row], LabelSets]:
    label_sets = LabelSets()
    return [_row_of(c, label_sets) for c in candidates], label_sets


@pytest.mark.parametrize("seed", range(5))
def test_candidate_rows_text_is_the_canonical_dump_of_the_same_rows(seed: int) -> None:
    """The fingerprint's candidate part, written row by row, is byte for byte the canonical digest of the rows."""
    rng = random.Random(seed)
    candidates = _random_candidates(rng, 300)
    relevant = frozenset({"priority:p0", "priority:p3", "protected", "área:ünïcode", 'quo"te\\'})
    for owner in ("me", "someone"):
        rows = [
            [c.issue_number, [label for label in c.labels if label in relevant], utc_micros(c.created_at),
             list(c.depends_on), c.ready, *([True] if owner in c.barred_owners else [])]
            for c in candidates
        ]
        candidate_rows, label_sets = _rows(candidates)
        texts = relevant_label_texts(label_sets.sets, relevant)
        assert candidate_rows_digest(owner, candidate_rows, texts) == fingerprint_digest(rows)


@pytest.mark.parametrize("seed", range(5))
def test_integer_rank_keys_order_as_the_plain_tuple_key(seed: int) -> None:
    """Priority, undated last, created_at as an instant (any offset, years 1 to 9999), then issue number."""
    rng = random.Random(seed)
    candidates = _random_candidates(rng, 400)
    candidates.append(Candidate(issue_number=MAX_ISSUE_NUMBER, created_at=datetime.min.replace(tzinfo=UTC)))
    candidates.append(Candidate(issue_number=MAX_ISSUE_NUMBER - 1, created_at=datetime.max.replace(tzinfo=UTC)))
    candidates.append(Candidate(issue_number=1, created_at=datetime.max.replace(tzinfo=UTC)))
    policy = RankingPolicy()
    prio = {label: i for i, label in enumerate(policy.priority_labels)}

    def plain_key(c: Candidate) -> tuple[Any, ...]:
        p = min([prio[label] for label in c.labels if label in prio], default=len(prio))
        when = c.created_at.astimezone(UTC) if c.created_at else datetime.min.replace(tzinfo=UTC)
        return (p, c.created_at is None, when, c.issue_number)

    owned = {candidates[3].issue_number: LiveLease(issue_number=candidates[3].issue_number, owner="me", role="r",
                                                   lease_id="L", expires_at=NOW)}
    candidate_rows, label_sets = _rows(sorted(candidates, key=lambda c: c.issue_number))  # as decide passes them
    set_priority = [min([prio[label] for label in labels if label in prio], default=len(prio))
                    for labels in label_sets.sets]
    ordered, ranked = _rank(candidate_rows, set_priority, owned, policy)
    expected = sorted(candidates, key=plain_key)
    assert [row[0] for row in ordered] == [c.issue_number for c in expected]
    assert all(isinstance(r, RankedCandidate) for r in ranked)
    assert [r.issue_number for r in ranked] == [c.issue_number for c in expected]
    assert [r.rank for r in ranked] == list(range(1, len(expected) + 1))
    for r, c in zip(ranked, expected, strict=True):
        p = plain_key(c)[0]
        assert r.priority_label == (policy.priority_labels[p] if p < len(prio) else None)
        assert r.created_at == c.created_at
        assert r.owned_lease_id == ("L" if c.issue_number in owned else None)


def test_label_sets_are_shared_among_the_candidates_of_one_call() -> None:
    records = [{"issue_number": n, "labels": ["b", "a"] if n % 2 else ["x"]} for n in range(1, 41)]
    candidates = normalize_candidates(records)
    assert len({id(c.labels) for c in candidates}) == 2
    assert {c.labels for c in candidates} == {("a", "b"), ("x",)}


@pytest.mark.parametrize("enabled", [True, False])
def test_decide_pauses_the_collector_leaves_no_cycles_and_restores_its_state(enabled: bool) -> None:
    """Pausing the collector is only sound because a decision builds no reference cycle: checked here."""
    records: list[dict[str, Any]] = [
        {"issue_number": n, "labels": ["priority:p1"] if n % 3 else [], "created_at": "2026-01-01T00:00:00+02:00",
         "depends_on": [n + 1] if n % 7 == 0 else []}
        for n in range(1, 500)
    ]
    leases = [LiveLease(issue_number=5, owner="other", role="r", lease_id="L5", expires_at=NOW + timedelta(hours=1))]
    cases = [
        AllocationRequest(owner="me", candidates=records, exclude_issue_numbers=[2, 3]),
        AllocationRequest(owner="me", candidates=[{"issue_number": "bad"}, *records]),  # invalid: InputError caught
        AllocationRequest(owner="me", candidates="[not json"),
    ]
    was = gc.isenabled()
    try:
        gc.collect()
        if enabled:
            gc.enable()
        else:
            gc.disable()
        for request in cases:
            seen: list[str] = []

            def on_collection(phase: str, info: dict[str, int], seen: list[str] = seen) -> None:
                seen.append(phase)

            gc.callbacks.append(on_collection)  # any collection during the call
            try:
                decision = decide(request, RankingPolicy(), leases, NOW)
            finally:
                gc.callbacks.remove(on_collection)
            assert gc.isenabled() is enabled
            assert not seen
            gc.disable()
            del decision
            assert gc.collect() == 0, "decide left cyclic garbage"
            if enabled:
                gc.enable()
    finally:
        (gc.enable if was else gc.disable)()


def _records(n: int) -> list[dict[str, Any]]:
    rng = random.Random(n)
    labels = ["priority:p1", "kind:bug", "area:x"]
    return [
        {"issue_number": i, "title": f"t{i}", "labels": rng.sample(labels, rng.randint(0, 2)),
         "created_at": f"2026-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}T0{rng.randint(0, 9)}:00:00"
                       f"+0{rng.randint(0, 9)}:00",
         "depends_on": [i - 1] if i % 20 == 0 else []}
        for i in range(1, n + 1)
    ]


def test_decide_work_grows_linearly_with_the_candidates() -> None:
    """Counted, not timed: the Python lines and the function calls one decide executes for 10x the candidates are at
    most ~10x (the rank sort is a single C call), so no per-candidate step may scan the others."""
    work: dict[int, int] = {}
    lines: dict[int, int] = {}
    for n in (400, 4_000):
        request = AllocationRequest(owner="me", candidates=_records(n), exclude_issue_numbers=list(range(1, n, 10)),
                                    open_issue_numbers=frozenset(range(1, n + 1)))
        leases = [LiveLease(issue_number=i, owner="other", role="r", lease_id=f"L{i}", expires_at=NOW + timedelta(1))
                  for i in range(5, n, 10)]
        run = functools.partial(decide, request, RankingPolicy(), leases, NOW)
        decision, raised, work[n] = counted(run)
        assert raised is None and decision is not None and decision.kind == "select"
        _, lines[n] = lines_executed(run)
    assert work[4_000] <= 10.5 * work[400], work
    assert lines[4_000] <= 10.5 * lines[400], lines


def _dated(texts: list[str]) -> list[dict[str, Any]]:
    return [{"issue_number": i, "labels": ["priority:p1"], "created_at": text} for i, text in enumerate(texts, 1)]


def test_a_remembered_created_at_decides_exactly_as_a_first_reading() -> None:
    """Seed AC4: the created_at memo changes no decision and no fingerprint; a text it refused is refused again."""
    texts = ["2026-01-02T03:04:05Z", "2026-01-02T05:04:05+02:00", "2025-12-31T23:59:59.5-05:00",
             "0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59.999999Z", "2026-07-20t21:35:15z"]
    request = AllocationRequest(owner="me", candidates=_dated(texts))
    forget_instants()
    first = decide(request, RankingPolicy(), [], NOW).to_dict()
    again = decide(request, RankingPolicy(), [], NOW).to_dict()
    assert first == again and first["decision"] == "select"
    assert "2026-07-20t21:35:15z" not in candidates_module._INSTANTS  # lowercase: the full validator's, never kept
    assert [r["issue_number"] for r in first["ranked"]] == [4, 3, 1, 2, 6, 5]  # 1 and 2 are the same instant
    for bad in ("2026-02-30T00:00:00Z", "2026-01-01T00:00:00", "2026-01-01 00:00:00Z", "2026-01-01T00:00:00+24:00"):
        for _ in range(2):  # first reading, then again: never remembered as valid
            refused = decide(AllocationRequest(owner="me", candidates=_dated([bad])), RankingPolicy(), [], NOW)
            assert refused.kind == "invalid" and refused.skipped[0].reason == "invalid_candidate"
        assert bad not in candidates_module._INSTANTS


def test_the_created_at_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that sees ever new issues keeps at most _INSTANTS_MAX texts (it is emptied when full)."""
    monkeypatch.setattr(candidates_module, "_INSTANTS_MAX", 8)
    forget_instants()
    for start in range(0, 40, 5):
        texts = [f"2026-01-01T00:00:{second:02d}Z" for second in range(start, start + 5)]
        request = AllocationRequest(owner="me", candidates=_dated(texts))
        assert decide(request, RankingPolicy(), [], NOW).kind == "select"
        assert len(candidates_module._INSTANTS) <= 8
    forget_instants()


def test_a_label_set_seen_before_does_not_let_an_invalid_one_through() -> None:
    """AC3: the per-call label set index only answers for tuples equal to validated ones; the rest is validated."""
    records: list[dict[str, Any]] = [
        {"issue_number": 1, "labels": ["priority:p0", "kind:bug"]},
        {"issue_number": 2, "labels": ("kind:bug", "priority:p0")},
        {"issue_number": 3, "labels": [["priority:p0"], "kind:bug"]},
        {"issue_number": 4, "labels": ["priority:p0", ""]},
        {"issue_number": 5, "labels": ["priority:p0", 7]},
        {"issue_number": 6, "labels": ["priority:p0", "kind:bug", "priority:p0"]},
    ]
    with pytest.raises(InputError) as caught:
        normalize_candidates(records)
    assert [(p.index, p.field) for p in caught.value.problems] == [(2, "labels[0]"), (3, "labels[1]"), (4, "labels[1]")]
    good = normalize_candidates([records[0], records[1], records[5]])
    assert [c.labels for c in good] == [("kind:bug", "priority:p0")] * 3
