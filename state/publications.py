"""The publish journal (commit, push, read-back of an issue branch) and the pull request recorded for each issue."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from state.db import Database, to_db_time
from state.sql import Connection, Row

PublishPhase = Literal["started", "committed", "pushed", "verified"]

_P_COLUMNS = (
    "id, repo, issue_number, key, lease_id, owner, branch, worktree_path, message_digest, phase, parent_sha,"
    " commit_sha, remote_before, result_json, created_at, updated_at"
)


@dataclass(frozen=True, slots=True)
class Publication:
    """One publish of an issue branch: where it stands (``phase``) and the commit it made or adopted."""

    id: int
    repo: str
    issue_number: int
    key: str
    lease_id: str
    owner: str
    branch: str
    worktree_path: str
    message_digest: str
    phase: PublishPhase
    parent_sha: str | None
    commit_sha: str | None
    remote_before: str | None
    result: dict[str, Any] | None
    created_at: str
    updated_at: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "issue_number": self.issue_number,
            "lease_id": self.lease_id,
            "owner": self.owner,
            "branch": self.branch,
            "phase": self.phase,
            "parent_sha": self.parent_sha,
            "commit_sha": self.commit_sha,
            "remote_before": self.remote_before,
        }


@dataclass(frozen=True, slots=True)
class IssuePull:
    """The pull request foreman opened (or adopted) for an issue."""

    repo: str
    issue_number: int
    pr_number: int
    head: str
    base: str
    opened_by: str
    adopted: bool
    recorded_at: str

    def to_dict(self) -> dict[str, Any]:
        return {"issue_number": self.issue_number, "pr_number": self.pr_number, "head": self.head,
                "base": self.base, "opened_by": self.opened_by, "adopted": self.adopted}


def _publication(row: Row) -> Publication:
    data = dict(row)
    raw = data.pop("result_json")
    return Publication(**data, result=json.loads(raw) if raw else None)


class PublicationStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def get(self, repo: str, key: str, conn: Connection | None = None) -> Publication | None:
        source = conn if conn is not None else self._db.reader
        async with source.execute(
            f"SELECT {_P_COLUMNS} FROM publications WHERE repo = ? AND key = ?", (repo, key)  # noqa: S608
        ) as cur:
            row = await cur.fetchone()
        return _publication(row) if row is not None else None

    async def start(
        self, conn: Connection, *, repo: str, issue_number: int, key: str, lease_id: str, owner: str,
        branch: str, worktree_path: str, message_digest: str, parent_sha: str | None, now: datetime,
    ) -> Publication:
        """Record a new publish (phase ``started``); an existing key is returned as it is."""
        at = to_db_time(now)
        await conn.execute(
            "INSERT INTO publications (repo, issue_number, key, lease_id, owner, branch, worktree_path,"
            " message_digest, phase, parent_sha, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'started', ?, ?, ?) ON CONFLICT (repo, key) DO NOTHING",
            (repo, issue_number, key, lease_id, owner, branch, worktree_path, message_digest, parent_sha, at, at),
        )
        found = await self.get(repo, key, conn)
        assert found is not None
        return found

    async def advance(
        self, conn: Connection, publication: Publication, phase: PublishPhase, *, now: datetime,
        commit_sha: str | None = None, remote_before: str | None = None, result: dict[str, Any] | None = None,
    ) -> Publication:
        """Move a publish on to ``phase``, keeping what earlier phases recorded unless given again."""
        await conn.execute(
            "UPDATE publications SET phase = ?, commit_sha = COALESCE(?, commit_sha),"
            " remote_before = COALESCE(?, remote_before), result_json = COALESCE(?, result_json), updated_at = ?"
            " WHERE id = ?",
            (phase, commit_sha, remote_before, json.dumps(result, sort_keys=True) if result is not None else None,
             to_db_time(now), publication.id),
        )
        found = await self.get(publication.repo, publication.key, conn)
        assert found is not None
        return found

    async def unfinished(self, repo: str, issue_number: int, lease_id: str, message_digest: str) -> Publication | None:
        """The latest publish of this lease and message that did not reach ``pushed`` (a crash or a refusal)."""
        async with self._db.reader.execute(
            f"SELECT {_P_COLUMNS} FROM publications WHERE repo = ? AND issue_number = ? AND lease_id = ?"  # noqa: S608
            " AND message_digest = ? AND phase IN ('started', 'committed') ORDER BY id DESC LIMIT 1",
            (repo, issue_number, lease_id, message_digest),
        ) as cur:
            row = await cur.fetchone()
        return _publication(row) if row is not None else None

    async def pushed_branches(self, repo: str, branch: str) -> list[Publication]:
        """The publishes of ours that pushed ``branch`` to Gitea (phase pushed or verified)."""
        async with self._db.reader.execute(
            f"SELECT {_P_COLUMNS} FROM publications WHERE repo = ? AND branch = ?"  # noqa: S608
            " AND phase IN ('pushed', 'verified') ORDER BY id",
            (repo, branch),
        ) as cur:
            return [_publication(row) for row in await cur.fetchall()]

    async def for_issue(self, repo: str, issue_number: int) -> list[Publication]:
        async with self._db.reader.execute(
            f"SELECT {_P_COLUMNS} FROM publications WHERE repo = ? AND issue_number = ? ORDER BY id",  # noqa: S608
            (repo, issue_number),
        ) as cur:
            return [_publication(row) for row in await cur.fetchall()]

    # --- pull requests ------------------------------------------------------------------------------------------------

    async def record_pull(
        self, conn: Connection, *, repo: str, issue_number: int, pr_number: int, head: str, base: str,
        opened_by: str, adopted: bool, now: datetime,
    ) -> None:
        await conn.execute(
            "INSERT INTO issue_pulls (repo, issue_number, pr_number, head, base, opened_by, adopted, recorded_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (repo, issue_number, pr_number) DO NOTHING",
            (repo, issue_number, pr_number, head, base, opened_by, int(adopted), to_db_time(now)),
        )

    async def pull_for_issue(self, repo: str, issue_number: int) -> IssuePull | None:
        """The latest pull request recorded for the issue (reviewers and the merge find it here)."""
        async with self._db.reader.execute(
            "SELECT repo, issue_number, pr_number, head, base, opened_by, adopted, recorded_at FROM issue_pulls"
            " WHERE repo = ? AND issue_number = ? ORDER BY recorded_at DESC, pr_number DESC LIMIT 1",
            (repo, issue_number),
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        data = dict(row)
        return IssuePull(**{**data, "adopted": bool(data["adopted"])})
