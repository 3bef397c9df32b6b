"""Issue state from comment and label events (requirements 4-6): the pure rules, then real signed deliveries."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.core.canonical import parse_comment, render
from bot.core.evidence import render_evidence
from bot.core.issue_state import (
    CommentRecord,
    current_record,
    diff_labels,
    effective_revisions,
    gitea_time,
    plan_label_sync,
)
from bot.core.vocabulary import vocabulary_markdown
from bot.handler_deps import PermissionCache
from state.db import to_db_time
from state.issues import IssueStore
from state.outbox import OutboxIntent
from tests.conftest import REPO_ROOT
from tests.gitea_fixtures import BOT, OWNER, REPO
from tests.support import HANG_S, Started, canonical_state, make_settings, wait_status, webhook_headers
from tests.world import FULL_NAME, ROSTER_AUTHOR, World, open_world

PERMISSION_ROUTE = "/repos/{owner}/{repo}/collaborators/{collaborator}/permission"


_state = canonical_state


# --- pure rules (no SQLite) -------------------------------------------------------------------------------------------


def _rec(
    record_id: int,
    comment_id: int,
    *,
    state: str | None = "ready",
    action: str = "created",
    created: int = 0,
    updated: int | None = None,
    trusted: bool | None = True,
) -> CommentRecord:
    stamp = f"2026-07-20T10:00:{created:02d}.000000Z"
    return CommentRecord(
        id=record_id,
        comment_id=comment_id,
        action=action,  # type: ignore[arg-type]
        author="alice",
        created_at=stamp,
        updated_at=f"2026-07-20T10:00:{(created if updated is None else updated):02d}.000000Z",
        trusted=trusted,
        trust_reason="permission:write" if trusted else "permission:read",
        state=None if state is None else _state(state),
    )


def test_current_state_is_the_latest_trusted_block_in_comment_order_not_arrival_order() -> None:
    """Requirement 4: a late delivery of an older comment (recorded last) does not override a newer one."""
    newer = _rec(1, 20, state="in-progress", created=5)
    older = _rec(2, 10, state="ready", created=1)  # arrived second
    chosen = current_record([newer, older])
    assert chosen is newer
    assert current_record([older, newer]) is newer


def test_same_second_comments_are_ordered_by_comment_id() -> None:
    """Requirement 4: Gitea keeps whole seconds; comment id breaks the tie, as Gitea's comment list does."""
    first, second = _rec(2, 10, state="ready"), _rec(1, 11, state="review")
    assert current_record([first, second]) is second


def test_untrusted_and_invalid_blocks_never_count() -> None:
    """Requirement 5: an untrusted block, a comment without a valid block, are recorded and skipped."""
    trusted = _rec(1, 10, state="ready", created=1)
    untrusted = _rec(2, 11, state="done", created=2, trusted=False)
    invalid = _rec(3, 12, state=None, created=3)
    no_block = _rec(4, 13, state=None, created=4, trusted=None)
    assert current_record([trusted, untrusted, invalid, no_block]) is trusted
    assert current_record([untrusted, invalid]) is None
    assert current_record([]) is None


def test_an_edit_replaces_its_comments_block_whatever_the_arrival_order() -> None:
    """Requirement 4: the edited revision stands (later updated_at); an edit arriving first still wins."""
    created = _rec(2, 10, state="ready", created=1)
    edited = _rec(1, 10, state="review", action="edited", created=1, updated=9)
    assert effective_revisions([edited, created])[10] is edited
    assert current_record([edited, created]) is edited
    # An edit that removed the block withdraws it: the previous comment counts again.
    earlier = _rec(3, 5, state="blocked", created=0)
    emptied = _rec(4, 10, state=None, action="edited", created=1, updated=12, trusted=None)
    assert current_record([earlier, created, edited, emptied]) is earlier


def test_an_edit_in_the_same_second_as_the_creation_still_replaces_it() -> None:
    """Requirement 4: same updated_at (whole seconds): an edit is newer than the creation it edits."""
    edited = _rec(1, 10, state="review", action="edited", created=1, updated=1)
    created = _rec(2, 10, state="ready", created=1)
    assert current_record([edited, created]) is edited


