"""The allocator with real SQLite leases and outbox, the CLI, racing processes, and Gitea candidates (seed 000)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.catalog import open_door
from bot.config import Settings
from bot.config_writer import write_config
from bot.core.canonical import parse_comment
from bot.verbs.allocate import AllocationCall, Allocator
from bot.verbs.candidates import depends_on
from bot.verbs.runtime import caller_for, no_bootstrap
from state.db import Database
from state.leases import LeaseStore
from state.outbox import OutboxStore
from tests.conftest import REPO_ROOT, sqlite_path
from tests.serve_support import run_foreman
from tests.support import make_settings, offline_config

NOW = datetime(2026, 7, 21, 12, 0, tzinfo=UTC)
ROSTER = {"controller-bot": ["controller"], "author-1": ["author"], "author-2": ["author"]}
# The canary of seed 000: #617 is ranked first (p0) and must never be leased when excluded.
CANARY = [
    {"issue_number": 617, "title": "protected", "labels": ["priority:p0"], "created_at": "2026-07-01T10:00:00-05:00"},
    {"issue_number": 618, "title": "next", "labels": ["priority:p1"], "created_at": "2026-07-02T10:00:00-05:00"},
    {"issue_number": 619, "title": "later", "labels": [], "created_at": "2026-06-01T10:00:00-05:00"},
]


def settings_for(tmp_path: Path, **allocator: Any) -> Settings:
    return make_settings(
        tmp_path,
        roster=ROSTER,
        allocator={"lease_ttl_s": 3600, "lease_grace_s": 60, **allocator},
        repository={"owner": "acme", "name": "widgets"},
    )


@pytest.fixture
async def allocator(tmp_path: Path) -> AsyncIterator[Allocator]:
    settings = settings_for(tmp_path)
    db = await Database.open(settings.database.path, synchronous="NORMAL")
    yield Allocator(db, settings, None, bot_login="foreman-bot")
    await db.close()


def call(**kwargs: Any) -> AllocationCall:
    base: dict[str, Any] = {"actor": "controller-bot", "owner": "author-1", "candidates_json": CANARY}
    return AllocationCall(**{**base, **kwargs})


async def leases_of(allocator: Allocator) -> list[tuple[int, str, str]]:
    rows = await allocator.leases.open_leases(allocator.repo)
    return [(lease.issue_number, lease.owner, lease.status) for lease in rows]


async def test_ac1_ac2_an_excluded_top_ranked_issue_is_never_leased(allocator: Allocator) -> None:
    """AC1/AC2: #617 ranks first; with exclude_issue_numbers=[617] neither dry-run nor apply touches it."""
    dry = await allocator.run(call(exclude_issue_numbers=[617]), now=NOW)
    assert dry.decision is not None and dry.to_dict()["issue_number"] == 618
    applied = await allocator.run(call(exclude_issue_numbers=[617], dry_run=False), now=NOW)
    assert applied.applied and applied.lease is not None and applied.lease.issue_number == 618
    assert await leases_of(allocator) == [(618, "author-1", "live")]
    skipped = {s["issue_number"]: s["reason"] for s in applied.to_dict()["skipped"]}
    assert skipped[617] == "excluded_by_controller"


async def test_ac9_without_exclusions_the_top_issue_is_leased_as_before(allocator: Allocator) -> None:
    """AC9: a call that omits exclude_issue_numbers keeps today's behaviour (the top issue)."""
    outcome = await allocator.run(call(dry_run=False), now=NOW)
    assert outcome.lease is not None and outcome.lease.issue_number == 617


async def test_ac3_json_string_and_decoded_list_are_the_same_request(allocator: Allocator) -> None:
    """AC3: candidates_json as a decoded list and as a JSON string normalize alike (same fingerprint)."""
    as_list = await allocator.run(call(exclude_issue_numbers=[617]), now=NOW)
    as_text = await allocator.run(call(candidates_json=json.dumps(CANARY), exclude_issue_numbers=[617]), now=NOW)
    assert as_list.to_dict()["fingerprint"] == as_text.to_dict()["fingerprint"]


