"""A controller's standing exclusions: what it last stated in an allocation call for an action, applied by
auto-allocation to that action's decisions."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from state.db import Database, to_db_time


class ExclusionStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def state(self, repo: str, controller: str, numbers: Iterable[int], *, action: str, at: datetime,
                    via: str | None) -> None:
        """Record what ``controller`` excludes from now on in allocations for ``action`` (replacing what it stated
        before for that action only: a review statement leaves its implement one standing, and the reverse)."""
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO controller_exclusions (repo, controller, action, issue_numbers, stated_at, via)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (repo, controller, action, json.dumps(sorted(set(numbers))), to_db_time(at), via),
            )

    async def standing(self, repo: str, *, action: str = "implement") -> dict[str, list[int]]:
        """Each controller's latest statement for ``action`` that still excludes something."""
        async with self._db.reader.execute(
            "SELECT controller, issue_numbers FROM controller_exclusions WHERE id IN"
            " (SELECT MAX(id) FROM controller_exclusions WHERE repo = ? AND action = ? GROUP BY controller)"
            " ORDER BY controller",
            (repo, action),
        ) as cur:
            rows = list(await cur.fetchall())
        found = {row["controller"]: list(json.loads(row["issue_numbers"])) for row in rows}
        return {controller: numbers for controller, numbers in found.items() if numbers}
