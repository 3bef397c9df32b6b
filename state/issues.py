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
  not older than the stored one; an older one is kept in the history with ``applied = 0``. The bot's own
  label changes come back as ignored webhooks, so the outbox completion hook stores their verified result.
* **Label sync** is planned inside the transaction that changes the state or the label snapshot: a needed
  change is an outbox ``labels`` entry written in that same transaction (issue 4), planned against the
  snapshot with the still-open label entries of the outbox applied on top.

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
from bot.core.vocabulary import is_status_label, label_for_state, status_labels
from state.db import Database, to_db_time, utcnow
from state.outbox import OutboxEntry, OutboxIntent, cancel_issue_entries, enqueue

CommentAction = Literal["created", "edited", "deleted"]
#: ``issues.label_sync``: whether the labels mirror the STATE. ``pending``: they do not yet, and the change is
#: in the outbox (sent by the outbox sender, or waiting there while no Gitea token is configured);
#: ``label_missing`` / ``failed``: the outbox entry for this state and label set failed (see issue_label_syncs).
LabelSync = Literal["no_state", "in_sync", "held", "pending", "label_missing", "failed"]
#: ``issue_label_syncs.outcome``: ``queued`` (an outbox entry was written), then what became of that entry
#: (``applied``, ``label_missing``, ``failed``); ``held`` (two status labels: nothing queued).
SyncOutcome = Literal["queued", "applied", "held", "label_missing", "failed"]
LABEL_SYNC_KEY_PREFIX = "label-sync:"

CONFLICTING_STATUS_LABELS = "conflicting_status_labels"
ISSUE_DELETED = "issue_deleted"
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

    @classmethod
    def from_event(cls, action: str, issue: dict[str, Any]) -> IssueObservation:
        """What an ``issues`` event says about the issue after the change.

        ``label_cleared`` lists the labels from *before* the clear (Gitea's models/issues/issue_label.go
        ``clearIssueLabels`` never reloads them, and services/webhook/notifier.go ``IssueClearLabels``
        converts that stale list; 1.22 to 1.26), so it is read as "no labels now".
        """
        observed = cls.from_payload(issue)
        if action == "label_cleared":
            return cls(observed.number, observed.is_open, (), observed.updated_at)
        return observed


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