@pytest.mark.parametrize(
    "bad",
    ['[{"issue_number": 617', "617", [{"issue_number": True}], [{"issue_number": 3.0}], [{"title": "x"}]],
)
async def test_ac3_invalid_candidates_are_refused_and_nothing_is_leased(allocator: Allocator, bad: object) -> None:
    """AC3: malformed JSON, scalars, booleans, floats and records without a number fail closed."""
    outcome = await allocator.run(call(candidates_json=bad, dry_run=False), now=NOW)
    doc = outcome.to_dict()
    assert outcome.exit_code == 1 and doc["error"] == "invalid_input"
    assert await leases_of(allocator) == []
    assert await OutboxStore(allocator.db).list() == []


async def test_ac4_apply_with_the_dry_runs_fingerprint_leases_the_same_issue(allocator: Allocator) -> None:
    """AC4: dry-run and apply share one path; the pinned apply leases what the dry-run showed."""
    dry = (await allocator.run(call(exclude_issue_numbers=[617]), now=NOW)).to_dict()
    applied = await allocator.run(
        call(exclude_issue_numbers=[617], dry_run=False, expected_fingerprint=dry["fingerprint"]), now=NOW
    )
    assert applied.applied and applied.to_dict()["issue_number"] == dry["issue_number"] == 618


async def test_ac4_ac5_drift_between_dry_run_and_apply_is_a_stale_pin_not_another_lease(
    allocator: Allocator,
) -> None:
    """AC4/AC5: a foreign lease appears after the dry-run; the pinned apply refuses with stale_pin."""
    dry = (await allocator.run(call(exclude_issue_numbers=[617]), now=NOW)).to_dict()
    await allocator.run(call(owner="author-2", exclude_issue_numbers=[617], dry_run=False), now=NOW)
    late = await allocator.run(
        call(exclude_issue_numbers=[617], dry_run=False, expected_fingerprint=dry["fingerprint"]), now=NOW
    )
    doc = late.to_dict()
    assert late.exit_code == 1 and doc["error"] == "stale_pin" and not late.applied
    assert doc["details"]["fingerprint"] != dry["fingerprint"]
    assert await leases_of(allocator) == [(618, "author-2", "live")]


async def test_ac5_a_foreign_lease_is_skipped_never_overridden(allocator: Allocator) -> None:
    """AC5/AC6: the top issue leased by someone else is skipped as foreign_claim; the next one is leased."""
    await allocator.run(call(owner="author-2", dry_run=False), now=NOW)
    mine = await allocator.run(call(dry_run=False), now=NOW)
    assert mine.lease is not None and mine.lease.issue_number == 618
    skipped = {s["issue_number"]: s["reason"] for s in mine.to_dict()["skipped"]}
    assert skipped[617] == "foreign_claim"
    assert sorted(await leases_of(allocator)) == [(617, "author-2", "live"), (618, "author-1", "live")]


async def test_ac9_a_same_owner_live_lease_is_resumed_not_duplicated(allocator: Allocator) -> None:
    """AC9: an owner with a live lease gets it back (resume); no second lease, the resume is recorded."""
    first = await allocator.run(call(dry_run=False), now=NOW)
    again = await allocator.run(call(dry_run=False), now=NOW + timedelta(minutes=5))
    assert again.to_dict()["decision"] == "resume" and not again.applied
    assert first.lease is not None and again.lease is not None and again.lease.lease_id == first.lease.lease_id
    assert await leases_of(allocator) == [(617, "author-1", "live")]
    kinds = [e["kind"] for e in await allocator.leases.events(first.lease.lease_id)]
    assert kinds == ["acquired", "resumed"]


