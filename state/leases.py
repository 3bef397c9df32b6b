"""Leases: at most one live lease per issue (a partial unique index), with every change recorded as an event."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from bot.core.allocator import LiveLease
from state.db import Database, from_db_time, to_db_time, utcnow
from state.sql import Connection, IntegrityError, Row

LeaseStatus = Literal["live", "released", "expired"]
LeaseEventKind = Literal["acquired", "resumed", "heartbeat", "released", "expired", "reclaimed"]


class LeaseTaken(Exception):
    """Another live lease on the issue won the race (the unique index refused the insert)."""


class LeaseRefused(Exception):
    """A heartbeat or release by someone who is not the lease's owner (or on a lease no longer live)."""


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: str
    repo: str
    issue_number: int
    owner: str
    role: str
    action: str
    acquired_at: datetime
    expires_at: datetime
    heartbeat_at: datetime
    status: LeaseStatus
    ended_at: datetime | None
    end_reason: str | None
    fingerprint: str | None
    #: What the caller asked for (an allocation's ``exclude`` among it), as stored.
    request: dict[str, Any] = field(default_factory=dict)

    def is_live(self, now: datetime) -> bool:
        return self.status == "live" and self.expires_at > now

    def as_live_lease(self) -> LiveLease:
        """The allocator core's view of this lease."""
        return LiveLease(
            issue_number=self.issue_number,
            owner=self.owner,
            role=self.role,
            lease_id=self.lease_id,
            expires_at=self.expires_at,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "repo": self.repo,
            "issue_number": self.issue_number,
            "owner": self.owner,
            "role": self.role,
            "action": self.action,
            "acquired_at": self.acquired_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "heartbeat_at": self.heartbeat_at.isoformat(),
            "status": self.status,
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "end_reason": self.end_reason,
        }


_COLUMNS = (
    "lease_id, repo, issue_number, owner, role, action, acquired_at, expires_at, heartbeat_at, status,"
    " ended_at, end_reason, fingerprint, request_json"
)


def _lease(row: Row) -> Lease:
    return Lease(
        lease_id=row["lease_id"],
        repo=row["repo"],
        issue_number=row["issue_number"],
        owner=row["owner"],
        role=row["role"],
        action=row["action"],
        acquired_at=from_db_time(row["acquired_at"]),
        expires_at=from_db_time(row["expires_at"]),
        heartbeat_at=from_db_time(row["heartbeat_at"]),
        status=row["status"],
        ended_at=from_db_time(row["ended_at"]) if row["ended_at"] else None,
        end_reason=row["end_reason"],
        fingerprint=row["fingerprint"],
        request=json.loads(row["request_json"]) if row["request_json"] else {},
    )


async def _event(
    conn: Connection, lease_id: str, kind: LeaseEventKind, actor: str, at: datetime, **detail: Any
) -> None:
    await conn.execute(
        "INSERT INTO lease_events (lease_id, kind, actor, at, detail_json) VALUES (?, ?, ?, ?, ?)",
        (lease_id, kind, actor, to_db_time(at), json.dumps(detail, sort_keys=True, default=str)),
    )


#: The review leases that ended ``reviewed`` with a given key in their release's detail and are still their issue's
#: latest lease (``released_naming``).
_RELEASED_NAMING = (
    "SELECT l.lease_id, l.issue_number, e.detail_json FROM leases l"
    " JOIN lease_events e ON e.lease_id = l.lease_id AND e.kind = 'released'"
    " WHERE l.repo = ? AND l.action = 'review' AND l.status = 'released' AND l.end_reason = 'reviewed'"
    " AND e.detail_json LIKE ?"
    " AND NOT EXISTS (SELECT 1 FROM leases n WHERE n.repo = l.repo AND n.issue_number = l.issue_number"
    " AND n.id > l.id) ORDER BY l.issue_number, l.id"
)
#: One owner's latest end: the MAX of an index range, which both databases read as one seek.
_LAST_ENDED = ("SELECT CAST(? AS TEXT) AS owner, (SELECT MAX(ended_at) FROM leases"
               " WHERE repo = ? AND owner = ? AND ended_at IS NOT NULL) AS ended")
