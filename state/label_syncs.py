"""Label-sync records: a held sync, a queued outbox label change, and what became of it."""

from __future__ import annotations

import json
from collections.abc import Sequence

from bot.core.canonical import CanonicalState, parse_comment
from bot.core.issue_state import (
    IssueSnapshot,
    LabelSync,
    SyncOutcome,
    SyncPlan,
    label_sync_key,
    project_labels,
    sync_change,
)
from bot.core.vocabulary import is_status_label
from state.outbox import OutboxIntent, enqueue
from state.sql import Connection, Row


async def plan_sync(
    conn: Connection,
    snapshot: IssueSnapshot,
    record_id: int,
    state: CanonicalState,
    plan: SyncPlan,
    cause: str,
    now: str,
) -> None:
    """Record a held sync, or queue the label change the state needs (outbox entry + ``queued`` row).

    The plan is made against the stored labels with the outbox's still-open label entries applied, so a
    change already on its way is not queued again, and one that an open entry would undo is queued after it.
    A state older than a Canonical Issue State still queued in the outbox queues nothing: a ``held`` row says
    which entry's state it yields to (that entry's completion plans the sync of the newer state).
    """
    assert plan.target is not None
    labels_before = json.dumps(snapshot.label_names)
    if plan.status == "held":
        await _insert_held(conn, snapshot, record_id, plan.target, "two status labels at once", labels_before, cause,
                           now)
        return
    async with conn.execute(
        "SELECT payload_json FROM outbox WHERE repo = ? AND issue_number = ? AND kind = 'labels'"
        " AND status IN ('pending', 'sending') ORDER BY id",
        (snapshot.repo, snapshot.number),
    ) as cur:
        open_changes = [json.loads(row[0]) for row in await cur.fetchall()]
    projected = project_labels(snapshot.label_names, open_changes)
    if [name for name in projected if is_status_label(name)] == [plan.target]:
        return  # in sync, or an open outbox entry will make it so
    newer = await _newer_queued_state(conn, snapshot.repo, snapshot.number)
    if newer is not None:
        # Never act on a state older than one already queued: the change would be undone by that state's own sync.
        newer_key, newer_state = newer
        reason = (f"a newer state is queued: STATE {state.state} is older than STATE {newer_state.state} in outbox"
                  f" entry {newer_key}, whose own label sync follows once it is sent")
        await _insert_held(conn, snapshot, record_id, plan.target, reason, labels_before, cause, now)
        return
    key = label_sync_key(
        snapshot.repo,
        snapshot.number,
        record_id,
        plan.target,
        [snapshot.label_names, snapshot.snapshot_as_of, projected],
    )
    change = sync_change(plan.target, snapshot.label_names, projected)
    if not await enqueue(conn, OutboxIntent(key, snapshot.number, "labels", change, cause, repo=snapshot.repo)):
        return  # this cause was handled before (a retried or replayed delivery)
    reason = f"STATE {state.state} is mirrored by {plan.target}; queued as outbox entry {key}"
    cursor = await conn.execute(
        "INSERT INTO issue_label_syncs (repo, number, state_record_id, target_label, outcome, reason,"
        " labels_before_json, outbox_key, delivery_id, recorded_at) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (snapshot.repo, snapshot.number, record_id, plan.target, reason, labels_before, key, cause, now),
    )
    await cursor.close()


async def _newer_queued_state(conn: Connection, repo: str, number: int) -> tuple[str, CanonicalState] | None:
    """The latest Canonical Issue State still waiting in the outbox for this repository's issue (key, state), if
    any (another repository's issue of the same number has its own states).

    The outbox sends one issue's entries in order, so a state comment still to be sent lands after whatever
    caused this sync (a bot comment just sent, a person's comment or label change already on Gitea) and
    becomes the current state."""
    async with conn.execute(
        "SELECT idempotency_key, payload_json FROM outbox WHERE repo = ? AND issue_number = ?"
        " AND kind IN ('comment', 'edit_comment') AND status IN ('pending', 'sending') ORDER BY id DESC",
        (repo, number),
    ) as cur:
        rows = await cur.fetchall()
    for key, payload in rows:
        queued = parse_comment(str(json.loads(payload).get("body") or "")).current
        if queued is not None:
            return str(key), queued
    return None


async def _insert_held(
    conn: Connection,
    snapshot: IssueSnapshot,
    record_id: int,
    target: str,
    reason: str,
    labels_before: str,
    cause: str,
    now: str,
) -> None:
    """A sync that queues nothing, with why (one row per state record and label set)."""
    cursor = await conn.execute(
        "INSERT INTO issue_label_syncs (repo, number, state_record_id, target_label, outcome, reason,"
        " labels_before_json, delivery_id, recorded_at) VALUES (?, ?, ?, ?, 'held', ?, ?, ?, ?)"
        " ON CONFLICT DO NOTHING",
        (snapshot.repo, snapshot.number, record_id, target, reason, labels_before, cause, now),
    )
    await cursor.close()


async def queued_sync(conn: Connection, key: str) -> Row | None:
    async with conn.execute(
        "SELECT * FROM issue_label_syncs WHERE outbox_key = ? AND outcome = 'queued'", (key,)
    ) as cur:
        row: Row | None = await cur.fetchone()
    return row


async def insert_sync(
    conn: Connection,
    queued: Row,
    *,
    outcome: SyncOutcome,
    reason: str,
    labels_after: Sequence[str] | None,
    source: str,
    now: str,
) -> None:
    """Record what became of a queued sync's outbox entry (once per entry and outcome)."""
    cursor = await conn.execute(
        "INSERT INTO issue_label_syncs (repo, number, state_record_id, target_label, outcome, reason,"
        " labels_before_json, labels_after_json, outbox_key, delivery_id, recorded_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        (
            queued["repo"],
            queued["number"],
            queued["state_record_id"],
            queued["target_label"],
            outcome,
            reason,
            queued["labels_before_json"],
            None if labels_after is None else json.dumps(list(labels_after)),
            queued["outbox_key"],
            source,
            now,
        ),
    )
    await cursor.close()


async def failed_sync(
    conn: Connection, snapshot: IssueSnapshot, record_id: int, target: str
) -> LabelSync | None:
    """``label_missing`` or ``failed`` when the latest settled sync of this state record and target failed."""
    async with conn.execute(
        "SELECT outcome FROM issue_label_syncs WHERE repo = ? AND number = ? AND state_record_id = ?"
        " AND target_label = ? AND outcome IN ('applied', 'label_missing', 'failed') ORDER BY id DESC LIMIT 1",
        (snapshot.repo, snapshot.number, record_id, target),
    ) as cur:
        row = await cur.fetchone()
    if row is None or row[0] == "applied":
        return None
    return "label_missing" if row[0] == "label_missing" else "failed"
