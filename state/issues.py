"""Each issue's Canonical Issue State with its history: comment records, label snapshots, blockers, label syncs.

Ordering rules (the pure functions below are the single source of truth; SQLite only stores their inputs):

* A comment's **effective revision** is its deletion record if one exists (comment ids are never reused),
  else the revision with the latest ``(comment updated_at, edited-after-created, record id)``: an edit
  replaces that comment's block, whatever order the deliveries arrived in.
* The issue's **current state** is the valid block of the effective revision of the comment that is
  latest in Gitea's comment order ``(comment created_at, comment id)`` among those whose author was
  trusted. Arrival order never matters, so a late delivery of an older comment cannot override a newer one,
  and deleting the comment that counts falls back to the previous trusted block.
* The issue's **snapshot** (labels, open/closed) is replaced only by a payload whose ``issue.updated_at`` is
  not older than the stored one; an older one is kept in the history with ``applied = 0``.

Every write happens in one ``BEGIN IMMEDIATE`` transaction, guarded by unique indexes and by
``UPDATE issues ... WHERE version = ?``, so concurrent workers cannot interleave a lost update.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import aiosqlite

from bot.core.canonical import CanonicalState, ParseResult
from bot.core.vocabulary import is_status_label, label_for_state
from state.db import Database, to_db_time, utcnow

CommentAction = Literal["created", "edited", "deleted"]
LabelSync = Literal["no_state", "in_sync", "held", "pending", "label_missing"]
SyncOutcome = Literal["applied", "pending", "held", "label_missing"]

CONFLICTING_STATUS_LABELS = "conflicting_status_labels"
READY_LABEL = label_for_state("ready")
_ACTION_RANK: dict[str, int] = {"created": 0, "edited": 1, "deleted": 2}


class ConcurrentUpdate(RuntimeError):
    """The issue row changed between read and write; the caller (the worker) retries the delivery."""


def gitea_time(text: str) -> str:
    """An RFC 3339 time from Gitea (with a zone offset, or ``Z``) as the stored fixed-width UTC text."""
    return to_db_time(datetime.fromisoformat(text.replace("Z", "+00:00")))


def repo_key(full_name: str) -> str:
    """Repositories are keyed by ``owner/name`` in lower case (Gitea names are case-insensitive)."""
    return full_name.lower()


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class IssueLabel:
    """A label on an issue, as Gitea identifies it (removal by id needs the id)."""

    id: int
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name}


@dataclass(frozen=True, slots=True)
class IssueObservation:
    """What a payload's ``issue`` object says: open or closed, the full label set, and as of when."""

    number: int
    is_open: bool
    labels: tuple[IssueLabel, ...]
    updated_at: str | None  # stored form (gitea_time); None when the payload has none (then arrival order)

    @classmethod
    def from_payload(cls, issue: dict[str, Any]) -> IssueObservation:
        labels = tuple(IssueLabel(int(item["id"]), str(item["name"])) for item in issue.get("labels") or [])
        return cls(
            number=int(issue["number"]),
            is_open=issue.get("state", "open") != "closed",
            labels=sorted_labels(labels),
            updated_at=gitea_time(str(issue["updated_at"])) if issue.get("updated_at") else None,
        )


@dataclass(frozen=True, slots=True)
class Trust:
    """Whether a comment's author may set the state, and why. ``trusted`` is None when there was no block."""

    trusted: bool | None
    reason: str


NO_BLOCK = Trust(None, "no_block")


@dataclass(frozen=True, slots=True)
class CommentObservation:
    """One issue_comment event, reduced to what the history keeps."""

    repo: str
    number: int
    comment_id: int
    action: CommentAction
    author: str
    created_at: str  # stored form
    updated_at: str  # stored form
    delivery_id: str
    body_sha256: str
    parsed: ParseResult | None  # None for a deletion
    trust: Trust

    @staticmethod
    def body_hash(body: str) -> str:
        return hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class CommentRecord:
    """One stored evaluation of one revision of one comment (a row of ``issue_comment_records``)."""

    id: int
    comment_id: int
    action: CommentAction
    author: str
    created_at: str
    updated_at: str
    trusted: bool | None
    trust_reason: str
    state: CanonicalState | None
    delivery_id: str = ""
    block_count: int = 0
    errors: tuple[dict[str, Any], ...] = ()
    superseded_by: int | None = None
    recorded_at: str = ""

    @property
    def counts(self) -> bool:
        """Whether this revision, if effective, can be the issue's state: trusted and valid."""
        return self.action != "deleted" and self.trusted is True and self.state is not None


@dataclass(frozen=True, slots=True)
class IssueSnapshot:
    """The issues row: current state and the last known labels and status."""

    repo: str
    number: int
    is_open: bool | None
    labels: tuple[IssueLabel, ...] | None
    snapshot_as_of: str | None
    state: CanonicalState | None
    state_record_id: int | None
    state_comment_id: int | None
    candidate: bool
    label_sync: LabelSync
    version: int
    open_blockers: tuple[str, ...] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(label.name for label in self.labels or ())

    @property
    def status_labels(self) -> tuple[str, ...]:
        return tuple(name for name in self.label_names if is_status_label(name))