def test_a_deleted_comment_falls_back_to_the_previous_trusted_block() -> None:
    """Requirement 4: deleting the comment that counts falls back; a deletion beats any revision."""
    first = _rec(1, 10, state="ready", created=1)
    second = _rec(2, 11, state="in-progress", created=2)
    deleted = _rec(3, 11, state=None, action="deleted", created=2, trusted=None)
    assert current_record([first, second]) is second
    assert current_record([first, second, deleted]) is first
    # Deletion delivered before the creation (concurrent deliveries): the creation never counts.
    assert current_record([deleted, first, second]) is first
    late_edit = _rec(4, 11, state="done", action="edited", created=2, updated=30)
    assert current_record([first, second, deleted, late_edit]) is first


def test_label_sync_plan_mirrors_state_and_holds_on_conflict() -> None:
    """Requirement 6: exactly one status label mirroring STATE; two status labels hold the sync."""
    state = _state("in-progress")
    assert plan_label_sync(None, ["status:ready"], conflict=False).status == "no_state"
    assert plan_label_sync(state, ["bug", "status:in-progress"], conflict=False).status == "in_sync"
    plan = plan_label_sync(state, ["bug", "status:ready"], conflict=False)
    assert (plan.status, plan.target, plan.remove) == ("pending", "status:in-progress", ("status:ready",))
    assert plan_label_sync(state, ["bug"], conflict=False).remove == ()
    assert plan_label_sync(state, ["status:ready", "status:review"], conflict=False).status == "held"
    assert plan_label_sync(state, ["status:in-progress"], conflict=True).status == "held"
    assert diff_labels(["a", "b"], ["b", "c"]) == (("c",), ("a",))


async def test_permission_cache_answers_from_memory_until_it_expires() -> None:
    """Requirement 5: permissions are cached briefly, per login (case-insensitive), failures never."""
    now = [0.0]
    calls: list[str] = []

    class Fake:
        async def get_user_permission(self, login: str) -> str:
            calls.append(login)
            if login == "flaky":
                raise RuntimeError("unreachable")
            return "write"

    cache = PermissionCache(ttl_s=60, clock=lambda: now[0])
    assert await cache.permission(Fake(), "Alice") == "write"
    now[0] = 59
    assert await cache.permission(Fake(), "alice") == "write"
    now[0] = 61
    assert await cache.permission(Fake(), "alice") == "write"
    for _ in range(2):
        with pytest.raises(RuntimeError):
            await cache.permission(Fake(), "flaky")
    assert calls == ["Alice", "alice", "flaky", "flaky"]


# --- docs -------------------------------------------------------------------------------------------------------------


def test_docs_carry_exactly_the_generated_vocabulary_table() -> None:
    """Requirement 3: the doc's vocabulary table is vocabulary_markdown()'s output, character for character."""
    doc = (REPO_ROOT / "docs" / "canonical-state.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- vocabulary:begin[^>]*-->\n(.*?)<!-- vocabulary:end -->", doc, re.S)
    assert match is not None, "docs/canonical-state.md lacks the vocabulary markers"
    assert match.group(1) == vocabulary_markdown()
    example = re.search(r"<!-- example:begin[^>]*-->\n````markdown\n(.*?)````\n<!-- example:end -->", doc, re.S)
    assert example is not None, "docs/canonical-state.md lacks the example block"
    parsed = parse_comment(example.group(1)).current
    assert parsed is not None and render(parsed) == example.group(1)  # the renderer's exact form


# --- against the emulator ---------------------------------------------------------------------------------------------


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    # Issue state alone: auto-allocation (on by default with a roster author) would take ready issues away.
    async with open_world(tmp_path, start, allocator={"auto": False}) as opened:
        yield opened


