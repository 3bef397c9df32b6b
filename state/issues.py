"""The issue-state store: comment records, label snapshots, blockers and label syncs, in SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from bot.core.canonical import CanonicalState
from bot.core.issue_state import (
    CONFLICTING_STATUS_LABELS,
    ISSUE_DELETED,
    READY_LABEL,
    CommentObservation,
    CommentRecord,
    IssueEventResult,
    IssueLabel,
    IssueObservation,
    IssueSnapshot,
    LabelSync,
    SyncOutcome,
    current_record,
    diff_labels,
    effective_revisions,
    gitea_time,
    not_older,
    plan_label_sync,
    repo_key,
    sorted_labels,
)
from bot.core.vocabulary import is_status_label, label_for_state
from state.db import Database, to_db_time, utcnow
from state.label_syncs import failed_sync, insert_sync, plan_sync, queued_sync
from state.outbox import OutboxEntry, cancel_issue_entries
from state.sql import Connection, Row


class ConcurrentUpdate(RuntimeError):
    """The issue row changed between read and write; the caller (the worker) retries the delivery."""


def _labels_json(labels: Iterable[IssueLabel]) -> str:
    return json.dumps([label.to_dict() for label in labels], sort_keys=True)


def _labels_from_json(text: str | None) -> tuple[IssueLabel, ...] | None:
    if text is None:
        return None
    return tuple(IssueLabel(int(item["id"]), str(item["name"])) for item in json.loads(text))


def _record_from_row(row: Row) -> CommentRecord:
    state_json = row["state_json"]
    trusted = row["trusted"]
    return CommentRecord(
        id=row["id"],
        comment_id=row["comment_id"],
        action=row["action"],
        author=row["author"],
        created_at=row["comment_created_at"],
        updated_at=row["comment_updated_at"],
        trusted=None if trusted is None else bool(trusted),
        trust_reason=row["trust_reason"],
        state=None if state_json is None else CanonicalState.from_dict(json.loads(state_json)),
        delivery_id=row["delivery_id"],
        block_count=row["block_count"],
        errors=tuple(json.loads(row["errors_json"])),
        superseded_by=row["superseded_by"],
        recorded_at=row["recorded_at"],
    )


_RECORD_COLUMNS = (
    "id, comment_id, action, author, comment_created_at, comment_updated_at, delivery_id, block_count, trusted,"
    " trust_reason, state_json, errors_json, superseded_by, recorded_at"
)


class IssueStore:
    """The issue-state aggregate over SQLite. Histories are append-only; current values are derived."""

    def __init__(self, db: Database) -> None:
        self._db = db

    # --- reads --------------------------------------------------------------------------------------------------------
    async def snapshot(self, repo: str, number: int) -> IssueSnapshot | None:
        return await self._snapshot(self._db.reader, repo_key(repo), number)

    async def open_issues(self, repo: str) -> list[IssueSnapshot]:
        """Every issue the webhooks last saw open, in number order (the allocator's view without Gitea)."""
        async with self._db.reader.execute(
            "SELECT number FROM issues WHERE repo = ? AND is_open = 1 ORDER BY number", (repo_key(repo),)
        ) as cur:
            numbers = [row[0] for row in await cur.fetchall()]
        found = [await self.snapshot(repo, number) for number in numbers]
        return [snapshot for snapshot in found if snapshot is not None]

    async def closed_since(self, repo: str, since: str) -> list[IssueSnapshot]:
        """The issues the webhooks last saw closed whose row changed at or after ``since`` (a stored time), in number
        order (the dashboard's "done today")."""
        async with self._db.reader.execute(
            "SELECT number FROM issues WHERE repo = ? AND is_open = 0 AND updated_at >= ? ORDER BY number",
            (repo_key(repo), since),
        ) as cur:
            numbers = [row[0] for row in await cur.fetchall()]
        found = [await self.snapshot(repo, number) for number in numbers]
        return [snapshot for snapshot in found if snapshot is not None]

    async def comment_records(self, repo: str, number: int) -> list[CommentRecord]:
        """Every record of the issue's comments, in the order they were recorded."""
        return await self._records(self._db.reader, repo_key(repo), number)

    async def issue_events(self, repo: str, number: int) -> list[dict[str, Any]]:
        async with self._db.reader.execute(
            "SELECT * FROM issue_events WHERE repo = ? AND number = ? ORDER BY id", (repo_key(repo), number)
        ) as cur:
            rows = await cur.fetchall()
        out = []
        for row in rows:
            doc = dict(row)
            for key in ("labels_json", "added_json", "removed_json"):
                doc[key.removesuffix("_json")] = json.loads(doc.pop(key))
            out.append(doc)
        return out

    async def blockers(self, repo: str, number: int) -> list[dict[str, Any]]:
        async with self._db.reader.execute(
            "SELECT * FROM issue_blockers WHERE repo = ? AND number = ? ORDER BY id", (repo_key(repo), number)
        ) as cur:
            rows = await cur.fetchall()
        return [{**dict(row), "detail": json.loads(row["detail_json"])} for row in rows]

    async def label_syncs(self, repo: str, number: int) -> list[dict[str, Any]]:
        async with self._db.reader.execute(
            "SELECT * FROM issue_label_syncs WHERE repo = ? AND number = ? ORDER BY id", (repo_key(repo), number)
        ) as cur:
            return [dict(row) for row in await cur.fetchall()]

    # --- writes -------------------------------------------------------------------------------------------------------
    async def record_comment(
        self, observation: CommentObservation, issue: IssueObservation | None = None
    ) -> IssueSnapshot:
        """Append one comment revision, mark what it supersedes, and recompute the issue's state.

        ``issue`` (the payload's issue object) seeds the label set and status when none is known yet.
        A repeated (delivery, comment) pair changes nothing (a retried or replayed delivery).
        """
        repo, number = repo_key(observation.repo), observation.number
        parsed = observation.parsed
        block = None if parsed is None else parsed.current_block
        state = None if block is None else block.state
        errors = [] if parsed is None else [error.to_dict() for error in parsed.errors]
        now = to_db_time(utcnow())
        async with self._db.transaction() as conn:
            await self._ensure_issue(conn, repo, number, now)
            cursor = await conn.execute(
                "INSERT INTO issue_comment_records (repo, number, comment_id, action, author, comment_created_at,"
                " comment_updated_at, delivery_id, body_sha256, block_count, trusted, trust_reason, state_json,"
                " errors_json, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (delivery_id, comment_id) DO NOTHING",
                (
                    repo,
                    number,
                    observation.comment_id,
                    observation.action,
                    observation.author,
                    observation.created_at,
                    observation.updated_at,
                    observation.delivery_id,
                    observation.body_sha256,
                    0 if parsed is None else parsed.block_count,
                    None if observation.trust.trusted is None else int(observation.trust.trusted),
                    observation.trust.reason,
                    None if state is None else json.dumps(state.to_dict(), sort_keys=True),
                    json.dumps(errors, sort_keys=True),
                    now,
                ),
            )
            await cursor.close()
            records = await self._records(conn, repo, number)
            effective = effective_revisions(records)[observation.comment_id]
            await conn.execute(
                "UPDATE issue_comment_records SET superseded_by = ?"
                " WHERE repo = ? AND number = ? AND comment_id = ? AND id <> ? AND superseded_by IS NULL",
                (effective.id, repo, number, observation.comment_id, effective.id),
            )
            snapshot = await self._snapshot(conn, repo, number)
            assert snapshot is not None
            if issue is not None and snapshot.labels is None:
                snapshot = await self._apply_observation(conn, snapshot, issue, observation.delivery_id, now)
            return await self._set_state(conn, snapshot, current_record(records), now, cause=observation.delivery_id)

    async def record_issue_event(
        self, issue: IssueObservation, *, repo: str, action: str, sender: str, delivery_id: str
    ) -> IssueEventResult:
        """Append an issues event, diff its label set against the stored one, and apply it unless older."""
        repo = repo_key(repo)
        now = to_db_time(utcnow())
        async with self._db.transaction() as conn:
            await self._ensure_issue(conn, repo, issue.number, now)
            before = await self._snapshot(conn, repo, issue.number)
            assert before is not None
            first = before.labels is None
            applied = not_older(issue, before)
            if applied and not delivery_id.startswith("reconcile:"):
                # A view another delivery already recorded (a late webhook after catch-up, a Replay): Gitea stores
                # whole seconds, so it may look as new as the snapshot; it is history only. Catch-up's views are
                # fresh reads of Gitea and keep the usual order (a later pass corrects a same-second snapshot).
                async with conn.execute(
                    "SELECT 1 FROM issue_events WHERE repo = ? AND number = ? AND issue_updated_at = ?"
                    " AND labels_json = ? AND is_open = ? AND delivery_id <> ? LIMIT 1",
                    (repo, issue.number, issue.updated_at or now, json.dumps([label.name for label in issue.labels]),
                     int(issue.is_open), delivery_id),
                ) as cur:
                    applied = await cur.fetchone() is None
            names = [label.name for label in issue.labels]
            added, removed = diff_labels(before.label_names, names) if applied else ((), ())
            will_be_candidate = applied and issue.is_open and READY_LABEL in names
            made_candidate = will_be_candidate and not before.candidate
            cursor = await conn.execute(
                "INSERT INTO issue_events (repo, number, delivery_id, action, sender, issue_updated_at, is_open,"
                " labels_json, added_json, removed_json, first_snapshot, applied, made_candidate, recorded_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (delivery_id) DO NOTHING",
                (
                    repo,
                    issue.number,
                    delivery_id,
                    action,
                    sender,
                    issue.updated_at or now,
                    int(issue.is_open),
                    json.dumps(names),
                    json.dumps(added),
                    json.dumps(removed),
                    int(first),
                    int(applied),
                    int(made_candidate),
                    now,
                ),
            )
            inserted = cursor.rowcount == 1
            await cursor.close()
            if not inserted:
                return IssueEventResult((), (), False, False, False, True, before)
            snapshot = before
            if applied:
                snapshot = await self._apply_observation(conn, before, issue, delivery_id, now)
                snapshot = await self._set_state(conn, snapshot, None, now, keep_state=True, cause=delivery_id)
            return IssueEventResult(added, removed, applied, first, made_candidate, False, snapshot)

    async def record_issue_deleted(
        self, repo: str, number: int, *, sender: str, delivery_id: str
    ) -> tuple[int, int, bool]:
        """``issues``/``deleted`` (Gitea 1.25+): in one transaction, the event is recorded, the issue is closed
        and no candidate, an ``issue_deleted`` blocker is raised, its live leases are released
        (``issue_deleted``) and its open outbox entries cancelled. Returns (leases ended, entries cancelled,
        duplicate)."""
        from state.leases import LeaseStore

        repo = repo_key(repo)
        moment = utcnow()
        now = to_db_time(moment)
        async with self._db.transaction() as conn:
            await self._ensure_issue(conn, repo, number, now)
            cursor = await conn.execute(
                "INSERT INTO issue_events (repo, number, delivery_id, action, sender, issue_updated_at, is_open,"
                " labels_json, added_json, removed_json, first_snapshot, applied, made_candidate, recorded_at)"
                " VALUES (?, ?, ?, 'deleted', ?, ?, 0, '[]', '[]', '[]', 0, 1, 0, ?)"
                " ON CONFLICT (delivery_id) DO NOTHING",
                (repo, number, delivery_id, sender, now, now),
            )
            inserted = cursor.rowcount == 1
            await cursor.close()
            if not inserted:
                return 0, 0, True
            await conn.execute(
                "UPDATE issues SET is_open = 0, candidate = 0, candidate_since = NULL, updated_at = ?,"
                " version = version + 1 WHERE repo = ? AND number = ?",
                (now, repo, number),
            )
            await conn.execute(
                "INSERT INTO issue_blockers (repo, number, kind, detail_json, raised_at, raised_by)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (repo, number, ISSUE_DELETED, json.dumps({"sender": sender}), now, delivery_id),
            )
            leases = LeaseStore(self._db)
            ended = 0
            async with conn.execute(
                "SELECT lease_id FROM leases WHERE repo = ? AND issue_number = ? AND status = 'live'", (repo, number)
            ) as cur:
                lease_ids = [row[0] for row in await cur.fetchall()]
            for lease_id in lease_ids:
                await leases.release(conn, lease_id, actor="foreman", reason=ISSUE_DELETED, now=moment)
                ended += 1
            reason = f"{ISSUE_DELETED} by {sender}" if sender else f"{ISSUE_DELETED} (found by the outbox)"
            cancelled = await cancel_issue_entries(conn, number, reason=reason, now=moment, repo=repo)
            return ended, cancelled, False

    async def record_outbox_labels(self, repo: str, entry: OutboxEntry, result: dict[str, Any]) -> IssueSnapshot:
        """An outbox ``labels`` entry was sent and verified: store the label set Gitea holds now.

        The bot's own label webhooks are recorded as ``ignored_self`` and never reach the handlers, so without
        this the stored snapshot would go stale. For a label-sync entry the sync is recorded ``applied`` (with
        the labels after). The snapshot is replaced only if the read-back is not older than it (a person's
        later change, already stored, stands). Nothing new is planned here: only the state and people's label
        changes cause syncs, so the bot never answers its own label changes.
        """
        repo, number, now = repo_key(repo), entry.issue_number, to_db_time(utcnow())
        source = f"outbox:{entry.key}"
        after: IssueObservation | None = None
        if isinstance(result.get("issue_labels"), list):
            stamp = result.get("issue_updated_at")
            after = IssueObservation(
                number=number,
                is_open=bool(result.get("issue_open", True)),
                labels=sorted_labels(IssueLabel(int(item["id"]), str(item["name"])) for item in result["issue_labels"]),
                updated_at=gitea_time(str(stamp)) if stamp else None,
            )
        async with self._db.transaction() as conn:
            await self._ensure_issue(conn, repo, number, now)
            queued = await queued_sync(conn, entry.key)
            if queued is not None:
                names = [label.name for label in after.labels] if after is not None else list(result.get("labels", []))
                await insert_sync(
                    conn,
                    queued,
                    outcome="applied",
                    reason=f"outbox entry {entry.id} sent and verified",
                    labels_after=names,
                    source=source,
                    now=now,
                )
            current = await self._snapshot(conn, repo, number)
            assert current is not None
            if after is not None and not_older(after, current):
                current = await self._apply_observation(conn, current, after, source, now)
            return await self._set_state(conn, current, None, now, keep_state=True, cause=None)

    async def record_outbox_failure(self, repo: str, entry: OutboxEntry) -> IssueSnapshot | None:
        """An outbox label-sync entry ended ``verification_failed`` or ``parked``: record it on the issue.

        A target label that Gitea did not put on the issue (it ignores names the repository lacks) is
        ``label_missing``; anything else is ``failed``. Returns None for entries that are not label syncs.
        """
        repo, now = repo_key(repo), to_db_time(utcnow())
        async with self._db.transaction() as conn:
            queued = await queued_sync(conn, entry.key)
            if queued is None:
                return None
            observed = entry.observed.get("observed") if isinstance(entry.observed, dict) else None
            target = str(queued["target_label"])
            if entry.status == "verification_failed" and isinstance(observed, list) and target not in observed:
                outcome: SyncOutcome = "label_missing"
                reason = f"the repository has no label {target} (outbox entry {entry.id} failed verification)"
            else:
                outcome = "failed"
                reason = f"outbox entry {entry.id} {entry.status}: {entry.last_error or ''}".strip()[:500]
            await insert_sync(
                conn,
                queued,
                outcome=outcome,
                reason=reason,
                labels_after=observed if isinstance(observed, list) else None,
                source=f"outbox:{entry.key}",
                now=now,
            )
            current = await self._snapshot(conn, repo, entry.issue_number)
            if current is None:
                return None
            return await self._set_state(conn, current, None, now, keep_state=True, cause=None)

    # --- internals ----------------------------------------------------------------------------------------------------
    async def _ensure_issue(self, conn: Connection, repo: str, number: int, now: str) -> None:
        await conn.execute(
            "INSERT INTO issues (repo, number, created_at, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (repo, number) DO NOTHING",
            (repo, number, now, now),
        )

    async def _records(self, conn: Connection, repo: str, number: int) -> list[CommentRecord]:
        async with conn.execute(
            f"SELECT {_RECORD_COLUMNS} FROM issue_comment_records"  # noqa: S608
            " WHERE repo = ? AND number = ? ORDER BY id",
            (repo, number),
        ) as cur:
            return [_record_from_row(row) for row in await cur.fetchall()]

    async def _snapshot(self, conn: Connection, repo: str, number: int) -> IssueSnapshot | None:
        async with conn.execute("SELECT * FROM issues WHERE repo = ? AND number = ?", (repo, number)) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        async with conn.execute(
            "SELECT kind FROM issue_blockers WHERE repo = ? AND number = ? AND resolved_at IS NULL ORDER BY kind",
            (repo, number),
        ) as cur:
            blockers = tuple(blocker[0] for blocker in await cur.fetchall())
        state_json = row["state_json"]
        return IssueSnapshot(
            repo=row["repo"],
            number=row["number"],
            is_open=None if row["is_open"] is None else bool(row["is_open"]),
            labels=_labels_from_json(row["labels_json"]),
            snapshot_as_of=row["snapshot_as_of"],
            state=None if state_json is None else CanonicalState.from_dict(json.loads(state_json)),
            state_record_id=row["state_record_id"],
            state_comment_id=row["state_comment_id"],
            candidate=bool(row["candidate"]),
            label_sync=row["label_sync"],
            version=row["version"],
            open_blockers=blockers,
        )

    async def _apply_observation(
        self, conn: Connection, snapshot: IssueSnapshot, issue: IssueObservation, source: str, now: str
    ) -> IssueSnapshot:
        """Store a newer label set and status; raise or resolve the conflicting-status-labels blocker."""
        names = [label.name for label in issue.labels]
        status = sorted(name for name in names if is_status_label(name))
        if len(status) > 1:
            detail = json.dumps({"labels": status})
            await conn.execute(
                "INSERT INTO issue_blockers (repo, number, kind, detail_json, raised_at, raised_by)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (snapshot.repo, snapshot.number, CONFLICTING_STATUS_LABELS, detail, now, source),
            )
        else:
            await conn.execute(
                "UPDATE issue_blockers SET resolved_at = ?, resolved_by = ?"
                " WHERE repo = ? AND number = ? AND kind = ? AND resolved_at IS NULL",
                (now, source, snapshot.repo, snapshot.number, CONFLICTING_STATUS_LABELS),
            )
        candidate = issue.is_open and READY_LABEL in names
        return await self._update(
            conn,
            snapshot,
            "is_open = ?, labels_json = ?, snapshot_as_of = ?, candidate = ?,"
            " candidate_since = CASE WHEN ? = 0 THEN NULL WHEN candidate = 1 THEN candidate_since ELSE ? END,"
            " updated_at = ?",
            (
                int(issue.is_open),
                _labels_json(issue.labels),
                issue.updated_at or snapshot.snapshot_as_of,
                int(candidate),
                int(candidate),
                now,
                now,
            ),
            "labels",
        )

    async def _update(
        self, conn: Connection, snapshot: IssueSnapshot, assignments: str, values: tuple[Any, ...], what: str
    ) -> IssueSnapshot:
        """One conditional write of the issue's row (its version must still be the snapshot's), read back."""
        cursor = await conn.execute(
            # Only this module's constant assignments are spliced in; every value is a parameter.
            f"UPDATE issues SET {assignments}, version = version + 1"  # noqa: S608
            " WHERE repo = ? AND number = ? AND version = ?",
            (*values, snapshot.repo, snapshot.number, snapshot.version),
        )
        if cursor.rowcount != 1:
            raise ConcurrentUpdate(f"issue {snapshot.repo}#{snapshot.number} changed while storing its {what}")
        await cursor.close()
        fresh = await self._snapshot(conn, snapshot.repo, snapshot.number)
        assert fresh is not None
        return fresh

    async def _set_state(
        self,
        conn: Connection,
        snapshot: IssueSnapshot,
        record: CommentRecord | None,
        now: str,
        *,
        keep_state: bool = False,
        cause: str | None,
    ) -> IssueSnapshot:
        """Store the current state (unless ``keep_state``) and the label-sync status it implies.

        With a ``cause`` (the delivery that changed the state or the labels), the label sync is planned too:
        a held sync is recorded, a needed change is queued in the outbox in this same transaction.
        """
        state = snapshot.state if keep_state else (None if record is None else record.state)
        record_id = snapshot.state_record_id if keep_state else (None if record is None else record.id)
        comment_id = snapshot.state_comment_id if keep_state else (None if record is None else record.comment_id)
        conflict = CONFLICTING_STATUS_LABELS in snapshot.open_blockers
        plan = plan_label_sync(state, snapshot.label_names, conflict=conflict)
        if cause is not None and state is not None and record_id is not None:
            await plan_sync(conn, snapshot, record_id, state, plan, cause, now)
        sync: LabelSync = plan.status
        if plan.needs_change and record_id is not None and plan.target is not None:
            sync = await failed_sync(conn, snapshot, record_id, plan.target) or plan.status
        return await self._update(
            conn,
            snapshot,
            "state_record_id = ?, state_comment_id = ?, state_json = ?, state_label = ?, label_sync = ?,"
            " updated_at = ?",
            (
                record_id,
                comment_id,
                None if state is None else json.dumps(state.to_dict(), sort_keys=True),
                None if state is None else label_for_state(state.state),
                sync,
                now,
            ),
            "state",
        )
