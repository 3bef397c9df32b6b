"""Teardowns: the record of each issue's end of life, written once per key in the transaction that ends its leases."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from state.db import Database, to_db_time
from state.sql import Connection, Row

_COLUMNS = "key, repo, issue_number, reason, pr_number, trigger, delivery_id, outcome_json, created_at"


@dataclass(frozen=True, slots=True)
class TeardownRecord:
    key: str
    repo: str
    issue_number: int
    reason: str
    pr_number: int | None
    trigger: str
    delivery_id: str | None
    outcome: dict[str, Any]
    created_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "issue_number": self.issue_number, "reason": self.reason, "pr_number": self.pr_number,
            "trigger": self.trigger, "delivery_id": self.delivery_id, "outcome": self.outcome,
            "created_at": self.created_at,
        }


def _record(row: Row) -> TeardownRecord:
    return TeardownRecord(
        key=row["key"], repo=row["repo"], issue_number=int(row["issue_number"]), reason=row["reason"],
        pr_number=row["pr_number"], trigger=row["trigger"], delivery_id=row["delivery_id"],
        outcome=json.loads(row["outcome_json"]), created_at=row["created_at"],
    )


class TeardownStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, key: str, conn: Connection | None = None) -> TeardownRecord | None:
        source = conn or self._db.reader
        async with source.execute(f"SELECT {_COLUMNS} FROM teardowns WHERE key = ?", (key,)) as cur:  # noqa: S608
            row = await cur.fetchone()
        return _record(row) if row is not None else None

    async def for_issue(self, repo: str, issue_number: int) -> list[TeardownRecord]:
        """Every teardown of the issue, oldest first."""
        async with self._db.reader.execute(
            f"SELECT {_COLUMNS} FROM teardowns WHERE repo = ? AND issue_number = ? ORDER BY created_at, key",  # noqa: S608
            (repo, issue_number),
        ) as cur:
            return [_record(row) for row in await cur.fetchall()]

    async def every(self) -> list[TeardownRecord]:
        async with self._db.reader.execute(f"SELECT {_COLUMNS} FROM teardowns ORDER BY created_at") as cur:  # noqa: S608
            return [_record(row) for row in await cur.fetchall()]

    async def torn_down_pulls(self, repo: str) -> frozenset[int]:
        """The pull requests whose close was torn down already (catch-up plans nothing for them)."""
        async with self._db.reader.execute(
            "SELECT pr_number FROM teardowns WHERE repo = ? AND pr_number IS NOT NULL", (repo,)
        ) as cur:
            return frozenset(int(row[0]) for row in await cur.fetchall())

    async def record(
        self, conn: Connection, *, key: str, repo: str, issue_number: int, reason: str,
        pr_number: int | None, trigger: str, delivery_id: str | None, outcome: dict[str, Any], now: datetime,
    ) -> bool:
        """Inside the caller's transaction; False when the key was recorded already (nothing is written)."""
        cursor = await conn.execute(
            f"INSERT INTO teardowns ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO NOTHING",  # noqa: S608
            (key, repo, issue_number, reason, pr_number, trigger, delivery_id,
             json.dumps(outcome, sort_keys=True, separators=(",", ":")), to_db_time(now)),
        )
        return bool(cursor.rowcount == 1)
