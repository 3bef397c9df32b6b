"""The outbox against the Gitea emulator: exactly once, read-after-write, ordering, parking, evidence format."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bot.config_sections import OutboxConfig
from bot.core.canonical import parse_comment
from bot.core.errors import Envelope
from bot.core.evidence import find_marker, marker, render_evidence, render_failure
from bot.metrics import Metrics
from bot.outbox import OutboxSender
from state.db import Database
from state.outbox import OutboxEntry, OutboxInputError, OutboxIntent, OutboxStore, enqueue
from tests.conftest import DbOpener, database_env
from tests.gitea_fixtures import OWNER, REPO, LiveEmulator, live_emulator
from tests.support import HANG_S, canonical_state, eventually

COMMENTS = "/repos/{owner}/{repo}/issues/{index}/comments"
COMMENT = "/repos/{owner}/{repo}/issues/comments/{id}"
STATE = canonical_state(
    next_action="implement the issue on its branch",
    next_prompt="Work in branches/issue-1-demo.\nCommit, then open a PR.", what_happened="leased issue #1 to author-1",
    why="highest-ranked ready issue", validation="lease row and assignee read back", last_updated_by="foreman-bot")


@dataclass
class Rig:
    live: LiveEmulator
    db: Database
    store: OutboxStore
    sender: OutboxSender
    metrics: Metrics

    def bodies(self, number: int = 1) -> list[str]:
        issue = self.live.emulator.issue(OWNER, REPO, number)
        return [c.body for c in issue.comments if c.kind == "comment"]

    async def drain(self, passes: int = 20) -> None:
        """Run sender passes until nothing is due (backoffs in these tests are a few ms)."""
        for _ in range(passes):
            if not await self.sender.run_once():
                await asyncio.sleep(0.02)
                if not await self.sender.run_once():
                    return

    async def entry(self, key: str) -> OutboxEntry:
        found = await self.store.by_key(key)
        assert found is not None
        return found


KEY = f"{OWNER}/{REPO}".lower()


def of_repo(*args: Any, **kwargs: Any) -> OutboxIntent:
    """An intent of the emulator's one repository, as a door builds it."""
    return OutboxIntent(*args, **{"repo": KEY, **kwargs})


@pytest.fixture
async def rig(open_db: DbOpener, tmp_path: Path) -> AsyncIterator[Rig]:
    async with live_emulator() as live:
        for title in ("first", "second"):
            live.emulator.create_issue(OWNER, REPO, title=title, author="alice")
        db = await open_db(tmp_path / "foreman.db", synchronous="NORMAL")
        store = OutboxStore(db)
        config = OutboxConfig(backoff_base_s=0.005, backoff_max_s=0.01, max_attempts=3, claim_ttl_s=0.2)
        metrics = Metrics()
        sender = OutboxSender(store, live.client(max_attempts=1), config, metrics)
        yield Rig(live, db, store, sender, metrics)
        await db.close()


def comment_intent(key: str, number: int = 1, summary: str = "Leased issue #1 to author-1.") -> OutboxIntent:
    body = render_evidence(key=key, summary=summary, state=STATE, evidence={"lease": {"id": 7}, "issue": number})
    return of_repo(key=key, issue_number=number, kind="comment", payload={"body": body})


async def test_a_comment_is_posted_read_back_and_recorded(rig: Rig) -> None:
    """An entry is posted, read back (exact body) and recorded done with the comment id."""
    intent = comment_intent("lease-1")
    assert await rig.store.add(intent)
    await rig.drain()
    assert rig.bodies() == [intent.payload["body"]]
    entry = await rig.entry("lease-1")
    assert entry.status == "done" and entry.result is not None
    assert entry.result["verified"] is True and entry.result["adopted"] is False
    assert rig.live.emulator.comment(entry.result["comment_id"]) is not None