#: Owners per statement (SQLite allows 500 terms in a compound SELECT).
_OWNERS_PER_QUERY = 200


def _mark(lease_id: str, status: str, end_reason: str | None) -> str:
    return f"{lease_id}:{status}:{end_reason or ''}"


def history_mark(history: Sequence[Lease]) -> str | None:
    """Where an issue's lease history stands: its latest lease, with its status and end (a lease granted, ended or
    expired since moves it). None: the issue has had no lease."""
    if not history:
        return None
    last = history[-1]
    return _mark(last.lease_id, last.status, last.end_reason)


class LeaseStore:
    """Lease rows and events. Writes that must be atomic with other effects take the caller's connection."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def open_leases(self, repo: str, conn: Connection | None = None) -> list[Lease]:
        """Leases still marked live (some may be past expiry, inside their grace period)."""
        source = conn or self._db.reader
        async with source.execute(
            f"SELECT {_COLUMNS} FROM leases WHERE repo = ? AND status = 'live' ORDER BY issue_number",  # noqa: S608
            (repo,),
        ) as cur:
            return [_lease(row) for row in await cur.fetchall()]

    async def last_ended(self, repo: str, owners: Sequence[str]) -> dict[str, datetime]:
        """Per owner of ``owners``, when its most recently ended lease ended (released or expired); auto-allocation's
        idle time. One seek in ``leases_owner_ended`` per owner: the cost does not grow with the ended leases."""
        found: dict[str, datetime] = {}
        wanted = list(dict.fromkeys(owners))
        for start in range(0, len(wanted), _OWNERS_PER_QUERY):
            chunk = wanted[start:start + _OWNERS_PER_QUERY]
            sql = " UNION ALL ".join([_LAST_ENDED] * len(chunk))
            args = [value for owner in chunk for value in (owner, repo, owner)]
            async with self._db.reader.execute(sql, args) as cur:
                found.update({row["owner"]: from_db_time(row["ended"]) for row in await cur.fetchall()
                              if row["ended"] is not None})
        return found

    async def get(self, lease_id: str) -> Lease | None:
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM leases WHERE lease_id = ?", (lease_id,)  # noqa: S608
        ) as cur:
            row = await cur.fetchone()
        return _lease(row) if row is not None else None

    async def live_for_issue(self, repo: str, issue_number: int) -> Lease | None:
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM leases WHERE repo = ? AND issue_number = ? AND status = 'live'",  # noqa: S608
            (repo, issue_number),
        ) as cur:
            row = await cur.fetchone()
        return _lease(row) if row is not None else None

    async def history(self, repo: str, issue_number: int) -> list[Lease]:
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM leases WHERE repo = ? AND issue_number = ? ORDER BY id",  # noqa: S608
            (repo, issue_number),
        ) as cur:
            return [_lease(row) for row in await cur.fetchall()]

    async def events(self, lease_id: str) -> list[dict[str, Any]]:
        async with self._db.reader.execute(
            "SELECT kind, actor, at, detail_json FROM lease_events WHERE lease_id = ? ORDER BY id", (lease_id,)
        ) as cur:
            return [
                {"kind": r["kind"], "actor": r["actor"], "at": r["at"], "detail": json.loads(r["detail_json"])}
                for r in await cur.fetchall()
            ]

    async def every_lease(self) -> list[Lease]:
        """Every lease of every repository, oldest first (the invariant checker's view)."""
        async with self._db.reader.execute(f"SELECT {_COLUMNS} FROM leases ORDER BY id") as cur:  # noqa: S608
            return [_lease(row) for row in await cur.fetchall()]

    async def recent(self, repo: str, *, issue: int | None = None, marked_live: bool = False,
                     limit: int | None = None) -> list[Lease]:
        """The repository's leases (of one issue; only those still marked live), newest first."""
        where, params = "repo = ?", list[Any]([repo])
        if issue is not None:
            where, params = where + " AND issue_number = ?", [*params, issue]
        if marked_live:
            where += " AND status = 'live'"
        bound = "" if limit is None else " LIMIT ?"  # SQLite's LIMIT -1 is an error on PostgreSQL
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM leases WHERE {where} ORDER BY id DESC{bound}",  # noqa: S608
            (*params,) if limit is None else (*params, limit),
        ) as cur:
            return [_lease(row) for row in await cur.fetchall()]

    async def released_naming(self, repo: str, key: str) -> list[tuple[str, int, dict[str, Any]]]:
        """(lease_id, issue, the ``released`` event's detail) of every review lease that ended ``reviewed`` with
        ``key`` in that detail and is still its issue's latest lease, by issue. The text match only narrows the rows
        read (the caller checks the decoded detail); ``leases_reviewed`` and ``leases_issue`` make each a seek."""
        async with self._db.reader.execute(_RELEASED_NAMING, (repo, f'%"{key}"%')) as cur:
            return [(row["lease_id"], row["issue_number"], json.loads(row["detail_json"] or "{}"))
                    for row in await cur.fetchall()]

    async def latest_mark(self, conn: Connection, repo: str, issue_number: int) -> str | None:
        """Inside the caller's transaction: the issue's latest lease as ``history_mark`` writes it (None: none)."""
        async with conn.execute(
            "SELECT lease_id, status, end_reason FROM leases WHERE repo = ? AND issue_number = ?"
            " ORDER BY id DESC LIMIT 1",
            (repo, issue_number),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else _mark(row["lease_id"], row["status"], row["end_reason"])

    async def self_released(self, repo: str) -> dict[int, str]:
        """Issue -> owner, for each issue whose latest lease is an implement lease its own owner released (not a
        controller, not foreman): auto-allocation does not hand the issue straight back to the author who gave it
        up."""
        async with self._db.reader.execute(
            "SELECT l.issue_number, l.owner FROM leases l JOIN lease_events e ON e.lease_id = l.lease_id"
            " AND e.kind = 'released' AND e.actor = l.owner"
            " WHERE l.repo = ? AND l.action = 'implement' AND l.status = 'released'"
            " AND NOT EXISTS (SELECT 1 FROM leases n WHERE n.repo = l.repo AND n.issue_number = l.issue_number"
            " AND n.id > l.id)",
            (repo,),
        ) as cur:
            return {row["issue_number"]: row["owner"] for row in await cur.fetchall()}

    async def events_of(self, lease_ids: Iterable[str]) -> list[dict[str, Any]]:
        """The events of several leases in one read, in the order they happened, each naming its lease."""
        ids = sorted(set(lease_ids))
        if not ids:
            return []
        marks = ", ".join("?" for _ in ids)
        async with self._db.reader.execute(
            f"SELECT lease_id, kind, actor, at, detail_json FROM lease_events WHERE lease_id IN ({marks})"  # noqa: S608
            " ORDER BY id",
            ids,
        ) as cur:
            return [
                {"lease_id": r["lease_id"], "kind": r["kind"], "actor": r["actor"], "at": r["at"],
                 "detail": json.loads(r["detail_json"] or "{}")}
                for r in await cur.fetchall()
            ]

    async def count_by_state(self, now: datetime) -> dict[str, int]:
        """Leases per status, with ``live_expired`` for those still marked live but past their expiry."""
        async with self._db.reader.execute(
            "SELECT CASE WHEN status = 'live' AND expires_at <= ? THEN 'live_expired' ELSE status END AS state,"
            " count(*) AS n FROM leases GROUP BY state",
            (to_db_time(now),),
        ) as cur:
            return {row["state"]: row["n"] for row in await cur.fetchall()}

    async def acquire(
        self,
        conn: Connection,
        *,
        repo: str,
        issue_number: int,
        owner: str,
        role: str,
        action: str,
        ttl: timedelta,
        now: datetime,
        actor: str,
        fingerprint: str | None,
        request: dict[str, Any],
        reclaim: Lease | None = None,
        grace: timedelta = timedelta(0),
    ) -> Lease:
        """Create a live lease inside the caller's transaction. ``reclaim``: an expired lease past its grace
        period that this one replaces (recorded as expired + reclaimed). Raises LeaseTaken on a race."""
        if reclaim is not None:
            cursor = await conn.execute(
                "UPDATE leases SET status = 'expired', ended_at = ?, end_reason = ?, version = version + 1"
                " WHERE lease_id = ? AND status = 'live' AND expires_at <= ?",
                (to_db_time(now), f"reclaimed by {owner}", reclaim.lease_id, to_db_time(now - grace)),
            )
            if cursor.rowcount != 1:
                raise LeaseTaken(f"lease {reclaim.lease_id} on #{issue_number} is no longer reclaimable")
            await _event(conn, reclaim.lease_id, "expired", actor, now, expired_at=reclaim.expires_at.isoformat())
            await _event(conn, reclaim.lease_id, "reclaimed", actor, now, new_owner=owner)
        lease_id = f"lease-{uuid.uuid4().hex}"
        request_json = json.dumps(request, sort_keys=True, default=str)
        try:
            await conn.execute(
                "INSERT INTO leases (lease_id, repo, issue_number, owner, role, action, acquired_at, expires_at,"
                " heartbeat_at, status, fingerprint, request_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'live', ?, ?)",
                (
                    lease_id,
                    repo,
                    issue_number,
                    owner,
                    role,
                    action,
                    to_db_time(now),
                    to_db_time(now + ttl),
                    to_db_time(now),
                    fingerprint,
                    request_json,
                ),
            )
        except IntegrityError as exc:
            raise LeaseTaken(f"issue #{issue_number} already has a live lease") from exc
        await _event(
            conn, lease_id, "acquired", actor, now, issue_number=issue_number, owner=owner, ttl_s=ttl.total_seconds()
        )
        return Lease(
            lease_id=lease_id,
            repo=repo,
            issue_number=issue_number,
            owner=owner,
            role=role,
            action=action,
            acquired_at=now,
            expires_at=now + ttl,
            heartbeat_at=now,
            status="live",
            ended_at=None,
            end_reason=None,
            fingerprint=fingerprint,
            request=json.loads(request_json),
        )

    async def record_resume(self, conn: Connection, lease: Lease, *, actor: str, now: datetime) -> None:
        await _event(conn, lease.lease_id, "resumed", actor, now, owner=lease.owner)

    async def heartbeat(self, lease_id: str, *, owner: str, ttl: timedelta, now: datetime | None = None) -> Lease:
        moment = now or utcnow()
        async with self._db.transaction() as conn:
            cursor = await conn.execute(
                "UPDATE leases SET heartbeat_at = ?, expires_at = ?, version = version + 1"
                " WHERE lease_id = ? AND owner = ? AND status = 'live' AND expires_at > ?",
                (to_db_time(moment), to_db_time(moment + ttl), lease_id, owner, to_db_time(moment)),
            )
            if cursor.rowcount != 1:
                raise LeaseRefused(f"lease {lease_id} is not a live lease owned by {owner}")
            await _event(conn, lease_id, "heartbeat", owner, moment, expires_at=(moment + ttl).isoformat())
        found = await self.get(lease_id)
        assert found is not None
        return found

    async def release(
        self, conn: Connection, lease_id: str, *, actor: str, reason: str, now: datetime, **detail: Any
    ) -> None:
        """Inside the caller's transaction: end a live lease (the caller checked who may); ``detail`` is kept on
        the ``released`` event."""
        cursor = await conn.execute(
            "UPDATE leases SET status = 'released', ended_at = ?, end_reason = ?, version = version + 1"
            " WHERE lease_id = ? AND status = 'live'",
            (to_db_time(now), reason, lease_id),
        )
        if cursor.rowcount != 1:
            raise LeaseRefused(f"lease {lease_id} is not live")
        await _event(conn, lease_id, "released", actor, now, **detail, reason=reason)

    async def expire(self, conn: Connection, lease_id: str, *, now: datetime, grace: timedelta) -> bool:
        """Inside the caller's transaction: record a live lease past its expiry and ``grace`` as expired (stranded
        work: its effects go in the same transaction). False when it was renewed or ended meanwhile."""
        async with conn.execute(
            "UPDATE leases SET status = 'expired', ended_at = ?, end_reason = 'expired', version = version + 1"
            " WHERE lease_id = ? AND status = 'live' AND expires_at <= ? RETURNING expires_at",
            (to_db_time(now), lease_id, to_db_time(now - grace)),
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return False
        await _event(conn, lease_id, "expired", "foreman", now, expired_at=row["expires_at"])
        return True