async def test_ac5_an_excluded_issue_with_my_live_lease_is_a_structured_blocker(allocator: Allocator) -> None:
    """AC5: excluding an issue the owner holds returns a resume/release blocker instead of stranding it."""
    await allocator.run(call(dry_run=False), now=NOW)  # author-1 holds #617
    blocked = await allocator.run(call(exclude_issue_numbers=[617], dry_run=False), now=NOW)
    doc = blocked.to_dict()
    assert blocked.exit_code == 1 and doc["decision"] == "blocked"
    assert doc["blockers"][0]["issue_number"] == 617 and "gitea_release_lease" in doc["exact_next_action"]
    assert await leases_of(allocator) == [(617, "author-1", "live")]


async def test_ac7_all_excluded_waits_and_creates_nothing(allocator: Allocator) -> None:
    """AC7: every eligible candidate excluded: the canonical WAIT, no lease, no outbox entry."""
    outcome = await allocator.run(call(exclude_issue_numbers=[617, 618, 619], dry_run=False), now=NOW)
    doc = outcome.to_dict()
    assert outcome.exit_code == 0 and doc["decision"] == "wait" and doc["issue_number"] is None
    assert {s["reason"] for s in doc["skipped"]} == {"excluded_by_controller"}
    assert await leases_of(allocator) == [] and await OutboxStore(allocator.db).list() == []


async def test_protected_issues_and_labels_from_config_are_removed_before_ranking(tmp_path: Path) -> None:
    """Configured protected issues and labels are exclusions too, with their own reasons."""
    settings = settings_for(tmp_path, protected_issues=[617], protected_labels=["security"])
    db = await Database.open(settings.database.path, synchronous="NORMAL")
    try:
        records = [*CANARY, {"issue_number": 600, "labels": ["priority:p0", "security"]}]
        outcome = await Allocator(db, settings, None, bot_login="bot").run(call(candidates_json=records), now=NOW)
        doc = outcome.to_dict()
        assert doc["issue_number"] == 618
        reasons = {s["issue_number"]: s["reason"] for s in doc["skipped"]}
        assert reasons == {617: "protected_issue", 600: "protected_label"}
    finally:
        await db.close()


async def test_apply_writes_lease_and_its_gitea_effects_in_one_transaction(allocator: Allocator) -> None:
    """The lease row, the status label, the assignee and the evidence comment are stored together."""
    outcome = await allocator.run(call(dry_run=False), now=NOW)
    assert outcome.lease is not None
    entries = sorted(await OutboxStore(allocator.db).list(), key=lambda e: e.id)
    assert [e.kind for e in entries] == ["labels", "assignees", "comment"]
    assert entries[0].payload == {"add": ["status:in-progress"], "remove": ["status:ready"]}
    assert entries[1].payload == {"assignees": ["author-1"]}
    state = parse_comment(entries[2].payload["body"]).current
    assert state is not None and (state.state, state.who_is_next) == ("in-progress", "author")
    assert outcome.lease.lease_id in entries[2].payload["body"]


async def test_ac9_the_lease_row_records_the_exclusions_the_decision_applied(allocator: Allocator) -> None:
    """Seed 000 AC9 (persisted controller ownership): the lease row stores the caller's
    exclusions as the decision applied them (normalized, sorted), never an empty list in their place."""
    outcome = await allocator.run(call(exclude_issue_numbers=[619, 617], dry_run=False), now=NOW)
    assert outcome.lease is not None and outcome.lease.issue_number == 618
    decided = outcome.to_dict()["exclusions"]["exclude_issue_numbers"]
    with sqlite3.connect(allocator.settings.database.path) as conn:
        [(request,)] = conn.execute("SELECT request_json FROM leases WHERE lease_id = ?",
                                    (outcome.lease.lease_id,)).fetchall()
    assert json.loads(request)["exclude"] == decided == [617, 619]


