"""The outbox: every Gitea mutation the bot intends, stored in the same transaction as its cause, then sent.

The intent itself (``OutboxIntent``, its kinds and its validation) is a pure value of the core
(``bot.core.intents``); this module stores it and hands the names on, as every store's face does."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from bot.core.intents import KINDS, OutboxInputError, OutboxIntent, OutboxKind
from state.db import Database, from_row, note_commit, to_db_time, utcnow
from state.sql import Connection, Row

__all__ = [
    "KINDS", "OUTBOX_STATUSES", "OUTBOX_TOPIC", "OutboxEntry", "OutboxInputError", "OutboxIntent", "OutboxKind",
    "OutboxRepositoryUnknown", "OutboxStatus", "OutboxStore", "cancel_issue_entries", "enqueue", "filing_repo",
]

OutboxStatus = Literal["pending", "sending", "done", "verification_failed", "parked"]
OUTBOX_STATUSES: tuple[OutboxStatus, ...] = ("pending", "sending", "done", "verification_failed", "parked")


#: What a transaction that stored an outbox entry announces when it commits; the sender listens for it.
OUTBOX_TOPIC = "outbox"


class OutboxRepositoryUnknown(OutboxInputError):
    """An intent that names no repository (``OutboxIntent.repo``, or ``repo=`` where it is stored)."""


def filing_repo(intent: OutboxIntent, repo: str | None = None) -> str:
    """The repository an entry is filed under: ``repo`` when the caller stores it for one, else the intent's own;
    refused (OutboxRepositoryUnknown) when neither names one, before anything is stored (never filed under
    whichever repository happens to be first)."""
    chosen = repo if repo is not None else intent.repo
    if not chosen:
        raise OutboxRepositoryUnknown(
            f"outbox intent {intent.key!r} names no repository: build it with repo= (the repository key of the "
            "door, lease, transition or grant it comes from)"
        )
    return chosen


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    id: int
    key: str
    issue_number: int
    kind: OutboxKind
    payload: dict[str, Any]
    status: OutboxStatus
    attempts: int
    next_attempt_at: str | None
    result: dict[str, Any] | None
    observed: Any
    last_error: str | None
    delivery_id: str | None
    created_at: str
    sent_at: str | None
    version: int
    #: The repository's key ("" for an entry stored before entries were filed by repository: the first one's).
    repo: str = ""

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "key": self.key,
            "issue": self.issue_number,
            "kind": self.kind,
            "status": self.status,
            "attempts": self.attempts,
            "next_attempt_at": self.next_attempt_at,
            "result": self.result,
            "observed": self.observed,
            "last_error": self.last_error,
            "delivery": self.delivery_id,
            "created_at": self.created_at,
            "sent_at": self.sent_at,
            "repo": self.repo,
        }


_COLUMNS = (
    "id, idempotency_key, issue_number, kind, payload_json, status, attempts, next_attempt_at, result_json,"
    " observed_json, last_error, delivery_id, created_at, sent_at, version, repo"
)


def _entry(row: Row) -> OutboxEntry:
    return from_row(OutboxEntry, row, key=row["idempotency_key"], payload=json.loads(row["payload_json"]),
                    result=_loads(row["result_json"]), observed=_loads(row["observed_json"]))


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


async def enqueue(
    conn: Connection, intent: OutboxIntent, *, now: datetime | None = None, repo: str | None = None
) -> bool:
    """Store an intent INSIDE the caller's open transaction (so it commits or rolls back with its cause).

    Returns False when the idempotency key is already stored for the repository: processing the same cause twice
    adds nothing. The entry is filed under the intent's repository (``repo=`` overrides it); with neither it is
    refused (OutboxRepositoryUnknown) before anything is stored.
    """
    filed_under = filing_repo(intent, repo)
    moment = to_db_time(now or utcnow())
    cursor = await conn.execute(
        "INSERT INTO outbox (repo, idempotency_key, issue_number, kind, payload_json, status, delivery_id,"
        " created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?) ON CONFLICT DO NOTHING",
        (
            filed_under,
            intent.key,
            intent.issue_number,
            intent.kind,
            json.dumps(intent.payload, sort_keys=True),
            intent.delivery_id,
            moment,
            moment,
        ),
    )
    inserted = cursor.rowcount == 1
    await cursor.close()
    if inserted:
        note_commit(OUTBOX_TOPIC)  # the commit wakes the sender (``Database.on_commit``), whoever enqueued
    return inserted


async def cancel_issue_entries(
    conn: Connection, issue_number: int, *, reason: str, now: datetime, repo: str
) -> int:
    """Inside the caller's transaction: the issue's open entries that no sender holds (pending, or
    verification_failed) are parked as ``cancelled: REASON`` and marked hooked (no failure hook: nothing was
    tried). An entry being sent settles on its own (a deleted issue answers GiteaIssueGone). Only the entries of
    ``repo``: another repository's issue of the same number is untouched."""
    moment = to_db_time(now)
    cursor = await conn.execute(
        "UPDATE outbox SET status = 'parked', last_error = ?, claimed_by = NULL, claimed_at = NULL,"
        " hooked_at = ?, updated_at = ?, version = version + 1"
        " WHERE repo = ? AND issue_number = ? AND status IN ('pending', 'verification_failed')",
        (f"cancelled: {reason}", moment, moment, repo, issue_number),
    )
    count = cursor.rowcount
    await cursor.close()
    return count


