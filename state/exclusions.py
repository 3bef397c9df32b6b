"""A controller's standing exclusions: what it last stated in an allocation call, applied by auto-allocation."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from state.db import Database, to_db_time


class ExclusionStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def state(self, repo: str, controller: str, numbers: Iterable[int], *, at: datetime,
                    via: str | None) -> None:
        """Record what ``controller`` excludes from now on (replacing what it stated before)."""
        async with self._db.transaction() as conn:
            await conn.execute(
                "INSERT INTO controller_exclusions (repo, controller, issue_numbers, stated_at, via)"
                " VALUES (?, ?, ?, ?, ?)",
                (repo, controller, json.dumps(sorted(set(numbers))), to_db_time(at), via),
            )

    async def standing(self, repo: str) -> dict[str, list[int]]:
        """Each controller's latest statement that still excludes something."""
        async with self._db.reader.execute(
            "SELECT controller, issue_numbers FROM controller_exclusions WHERE id IN"
            " (SELECT MAX(id) FROM controller_exclusions WHERE repo = ? GROUP BY controller) ORDER BY controller",
            (repo,),
        ) as cur:
            rows = list(await cur.fetchall())
        found = {row["controller"]: list(json.loads(row["issue_numbers"])) for row in rows}
        return {controller: numbers for controller, numbers in found.items() if numbers}
