"""Catch-up bookkeeping: reconcile passes and their watermark, the service's heartbeat, comment commands run once."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bot.core.issue_state import repo_key
from state.db import Database, from_db_time, to_db_time, utcnow
from state.outbox import OutboxIntent, enqueue
from state.sql import Row


@dataclass(frozen=True, slots=True)
class ReconcilePass:
    """One row of ``reconcile_passes``."""

    id: int
    repo: str
    trigger: str
    started_at: str
    finished_at: str | None
    since: str | None
    watermark: str | None
    outcome: str
    calls: int
    read_issues: int
    read_comments: int
    found: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    down_from: str | None = None
    down_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "repo": self.repo,
            "trigger": self.trigger,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "since": self.since,
            "watermark": self.watermark,
            "outcome": self.outcome,
            "calls": self.calls,
            "read": {"issues": self.read_issues, "comments": self.read_comments},
            "found": dict(self.found),
            "found_total": sum(self.found.values()),
            "error": self.error,
            "down_window": {"from": self.down_from, "seconds": self.down_seconds},
        }


_COLUMNS = (
    "id, repo, trigger, started_at, finished_at, since, watermark, outcome, calls, read_issues, read_comments,"
    " found_json, error, down_from, down_seconds"
)


def _pass(row: Any) -> ReconcilePass:
    return ReconcilePass(
        id=row[0],
        repo=row[1],
        trigger=row[2],
        started_at=row[3],
        finished_at=row[4],
        since=row[5],
        watermark=row[6],
        outcome=row[7],
        calls=row[8],
        read_issues=row[9],
        read_comments=row[10],
        found={str(k): int(v) for k, v in json.loads(row[11] or "{}").items()},
        error=row[12],
        down_from=row[13],
        down_seconds=row[14],
    )


class ReconcileStore:
    """Reads and writes of the catch-up tables; every write is its own short transaction."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def start_pass(
        self, repo: str, *, trigger: str, since: str | None, down_from: str | None, down_seconds: float | None
    ) -> int:
        async with self._db.transaction(durable=False) as conn:
            async with conn.execute(
                "INSERT INTO reconcile_passes (repo, trigger, started_at, since, outcome, down_from, down_seconds)"
                " VALUES (?, ?, ?, ?, 'running', ?, ?) RETURNING id",
                (repo_key(repo), trigger, to_db_time(utcnow()), since, down_from, down_seconds),
            ) as cur:
                row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def finish_pass(
        self,
        pass_id: int,
        *,
        outcome: str,
        watermark: str | None,
        calls: int,
        read_issues: int,
        read_comments: int,
        found: Mapping[str, int],
        error: str | None,
    ) -> None:
        async with self._db.transaction() as conn:
            await conn.execute(
                "UPDATE reconcile_passes SET finished_at = ?, outcome = ?, watermark = ?, calls = ?, read_issues = ?,"
                " read_comments = ?, found_json = ?, error = ? WHERE id = ?",
                (
                    to_db_time(utcnow()),
                    outcome,
                    watermark,
                    calls,
                    read_issues,
                    read_comments,
                    json.dumps(dict(found), sort_keys=True),
                    error,
                    pass_id,
                ),
            )

    async def watermark(self, repo: str) -> str | None:
        """Where the next pass reads from: the watermark of the last pass that succeeded (None: never)."""
        async with self._db.reader.execute(
            "SELECT watermark FROM reconcile_passes WHERE repo = ? AND outcome IN ('ok', 'baseline')"
            " AND watermark IS NOT NULL ORDER BY id DESC LIMIT 1",
            (repo_key(repo),),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def last_pass(self, repo: str, *, succeeded: bool = False) -> ReconcilePass | None:
        where = " AND outcome IN ('ok', 'baseline')" if succeeded else " AND outcome <> 'running'"
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM reconcile_passes WHERE repo = ?{where} ORDER BY id DESC LIMIT 1",  # noqa: S608
            (repo_key(repo),),
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else _pass(row)

    async def beat(self, repo: str, moment: datetime | None = None) -> None:
        async with self._db.transaction(durable=False) as conn:
            await conn.execute(
                "INSERT INTO reconcile_heartbeats (repo, seen_at) VALUES (?, ?)"
                " ON CONFLICT (repo) DO UPDATE SET seen_at = excluded.seen_at",
                (repo_key(repo), to_db_time(moment or utcnow())),
            )

    async def last_alive(self, repo: str) -> datetime | None:
        """The last heartbeat, else the end of the last pass (None: this database never served the repository)."""
        async with self._db.reader.execute(
            "SELECT seen_at FROM reconcile_heartbeats WHERE repo = ?", (repo_key(repo),)
        ) as cur:
            row = await cur.fetchone()
        if row is not None:
            return from_db_time(row[0])
        last = await self.last_pass(repo)
        return from_db_time(last.finished_at) if last is not None and last.finished_at else None

    # --- what the service already saw (for the plan: a synthetic delivery only for what it never saw) -----------------
    async def comment_revisions(self, repo: str, comment_ids: Iterable[int]) -> dict[int, str]:
        """Comment id → the newest ``updated_at`` recorded for it by any delivery (stored time form)."""
        ids = sorted(set(comment_ids))
        found: dict[int, str] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            async with self._db.reader.execute(
                "SELECT comment_id, MAX(comment_updated_at) FROM issue_comment_records"  # noqa: S608
                f" WHERE repo = ? AND comment_id IN ({marks}) GROUP BY comment_id",
                (repo_key(repo), *chunk),
            ) as cur:
                found.update({int(r[0]): str(r[1]) for r in await cur.fetchall()})
        return found

    async def claimed_comments(self, repo: str, comment_ids: Iterable[int]) -> set[int]:
        ids = sorted(set(comment_ids))
        claimed: set[int] = set()
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ", ".join("?" * len(chunk))
            async with self._db.reader.execute(
                f"SELECT comment_id FROM command_claims WHERE repo = ? AND comment_id IN ({marks})",  # noqa: S608
                (repo_key(repo), *chunk),
            ) as cur:
                claimed.update(int(r[0]) for r in await cur.fetchall())
        return claimed


@dataclass(frozen=True, slots=True)
class CommandClaim:
    """One comment's command claim: the delivery it ran (or runs) for, and when it finished (None: not yet)."""

    repo: str
    comment_id: int
    command: str | None
    delivery_id: str
    claimed_at: str
    finished_at: str | None


class CommandClaims:
    """A comment command runs once per comment (repository + comment id), whatever path brought the comment.

    The claim names the delivery that runs the command; until the command finishes, that delivery's own retries
    may run it again (a retry resumes what an unavailable Gitea interrupted). Once it finished, nothing runs it
    again: not a late webhook, a Replay, catch-up, nor a forced replay of the delivery that ran it.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    async def claim(self, repo: str, comment_id: int, command: str, delivery_id: str) -> CommandClaim | None:
        """Claim the comment's command for this delivery. None: this delivery runs it (a new claim, or its own
        retry of a command that has not finished); else the claim that stops it (another delivery's, or a
        finished one)."""
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO command_claims (repo, comment_id, command, delivery_id, claimed_at)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (repo, comment_id) DO NOTHING",
                (repo_key(repo), comment_id, command, delivery_id, to_db_time(utcnow())),
            )
            async with conn.execute(
                f"SELECT {_CLAIM_COLUMNS} FROM command_claims WHERE repo = ? AND comment_id = ?",  # noqa: S608
                (repo_key(repo), comment_id),
            ) as cur:
                row = await cur.fetchone()
        assert row is not None  # inserted or already there, inside this transaction
        held = _claim(row)
        return None if held.delivery_id == delivery_id and held.finished_at is None else held

    async def finish(self, repo: str, comment_id: int, delivery_id: str, reply: OutboxIntent) -> None:
        """The command ran for ``delivery_id``: queue its reply and mark the claim finished, in one commit (a
        crash between the two cannot leave a finished command without its reply, nor a reply for a command
        that a retry runs again). The reply is filed as any outbox entry: under the repository the task acts for."""
        async with self._db.transaction() as conn:
            await enqueue(conn, reply)
            await conn.execute(
                "UPDATE command_claims SET finished_at = ? WHERE repo = ? AND comment_id = ? AND delivery_id = ?"
                " AND finished_at IS NULL",
                (to_db_time(utcnow()), repo_key(repo), comment_id, delivery_id),
            )

    async def get(self, repo: str, comment_id: int) -> CommandClaim | None:
        async with self._db.reader.execute(
            f"SELECT {_CLAIM_COLUMNS} FROM command_claims WHERE repo = ? AND comment_id = ?",  # noqa: S608
            (repo_key(repo), comment_id),
        ) as cur:
            row = await cur.fetchone()
        return _claim(row) if row is not None else None


_CLAIM_COLUMNS = "repo, comment_id, command, delivery_id, claimed_at, finished_at"


def _claim(row: Row) -> CommandClaim:
    return CommandClaim(
        repo=str(row[0]),
        comment_id=int(row[1]),
        command=None if row[2] is None else str(row[2]),
        delivery_id=str(row[3]),
        claimed_at=str(row[4]),
        finished_at=None if row[5] is None else str(row[5]),
    )