async def test_a_new_block_from_a_writer_becomes_the_state_and_the_label_follows(world: World) -> None:
    """Requirements 4-6: a writer's block is recorded with its history and the status label is synced."""
    number = await world.open_issue()
    comment_id = await world.comment("alice", number, "Taking this.\n\n" + render(_state("in-progress")))
    snap = await world.snapshot(number)
    assert snap.state == _state("in-progress") and snap.state_comment_id == comment_id
    [record] = await world.store.comment_records(FULL_NAME, number)
    assert (record.comment_id, record.author, record.trusted, record.trust_reason) == (
        comment_id,
        "alice",
        True,
        "permission:write",
    )
    assert record.delivery_id in world.settled and record.superseded_by is None
    # Label sync: queued as an outbox entry in the comment's transaction, sent and verified by the outbox
    # sender; its own webhook was ignored_self, so the completion hook stored the verified label set.
    assert world.labels(number) == ["status:in-progress"]
    assert snap.label_names == ("status:in-progress",) and snap.label_sync == "in_sync"
    [entry] = await world.label_sync_entries(number)
    assert entry.key.startswith(f"label-sync:{FULL_NAME}#{number}:record-{record.id}:status:in-progress:basis-")
    assert (entry.status, entry.kind, entry.delivery_id) == ("done", "labels", record.delivery_id)
    assert entry.payload["add"] == ["status:in-progress"] and "status:ready" in entry.payload["remove"]
    assert entry.result is not None and entry.result["labels"] == ["status:in-progress"]
    assert entry.result["issue_labels"] == [{"id": world.label_id("status:in-progress"), "name": "status:in-progress"}]
    queued, applied = await world.store.label_syncs(FULL_NAME, number)
    assert [(s["outcome"], s["target_label"], s["state_record_id"], s["outbox_key"]) for s in (queued, applied)] == [
        ("queued", "status:in-progress", record.id, entry.key),
        ("applied", "status:in-progress", record.id, entry.key),
    ]
    assert (json.loads(queued["labels_before_json"]), json.loads(applied["labels_after_json"])) == (
        [],
        ["status:in-progress"],
    )
    statuses = [(await world.service.store.get(d)).status for d in world.settled]  # type: ignore[union-attr]
    assert "ignored_self" in statuses
    assert world.bot_label_writes() == 1  # one POST of the label, nothing to remove


async def test_an_edited_block_replaces_that_comments_state(world: World) -> None:
    """Requirement 4: an edit re-evaluates the comment; the earlier revision is marked superseded."""
    number = await world.open_issue()
    comment_id = await world.comment("alice", number, render(_state("in-progress")))
    await world.call("alice", "PATCH", f"/issues/comments/{comment_id}", {"body": render(_state("review", "reviewer"))})
    snap = await world.snapshot(number)
    assert snap.state == _state("review", "reviewer") and snap.state_comment_id == comment_id
    first, second = await world.store.comment_records(FULL_NAME, number)
    assert (first.action, second.action) == ("created", "edited")
    assert first.superseded_by == second.id and second.superseded_by is None
    assert world.labels(number) == ["status:review"]


async def test_a_deleted_block_falls_back_to_the_previous_trusted_block(world: World) -> None:
    """Requirement 4: deleting the comment that counts brings back the previous trusted state."""
    number = await world.open_issue()
    await world.comment("alice", number, render(_state("ready", "controller")))
    newer = await world.comment(ROSTER_AUTHOR, number, render(_state("in-progress")))
    snap = await world.snapshot(number)
    assert snap.state_comment_id == newer and world.labels(number) == ["status:in-progress"]
    await world.call("alice", "DELETE", f"/issues/comments/{newer}")
    snap = await world.snapshot(number)
    assert snap.state == _state("ready", "controller") and snap.state_comment_id != newer
    records = await world.store.comment_records(FULL_NAME, number)
    deletion = records[-1]
    assert deletion.action == "deleted" and deletion.comment_id == newer
    assert next(r for r in records if r.comment_id == newer and r.action == "created").superseded_by == deletion.id
    assert records[1].trust_reason == "roster"
    assert world.labels(number) == ["status:ready"]


async def test_a_quoted_block_is_not_a_block(world: World) -> None:
    """Requirement 1/4: people quote old states in replies; a quoted block changes nothing."""
    number = await world.open_issue()
    await world.comment("alice", number, render(_state("in-progress")))
    quoted = "\n".join("> " + line for line in render(_state("done", "human")).splitlines())
    await world.comment("alice", number, f"Earlier it said:\n\n{quoted}\n\nStill true?")
    snap = await world.snapshot(number)
    assert snap.state is not None and snap.state.state == "in-progress"
    records = await world.store.comment_records(FULL_NAME, number)
    assert (records[-1].block_count, records[-1].trusted, records[-1].trust_reason) == (0, None, "no_block")