async def test_an_expired_foreign_lease_is_reclaimed_only_after_the_grace(allocator: Allocator) -> None:
    """An expired lease is skipped during its grace, then reclaimed, and the reclaim recorded."""
    only = [CANARY[0]]
    old = await allocator.run(call(owner="author-2", candidates_json=only, dry_run=False), now=NOW)
    assert old.lease is not None
    expired = NOW + timedelta(hours=1, seconds=10)  # ttl 3600 s, grace 60 s
    during = await allocator.run(call(candidates_json=only, dry_run=False), now=expired)
    assert during.to_dict()["decision"] == "wait"
    assert {s["reason"] for s in during.to_dict()["skipped"]} == {"lease_grace"}
    after = await allocator.run(call(candidates_json=only, dry_run=False), now=expired + timedelta(minutes=2))
    assert after.lease is not None and after.lease.owner == "author-1"
    history = await allocator.leases.history(allocator.repo, 617)
    assert [(h.owner, h.status) for h in history] == [("author-2", "expired"), ("author-1", "live")]
    kinds = [e["kind"] for e in await allocator.leases.events(old.lease.lease_id)]
    assert kinds == ["acquired", "expired", "reclaimed"]


async def test_the_database_itself_refuses_a_second_live_lease(allocator: Allocator) -> None:
    """One live lease per issue is a unique index, not only code."""
    await allocator.run(call(dry_run=False), now=NOW)
    with pytest.raises(sqlite3.IntegrityError):
        with sqlite3.connect(sqlite_path(allocator.db)) as conn:
            conn.execute(
                "INSERT INTO leases (lease_id, repo, issue_number, owner, role, action, acquired_at, expires_at,"
                " heartbeat_at, status, request_json) VALUES ('x', ?, 617, 'a', 'author', 'implement', 't', 't',"
                " 't', 'live', '{}')",
                (allocator.repo,),
            )


async def test_only_controllers_allocate_and_only_roster_owners_receive(allocator: Allocator) -> None:
    """A non-controller is not_authorized (at the door, the verb's role gate); an owner without the
    action's role is refused (by the allocator)."""
    door = open_door(db=allocator.db, settings=allocator.settings, bot_login="foreman-bot",
                       bootstrap_factory=no_bootstrap)
    by_author = await door.call("allocate_next_work", caller_for(allocator.settings, "author-1", "mcp"),
                                {"owner": "author-1", "candidates_json": CANARY, "dry_run": False})
    assert by_author.doc["error"] == "not_authorized"
    to_stranger = await allocator.run(call(owner="mallory", dry_run=False), now=NOW)
    assert to_stranger.to_dict()["error"] == "not_authorized"
    assert await leases_of(allocator) == []


def test_depends_lines_in_an_issue_body_are_parsed() -> None:
    """`Depends: #N` lines name dependencies (other #refs do not)."""
    body = "Intro mentions #5.\n\nParent: #600\nDepends: #765, #758\n- **Depends on**: #12\nBlocks: none"
    assert depends_on(body) == [12, 758, 765]


