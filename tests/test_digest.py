"""The one canonical JSON and its digests (grants, run evidence and the allocator's fingerprint use it)."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime, timedelta

import pytest

from bot.core.allocator import (
    AllocationDecision,
    AllocationRequest,
    LiveLease,
    RankingPolicy,
    ResumeDecision,
    check_apply,
    decide,
)
from bot.core.digest import CanonicalError, canonical_json, digest, fingerprint_digest, freeze
from bot.core.grants import Grant


def test_canonical_json_is_key_order_and_whitespace_independent_and_typed() -> None:
    """Digests are SHA-256 over canonical JSON; true is never 1 and 1 is never 1.0."""
    assert canonical_json({"b": [1, {"d": 2, "c": "é"}], "a": None}) == '{"a":null,"b":[1,{"c":"é","d":2}]}'
    assert digest({"x": 1, "y": 2}) == digest({"y": 2, "x": 1})
    assert canonical_json({"v": True}) != canonical_json({"v": 1})
    assert canonical_json({"v": 1}) != canonical_json({"v": 1.0})
    for bad in ({1: "x"}, {"n": float("nan")}, {"s": {1, 2}}, object()):
        with pytest.raises(CanonicalError):
            canonical_json(bad)


def test_freeze_gives_a_deep_read_only_copy() -> None:
    source = {"a": [1, {"b": 2}]}
    frozen = freeze(source)
    source["a"].append(3)
    assert frozen["a"] == (1, {"b": 2})
    with pytest.raises(TypeError):
        frozen["a"][1]["b"] = 3


# Computed by the allocator before its fingerprint went through bot.core.digest: non-ASCII labels and lease ids
# and a same-owner live lease (a resume).
_OLD_FINGERPRINT = "478ead9a84a8c43577de3c66cbca634fd3c346ea66133504aeb0318c0f0123de"
_OLD_CANDIDATES_PART = "34452d124296e64ecbc85ed3d6f2d83d1ff1575876ec3abfc605af30f8febe85"
_NOW = datetime(2026, 7, 21, 12, 0, tzinfo=UTC)


def _pre_upgrade_situation() -> AllocationDecision:
    policy = RankingPolicy(priority_labels=("priorität:hoch", "priority:p1"))
    candidates = [
        {"issue_number": 617, "title": "tërminal", "labels": ["priorität:hoch"], "created_at": "2026-07-01T00:00:00Z"},
        {"issue_number": 776, "labels": ["priority:p1"]},
    ]
    held = LiveLease(
        issue_number=776, owner="author-1", role="author", lease_id="lease-ü", expires_at=_NOW + timedelta(minutes=30)
    )
    request = AllocationRequest(
        owner="author-1", candidates=candidates, exclude_issue_numbers=[1], open_issue_numbers=frozenset()
    )
    return decide(request, policy, [held], _NOW)


def test_the_allocator_fingerprint_is_byte_identical_to_the_one_before_the_shared_module() -> None:
    """Seed AC4: a fingerprint a dry run handed out (or a lease recorded) before the upgrade is still recognised:
    the same owner's live lease is resumed and the old pin passes ``check_apply``."""
    decision = _pre_upgrade_situation()
    assert isinstance(decision, ResumeDecision)
    assert decision.lease.lease_id == "lease-ü"
    assert decision.fingerprint == _OLD_FINGERPRINT
    assert decision.fingerprint_parts["candidates"] == _OLD_CANDIDATES_PART
    assert check_apply(_OLD_FINGERPRINT, decision) is None


def test_the_fingerprint_form_and_the_grant_form_are_one_canonical_json() -> None:
    """The two digests differ only in how they spell the same canonical text (escaped or raw UTF-8, prefix)."""
    value = {"b": ("é", 1), "a": None}
    escaped = json.dumps(json.loads(canonical_json(value)), sort_keys=True, separators=(",", ":"))
    assert fingerprint_digest(value) == hashlib.sha256(escaped.encode("ascii")).hexdigest()
    assert digest(value) == "sha256:" + hashlib.sha256(canonical_json(value).encode("utf-8")).hexdigest()
    assert canonical_json(value) == '{"a":null,"b":["é",1]}'
    with pytest.raises(CanonicalError):
        fingerprint_digest({"n": float("inf")})


# A grant as sealed (and stored) before the canonical JSON moved to bot.core.digest, with non-ASCII text in it.
_STORED_GRANT = (
    '{"action":"implement","calls":[{"arguments":{"issue_number":8},"effect":"mutate","position":0,'
    '"tool":"gitea_lock_issue"},{"arguments":{"issue_number":8,"reason":"fertig für author-1"},"effect":"teardown",'
    '"position":1,"tool":"gitea_release_lease"}],'
    '"contract_digest":"sha256:1664b9a7dd733e83cb6ea39a8e420377648e56598587e1d83e1da32f280905c3",'
    '"expires_at":"2026-07-01T12:10:00.000000Z",'
    '"grant_digest":"sha256:8ee3d18d7471f6529e4f01f93275bae4890307f9304340a9311ca66f878832d8",'
    '"host_id":"host-a/1111","issue_number":8,"issued_at":"2026-07-01T12:00:00.000000Z","lease_id":"lease-1",'
    '"owner":"author-1","policy":{"digest":"sha256:b703c6e4e0818980b3b39a1ddd1efc6feef984a84722d176d95f42c59084bfa0",'
    '"key":"author.implement"},"protocol":"foreman-grants/1","repo":"org/repo","role":"author",'
    '"run_id":"run-00000000000000000000000000000000",'
    '"worktree":{"branch":"issue-8-ü","path":"/co/branches/issue-8-ü","uuid":"wt-uuid"}}'
)


def test_a_grant_sealed_before_the_shared_module_still_verifies_and_round_trips() -> None:
    """A sealed grant already in a database loads (its digest checks) and is stored again byte for byte."""
    grant = Grant.from_json(_STORED_GRANT)
    assert grant.digest == "sha256:8ee3d18d7471f6529e4f01f93275bae4890307f9304340a9311ca66f878832d8"
    assert digest(grant.body()) == grant.digest
    assert grant.canonical() == _STORED_GRANT


def test_values_without_a_canonical_utf8_text_are_refused_as_canonical_errors() -> None:
    """A lone surrogate and an integer too long to print have no canonical text: CanonicalError (which callers
    handle), never a UnicodeEncodeError or ValueError from deep inside json (the broker's snapshot of a call)."""
    for bad in ({"s": "\ud800"}, {"\udfff": 1}, {"n": 10**5000}, [-(10**5000)]):
        with pytest.raises(CanonicalError):
            canonical_json(bad)
        with pytest.raises(CanonicalError):
            digest(bad)
    with pytest.raises(CanonicalError):
        fingerprint_digest({"n": 10**5000})
    assert fingerprint_digest({"s": "\ud800"}) == hashlib.sha256(b'{"s":"\\ud800"}').hexdigest()  # as before