async def test_an_untrusted_authors_block_is_recorded_and_ignored(world: World) -> None:
    """Requirement 5: a reader's block is recorded as untrusted; the permission answer is cached."""
    number = await world.open_issue()
    await world.comment("alice", number, render(_state("in-progress")))
    asked_before = sum(1 for r in world.live.emulator.requests if r.route == PERMISSION_ROUTE)
    await world.comment("bob", number, render(_state("done", "human")))
    await world.comment("bob", number, render(_state("blocked", "human")))
    snap = await world.snapshot(number)
    assert snap.state is not None and snap.state.state == "in-progress"
    bob = [r for r in await world.store.comment_records(FULL_NAME, number) if r.author == "bob"]
    assert [(r.trusted, r.trust_reason, r.state is not None) for r in bob] == [(False, "permission:read", True)] * 2
    asked = [r for r in world.live.emulator.requests if r.route == PERMISSION_ROUTE][asked_before:]
    assert [r.path.rsplit("/", 2)[-2] for r in asked] == ["bob"]  # cached for the second comment
    assert world.labels(number) == ["status:in-progress"]


async def test_permission_check_fails_closed_and_the_delivery_is_retried(world: World) -> None:
    """Requirement 5: Gitea unreachable for the permission check: nothing is recorded, the worker retries."""
    number = await world.open_issue()
    world.live.emulator.faults.fail("GET", PERMISSION_ROUTE, status=503, times=4)  # every client retry
    comment_id = await world.comment("alice", number, render(_state("review", "reviewer")))
    [record] = await world.store.comment_records(FULL_NAME, number)
    assert (record.comment_id, record.trusted) == (comment_id, True)
    row = await world.service.store.get(record.delivery_id)
    assert row is not None and row.attempts == 2


async def test_out_of_order_deliveries_never_let_an_older_comment_win(world: World) -> None:
    """Requirement 4: Gitea's signed deliveries sent newest first: the newest comment's block still counts."""
    number = await world.open_issue()
    world.hook.url = "http://127.0.0.1:9/unreachable"  # capture the signed deliveries instead of sending them
    older = await world.comment("alice", number, render(_state("ready", "controller")))
    newer = await world.comment("alice", number, render(_state("pr-open", "reviewer", related_prs=(7,))))
    await world.call("alice", "PATCH", f"/issues/comments/{newer}", {"body": render(_state("review", "reviewer"))})
    world.hook.url = world.webhook_url
    captured = [d for d in world.live.emulator.deliveries if d.url != world.webhook_url]
    assert [d.action for d in captured] == ["created", "created", "edited"]
    for delivery in reversed(captured):  # the edit first, then the newer comment, then the older one
        resp = await world.client.post("/webhook", data=delivery.body, headers=delivery.headers)
        assert resp.status == 202
        await world.wait_settled(delivery.delivery_id, asyncio.get_running_loop().time() + HANG_S)
        snap = await world.snapshot(number)
        assert snap.state_comment_id == newer and snap.state == _state("review", "reviewer")
    await world.settle()
    records = await world.store.comment_records(FULL_NAME, number)
    assert [(r.comment_id, r.action) for r in records] == [(newer, "edited"), (newer, "created"), (older, "created")]
    assert records[1].superseded_by == records[0].id
    assert world.labels(number) == ["status:review"]


async def test_concurrent_deliveries_converge_on_the_newest_block(world: World) -> None:
    """Requirement 4: comments posted back to back, delivered and processed concurrently: newest wins."""
    number = await world.open_issue()
    states = ["ready", "in-progress", "pr-open", "review", "blocked", "done", "review", "in-progress"]
    ids = []
    for index, name in enumerate(states):
        login = "alice" if index % 2 else ROSTER_AUTHOR
        body = {"body": render(_state(name, next_action=f"Step {index}"))}
        comment = await world.call(login, "POST", f"/issues/{number}/comments", body, tick=index % 3 == 0, settle=False)
        ids.append(int(comment["id"]))
    await world.settle()
    snap = await world.snapshot(number)
    assert snap.state_comment_id == ids[-1] and snap.state == _state("in-progress", next_action="Step 7")
    assert len(await world.store.comment_records(FULL_NAME, number)) == len(states)
    assert world.labels(number) == ["status:in-progress"] and snap.label_sync == "in_sync"