@dataclass(frozen=True, slots=True)
class IssueEventResult:
    """What one issues event changed."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    applied: bool
    first_snapshot: bool
    made_candidate: bool
    duplicate: bool
    snapshot: IssueSnapshot


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What label sync should do for a snapshot: nothing, hold, or add ``target`` and remove ``remove``."""

    status: LabelSync
    target: str | None = None
    remove: tuple[str, ...] = field(default=())

    @property
    def needs_change(self) -> bool:
        return self.status == "pending"


# --------------------------------------------------------------------------- pure rules


def _revision_key(record: CommentRecord) -> tuple[int, str, int, int]:
    if record.action == "deleted":
        # A deletion wins over every revision; among repeated deletions the first recorded one stands.
        return (1, "", 0, -record.id)
    # Same updated_at (Gitea keeps whole seconds): an edit is newer than the creation, then arrival order.
    return (0, record.updated_at, _ACTION_RANK[record.action], record.id)


def effective_revisions(records: Iterable[CommentRecord]) -> dict[int, CommentRecord]:
    """Per comment id, the revision that stands (see the module docstring), whatever the arrival order."""
    best: dict[int, CommentRecord] = {}
    for record in records:
        held = best.get(record.comment_id)
        if held is None or _revision_key(record) > _revision_key(held):
            best[record.comment_id] = record
    return best


def current_record(records: Iterable[CommentRecord]) -> CommentRecord | None:
    """The record whose block is the issue's current state, or None: the latest trusted valid block.

    Latest means Gitea's comment order ``(created_at, comment id)``, never arrival order; each comment is
    represented by its effective revision, so edits replace and deletions withdraw that comment's block.
    """
    standing = [record for record in effective_revisions(records).values() if record.counts]
    if not standing:
        return None
    return max(standing, key=lambda record: (record.created_at, record.comment_id))


def plan_label_sync(state: CanonicalState | None, labels: Sequence[str] | None, *, conflict: bool) -> SyncPlan:
    """Whether the labels mirror ``state`` with exactly one ``status:*`` label, and what to change if not.

    Two or more status labels are a conflict for the controller: sync holds off rather than guess.
    """
    if state is None:
        return SyncPlan("no_state")
    target = label_for_state(state.state)
    status = [name for name in labels or () if is_status_label(name)]
    if conflict or len(status) > 1:
        return SyncPlan("held", target)
    if status == [target]:
        return SyncPlan("in_sync", target)
    return SyncPlan("pending", target, tuple(name for name in status if name != target))