def _scoped(where: str, params: list[Any], repo: str | None) -> tuple[str, list[Any]]:
    """``where`` narrowed to one repository's entries when ``repo`` is given."""
    return (f"repo = ? AND {where}", [repo, *params]) if repo is not None else (where, params)


class OutboxStore:
    """Outbox reads and conditional state changes."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def add(self, intent: OutboxIntent, *, repo: str | None = None) -> bool:
        """Enqueue on its own (for callers with no state change of their own); ``repo`` as for ``enqueue``."""
        filed_under = filing_repo(intent, repo)
        async with self._db.transaction() as conn:
            return await enqueue(conn, intent, repo=filed_under)

    async def due_heads(self, *, claim_ttl_s: float, limit: int, now: datetime | None = None) -> list[OutboxEntry]:
        """The oldest open entry of each issue, if it is due: pending and past its backoff, or sending with
        a claim older than ``claim_ttl_s`` (its sender died). A parked head holds back its own issue only."""
        moment = now or utcnow()
        stale = to_db_time(moment - timedelta(seconds=claim_ttl_s))
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM outbox o WHERE o.id IN"  # noqa: S608
            " (SELECT MIN(id) FROM outbox WHERE status IN ('pending', 'sending', 'verification_failed', 'parked')"
            "  GROUP BY repo, issue_number)"
            " AND ((o.status = 'pending' AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= ?))"
            "   OR (o.status = 'sending' AND o.claimed_at < ?))"
            " ORDER BY o.id LIMIT ?",
            (to_db_time(moment), stale, limit),
        ) as cur:
            return [_entry(row) for row in await cur.fetchall()]

    async def next_head(self, repo: str, issue_number: int, *, now: datetime | None = None) -> OutboxEntry | None:
        """The issue's oldest open entry if it is pending and due: what its sender sends next, right after the
        entry before it settled (one indexed read of that issue's open entries, however large the outbox is)."""
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM outbox WHERE repo = ? AND issue_number = ?"  # noqa: S608
            " AND status IN ('pending', 'sending', 'verification_failed', 'parked') ORDER BY id LIMIT 1",
            (repo, issue_number),
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        entry = _entry(row)
        due = entry.next_attempt_at is None or entry.next_attempt_at <= to_db_time(now or utcnow())
        return entry if entry.status == "pending" and due else None

    async def claim(self, entry: OutboxEntry, sender_id: str) -> OutboxEntry | None:
        """Mark an entry as being sent (before anything reaches Gitea); None if someone else changed it."""
        moment = to_db_time(utcnow())
        # PostgreSQL: the entry's row is locked, and one another sender holds is passed over, not waited for.
        skip_locked = " FOR UPDATE SKIP LOCKED" if self._db.dialect == "postgresql" else ""
        # One statement, its own transaction (on PostgreSQL one round trip: the lock never waits on this process).
        claimed = await self._db.write_one(
            "UPDATE outbox SET status = 'sending', attempts = attempts + 1, claimed_by = ?, claimed_at = ?,"  # noqa: S608
            " updated_at = ?, version = version + 1"
            f" WHERE id = (SELECT id FROM outbox WHERE id = ? AND version = ?{skip_locked}) RETURNING {_COLUMNS}",
            (sender_id, moment, moment, entry.id, entry.version),
        )
        return _entry(claimed.rows[0]) if claimed.rows else None

    async def _settle(self, entry: OutboxEntry, assignments: str, params: tuple[Any, ...]) -> bool:
        moment = to_db_time(utcnow())
        settled = await self._db.write_one(
            f"UPDATE outbox SET {assignments}, claimed_by = NULL, claimed_at = NULL, updated_at = ?,"  # noqa: S608
            " version = version + 1 WHERE id = ? AND version = ? AND status = 'sending'",
            (*params, moment, entry.id, entry.version),
        )
        return settled.rowcount == 1

    async def complete(self, entry: OutboxEntry, result: dict[str, Any]) -> bool:
        moment = to_db_time(utcnow())
        return await self._settle(
            entry,
            "status = 'done', result_json = ?, sent_at = ?, last_error = NULL",
            (json.dumps(result, sort_keys=True), moment),
        )

    async def retry_later(self, entry: OutboxEntry, *, error: str, next_attempt_at: datetime) -> bool:
        return await self._settle(
            entry,
            "status = 'pending', last_error = ?, next_attempt_at = ?",
            (error, to_db_time(next_attempt_at)),
        )

    async def park(self, entry: OutboxEntry, *, error: str) -> bool:
        return await self._settle(entry, "status = 'parked', last_error = ?", (error,))

    async def verification_failed(
        self, entry: OutboxEntry, *, error: str, observed: Any, result: dict[str, Any]
    ) -> bool:
        return await self._settle(
            entry,
            "status = 'verification_failed', last_error = ?, observed_json = ?, result_json = ?",
            (error, json.dumps(observed, sort_keys=True), json.dumps(result, sort_keys=True)),
        )

    async def mark_hooked(self, entry_id: int, *, error: str | None = None) -> None:
        """The settled entry's hook ran (or failed, recorded, and is not run again)."""
        await self._db.write_one(
            "UPDATE outbox SET hooked_at = ?, hook_error = ? WHERE id = ? AND hooked_at IS NULL",
            (to_db_time(utcnow()), error, entry_id),
            durable=False,
        )

    async def adopt_unscoped(self, repo: str) -> int:
        """File every entry stored before entries were filed by repository (``repo = ''``) under ``repo``, the
        first configured repository (the one such a database served). Returns how many."""
        async with self._db.transaction() as conn:
            cursor = await conn.execute("UPDATE outbox SET repo = ? WHERE repo = ''", (repo,))
            count = cursor.rowcount
            await cursor.close()
        return count

    async def unhooked(self, *, limit: int = 50) -> list[OutboxEntry]:
        """Settled entries whose hook never ran (the process died in between)."""
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM outbox WHERE status IN ('done', 'verification_failed', 'parked')"  # noqa: S608
            " AND hooked_at IS NULL ORDER BY id LIMIT ?",
            (limit,),
        ) as cur:
            return [_entry(row) for row in await cur.fetchall()]

    async def retry(self, entry_id: int) -> OutboxEntry:
        """An operator's `foreman outbox retry ID`: a parked or verification_failed entry is sent again."""
        async with self._db.transaction() as conn:
            async with conn.execute(
                "UPDATE outbox SET status = 'pending', attempts = 0, next_attempt_at = NULL, updated_at = ?,"  # noqa: S608
                " hooked_at = NULL, hook_error = NULL,"
                " version = version + 1 WHERE id = ? AND status IN ('parked', 'verification_failed')"
                f" RETURNING {_COLUMNS}",
                (to_db_time(utcnow()), entry_id),
            ) as cur:
                row = await cur.fetchone()
        if row is None:
            found = await self.get(entry_id)
            if found is None:
                raise LookupError(f"no outbox entry {entry_id}")
            raise ValueError(f"outbox entry {entry_id} is {found.status}; only parked or verification_failed entries")
        return _entry(row)

    async def get(self, entry_id: int) -> OutboxEntry | None:
        async with self._db.reader.execute(f"SELECT {_COLUMNS} FROM outbox WHERE id = ?", (entry_id,)) as cur:  # noqa: S608
            row = await cur.fetchone()
        return _entry(row) if row is not None else None

    async def by_key(self, key: str, *, repo: str | None = None) -> OutboxEntry | None:
        """The entry of ``repo`` with idempotency key ``key`` (keys are unique per repository); without ``repo``
        the oldest of any repository (an operator's look-up across the whole outbox)."""
        where, params = _scoped("idempotency_key = ?", [key], repo)
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM outbox WHERE {where} ORDER BY id LIMIT 1",  # noqa: S608
            params,
        ) as cur:
            row = await cur.fetchone()
        return _entry(row) if row is not None else None

    async def for_issue(self, issue_number: int, *, repo: str | None = None) -> list[OutboxEntry]:
        """Every entry of one issue, oldest first, in one read (of the repository ``repo`` when given)."""
        where, params = "issue_number = ?", list[object]([issue_number])
        if repo is not None:
            where, params = where + " AND repo = ?", [*params, repo]
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM outbox WHERE {where} ORDER BY id", params  # noqa: S608
        ) as cur:
            return [_entry(row) for row in await cur.fetchall()]

    async def unsettled_for_issue(self, issue_number: int, *, repo: str | None = None) -> int:
        """How many of one issue's entries (of ``repo`` when given) are not sent yet or have not had their
        completion hook run."""
        where, params = _scoped("issue_number = ? AND (status != 'done' OR hooked_at IS NULL)", [issue_number], repo)
        async with self._db.reader.execute(
            f"SELECT COUNT(*) FROM outbox WHERE {where}",  # noqa: S608
            params,
        ) as cur:
            counted = [int(row[0]) for row in await cur.fetchall()]
        return counted[0]

    async def evidence_comments(self, *, limit: int, repo: str | None = None) -> list[OutboxEntry]:
        """The newest comment entries (of ``repo`` when given) whose key ends in ``:evidence`` (the bot's evidence
        comments)."""
        where, params = _scoped("kind = 'comment' AND idempotency_key LIKE '%:evidence'", [], repo)
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM outbox WHERE {where} ORDER BY id DESC LIMIT ?",  # noqa: S608
            [*params, limit],
        ) as cur:
            return [_entry(row) for row in await cur.fetchall()]

    async def command_replies(self, *, repo: str, limit: int) -> list[OutboxEntry]:
        """The newest replies to comment commands of ``repo`` (keys ``command:<comment>:reply``)."""
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM outbox WHERE repo = ? AND kind = 'comment'"  # noqa: S608
            " AND idempotency_key LIKE 'command:%:reply' ORDER BY id DESC LIMIT ?",
            (repo, limit),
        ) as cur:
            return [_entry(row) for row in await cur.fetchall()]

    async def comment_statuses(self, key_prefix: str, *, repo: str) -> list[OutboxStatus]:
        """The status of every comment entry of ``repo`` whose key starts with ``key_prefix``, oldest first."""
        pattern = key_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        async with self._db.reader.execute(
            "SELECT status FROM outbox WHERE repo = ? AND idempotency_key LIKE ? ESCAPE '\\' AND kind = 'comment'"
            " ORDER BY id",
            (repo, pattern),
        ) as cur:
            return [row["status"] for row in await cur.fetchall()]

    async def every_entry(self) -> list[OutboxEntry]:
        """Every entry, oldest first (the invariant checker's view)."""
        async with self._db.reader.execute(f"SELECT {_COLUMNS} FROM outbox ORDER BY id") as cur:  # noqa: S608
            return [_entry(row) for row in await cur.fetchall()]

    async def list(self, *, status: str | None = None, limit: int = 100) -> list[OutboxEntry]:
        if status is not None and status not in OUTBOX_STATUSES:
            raise ValueError(f"unknown status {status!r}; one of {', '.join(OUTBOX_STATUSES)}")
        where = "WHERE status = ?" if status else ""
        params: tuple[Any, ...] = (status, limit) if status else (limit,)
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM outbox {where} ORDER BY id DESC LIMIT ?",  # noqa: S608
            params,
        ) as cur:
            return [_entry(row) for row in await cur.fetchall()]

    async def counts(self) -> dict[str, int]:
        async with self._db.reader.execute("SELECT status, COUNT(*) FROM outbox GROUP BY status") as cur:
            found = {row[0]: row[1] for row in await cur.fetchall()}
        return {status: found.get(status, 0) for status in OUTBOX_STATUSES}