async def test_a_replayed_delivery_adds_no_history(world: World) -> None:
    """Requirement 4: a forced replay of a handled comment delivery records nothing twice."""
    number = await world.open_issue()
    await world.comment("alice", number, render(_state("in-progress")))
    [record] = await world.store.comment_records(FULL_NAME, number)
    before = await world.snapshot(number)
    await world.service.store.replay(record.delivery_id, requested_by="test", force=True)
    world.service.worker.wakeup.set()
    world.settled.discard(record.delivery_id)
    await world.wait_settled(record.delivery_id, asyncio.get_running_loop().time() + 10)
    await world.settle()
    assert await world.store.comment_records(FULL_NAME, number) == [record]
    after = await world.snapshot(number)
    assert (after.state_record_id, after.label_names) == (before.state_record_id, before.label_names)
    [entry] = await world.label_sync_entries(number)  # the sync was not queued a second time
    assert entry.status == "done" and world.bot_label_writes() == 1


async def test_label_changes_are_diffed_against_the_stored_set(world: World) -> None:
    """Requirement 6: Gitea sends only the full set after a change; added/removed come from the stored set."""
    for name in ("bug", "priority:p0"):
        assert name in {label.name for label in world.live.emulator.repo(OWNER, REPO).labels.values()}
    number = await world.open_issue()
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["bug", "priority:p0"]})
    await world.call("alice", "DELETE", f"/issues/{number}/labels/{world.label_id('bug')}")
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["feature"]})
    await world.call("alice", "DELETE", f"/issues/{number}/labels")
    events = await world.store.issue_events(FULL_NAME, number)
    assert [(e["action"], e["added"], e["removed"], e["sender"]) for e in events] == [
        ("opened", [], [], "alice"),
        ("label_updated", ["bug", "priority:p0"], [], "alice"),
        ("label_updated", [], ["bug"], "alice"),
        ("label_updated", ["feature"], [], "alice"),
        ("label_cleared", [], ["feature", "priority:p0"], "alice"),
    ]
    assert events[0]["first_snapshot"] == 1 and all(e["applied"] == 1 for e in events)
    assert (await world.snapshot(number)).label_names == ()


async def test_an_older_label_snapshot_delivered_late_is_kept_but_not_applied(world: World) -> None:
    """Requirement 4/6: label deliveries out of order: the older full set does not overwrite the newer one."""
    number = await world.open_issue()
    world.hook.url = "http://127.0.0.1:9/unreachable"
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["bug"]})
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["feature"]})
    world.hook.url = world.webhook_url
    first, second = [d for d in world.live.emulator.deliveries if d.url != world.webhook_url]
    for delivery in (second, first):
        assert (await world.client.post("/webhook", data=delivery.body, headers=delivery.headers)).status == 202
        await world.wait_settled(delivery.delivery_id, asyncio.get_running_loop().time() + 10)
    events = await world.store.issue_events(FULL_NAME, number)
    assert [(e["added"], e["applied"]) for e in events[1:]] == [(["bug", "feature"], 1), ([], 0)]
    assert (await world.snapshot(number)).label_names == ("bug", "feature")


async def test_a_human_labelling_ready_makes_a_candidate(world: World) -> None:
    """Requirement 6: status:ready by a human makes the open issue a candidate (recorded); closing ends it."""
    number = await world.open_issue()
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready"]})
    snap = await world.snapshot(number)
    assert snap.candidate and snap.label_sync == "no_state"
    events = await world.store.issue_events(FULL_NAME, number)
    assert events[-1]["made_candidate"] == 1 and events[-1]["sender"] == "alice"
    await world.call("alice", "PATCH", f"/issues/{number}", {"state": "closed"})
    snap = await world.snapshot(number)
    assert snap.is_open is False and not snap.candidate
    assert world.labels(number) == ["status:ready"]  # no state: nothing to sync


async def test_two_status_labels_are_a_blocker_and_sync_holds_until_resolved(world: World) -> None:
    """Requirement 6: two status labels at once: a blocker for the controller, no guessing; then re-synced."""
    number = await world.open_issue()
    await world.comment("alice", number, render(_state("in-progress")))
    assert world.labels(number) == ["status:in-progress"]
    writes = world.bot_label_writes()
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:review"]})
    snap = await world.snapshot(number)
    assert snap.open_blockers == ("conflicting_status_labels",) and snap.label_sync == "held"
    assert world.labels(number) == ["status:in-progress", "status:review"]  # untouched
    assert world.bot_label_writes() == writes
    [blocker] = await world.store.blockers(FULL_NAME, number)
    assert blocker["detail"] == {"labels": ["status:in-progress", "status:review"]} and blocker["resolved_at"] is None
    # Resolved by a person removing one: the blocker closes and the label follows the STATE again.
    await world.call("alice", "DELETE", f"/issues/{number}/labels/{world.label_id('status:in-progress')}")
    [blocker] = await world.store.blockers(FULL_NAME, number)
    assert blocker["resolved_at"] is not None
    assert world.labels(number) == ["status:in-progress"]
    assert (await world.snapshot(number)).label_sync == "in_sync"