def diff_labels(before: Iterable[str], after: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(added, removed) label names, each sorted."""
    old, new = set(before), set(after)
    return tuple(sorted(new - old)), tuple(sorted(old - new))


def _not_older(issue: IssueObservation, snapshot: IssueSnapshot) -> bool:
    """Whether a payload's issue may replace the stored snapshot (same second: arrival order decides)."""
    return issue.updated_at is None or snapshot.snapshot_as_of is None or issue.updated_at >= snapshot.snapshot_as_of


def sorted_labels(labels: Iterable[IssueLabel]) -> tuple[IssueLabel, ...]:
    """Labels in Gitea's order (by name), without repeats."""
    return tuple(sorted(set(labels), key=lambda label: (label.name, label.id)))


# --------------------------------------------------------------------------- the store


def _labels_json(labels: Iterable[IssueLabel]) -> str:
    return json.dumps([label.to_dict() for label in labels], sort_keys=True)


def _labels_from_json(text: str | None) -> tuple[IssueLabel, ...] | None:
    if text is None:
        return None
    return tuple(IssueLabel(int(item["id"]), str(item["name"])) for item in json.loads(text))


def _record_from_row(row: sqlite3.Row) -> CommentRecord:
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

    # --- reads -----------------------------------------------------------------------------------------
    async def snapshot(self, repo: str, number: int) -> IssueSnapshot | None:
        return await self._snapshot(self._db.reader, repo_key(repo), number)

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

    # --- writes ----------------------------------------------------------------------------------------
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
            return await self._set_state(conn, snapshot, current_record(records), now)

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
            applied = _not_older(issue, before)
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
                snapshot = await self._set_state(conn, snapshot, None, now, keep_state=True)
            return IssueEventResult(added, removed, applied, first, made_candidate, False, snapshot)

    async def record_sync(
        self,
        snapshot: IssueSnapshot,
        *,
        plan: SyncPlan,
        outcome: SyncOutcome,
        reason: str,
        delivery_id: str,
        after: IssueObservation | None = None,
    ) -> IssueSnapshot:
        """Record what label sync did; with ``after`` (Gitea's view after the change) store that snapshot."""
        assert snapshot.state_record_id is not None and plan.target is not None
        repo, now = snapshot.repo, to_db_time(utcnow())
        async with self._db.transaction() as conn:
            cursor = await conn.execute(
                "INSERT INTO issue_label_syncs (repo, number, state_record_id, target_label, outcome, reason,"
                " labels_before_json, labels_after_json, delivery_id, recorded_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (repo, number, state_record_id, outcome, labels_before_json) DO NOTHING",
                (
                    repo,
                    snapshot.number,
                    snapshot.state_record_id,
                    plan.target,
                    outcome,
                    reason,
                    json.dumps(snapshot.label_names),
                    None if after is None else json.dumps([label.name for label in after.labels]),
                    delivery_id,
                    now,
                ),
            )
            await cursor.close()
            current = await self._snapshot(conn, repo, snapshot.number)
            assert current is not None
            if after is not None and _not_older(after, current):
                current = await self._apply_observation(conn, current, after, delivery_id, now)
            failed: LabelSync | None = "label_missing" if outcome == "label_missing" else None
            return await self._set_state(conn, current, None, now, keep_state=True, failed_sync=failed)

    # --- internals -------------------------------------------------------------------------------------
    async def _ensure_issue(self, conn: aiosqlite.Connection, repo: str, number: int, now: str) -> None:
        await conn.execute(
            "INSERT INTO issues (repo, number, created_at, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (repo, number) DO NOTHING",
            (repo, number, now, now),
        )

    async def _records(self, conn: aiosqlite.Connection, repo: str, number: int) -> list[CommentRecord]:
        async with conn.execute(
            f"SELECT {_RECORD_COLUMNS} FROM issue_comment_records"  # noqa: S608
            " WHERE repo = ? AND number = ? ORDER BY id",
            (repo, number),
        ) as cur:
            return [_record_from_row(row) for row in await cur.fetchall()]

    async def _snapshot(self, conn: aiosqlite.Connection, repo: str, number: int) -> IssueSnapshot | None:
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
        self, conn: aiosqlite.Connection, snapshot: IssueSnapshot, issue: IssueObservation, source: str, now: str
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
        cursor = await conn.execute(
            "UPDATE issues SET is_open = ?, labels_json = ?, snapshot_as_of = ?, candidate = ?,"
            " candidate_since = CASE WHEN ? = 0 THEN NULL WHEN candidate = 1 THEN candidate_since ELSE ? END,"
            " updated_at = ?, version = version + 1 WHERE repo = ? AND number = ? AND version = ?",
            (
                int(issue.is_open),
                _labels_json(issue.labels),
                issue.updated_at or snapshot.snapshot_as_of,
                int(candidate),
                int(candidate),
                now,
                now,
                snapshot.repo,
                snapshot.number,
                snapshot.version,
            ),
        )
        if cursor.rowcount != 1:
            raise ConcurrentUpdate(f"issue {snapshot.repo}#{snapshot.number} changed while storing its labels")
        await cursor.close()
        fresh = await self._snapshot(conn, snapshot.repo, snapshot.number)
        assert fresh is not None
        return fresh

    async def _set_state(
        self,
        conn: aiosqlite.Connection,
        snapshot: IssueSnapshot,
        record: CommentRecord | None,
        now: str,
        *,
        keep_state: bool = False,
        failed_sync: LabelSync | None = None,
    ) -> IssueSnapshot:
        """Store the current state (unless ``keep_state``) and the label-sync status it implies."""
        state = snapshot.state if keep_state else (None if record is None else record.state)
        record_id = snapshot.state_record_id if keep_state else (None if record is None else record.id)
        comment_id = snapshot.state_comment_id if keep_state else (None if record is None else record.comment_id)
        conflict = CONFLICTING_STATUS_LABELS in snapshot.open_blockers
        plan = plan_label_sync(state, snapshot.label_names, conflict=conflict)
        sync: LabelSync = failed_sync if (failed_sync is not None and plan.needs_change) else plan.status
        cursor = await conn.execute(
            "UPDATE issues SET state_record_id = ?, state_comment_id = ?, state_json = ?, state_label = ?,"
            " label_sync = ?, updated_at = ?, version = version + 1 WHERE repo = ? AND number = ? AND version = ?",
            (
                record_id,
                comment_id,
                None if state is None else json.dumps(state.to_dict(), sort_keys=True),
                None if state is None else label_for_state(state.state),
                sync,
                now,
                snapshot.repo,
                snapshot.number,
                snapshot.version,
            ),
        )
        if cursor.rowcount != 1:
            raise ConcurrentUpdate(f"issue {snapshot.repo}#{snapshot.number} changed while storing its state")
        await cursor.close()
        fresh = await self._snapshot(conn, snapshot.repo, snapshot.number)
        assert fresh is not None
        return fresh
