"""The durable inbox: every admitted webhook delivery, its processing claim, handler results and replays."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import orjson

from bot.core.intake import Delivery, WebhookDelivery
from bot.core.issue_state import repo_key
from state.db import Database, from_db_time, from_row, to_db_time, utcnow
from state.sql import Connection, Row

DeliveryStatus = Literal["queued", "processing", "done", "failed", "ignored_self", "ignored"]
#: ``ignored``: stored but for no handler (another repository, say), with ``ignored_reason``.
STATUSES: tuple[DeliveryStatus, ...] = ("queued", "processing", "done", "failed", "ignored_self", "ignored")
InsertOutcome = Literal["queued", "ignored_self", "duplicate"]


@dataclass(frozen=True, slots=True)
class InsertResult:
    outcome: InsertOutcome
    pk: int | None


@dataclass(frozen=True, slots=True)
class StoredDelivery(WebhookDelivery):
    """One row of the inbox, as the worker and the CLI see it."""

    pk: int
    received_at: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: str | None
    last_error: str | None
    finished_at: str | None
    ignored_reason: str | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.pk,
            "delivery": self.delivery_id,
            "event": self.event,
            "event_type": self.event_type,
            "action": self.action,
            "sender": self.sender_login,
            "received_at": self.received_at,
            "status": self.status,
            "attempts": self.attempts,
            "next_attempt_at": self.next_attempt_at,
            "last_error": self.last_error,
            "finished_at": self.finished_at,
            "ignored_reason": self.ignored_reason,
            # Catch-up's synthetic deliveries (bot/reconcile.py) carry ids starting "reconcile:".
            "source": "reconcile" if self.delivery_id.startswith("reconcile:") else "webhook",
        }


@dataclass(frozen=True, slots=True)
class Replayed:
    """A delivery queued again, and what the replay will not run again (each a finished comment command:
    repository, comment, command, the delivery it ran for, when)."""

    delivery: StoredDelivery
    skipped: tuple[dict[str, Any], ...] = ()

    @property
    def status(self) -> DeliveryStatus:
        return self.delivery.status

    def summary(self) -> dict[str, Any]:
        return {**self.delivery.summary(), "skipped": list(self.skipped)}

    def describe(self) -> str:
        """One line for the CLI: what was queued and what it skips."""
        line = f"delivery {self.delivery.pk} ({self.delivery.delivery_id}) queued again"
        for item in self.skipped:
            line += (
                f"; skipped: the command {item['command'] or '(unknown)'} of comment {item['comment']} on "
                f"{item['repository']} already ran (for delivery {item['ran_for_delivery']}, finished "
                f"{item['finished_at']}) and runs once per comment"
            )
        return line


async def _finished_commands(conn: Connection, found: StoredDelivery) -> list[dict[str, Any]]:
    """The comment command this delivery brings, if it already finished (for any delivery): a replay skips it."""
    if found.event != "issue_comment":
        return []
    try:
        data = orjson.loads(found.body)
        repo, comment_id = str(data["repository"]["full_name"]), int(data["comment"]["id"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return []
    async with conn.execute(
        "SELECT command, delivery_id, finished_at FROM command_claims"
        " WHERE repo = ? AND comment_id = ? AND finished_at IS NOT NULL",
        (repo_key(repo), comment_id),
    ) as cur:
        row = await cur.fetchone()
    if row is None:
        return []
    return [{"repository": repo_key(repo), "comment": comment_id, "command": row[0], "ran_for_delivery": row[1],
             "finished_at": row[2]}]


_COLUMNS = (
    "id, delivery_id, event, event_type, action, sender_login, body, received_at, status, attempts, "
    "next_attempt_at, last_error, finished_at, ignored_reason"
)


def _row(row: Row) -> StoredDelivery:
    return from_row(StoredDelivery, row, pk=row["id"], body=bytes(row["body"]))


async def _record_handler(conn: Connection, pk: int, handler: str, error: str | None) -> None:
    await conn.execute(
        "INSERT INTO delivery_handlers (delivery_pk, handler, status, attempts, last_error, updated_at)"
        " VALUES (?, ?, ?, 1, ?, ?)"
        " ON CONFLICT (delivery_pk, handler) DO UPDATE SET status = excluded.status,"
        " attempts = delivery_handlers.attempts + 1, last_error = excluded.last_error,"
        " updated_at = excluded.updated_at",
        (pk, handler, "error" if error else "done", error, to_db_time(utcnow())),
    )


class DeliveryStore:
    """Inbox operations. Every state change is a conditional write, so two workers can never both win."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert_batch(
        self, batch: Sequence[tuple[Delivery, bool]], *, now: datetime | None = None
    ) -> list[InsertResult]:
        """Store admitted deliveries in ONE statement and transaction (group commit); (delivery, is_self) pairs.

        A delivery whose id or raw-body hash is already stored is a duplicate and changes nothing.
        """
        received = to_db_time(now or utcnow())
        if not batch:
            return []
        params: list[Any] = []
        for delivery, is_self in batch:
            params += (
                delivery.delivery_id,
                delivery.body_sha256,
                delivery.event,
                delivery.event_type,
                delivery.action,
                delivery.sender_login,
                orjson.dumps(delivery.headers, option=orjson.OPT_SORT_KEYS).decode(),
                delivery.body,
                received,
                "ignored_self" if is_self else "queued",
                received if is_self else None,
            )
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(batch))
        # One statement for the whole batch, its own durable transaction (on SQLite one trip to the database
        # thread). Rows skipped by ON CONFLICT are not RETURNed; VALUES rows are inserted in order, so within a
        # batch the first of two equal ids or bodies wins, as with one INSERT per row.
        stored = await self._db.write_rows(
            "INSERT INTO deliveries (delivery_id, body_sha256, event, event_type, action, sender_login,"  # noqa: S608
            f" headers_json, body, received_at, status, finished_at) VALUES {values}"
            " ON CONFLICT DO NOTHING RETURNING id, delivery_id, body_sha256",
            params,
        )
        # Keyed by id AND body: a row skipped for its body must not take the pk of a later row with its id (each
        # 202 belongs to its own request).
        inserted = {(row[1], row[2]): row[0] for row in stored}
        results: list[InsertResult] = []
        for delivery, is_self in batch:
            pk = inserted.pop((delivery.delivery_id, delivery.body_sha256), None)
            if pk is None:
                results.append(InsertResult("duplicate", None))
            else:
                results.append(InsertResult("ignored_self" if is_self else "queued", pk))
        return results

    async def claim_next(self, worker_id: str, *, now: datetime | None = None) -> StoredDelivery | None:
        """Take the oldest due queued delivery for this worker (one conditional UPDATE: one winner)."""
        moment = to_db_time(now or utcnow())
        due = (
            "SELECT id FROM deliveries WHERE status = 'queued'"
            " AND (next_attempt_at IS NULL OR next_attempt_at <= ?) ORDER BY id LIMIT 1"
        )
        async with self._db.reader.execute(due, (moment,)) as cur:
            if await cur.fetchone() is None:
                return None  # idle: no write lock taken
        # PostgreSQL: the due row is locked, and a row another claim holds is passed over, not waited for.
        skip_locked = " FOR UPDATE SKIP LOCKED" if self._db.dialect == "postgresql" else ""
        # One statement, its own transaction (on PostgreSQL one round trip: the lock never waits on this process).
        claimed = await self._db.write_one(
            "UPDATE deliveries SET status = 'processing', claimed_by = ?, heartbeat_at = ?,"  # noqa: S608
            " attempts = attempts + 1, version = version + 1"
            f" WHERE id = ({due}{skip_locked}) AND status = 'queued' RETURNING {_COLUMNS}",
            (worker_id, moment, moment),
            durable=False,
        )
        return _row(claimed.rows[0]) if claimed.rows else None

    async def heartbeat(self, pk: int, worker_id: str) -> bool:
        beat = await self._db.write_one(
            "UPDATE deliveries SET heartbeat_at = ? WHERE id = ? AND claimed_by = ? AND status = 'processing'",
            (to_db_time(utcnow()), pk, worker_id),
            durable=False,
        )
        return beat.rowcount == 1

    async def reclaim_stale(self, *, ttl_s: float, now: datetime | None = None) -> int:
        """Give back deliveries whose claim stopped heartbeating (their process died): they run again."""
        moment = now or utcnow()
        cutoff = to_db_time(moment - timedelta(seconds=ttl_s))
        async with self._db.transaction(durable=False) as conn:
            cursor = await conn.execute(
                "UPDATE deliveries SET status = 'queued', claimed_by = NULL, heartbeat_at = NULL,"
                " version = version + 1, last_error = COALESCE(last_error, 'claim expired: worker died')"
                " WHERE status = 'processing' AND heartbeat_at < ?",
                (cutoff,),
            )
            return cursor.rowcount

    async def done_handlers(self, pk: int) -> set[str]:
        async with self._db.reader.execute(
            "SELECT handler FROM delivery_handlers WHERE delivery_pk = ? AND status = 'done'", (pk,)
        ) as cur:
            return {row[0] for row in await cur.fetchall()}

    async def record_handler(self, pk: int, handler: str, *, error: str | None) -> None:
        async with self._db.transaction(durable=False) as conn:
            await _record_handler(conn, pk, handler, error)

    async def handler_results(self, pk: int) -> list[dict[str, Any]]:
        async with self._db.reader.execute(
            "SELECT handler, status, attempts, last_error FROM delivery_handlers"
            " WHERE delivery_pk = ? ORDER BY handler",
            (pk,),
        ) as cur:
            return [dict(row) for row in await cur.fetchall()]

    async def _settle(
        self,
        pk: int,
        worker_id: str,
        assignments: str,
        params: tuple[Any, ...],
        handler_results: Mapping[str, str | None] | None = None,
    ) -> bool:
        settle = (
            f"UPDATE deliveries SET {assignments}, claimed_by = NULL, heartbeat_at = NULL,"  # noqa: S608
            " version = version + 1 WHERE id = ? AND claimed_by = ? AND status = 'processing'"
        )
        if not handler_results:  # one statement: its own transaction, one round trip on PostgreSQL
            return (await self._db.write_one(settle, (*params, pk, worker_id), durable=False)).rowcount == 1
        async with self._db.transaction(durable=False) as conn:
            cursor = await conn.execute(settle, (*params, pk, worker_id))
            if cursor.rowcount != 1:
                return False
            for handler, error in (handler_results or {}).items():
                await _record_handler(conn, pk, handler, error)
            return True

    async def finish(self, pk: int, worker_id: str, *, handler_results: Mapping[str, str | None] | None = None) -> bool:
        """Done; ``handler_results`` (handler → error or None) not yet recorded are written in the same commit."""
        return await self._settle(
            pk,
            worker_id,
            "status = 'done', finished_at = ?, last_error = NULL",
            (to_db_time(utcnow()),),
            handler_results,
        )

    async def retry_later(
        self,
        pk: int,
        worker_id: str,
        *,
        error: str,
        next_attempt_at: datetime,
        handler_results: Mapping[str, str | None] | None = None,
    ) -> bool:
        return await self._settle(
            pk,
            worker_id,
            "status = 'queued', last_error = ?, next_attempt_at = ?",
            (error, to_db_time(next_attempt_at)),
            handler_results,
        )

    async def park_failed(
        self, pk: int, worker_id: str, *, error: str, handler_results: Mapping[str, str | None] | None = None
    ) -> bool:
        return await self._settle(
            pk,
            worker_id,
            "status = 'failed', last_error = ?, finished_at = ?",
            (error, to_db_time(utcnow())),
            handler_results,
        )

    async def ignore(self, pk: int, worker_id: str, *, reason: str) -> bool:
        """Not for any handler here (another repository): settled as ``ignored`` with the reason, never retried."""
        return await self._settle(
            pk,
            worker_id,
            "status = 'ignored', ignored_reason = ?, finished_at = ?, last_error = NULL",
            (reason, to_db_time(utcnow())),
        )

    async def abandon(self, pk: int, worker_id: str) -> bool:
        """Shutdown mid-delivery: put it back untouched (the attempt does not count)."""
        return await self._settle(pk, worker_id, "status = 'queued', attempts = attempts - 1", ())

    async def get(self, key: int | str) -> StoredDelivery | None:
        """By row id (int, or a string of digits) or by Gitea delivery id."""
        if isinstance(key, int) or key.isdigit():
            sql, param = f"SELECT {_COLUMNS} FROM deliveries WHERE id = ?", int(key)  # noqa: S608
            async with self._db.reader.execute(sql, (param,)) as cur:
                row = await cur.fetchone()
            if row is not None or isinstance(key, int):
                return _row(row) if row is not None else None
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM deliveries WHERE delivery_id = ?", (str(key),)  # noqa: S608
        ) as cur:
            row = await cur.fetchone()
        return _row(row) if row is not None else None

    async def for_issue(self, repo: str, number: int, *, limit: int = 50) -> list[StoredDelivery]:
        """The newest deliveries whose body names this repository (any case) and issue or pull request."""
        if self._db.dialect == "postgresql":
            where = (
                "lower(foreman_json_or_null(body) #>> '{repository,full_name}') = ?"
                " AND coalesce(foreman_json_or_null(body) #>> '{issue,number}',"
                " foreman_json_or_null(body) #>> '{pull_request,number}') = CAST(? AS TEXT)"
            )
        else:
            where = (
                "json_valid(CAST(body AS TEXT))"
                " AND lower(json_extract(CAST(body AS TEXT), '$.repository.full_name')) = ?"
                " AND coalesce(json_extract(CAST(body AS TEXT), '$.issue.number'),"
                " json_extract(CAST(body AS TEXT), '$.pull_request.number')) = ?"
            )
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM deliveries WHERE {where} ORDER BY id DESC LIMIT ?",  # noqa: S608
            (repo_key(repo), number, limit),
        ) as cur:
            return [_row(row) for row in await cur.fetchall()]

    async def issue_titles(self, repo: str, *, scan: int = 2000) -> dict[int, str]:
        """Each issue's title as the newest of the last ``scan`` issue and comment deliveries of ``repo`` carries it
        (the issue store keeps no title; the dashboard's board shows them)."""
        async with self._db.reader.execute(
            "SELECT body FROM deliveries WHERE event IN ('issues', 'issue_comment') ORDER BY id DESC LIMIT ?", (scan,)
        ) as cur:
            rows = await cur.fetchall()
        titles: dict[int, str] = {}
        wanted = repo_key(repo)
        for row in rows:
            try:
                data = orjson.loads(bytes(row[0]))
                issue = data["issue"]
                if repo_key(str(data["repository"]["full_name"])) != wanted or issue.get("pull_request"):
                    continue
                number, title = int(issue["number"]), issue.get("title")
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
                continue
            if isinstance(title, str) and number not in titles:
                titles[number] = title
        return titles

    async def with_action(self, event: str, action: str) -> list[StoredDelivery]:
        """Every delivery of one event and action, oldest first."""
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM deliveries WHERE event = ? AND action = ? ORDER BY id",  # noqa: S608
            (event, action),
        ) as cur:
            return [_row(row) for row in await cur.fetchall()]

    async def digests(self) -> list[tuple[str, str, DeliveryStatus]]:
        """(delivery id, body SHA-256, status) of every delivery, oldest first (the invariant checker's view)."""
        async with self._db.reader.execute(
            "SELECT delivery_id, body_sha256, status FROM deliveries ORDER BY id"
        ) as cur:
            return [(row[0], row[1], row[2]) for row in await cur.fetchall()]

    async def list(self, *, status: str | None = None, limit: int = 100) -> list[StoredDelivery]:
        if status is not None and status not in STATUSES:
            raise ValueError(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
        where = "WHERE status = ?" if status else ""
        params: tuple[Any, ...] = (status, limit) if status else (limit,)
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM deliveries {where} ORDER BY id DESC LIMIT ?", params  # noqa: S608
        ) as cur:
            return [_row(row) for row in await cur.fetchall()]

    async def counts(self) -> dict[str, int]:
        async with self._db.reader.execute("SELECT status, COUNT(*) FROM deliveries GROUP BY status") as cur:
            found = {row[0]: row[1] for row in await cur.fetchall()}
        return {status: found.get(status, 0) for status in STATUSES}

    async def replay(self, key: int | str, *, requested_by: str, force: bool = False) -> Replayed:
        """Queue a stored delivery again (failed ones; done or ignored ones only with force). Recorded, with what
        the replay will not run again: a comment command that already finished (it runs once per comment, whoever
        replays it; see state.reconcile.CommandClaims)."""
        found = await self.get(key)
        if found is None:
            raise LookupError(f"no stored delivery {key!r}")
        allowed: tuple[str, ...] = ("failed", "done", "ignored_self", "ignored") if force else ("failed",)
        if found.status not in allowed:
            raise ValueError(
                f"delivery {found.pk} is {found.status}; only failed deliveries are replayed"
                + ("" if force else " (use --force for done or ignored ones)")
            )
        async with self._db.transaction() as conn:
            cursor = await conn.execute(
                "UPDATE deliveries SET status = 'queued', attempts = 0, next_attempt_at = NULL,"
                " finished_at = NULL, ignored_reason = NULL, version = version + 1 WHERE id = ? AND status = ?",
                (found.pk, found.status),
            )
            if cursor.rowcount != 1:
                raise ValueError(f"delivery {found.pk} changed while replaying; try again")
            if force:
                # A forced replay runs every handler again, on purpose; a comment command's own claim still holds.
                await conn.execute("DELETE FROM delivery_handlers WHERE delivery_pk = ?", (found.pk,))
            skipped = await _finished_commands(conn, found)
            await conn.execute(
                "INSERT INTO delivery_replays (delivery_pk, from_status, requested_at, requested_by, skipped_json)"
                " VALUES (?, ?, ?, ?, ?)",
                (found.pk, found.status, to_db_time(utcnow()), requested_by,
                 orjson.dumps(skipped).decode() if skipped else None),
            )
        replayed = await self.get(found.pk)
        assert replayed is not None
        return Replayed(replayed, tuple(skipped))

    async def oldest_due_age_s(self, *, now: datetime | None = None) -> float:
        async with self._db.reader.execute(
            "SELECT MIN(received_at) FROM deliveries WHERE status IN ('queued', 'processing')"
        ) as cur:
            row = await cur.fetchone()
        if row is None or row[0] is None:
            return 0.0
        return max(0.0, ((now or utcnow()) - from_db_time(row[0])).total_seconds())