async def test_a_status_label_the_repository_lacks_ends_as_label_missing(world: World) -> None:
    """Requirement 6: Gitea ignores an unknown label name; the outbox read-back catches it, the
    entry ends verification_failed, the issue records label_missing, and the old status label stays."""
    emu = world.live.emulator
    del emu.repo(OWNER, REPO).labels[world.label_id("status:blocked")]
    number = await world.open_issue()
    await world.comment("alice", number, render(_state("in-progress")))
    assert world.labels(number) == ["status:in-progress"]
    await world.comment("alice", number, render(_state("blocked", "human")))
    first, second = await world.label_sync_entries(number)
    assert first.status == "done" and second.payload["add"] == ["status:blocked"]
    assert second.status == "verification_failed" and second.observed["observed"] == ["status:in-progress"]
    assert world.labels(number) == ["status:in-progress"]  # not removed: its replacement never landed
    snap = await world.snapshot(number)
    assert snap.state is not None and snap.state.state == "blocked" and snap.label_sync == "label_missing"
    last = (await world.store.label_syncs(FULL_NAME, number))[-1]
    assert (last["outcome"], last["target_label"], last["outbox_key"]) == (
        "label_missing",
        "status:blocked",
        second.key,
    )
    assert json.loads(last["labels_after_json"]) == ["status:in-progress"]
    # Another event with the same label set queues nothing new and does not hide the failure.
    await world.comment("alice", number, "Any news?")
    assert len(await world.label_sync_entries(number)) == 2
    assert (await world.snapshot(number)).label_sync == "label_missing"
    # The operator creates the label and retries the entry (`foreman outbox retry ID`): the sync completes.
    emu.create_label(OWNER, REPO, "status:blocked", color="#00aa00")
    await world.service.outbox.retry(second.id)
    world.service.outbox_wakeup()
    await world.settle()
    assert world.labels(number) == ["status:blocked"]
    snap = await world.snapshot(number)
    assert snap.label_sync == "in_sync" and snap.label_names == ("status:blocked",)
    assert (await world.store.label_syncs(FULL_NAME, number))[-1]["outcome"] == "applied"


async def test_the_bots_own_state_comment_becomes_the_state_and_a_later_human_block_wins(world: World) -> None:
    """Requirements 4-5: the bot's evidence comment, posted through the outbox, is recorded by the completion
    hook (its own webhook is ignored_self) as a trusted block (reason `bot`) in comment order."""
    number = await world.open_issue()
    await world.comment("alice", number, render(_state("ready", "controller")))
    assert world.labels(number) == ["status:ready"]
    key = f"lease-{number}:evidence"
    bot_state = _state("in-progress", last_updated_by=BOT)
    body = render_evidence(key=key, summary=f"Leased #{number} to author-1.", state=bot_state, evidence={"n": number})
    assert await world.service.outbox.add(OutboxIntent(key, number, "comment", {"body": body}),
                                    repo=world.service.settings.repo_key)
    world.service.outbox_wakeup()
    await world.settle()
    entry = await world.service.outbox.by_key(key)
    assert entry is not None and entry.status == "done" and entry.result is not None
    comment_id = entry.result["comment_id"]
    snap = await world.snapshot(number)
    assert snap.state == bot_state and snap.state_comment_id == comment_id
    records = await world.store.comment_records(FULL_NAME, number)
    assert len(records) == 2  # alice's and the bot's, once: the bot's comment webhook was ignored_self
    mine = records[-1]
    assert (mine.comment_id, mine.author, mine.trusted, mine.trust_reason, mine.delivery_id) == (
        comment_id,
        BOT,
        True,
        "bot",
        f"outbox:{key}",
    )
    stored = world.live.emulator.comment(comment_id)
    assert stored is not None and mine.created_at == to_db_time(datetime.fromtimestamp(stored.created, UTC))
    assert mine.created_at == gitea_time(entry.result["created_at"])
    # The label follows the bot's state (a second outbox entry, queued by the hook's transaction).
    assert world.labels(number) == ["status:in-progress"] and snap.label_sync == "in_sync"
    # A later human block wins by comment order.
    later = await world.comment("alice", number, render(_state("review", "reviewer")))
    snap = await world.snapshot(number)
    assert snap.state == _state("review", "reviewer") and snap.state_comment_id == later
    assert world.labels(number) == ["status:review"]


