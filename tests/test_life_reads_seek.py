"""Issue 35: what every life reads of the journal and the publications is a seek, not a scan of every row ever
written (the whole-life benchmark's latency grew with them). The statements are the stores' own, as they run."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from state.db import Database
from state.journal import JournalStore
from state.publications import PublicationStore

#: The tables each life adds rows to that these reads name; a full SCAN of one grows with the lives.
GROWING = ("worktree_registrations", "bootstrap_journal", "publications")


def _tracing(statements: list[str]) -> Callable[..., sqlite3.Connection]:
    connect = sqlite3.connect

    def tracing_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.set_trace_callback(statements.append)
        return conn

    return tracing_connect


async def test_each_lifes_journal_and_publication_reads_seek(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    statements: list[str] = []
    monkeypatch.setattr(sqlite3, "connect", _tracing(statements))
    db = await Database.open(tmp_path / "foreman.db")
    try:
        statements.clear()
        journal, publications = JournalStore(db), PublicationStore(db)
        assert await journal.registrations("o/r", 7) == []
        assert await journal.registration_for_journal(3) is None
        assert await journal.compensated_count("lease-1") == 0
        assert await publications.unfinished("o/r", 7, "lease-1", "digest") is None
    finally:
        await db.close()
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 4, statements
    with sqlite3.connect(tmp_path / "foreman.db") as conn:
        for sql in reads:
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}")]
            scans = [line for line in plan if re.match(rf"SCAN ({'|'.join(GROWING)})\b", line)]
            assert scans == [], (sql, plan)