async def test_the_same_cause_processed_twice_posts_one_comment(rig: Rig) -> None:
    """A delivery processed twice enqueues the same key twice: one entry, one comment."""
    async with rig.db.transaction() as conn:
        assert await enqueue(conn, comment_intent("dup-1"))
    async with rig.db.transaction() as conn:
        assert not await enqueue(conn, comment_intent("dup-1"))
    await rig.drain()
    assert len(rig.bodies()) == 1


async def test_an_intent_rolls_back_with_its_cause(rig: Rig) -> None:
    """The entry is written in the same transaction as its cause; a failed cause leaves nothing."""
    with pytest.raises(RuntimeError):
        async with rig.db.transaction() as conn:
            await enqueue(conn, comment_intent("rolled-back"))
            raise RuntimeError("the state change failed")
    assert await rig.store.by_key("rolled-back") is None


async def test_a_lost_answer_after_gitea_stored_the_comment_is_adopted_not_reposted(rig: Rig) -> None:
    """Gitea stores the comment but the answer is lost; the retry finds the marker and adopts it."""
    rig.live.emulator.faults.drop_after_store("POST", COMMENTS)
    await rig.store.add(comment_intent("lost-1"))
    await rig.drain()
    assert len(rig.bodies()) == 1
    entry = await rig.entry("lost-1")
    assert entry.status == "done" and entry.attempts == 2
    assert entry.result is not None and entry.result["adopted"] is True
    assert 'foreman_outbox_retries_total{kind="comment"} 1.0' in rig.metrics.render().decode()


async def test_a_sender_that_died_between_post_and_commit_is_adopted_by_the_next(rig: Rig) -> None:
    """The claim is committed, the comment posted, then the sender dies; the next one adopts it."""
    await rig.store.add(comment_intent("crash-1"))
    [head] = await rig.store.due_heads(claim_ttl_s=60, limit=10)
    claimed = await rig.store.claim(head, "dead-sender")
    assert claimed is not None
    await rig.live.client().create_comment(1, claimed.payload["body"])  # the dead sender's POST
    assert await rig.store.due_heads(claim_ttl_s=60, limit=10) == []  # its claim is fresh: not taken over
    await asyncio.sleep(0.25)  # claim_ttl_s = 0.2
    await rig.drain()
    assert len(rig.bodies()) == 1
    entry = await rig.entry("crash-1")
    assert entry.status == "done" and entry.result is not None and entry.result["adopted"] is True


async def test_a_changed_body_is_rewritten_once_then_verified(rig: Rig) -> None:
    """A read-back that differs is retried (written again) and then verified."""
    rig.live.emulator.faults.alter_stored("POST", COMMENTS, suffix="\n(edited by someone)")
    intent = comment_intent("heal-1")
    await rig.store.add(intent)
    await rig.drain()
    assert rig.bodies() == [intent.payload["body"]]
    entry = await rig.entry("heal-1")
    assert entry.status == "done" and entry.result is not None and entry.result["verify_attempts"] == 2