def project_labels(names: Iterable[str], changes: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The label names after the outbox's still-open ``labels`` entries (their payloads, in order) are applied."""
    projected = set(names)
    for change in changes:
        projected |= set(change.get("add", []))
        projected -= set(change.get("remove", []))
    return tuple(sorted(projected))


def sync_change(target: str, *label_sets: Iterable[str]) -> dict[str, list[str]]:
    """The outbox ``labels`` payload that makes ``target`` the only status label.

    Every other status label is removed: the vocabulary's and any other ``status:*`` label seen in
    ``label_sets``. The sender removes only what the issue carries, so listing them all costs nothing, and an
    entry planned against a label set that an earlier entry is still changing cannot leave two status labels.
    """
    others = set(status_labels()).union(*(filter(is_status_label, names) for names in label_sets))
    return {"add": [target], "remove": sorted(others - {target})}


def label_sync_key(repo: str, number: int, record_id: int, target: str, basis: Sequence[Any]) -> str:
    """The idempotency key of the label sync for one state record, target and label basis.

    ``basis`` is what the plan was made from (the stored label set and its time, the projected set): the same
    cause processed again (a retried or replayed delivery) yields the same key, so nothing is queued twice;
    a later label change by someone else yields a new one, so the status label is put back again.
    """
    digest = hashlib.sha256(json.dumps(list(basis), sort_keys=True).encode()).hexdigest()[:16]
    return f"{LABEL_SYNC_KEY_PREFIX}{repo_key(repo)}#{number}:record-{record_id}:{target}:basis-{digest}"


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

    async def open_issues(self, repo: str) -> list[IssueSnapshot]:
        """Every issue the webhooks last saw open, in number order (the allocator's view without Gitea)."""
        async with self._db.reader.execute(
            "SELECT number FROM issues WHERE repo = ? AND is_open = 1 ORDER BY number", (repo_key(repo),)
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
            applied = _not_older(issue, before)
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
            cancelled = await cancel_issue_entries(conn, number, reason=reason, now=moment)
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
            queued = await self._queued_sync(conn, entry.key)
            if queued is not None:
                names = [label.name for label in after.labels] if after is not None else list(result.get("labels", []))
                await self._insert_sync(
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
            if after is not None and _not_older(after, current):
                current = await self._apply_observation(conn, current, after, source, now)
            return await self._set_state(conn, current, None, now, keep_state=True, cause=None)

    async def record_outbox_failure(self, repo: str, entry: OutboxEntry) -> IssueSnapshot | None:
        """An outbox label-sync entry ended ``verification_failed`` or ``parked``: record it on the issue.

        A target label that Gitea did not put on the issue (it ignores names the repository lacks) is
        ``label_missing``; anything else is ``failed``. Returns None for entries that are not label syncs.
        """
        repo, now = repo_key(repo), to_db_time(utcnow())
        async with self._db.transaction() as conn:
            queued = await self._queued_sync(conn, entry.key)
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
            await self._insert_sync(
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
            await self._plan_sync(conn, snapshot, record_id, state, plan, cause, now)
        sync: LabelSync = plan.status
        if plan.needs_change and record_id is not None and plan.target is not None:
            sync = await self._failed_sync(conn, snapshot, record_id, plan.target) or plan.status
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

    async def _plan_sync(
        self,
        conn: aiosqlite.Connection,
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
        """
        assert plan.target is not None
        labels_before = json.dumps(snapshot.label_names)
        if plan.status == "held":
            cursor = await conn.execute(
                "INSERT INTO issue_label_syncs (repo, number, state_record_id, target_label, outcome, reason,"
                " labels_before_json, delivery_id, recorded_at) VALUES (?, ?, ?, ?, 'held', ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (
                    snapshot.repo,
                    snapshot.number,
                    record_id,
                    plan.target,
                    "two status labels at once",
                    labels_before,
                    cause,
                    now,
                ),
            )
            await cursor.close()
            return
        async with conn.execute(
            "SELECT payload_json FROM outbox WHERE issue_number = ? AND kind = 'labels'"
            " AND status IN ('pending', 'sending') ORDER BY id",
            (snapshot.number,),
        ) as cur:
            open_changes = [json.loads(row[0]) for row in await cur.fetchall()]
        projected = project_labels(snapshot.label_names, open_changes)
        if [name for name in projected if is_status_label(name)] == [plan.target]:
            return  # in sync, or an open outbox entry will make it so
        key = label_sync_key(
            snapshot.repo,
            snapshot.number,
            record_id,
            plan.target,
            [snapshot.label_names, snapshot.snapshot_as_of, projected],
        )
        change = sync_change(plan.target, snapshot.label_names, projected)
        if not await enqueue(conn, OutboxIntent(key, snapshot.number, "labels", change, cause)):
            return  # this cause was handled before (a retried or replayed delivery)
        reason = f"STATE {state.state} is mirrored by {plan.target}; queued as outbox entry {key}"
        cursor = await conn.execute(
            "INSERT INTO issue_label_syncs (repo, number, state_record_id, target_label, outcome, reason,"
            " labels_before_json, outbox_key, delivery_id, recorded_at) VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            (snapshot.repo, snapshot.number, record_id, plan.target, reason, labels_before, key, cause, now),
        )
        await cursor.close()

    async def _queued_sync(self, conn: aiosqlite.Connection, key: str) -> sqlite3.Row | None:
        async with conn.execute(
            "SELECT * FROM issue_label_syncs WHERE outbox_key = ? AND outcome = 'queued'", (key,)
        ) as cur:
            row: sqlite3.Row | None = await cur.fetchone()
        return row

    async def _insert_sync(
        self,
        conn: aiosqlite.Connection,
        queued: sqlite3.Row,
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

    async def _failed_sync(
        self, conn: aiosqlite.Connection, snapshot: IssueSnapshot, record_id: int, target: str
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