async def test_label_sync_replaces_only_the_status_label_and_is_idempotent(world: World) -> None:
    """Requirement 6: the status label follows the STATE; other labels stay; no change when already right."""
    number = await world.open_issue()
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["bug", "status:ready"]})
    assert (await world.snapshot(number)).candidate
    await world.comment(ROSTER_AUTHOR, number, render(_state("in-progress")))
    assert world.labels(number) == ["bug", "status:in-progress"]
    snap = await world.snapshot(number)
    assert snap.label_names == ("bug", "status:in-progress") and not snap.candidate and snap.label_sync == "in_sync"
    writes = world.bot_label_writes()
    await world.comment("alice", number, "A comment without a block.")
    await world.comment("alice", number, render(_state("in-progress", next_action="Keep going")))
    assert world.bot_label_writes() == writes


async def test_without_a_gitea_client_the_label_sync_waits_in_the_outbox(tmp_path: Path, start: Started) -> None:
    """Requirement 6: no token configured: trust comes from the roster only; the sync is queued in the outbox
    (recorded `queued`, the issue `pending`) and waits there; a replayed delivery queues nothing more."""
    service, client = await start(make_settings(tmp_path, roster={ROSTER_AUTHOR: ["author"]}))
    issue = {
        "id": 501,
        "number": 5,
        "labels": [{"id": 3, "name": "status:ready"}],
        "state": "open",
        "updated_at": "2026-07-20T21:35:15-05:00",
        "pull_request": None,
    }
    repository = {"id": 1, "name": "repo", "full_name": "org/repo"}

    def comment(comment_id: int, login: str, state: str) -> bytes:
        doc = {
            "action": "created",
            "issue": issue,
            "comment": {
                "id": comment_id,
                "user": {"login": login, "is_admin": True},  # never consulted
                "body": render(_state(state)),
                "created_at": "2026-07-20T21:35:15-05:00",
                "updated_at": "2026-07-20T21:35:15-05:00",
            },
            "repository": repository,
            "sender": {"login": login, "is_admin": True},
            "is_pull": False,
        }
        return json.dumps(doc, indent=2).encode()

    for delivery, body in (("c-1", comment(40, "stranger", "done")), ("c-2", comment(41, ROSTER_AUTHOR, "review"))):
        resp = await client.post(
            "/webhook", data=body, headers=webhook_headers(body, event="issue_comment", delivery=delivery)
        )
        assert resp.status == 202
        await wait_status(service, delivery, "done")
    store = IssueStore(service.db)
    stranger, author = await store.comment_records("org/repo", 5)
    assert (stranger.trusted, stranger.trust_reason.split(":")[0]) == (False, "no_gitea_client")
    assert (author.trusted, author.trust_reason) == (True, "roster")
    snap = await store.snapshot("org/repo", 5)
    assert snap is not None and snap.state is not None and snap.state.state == "review"
    assert snap.label_sync == "pending" and snap.label_names == ("status:ready",)
    [sync] = await store.label_syncs("org/repo", 5)
    assert (sync["outcome"], sync["target_label"], json.loads(sync["labels_before_json"])) == (
        "queued",
        "status:review",
        ["status:ready"],
    )
    [entry] = await service.outbox.list()
    assert (entry.key, entry.status, entry.kind, entry.delivery_id) == (sync["outbox_key"], "pending", "labels", "c-2")
    assert entry.key.startswith(f"label-sync:org/repo#5:record-{author.id}:status:review:")
    assert entry.payload == {
        "add": ["status:review"],
        "remove": ["status:blocked", "status:done", "status:in-progress", "status:pr-open", "status:ready"],
    }
    # A forced replay of the delivery that queued it: the same plan, the same key, nothing new.
    await service.store.replay("c-2", requested_by="test", force=True)
    service.worker.wakeup.set()
    await wait_status(service, "c-2", "done")
    assert [e.key for e in await service.outbox.list()] == [entry.key]
    assert len(await store.label_syncs("org/repo", 5)) == 1
    assert (await service.outbox.counts())["pending"] == 1