async def test_a_body_that_keeps_changing_is_recorded_as_verification_failed_with_both_versions(
    rig: Rig, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A persistent mismatch ends as verification_failed with both versions, shown by the CLI."""
    rig.live.emulator.faults.alter_stored("POST", COMMENTS, suffix=" [x]")
    rig.live.emulator.faults.alter_stored("PATCH", COMMENT, suffix=" [x]", times=10)
    intent = comment_intent("bad-1")
    await rig.store.add(intent)
    await rig.drain()
    entry = await rig.entry("bad-1")
    assert entry.status == "verification_failed"
    assert entry.observed["intended"] == intent.payload["body"]
    assert entry.observed["observed"] == intent.payload["body"] + " [x]"
    assert 'foreman_outbox_verification_failures_total{kind="comment"} 1.0' in rig.metrics.render().decode()

    from bot.cli import main

    for name, value in database_env(rig.db, tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FOREMAN_WEBHOOK__SECRETS", '["a-long-enough-test-secret"]')
    assert await asyncio.to_thread(main, ["outbox", "--status", "verification_failed", "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["key"] == "bad-1" and listed["observed"]["observed"].endswith(" [x]")
    rig.live.emulator.faults.clear()
    assert await asyncio.to_thread(main, ["outbox", "retry", str(entry.id), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "pending"
    await rig.drain()
    assert (await rig.entry("bad-1")).status == "done"
    assert rig.bodies() == [intent.payload["body"]]


async def test_entries_of_one_issue_are_sent_in_order(rig: Rig) -> None:
    """One issue's entries go out in order, even when the first one needs a retry."""
    rig.live.emulator.faults.fail("POST", COMMENTS, status=503, times=1)
    keys = [f"order-{i}" for i in range(4)]
    for key in keys:
        await rig.store.add(comment_intent(key, summary=f"step {key}"))
    await rig.drain()
    assert [find_marker(body) for body in rig.bodies()] == keys


async def test_an_issues_next_entry_follows_as_soon_as_the_one_before_is_done(rig: Rig) -> None:
    """One pass sends an issue's whole queue in order (each entry right after the one before it was verified and
    hooked), not one entry per pass; another issue's entries go out beside it."""
    keys = [f"chain-{i}" for i in range(3)]
    for key in keys:
        await rig.store.add(comment_intent(key, summary=f"step {key}"))
    await rig.store.add(comment_intent("beside", number=2))
    assert await rig.sender.run_once() == 4
    assert [find_marker(body) for body in rig.bodies()] == keys and len(rig.bodies(2)) == 1
    assert await rig.sender.run_once() == 0


async def test_the_running_sender_sends_what_is_committed_while_it_looks(rig: Rig) -> None:
    """The running sender, polling only once a minute, still sends every entry it was woken for, including one
    committed while it was reading the due heads (the wake-up is never cleared after the look)."""
    rig.sender.config = OutboxConfig(poll_interval_s=60.0, claim_ttl_s=0.2)
    looked = asyncio.Event()
    due_heads = rig.store.due_heads

    async def slow_look(**kwargs: Any) -> list[OutboxEntry]:
        found = await due_heads(**kwargs)
        if not looked.is_set():
            looked.set()
            await rig.store.add(comment_intent("during-look"))  # committed after the read, before the wait
            rig.sender.wakeup.set()
        return found

    rig.store.due_heads = slow_look  # type: ignore[method-assign]
    rig.sender.start()
    try:
        await asyncio.wait_for(looked.wait(), timeout=HANG_S)

        async def sent() -> bool:
            entry = await rig.store.by_key("during-look")
            return entry is not None and entry.status == "done"

        await eventually(sent, "the entry added during the look sent")
        assert (await rig.entry("during-look")).status == "done"
    finally:
        await rig.sender.stop()


async def test_a_chain_that_fails_is_looked_at_again_at_the_next_poll_not_at_once(rig: Rig) -> None:
    """A chain that raises (here the claim: a database that cannot be written) leaves its entry for the next poll:
    the running sender does not spin on it."""
    rig.sender.config = OutboxConfig(poll_interval_s=60.0, claim_ttl_s=0.2)
    looks, claims = 0, 0
    due_heads = rig.store.due_heads

    async def counted(**kwargs: Any) -> list[OutboxEntry]:
        nonlocal looks
        looks += 1
        return await due_heads(**kwargs)

    async def failing(entry: OutboxEntry, sender_id: str) -> OutboxEntry | None:
        nonlocal claims
        claims += 1
        raise RuntimeError("database is locked")

    rig.store.due_heads = counted  # type: ignore[method-assign]
    rig.store.claim = failing  # type: ignore[method-assign]
    await rig.store.add(comment_intent("fails"))
    rig.sender.start()
    try:
        await eventually(lambda: claims, "the first claim", poll_s=0.01)
        await asyncio.sleep(0.3)  # room for a spin to show; the next poll is a minute away
        assert (claims, looks) == (1, 1)
    finally:
        await rig.sender.stop()
    assert (await rig.entry("fails")).status == "pending"


async def test_a_poisoned_entry_parks_and_holds_back_only_its_own_issue(rig: Rig) -> None:
    """A 4xx parks the entry; later entries of that issue wait, other issues go on."""
    rig.live.emulator.faults.fail("POST", COMMENTS, status=422, times=1)
    await rig.store.add(comment_intent("poison", number=1))
    await rig.store.add(comment_intent("after-poison", number=1))
    await rig.store.add(comment_intent("other-issue", number=2))
    await rig.drain()
    assert (await rig.entry("poison")).status == "parked"
    assert (await rig.entry("after-poison")).status == "pending"
    assert (await rig.entry("other-issue")).status == "done"
    assert rig.bodies(1) == [] and len(rig.bodies(2)) == 1
    await rig.store.retry((await rig.entry("poison")).id)
    await rig.drain()
    assert [find_marker(b) for b in rig.bodies(1)] == ["poison", "after-poison"]


async def test_label_changes_are_applied_and_verified(rig: Rig) -> None:
    """A label change is verified by reading the issue's labels back."""
    rig.live.emulator.add_labels(OWNER, REPO, 1, ["status/ready"], actor="alice")
    intent = of_repo("labels-1", 1, "labels", {"add": ["status/in-progress", "bug"], "remove": ["status/ready"]})
    await rig.store.add(intent)
    await rig.drain()
    entry = await rig.entry("labels-1")
    assert entry.status == "done"
    assert set(rig.live.emulator.label_names(OWNER, REPO, 1)) == {"status/in-progress", "bug"}
    # The result is the read-back label set, with ids, as of the issue's updated_at (a snapshot to store).
    issue = rig.live.emulator.issue(OWNER, REPO, 1)
    assert entry.result is not None and entry.result["labels"] == ["bug", "status/in-progress"]
    assert [label["name"] for label in entry.result["issue_labels"]] == ["bug", "status/in-progress"]
    assert sorted(label["id"] for label in entry.result["issue_labels"]) == sorted(issue.label_ids)
    assert datetime.fromisoformat(entry.result["issue_updated_at"]).timestamp() == issue.updated
    assert entry.result["issue_open"] is True


async def test_an_unknown_label_fails_verification_instead_of_passing_silently(rig: Rig) -> None:
    """FACTS 5: Gitea ignores unknown label names; the read-back catches it."""
    await rig.store.add(of_repo("labels-2", 1, "labels", {"add": ["no-such-label"], "remove": []}))
    await rig.drain()
    entry = await rig.entry("labels-2")
    assert entry.status == "verification_failed" and entry.observed["observed"] == []


async def test_assignee_changes_are_applied_and_verified(rig: Rig) -> None:
    """An assignee change is verified by reading the issue back."""
    await rig.store.add(of_repo("assign-1", 1, "assignees", {"assignees": ["alice"]}))
    await rig.drain()
    entry = await rig.entry("assign-1")
    assert entry.status == "done" and entry.result == {"assignees": ["alice"], "verified": True}


async def test_a_failing_completion_hook_does_not_undo_the_done_entry(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    """The completion hook runs once, after the entry is verified and recorded done, with the read-back
    comment's author and times; when it raises, that is logged and the entry stays done (never re-sent)."""
    calls: list[tuple[str, str, dict[str, Any]]] = []

    async def hook(entry: OutboxEntry, result: dict[str, Any]) -> None:
        stored = await rig.store.get(entry.id)
        assert stored is not None
        calls.append((entry.key, stored.status, result))
        raise RuntimeError("the consumer broke")

    rig.sender.on_complete = hook
    await rig.store.add(comment_intent("hook-1"))
    with caplog.at_level(logging.ERROR, logger="foreman.outbox"):
        await rig.drain()
    entry = await rig.entry("hook-1")
    assert entry.status == "done" and entry.result is not None and len(rig.bodies()) == 1
    [(key, status_seen, result)] = calls
    assert (key, status_seen, result) == ("hook-1", "done", entry.result)
    comment = rig.live.emulator.comment(result["comment_id"])
    assert comment is not None and result["author"] == "foreman-bot"
    assert datetime.fromisoformat(result["created_at"]).timestamp() == comment.created
    assert datetime.fromisoformat(result["updated_at"]).timestamp() == comment.updated
    assert "completion hook failed (the entry stays done)" in caplog.text
    await rig.drain()
    assert len(calls) == 1 and len(rig.bodies()) == 1


async def test_a_failed_label_change_removes_nothing_and_calls_the_failure_hook(rig: Rig) -> None:
    """A label swap whose new label is unknown must not remove the old one (the issue would have neither);
    the failure hook gets the entry as stored (verification_failed, with what was observed)."""
    rig.live.emulator.add_labels(OWNER, REPO, 1, ["status/ready"], actor="alice")
    failed: list[OutboxEntry] = []

    async def on_failure(entry: OutboxEntry) -> None:
        failed.append(entry)

    rig.sender.on_failure = on_failure
    await rig.store.add(of_repo("swap-1", 1, "labels", {"add": ["status/unknown"], "remove": ["status/ready"]}))
    await rig.drain()
    assert rig.live.emulator.label_names(OWNER, REPO, 1) == ["status/ready"]
    [entry] = failed
    assert (entry.key, entry.status, entry.observed["observed"]) == ("swap-1", "verification_failed", ["status/ready"])


def test_intents_are_validated_before_they_are_stored() -> None:
    """Fail closed: a comment without its marker, bad numbers or empty label changes are refused."""
    with pytest.raises(OutboxInputError, match="marker"):
        of_repo("k1", 1, "comment", {"body": "no marker here"})
    with pytest.raises(OutboxInputError, match="issue_number"):
        of_repo("k2", True, "labels", {"add": ["bug"]})
    with pytest.raises(OutboxInputError, match="both added and removed"):
        of_repo("k3", 1, "labels", {"add": ["bug"], "remove": ["bug"]})
    with pytest.raises(OutboxInputError, match="comment_id"):
        of_repo("k4", 1, "edit_comment", {"comment_id": 0, "body": "x " + marker("k4")})


def test_an_evidence_comment_has_summary_state_json_and_marker_and_no_secrets() -> None:
    """Summary paragraph, Canonical Issue State block, collapsed JSON evidence, hidden marker."""
    body = render_evidence(
        key="lease-42",
        summary="Leased issue #42 to author-1\nfor implementation.",
        state=STATE,
        evidence={"lease": {"id": 3, "token": "s3cr3t"}, "sha": "abc123", "gitea_token": "x"},
    )
    assert body.startswith("Leased issue #42 to author-1 for implementation.\n")
    assert parse_comment(body).current == STATE
    assert "<details>" in body and "</details>" in body
    doc = json.loads(body.split("```json\n", 1)[1].split("\n```", 1)[0])
    assert doc == {"lease": {"id": 3}, "sha": "abc123"}
    assert "s3cr3t" not in body
    assert find_marker(body) == "lease-42" and body.rstrip().endswith(marker("lease-42"))
    assert len(body.splitlines()) < 60


def test_a_failure_comment_names_the_reason_and_the_exact_next_action() -> None:
    """A refusal comment says what happened and the next action (no shell command)."""
    envelope = Envelope(
        error="tracing_gap",
        message="the branch has no commits beyond the base",
        remediate="commit your work on the issue branch",
        exact_next_action="commit on branch issue-7-x, then call gitea_open_pr again",
        missing=("commits",),
    )
    body = render_failure(key="refuse-7", what="Opening a PR for #7", envelope=envelope, evidence={"issue": 7})
    assert "refused" in body and "tracing_gap" in body and "commits" in body
    assert "**Next action:** commit on branch issue-7-x, then call gitea_open_pr again" in body
    assert find_marker(body) == "refuse-7"


async def test_a_hook_that_a_dead_process_never_ran_is_run_on_the_next_pass(rig: Rig) -> None:
    """Hooks are durable: an entry settled done by a process that died before its hook gets the hook later,
    exactly once (hooked_at is recorded)."""
    calls: list[str] = []

    async def hook(entry: OutboxEntry, result: dict[str, Any]) -> None:
        calls.append(entry.key)

    await rig.store.add(comment_intent("orphan-1"))
    await rig.drain()  # settled with no hook configured: marked as hooked
    await rig.store.add(comment_intent("orphan-2"))
    [head] = await rig.store.due_heads(claim_ttl_s=60, limit=10)
    claimed = await rig.store.claim(head, "dying-sender")
    assert claimed is not None
    assert await rig.store.complete(claimed, {"comment_id": 1, "verified": True})  # ... and then it died
    rig.sender.on_complete = hook
    await rig.drain()
    await rig.drain()
    assert calls == ["orphan-2"]
    assert await rig.store.unhooked() == []


async def test_store_reads_an_issues_entries_and_every_entry_oldest_first(open_db: DbOpener, tmp_path: Path) -> None:
    db = await open_db(tmp_path / "foreman.db")
    try:
        store = OutboxStore(db)
        for key, number in (("a", 1), ("b", 2), ("c", 1)):
            await store.add(of_repo(key, number, "labels", {"add": [key]}))
        assert [e.key for e in await store.for_issue(1)] == ["a", "c"]
        assert [e.payload for e in await store.for_issue(2)] == [{"add": ["b"]}]
        assert await store.for_issue(3) == []
        assert [(e.key, e.issue_number) for e in await store.every_entry()] == [("a", 1), ("b", 2), ("c", 1)]
    finally:
        await db.close()


async def test_store_reads_the_newest_evidence_comments(open_db: DbOpener, tmp_path: Path) -> None:
    db = await open_db(tmp_path / "foreman.db")
    try:
        store = OutboxStore(db)
        for key in ("lease-1:evidence", "lease-1:release", "run-2:evidence", "lease-3:evidence"):
            await store.add(comment_intent(key))
        await store.add(of_repo("x:evidence", 1, "labels", {"add": ["y"]}))
        assert [e.key for e in await store.evidence_comments(limit=10)] == [
            "lease-3:evidence", "run-2:evidence", "lease-1:evidence"]
        assert [e.key for e in await store.evidence_comments(limit=1)] == ["lease-3:evidence"]
    finally:
        await db.close()


async def test_store_reads_comment_statuses_by_key_prefix_with_no_wildcards(open_db: DbOpener, tmp_path: Path) -> None:
    """A prefix is matched as text: ``_`` and ``%`` in it match only themselves."""
    db = await open_db(tmp_path / "foreman.db")
    try:
        store = OutboxStore(db)
        for key in ("auto-proof:1:0", "auto-proof:1:1", "auto-proof:12:0", "auto-proofX1:0", "a_b:0", "axb:0"):
            await store.add(comment_intent(key))
        await store.add(of_repo("auto-proof:1:labels", 1, "labels", {"add": ["y"]}))
        [first, *_] = await store.due_heads(claim_ttl_s=60, limit=10)
        claimed = await store.claim(first, "s")
        assert claimed is not None and await store.complete(claimed, {"comment_id": 1})
        assert await store.comment_statuses("auto-proof:1:", repo=KEY) == ["done", "pending"]
        assert await store.comment_statuses("a_b:", repo=KEY) == ["pending"]
        assert await store.comment_statuses("auto-proof:9:", repo=KEY) == []
    finally:
        await db.close()


async def test_store_counts_an_issues_entries_until_sent_and_hooked(open_db: DbOpener, tmp_path: Path) -> None:
    """An entry is settled only when it is done AND its completion hook ran; other issues do not count."""
    db = await open_db(tmp_path / "foreman.db")
    try:
        store = OutboxStore(db)
        await store.add(comment_intent("k:1", 1))
        await store.add(comment_intent("k:2", 2))
        assert (await store.unsettled_for_issue(1), await store.unsettled_for_issue(3)) == (1, 0)
        [first] = [e for e in await store.due_heads(claim_ttl_s=60, limit=10) if e.issue_number == 1]
        claimed = await store.claim(first, "s")
        assert claimed is not None and await store.complete(claimed, {"comment_id": 1})
        assert await store.unsettled_for_issue(1) == 1  # sent, but its hook has not run
        await store.mark_hooked(claimed.id)
        assert (await store.unsettled_for_issue(1), await store.unsettled_for_issue(2)) == (0, 1)
    finally:
        await db.close()


def _requests(rig: Rig, method: str, route: str) -> int:
    return sum(1 for r in rig.live.emulator.requests
               if r.method == method and r.route is not None and r.route.removeprefix("/api/v1") == route)


async def test_a_first_send_posts_without_listing_the_issues_comments(rig: Rig) -> None:
    """Nothing can carry the marker of an entry never sent before: its first send posts at once (no listing of
    every comment of the issue), and still reads the comment back."""
    await rig.store.add(comment_intent("first-1"))
    await rig.drain()
    entry = await rig.entry("first-1")
    assert entry.status == "done" and entry.attempts == 1 and entry.result is not None
    assert (_requests(rig, "GET", COMMENTS), _requests(rig, "POST", COMMENTS), _requests(rig, "GET", COMMENT)) == (
        0, 1, 1)


async def test_an_operator_retry_adopts_the_comment_an_earlier_attempt_posted(rig: Rig) -> None:
    """An operator's retry starts the attempts again from 0, but the entry was sent before: the retry lists the
    issue's comments and adopts the one posted, instead of posting a second."""
    rig.live.emulator.faults.alter_stored("POST", COMMENTS, times=1)
    rig.live.emulator.faults.alter_stored("PATCH", COMMENT, times=5)
    await rig.store.add(comment_intent("retried-1"))
    await rig.drain()
    failed = await rig.entry("retried-1")
    assert failed.status == "verification_failed"
    rig.live.emulator.faults.clear()
    await rig.store.retry(failed.id)
    await rig.drain()
    entry = await rig.entry("retried-1")
    assert entry.status == "done" and entry.result is not None and entry.result["adopted"] is True
    assert len(rig.bodies()) == 1 and _requests(rig, "POST", COMMENTS) == 1


async def test_label_ids_are_listed_once_for_many_entries_and_again_when_a_label_was_made_anew(rig: Rig) -> None:
    """The repository's label ids serve the next entries without a listing; a label deleted and made again
    (a new id, which Gitea ignores when it is added by the old one) is read again and the change verifies."""
    for n, key, name in ((1, "ids-1", "bug"), (2, "ids-2", "status/ready")):
        await rig.store.add(of_repo(key, n, "labels", {"add": [name], "remove": []}))
        await rig.drain()
        assert (await rig.entry(key)).status == "done"
    assert _requests(rig, "GET", "/repos/{owner}/{repo}/labels") == 1
    rig.live.emulator.delete_label(OWNER, REPO, "bug")
    rig.live.emulator.create_label(OWNER, REPO, "bug", color="#00aa00")
    await rig.store.add(of_repo("ids-3", 1, "labels", {"add": ["bug"], "remove": []}))
    await rig.drain()
    entry = await rig.entry("ids-3")
    assert entry.status == "done" and rig.live.emulator.label_names(OWNER, REPO, 1) == ["bug"]
    assert _requests(rig, "GET", "/repos/{owner}/{repo}/labels") == 2
