"""Auto-allocation decisions: every automatic run of the allocator, as it decided, kept as history."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from state.db import Database, to_db_time


@dataclass(frozen=True, slots=True)
class AutoDecision:
    """One row of ``auto_allocations``: when, why (the trigger and its delivery) and the decision's document."""

    decided_at: str
    trigger: str
    delivery_id: str | None
    doc: Any


class AutoAllocationStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def record(self, repo: str, *, decided_at: datetime, trigger: str, delivery_id: str | None,
                     doc: dict[str, Any]) -> None:
        """Append one decision (its own transaction: the decision's effects were committed by then)."""
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO auto_allocations (repo, decided_at, trigger, delivery_id, doc_json)"
                " VALUES (?, ?, ?, ?, ?)",
                (repo, to_db_time(decided_at), trigger, delivery_id, json.dumps(doc, sort_keys=True, default=str)),
            )

    async def recent(self, repo: str, *, limit: int = 10) -> list[AutoDecision]:
        """The repository's latest decisions, newest first."""
        async with self._db.reader.execute(
            "SELECT decided_at, trigger, delivery_id, doc_json FROM auto_allocations WHERE repo = ?"
            " ORDER BY id DESC LIMIT ?",
            (repo, limit),
        ) as cur:
            return [AutoDecision(r["decided_at"], r["trigger"], r["delivery_id"], json.loads(r["doc_json"]))
                    for r in await cur.fetchall()]