@pytest.mark.process
async def test_two_processes_racing_for_the_top_issue_end_with_exactly_one_lease(tmp_path: Path) -> None:
    """Two separate processes apply at once on one database: exactly one lease on the top issue;
    the loser gets a typed result (exit 1 with a JSON envelope), not an exception."""
    candidates = tmp_path / "candidates.json"
    candidates.write_text(json.dumps(CANARY), encoding="utf-8")

    async def allocate(config: Path, *extra: str) -> tuple[int, dict[str, Any]]:
        code, out, err = await run_foreman("allocate", "--config", str(config), "--candidates-json", f"@{candidates}",
                                           "--json", *extra, cwd=REPO_ROOT)
        assert out, err
        return code, json.loads(out)

    for race in range(2):
        database = tmp_path / f"race-{race}.db"
        config = write_config(tmp_path / f"race-{race}.toml", offline_config(
            database, {"repository": {"owner": "acme", "name": "widgets"}, "roster": ROSTER}))
        _, dry = await allocate(config, "--owner", "author-1")
        assert dry["issue_number"] == 617
        results = await asyncio.gather(
            allocate(config, "--apply", "--owner", "author-1", "--expect-fingerprint", dry["fingerprint"]),
            allocate(config, "--apply", "--owner", "author-1", "--expect-fingerprint", dry["fingerprint"]),
        )
        assert sorted(code for code, _ in results) == [0, 1], results
        loser = next(doc for code, doc in results if code == 1)
        assert loser["error"] == "stale_pin" and loser["exact_next_action"] and not loser["applied"]
        with sqlite3.connect(database) as conn:
            live = conn.execute("SELECT issue_number, owner FROM leases WHERE status = 'live'").fetchall()
            effects = conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
        assert live == [(617, "author-1")]
        assert effects == 3  # one lease's label, assignee and evidence entries: nothing from the loser


async def test_lease_store_heartbeat_and_release_are_owner_only_and_recorded(allocator: Allocator) -> None:
    """Heartbeat extends only the owner's live lease; release is recorded, never deleted."""
    outcome = await allocator.run(call(dry_run=False), now=NOW)
    assert outcome.lease is not None
    store: LeaseStore = allocator.leases
    from state.leases import LeaseRefused

    with pytest.raises(LeaseRefused):
        await store.heartbeat(outcome.lease.lease_id, owner="author-2", ttl=timedelta(hours=1), now=NOW)
    beat = await store.heartbeat(outcome.lease.lease_id, owner="author-1", ttl=timedelta(hours=2), now=NOW)
    assert beat.expires_at == NOW + timedelta(hours=2)
    async with allocator.db.transaction() as conn:
        await store.release(conn, outcome.lease.lease_id, actor="author-1", reason="done", now=NOW)
    [row] = await store.history(allocator.repo, 617)
    assert (row.status, row.end_reason) == ("released", "done")
    assert [e["kind"] for e in await store.events(row.lease_id)] == ["acquired", "heartbeat", "released"]


def test_the_allocator_doc_lists_every_stable_skip_reason() -> None:
    """The documented list of skipped reasons is the code's list."""
    from bot.core.allocator import SKIP_REASONS

    doc = (REPO_ROOT / "docs" / "allocator.md").read_text(encoding="utf-8")
    table = doc.split("## Skipped reasons (stable)", 1)[1].split("\n## ", 1)[0]
    documented = [line.split("`")[1] for line in table.splitlines() if line.startswith("| `")]
    assert documented == list(SKIP_REASONS)


async def test_without_a_gitea_client_candidates_come_from_the_stored_issue_state(allocator: Allocator) -> None:
    """The candidates are the open `status:ready` issues of the stored issue state that webhooks keep
    fresh (closed, not-ready and priority labels as last reported)."""
    rows = [
        (1, 1, [{"id": 1, "name": "status:ready"}]),
        (2, 1, [{"id": 1, "name": "status:ready"}, {"id": 9, "name": "priority:p0"}]),
        (3, 0, [{"id": 1, "name": "status:ready"}, {"id": 9, "name": "priority:p0"}]),  # closed
        (4, 1, [{"id": 2, "name": "status:in-progress"}]),
    ]
    with sqlite3.connect(sqlite_path(allocator.db)) as conn:
        for number, is_open, labels in rows:
            conn.execute(
                "INSERT INTO issues (repo, number, is_open, labels_json, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, 't', 't')",
                (allocator.repo, number, is_open, json.dumps(labels)),
            )
    outcome = await allocator.run(call(candidates_json=None, dry_run=False), now=NOW)
    doc = outcome.to_dict()
    assert doc["candidate_source"] == "stored_state" and doc["considered"] == 2
    assert outcome.lease is not None and outcome.lease.issue_number == 2
