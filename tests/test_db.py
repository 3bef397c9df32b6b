"""The database edge opened read-only: it reads what a writer committed and refuses to write or create."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from state.db import Database, read_only
from state.outbox import OutboxIntent, OutboxStore


async def test_a_read_only_database_sees_the_writers_commits_and_refuses_writes(tmp_path: Path) -> None:
    path = tmp_path / "with space?and#hash" / "foreman.db"
    writer = await Database.open(path)
    try:
        async with read_only(path) as db:
            assert await OutboxStore(db).counts() == dict.fromkeys(await OutboxStore(writer).counts(), 0)
            await OutboxStore(writer).add(OutboxIntent("k", 1, "labels", {"add": ["x"]}))
            assert (await OutboxStore(db).counts())["pending"] == 1
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                await OutboxStore(db).add(OutboxIntent("k2", 1, "labels", {"add": ["y"]}))
    finally:
        await writer.close()


async def test_a_read_only_database_is_never_created(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await Database.open_read_only(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
