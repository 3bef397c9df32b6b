"""The bootstrap phase journal, worktree registrations and issue locks (SQLite; constraints do the guarding)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from bot.core.bootstrap import Outcome, Phase, may_follow, outcome_of
from state.db import Database, from_row, to_db_time
from state.sql import Connection, IntegrityError, Row


class JournalConflict(Exception):
    """A unique constraint refused the write: another transition holds the issue, the path or the lease."""


class JournalRaced(Exception):
    """The transition's row changed since it was read (another runner advanced it): nothing was written."""


@dataclass(frozen=True, slots=True)
class NewTransition:
    """The authoritative inputs of a transition, as recorded by ``accept``."""

    key: str
    key_source: Literal["caller", "derived"]
    repo: str
    issue_number: int
    lease_id: str
    owner: str
    role: str
    attempt: int
    base_branch: str
    base_sha: str
    branch: str
    checkout_path: str
    worktree_path: str
    inputs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Transition(NewTransition):
    """One bootstrap transition as stored: its inputs, and where its journal stands."""

    id: int
    phase: Phase
    outcome: Outcome
    failed_phase: str | None
    error: dict[str, Any] | None
    result: dict[str, Any] | None
    created_at: str
    updated_at: str
    version: int

    def summary(self) -> dict[str, Any]:
        return {
            "idempotency_key": self.key,
            "key_source": self.key_source,
            "issue_number": self.issue_number,
            "lease_id": self.lease_id,
            "owner": self.owner,
            "phase": self.phase,
            "outcome": self.outcome,
            "branch": self.branch,
            "worktree_path": self.worktree_path,
            "base_branch": self.base_branch,
            "base_sha": self.base_sha,
            "failed_phase": self.failed_phase,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    phase: Phase
    proof: dict[str, Any]
    runner: str
    recorded_at: str

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "recorded_at": self.recorded_at, "runner": self.runner, "proof": self.proof}


#: The ``end_reason`` of a kept worktree's registration, until the issue's teardown removes it (``clear_kept``).
KEPT_PREFIX = "kept: "


@dataclass(frozen=True, slots=True)
class Registration:
    id: int
    journal_id: int
    repo: str
    issue_number: int
    lease_id: str
    owner: str
    branch: str
    worktree_path: str
    created_branch: bool
    created_worktree: bool
    registered_at: str
    ended_at: str | None
    end_reason: str | None

    @property
    def kept(self) -> bool:
        """A worktree kept aside for its earlier owner when another author took the issue over, not yet removed by
        the issue's teardown (a row recorded ended, its ``end_reason`` starting with ``KEPT_PREFIX``)."""
        return self.ended_at is not None and (self.end_reason or "").startswith(KEPT_PREFIX)

    def to_dict(self) -> dict[str, Any]:
        return {
            "registration_id": self.id,
            "lease_id": self.lease_id,
            "owner": self.owner,
            "branch": self.branch,
            "worktree_path": self.worktree_path,
            "created_branch": self.created_branch,
            "created_worktree": self.created_worktree,
            "registered_at": self.registered_at,
            "ended_at": self.ended_at,
            "end_reason": self.end_reason,
        }


@dataclass(frozen=True, slots=True)
class IssueLock:
    lock_id: str
    repo: str
    issue_number: int
    lease_id: str
    owner: str
    registration_id: int
    branch: str
    worktree_path: str
    proof: dict[str, Any]
    acquired_at: str
    released_at: str | None
    release_reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "lock_id": self.lock_id,
            "issue_number": self.issue_number,
            "lease_id": self.lease_id,
            "owner": self.owner,
            "registration_id": self.registration_id,
            "branch": self.branch,
            "worktree_path": self.worktree_path,
            "acquired_at": self.acquired_at,
            "released_at": self.released_at,
            "release_reason": self.release_reason,
        }


_T_COLUMNS = (
    "id, idempotency_key, key_source, repo, issue_number, lease_id, owner, role, attempt, base_branch, base_sha,"
    " branch, checkout_path, worktree_path, inputs_json, phase, outcome, failed_phase, error_json, result_json,"
    " created_at, updated_at, version"
)
_R_COLUMNS = (
    "id, journal_id, repo, issue_number, lease_id, owner, branch, worktree_path, created_branch, created_worktree,"
    " registered_at, ended_at, end_reason"
)
_L_COLUMNS = (
    "lock_id, repo, issue_number, lease_id, owner, registration_id, branch, worktree_path, proof_json, acquired_at,"
    " released_at, release_reason"
)


def _returning(statement: str, columns: str) -> str:
    return f"{statement} RETURNING {columns}"


_INSERT_TRANSITION = _returning(
    "INSERT INTO bootstrap_journal (idempotency_key, key_source, repo, issue_number, lease_id, owner, role, attempt,"
    " base_branch, base_sha, branch, checkout_path, worktree_path, inputs_json, phase, outcome, created_at,"
    " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'accepted', 'open', ?, ?)",
    _T_COLUMNS,
)
_ADVANCE = _returning(
    "UPDATE bootstrap_journal SET phase = ?, outcome = ?, failed_phase = ?, error_json = COALESCE(?, error_json),"
    " result_json = COALESCE(?, result_json), updated_at = ?, version = version + 1"
    " WHERE id = ? AND phase = ? AND version = ?",
    _T_COLUMNS,
)
_INSERT_REGISTRATION = _returning(
    "INSERT INTO worktree_registrations (journal_id, repo, issue_number, lease_id, owner, branch, worktree_path,"
    " created_branch, created_worktree, registered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    _R_COLUMNS,
)
_INSERT_KEPT = _returning(
    "INSERT INTO worktree_registrations (journal_id, repo, issue_number, lease_id, owner, branch, worktree_path,"
    " created_branch, created_worktree, registered_at, ended_at, end_reason)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    _R_COLUMNS,
)
_INSERT_LOCK = _returning(
    "INSERT INTO issue_locks (lock_id, repo, issue_number, lease_id, owner, registration_id, branch, worktree_path,"
    " proof_json, acquired_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    _L_COLUMNS,
)


def _loads(text: str | None) -> Any:
    return json.loads(text) if text else None


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _transition(row: Row) -> Transition:
    return from_row(Transition, row, key=row["idempotency_key"], inputs=json.loads(row["inputs_json"]),
                    error=_loads(row["error_json"]), result=_loads(row["result_json"]))


def _registration(row: Row) -> Registration:
    return from_row(Registration, row, created_branch=bool(row["created_branch"]),
                    created_worktree=bool(row["created_worktree"]))


def _lock(row: Row) -> IssueLock:
    return from_row(IssueLock, row, proof=json.loads(row["proof_json"]))


class JournalStore:
    """Reads take the database's reader; every write takes the caller's open transaction (so a phase, its
    proof and the effects recorded with it commit together)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def _source(self, conn: Connection | None) -> Connection:
        return conn or self._db.reader

    async def _one(self, conn: Connection | None, sql: str, params: tuple[Any, ...]) -> Row | None:
        async with self._source(conn).execute(sql, params) as cur:
            row: Row | None = await cur.fetchone()
        return row

    # --- transitions --------------------------------------------------------------------------------------------------

    async def get(self, key: str, conn: Connection | None = None) -> Transition | None:
        row = await self._one(conn, f"SELECT {_T_COLUMNS} FROM bootstrap_journal WHERE idempotency_key = ?", (key,))  # noqa: S608
        return _transition(row) if row is not None else None

    async def open_for_issue(
        self, repo: str, issue_number: int, conn: Connection | None = None
    ) -> Transition | None:
        row = await self._one(
            conn,
            f"SELECT {_T_COLUMNS} FROM bootstrap_journal WHERE repo = ? AND issue_number = ? AND outcome = 'open'",  # noqa: S608
            (repo, issue_number),
        )
        return _transition(row) if row is not None else None

    async def open_transitions(self, repo: str) -> list[Transition]:
        """Every transition not yet completed or compensated (what a dead process may have left half-way)."""
        async with self._db.reader.execute(
            f"SELECT {_T_COLUMNS} FROM bootstrap_journal WHERE repo = ? AND outcome = 'open' ORDER BY id",  # noqa: S608
            (repo,),
        ) as cur:
            return [_transition(row) for row in await cur.fetchall()]

    async def completed_for_lease(self, lease_id: str, conn: Connection | None = None) -> Transition | None:
        row = await self._one(
            conn,
            f"SELECT {_T_COLUMNS} FROM bootstrap_journal WHERE lease_id = ? AND outcome = 'completed'",  # noqa: S608
            (lease_id,),
        )
        return _transition(row) if row is not None else None

    async def latest_completed(self, repo: str, issue_number: int) -> Transition | None:
        row = await self._one(
            None,
            f"SELECT {_T_COLUMNS} FROM bootstrap_journal WHERE repo = ? AND issue_number = ? AND outcome = 'completed'"  # noqa: S608
            " ORDER BY id DESC LIMIT 1",
            (repo, issue_number),
        )
        return _transition(row) if row is not None else None

    async def compensated_count(self, lease_id: str) -> int:
        async with self._db.reader.execute(
            "SELECT COUNT(*) FROM bootstrap_journal WHERE lease_id = ? AND outcome = 'compensated'", (lease_id,)
        ) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row is not None else 0

    async def history(self, repo: str, issue_number: int) -> list[Transition]:
        async with self._db.reader.execute(
            f"SELECT {_T_COLUMNS} FROM bootstrap_journal WHERE repo = ? AND issue_number = ? ORDER BY id",  # noqa: S608
            (repo, issue_number),
        ) as cur:
            return [_transition(row) for row in await cur.fetchall()]

    async def recent(self, repo: str, *, issue: int | None = None, limit: int = 50) -> list[Transition]:
        """The repository's transitions (of one issue), newest first."""
        where, params = "repo = ?", list[Any]([repo])
        if issue is not None:
            where, params = where + " AND issue_number = ?", [*params, issue]
        async with self._db.reader.execute(
            f"SELECT {_T_COLUMNS} FROM bootstrap_journal WHERE {where} ORDER BY id DESC LIMIT ?",  # noqa: S608
            (*params, limit),
        ) as cur:
            return [_transition(row) for row in await cur.fetchall()]

    async def first_for_lease(self, lease_id: str) -> Transition | None:
        """The lease's first transition, whatever its outcome."""
        row = await self._one(
            None, f"SELECT {_T_COLUMNS} FROM bootstrap_journal WHERE lease_id = ? ORDER BY id LIMIT 1", (lease_id,)  # noqa: S608
        )
        return _transition(row) if row is not None else None

    async def every_transition(self) -> list[Transition]:
        """Every transition of every repository, oldest first (the invariant checker's view)."""
        async with self._db.reader.execute(f"SELECT {_T_COLUMNS} FROM bootstrap_journal ORDER BY id") as cur:  # noqa: S608
            return [_transition(row) for row in await cur.fetchall()]

    async def outcome_counts(self) -> tuple[dict[str, int], str | None]:
        """Transitions per outcome, and when the oldest still open one was created (None: none is open)."""
        async with self._db.reader.execute(
            "SELECT outcome, count(*) AS n, min(CASE WHEN outcome = 'open' THEN created_at END) AS oldest"
            " FROM bootstrap_journal GROUP BY outcome"
        ) as cur:
            rows = list(await cur.fetchall())
        return {row["outcome"]: row["n"] for row in rows}, next((row["oldest"] for row in rows if row["oldest"]), None)

    async def phases(self, journal_id: int, conn: Connection | None = None) -> list[PhaseRecord]:
        async with self._source(conn).execute(
            "SELECT phase, proof_json, runner, recorded_at FROM bootstrap_phases WHERE journal_id = ? ORDER BY id",
            (journal_id,),
        ) as cur:
            return [
                PhaseRecord(row["phase"], json.loads(row["proof_json"]), row["runner"], row["recorded_at"])
                for row in await cur.fetchall()
            ]

    async def phases_of(self, journal_ids: Iterable[int]) -> dict[int, list[PhaseRecord]]:
        """The phases of several transitions in one read, each transition's oldest first."""
        ids = sorted(set(journal_ids))
        found: dict[int, list[PhaseRecord]] = {journal_id: [] for journal_id in ids}
        if not ids:
            return found  # "IN ()" is SQLite's, not PostgreSQL's
        marks = ", ".join("?" for _ in ids)
        async with self._db.reader.execute(
            "SELECT journal_id, phase, proof_json, runner, recorded_at FROM bootstrap_phases"  # noqa: S608
            f" WHERE journal_id IN ({marks}) ORDER BY id",
            ids,
        ) as cur:
            for row in await cur.fetchall():
                found[row["journal_id"]].append(
                    PhaseRecord(row["phase"], json.loads(row["proof_json"]), row["runner"], row["recorded_at"]))
        return found

    async def proof(self, journal_id: int, phase: Phase) -> dict[str, Any] | None:
        row = await self._one(
            None, "SELECT proof_json FROM bootstrap_phases WHERE journal_id = ? AND phase = ?", (journal_id, phase)
        )
        return json.loads(row["proof_json"]) if row is not None else None

    async def accept(
        self, conn: Connection, new: NewTransition, *, proof: dict[str, Any], runner: str, now: datetime
    ) -> Transition:
        """Record the request (phase ``accepted``) with its inputs. JournalConflict when the key, the issue's
        open transition, the path or the lease's completed transition is already taken."""
        moment = to_db_time(now)
        try:
            async with conn.execute(
                _INSERT_TRANSITION,
                (
                    new.key, new.key_source, new.repo, new.issue_number, new.lease_id, new.owner, new.role,
                    new.attempt, new.base_branch, new.base_sha, new.branch, new.checkout_path, new.worktree_path,
                    _dumps(new.inputs), moment, moment,
                ),
            ) as cur:
                row = await cur.fetchone()
        except IntegrityError as exc:
            raise JournalConflict(str(exc)) from exc
        assert row is not None
        transition = _transition(row)
        await self._record_phase(conn, transition.id, "accepted", proof, runner, moment)
        return transition

    async def _record_phase(
        self, conn: Connection, journal_id: int, phase: Phase, proof: dict[str, Any], runner: str,
        moment: str,
    ) -> None:
        try:
            await conn.execute(
                "INSERT INTO bootstrap_phases (journal_id, phase, proof_json, runner, recorded_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (journal_id, phase, _dumps(proof), runner, moment),
            )
        except IntegrityError as exc:
            raise JournalRaced(f"phase {phase} of transition {journal_id} is already recorded") from exc

    async def advance(
        self,
        conn: Connection,
        transition: Transition,
        phase: Phase,
        *,
        proof: dict[str, Any],
        runner: str,
        now: datetime,
        error: dict[str, Any] | None = None,
        result: dict[str, Any] | None = None,
    ) -> Transition:
        """Move to ``phase`` only if the row is still as ``transition`` saw it (JournalRaced otherwise)."""
        if not may_follow(transition.phase, phase):
            raise ValueError(f"a transition cannot move from {transition.phase} to {phase}")
        moment = to_db_time(now)
        failed_phase = transition.phase if phase == "compensation_required" else transition.failed_phase
        async with conn.execute(
            _ADVANCE,
            (
                phase, outcome_of(phase), failed_phase, _dumps(error) if error is not None else None,
                _dumps(result) if result is not None else None, moment, transition.id, transition.phase,
                transition.version,
            ),
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            raise JournalRaced(f"transition {transition.key} changed since it was read")
        await self._record_phase(conn, transition.id, phase, proof, runner, moment)
        return _transition(row)

    async def note_error(self, conn: Connection, transition: Transition, error: dict[str, Any],
                         *, now: datetime) -> Transition:
        """Record why the transition cannot go on (without changing its phase)."""
        async with conn.execute(
            f"UPDATE bootstrap_journal SET error_json = ?, updated_at = ?, version = version + 1 WHERE id = ?"  # noqa: S608
            f" AND version = ? RETURNING {_T_COLUMNS}",
            (_dumps(error), to_db_time(now), transition.id, transition.version),
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            raise JournalRaced(f"transition {transition.key} changed since it was read")
        return _transition(row)

    # --- registrations ------------------------------------------------------------------------------------------------

    async def live_registration(
        self, repo: str, issue_number: int, conn: Connection | None = None
    ) -> Registration | None:
        row = await self._one(
            conn,
            f"SELECT {_R_COLUMNS} FROM worktree_registrations WHERE repo = ? AND issue_number = ?"  # noqa: S608
            " AND ended_at IS NULL",
            (repo, issue_number),
        )
        return _registration(row) if row is not None else None

    async def registration_for_journal(
        self, journal_id: int, conn: Connection | None = None
    ) -> Registration | None:
        row = await self._one(
            conn,
            f"SELECT {_R_COLUMNS} FROM worktree_registrations WHERE journal_id = ? ORDER BY id DESC LIMIT 1",  # noqa: S608
            (journal_id,),
        )
        return _registration(row) if row is not None else None

    async def registrations(self, repo: str, issue_number: int) -> list[Registration]:
        """Every worktree registered for the issue, oldest first."""
        async with self._db.reader.execute(
            f"SELECT {_R_COLUMNS} FROM worktree_registrations WHERE repo = ? AND issue_number = ? ORDER BY id",  # noqa: S608
            (repo, issue_number),
        ) as cur:
            return [_registration(row) for row in await cur.fetchall()]

    async def every_registration(self) -> list[tuple[str, Registration]]:
        """Every registration with the idempotency key of its transition, oldest first (the invariant checker's)."""
        columns = ", ".join(f"r.{name.strip()}" for name in _R_COLUMNS.split(","))
        async with self._db.reader.execute(
            f"SELECT j.idempotency_key AS journal_key, {columns} FROM worktree_registrations r"  # noqa: S608
            " JOIN bootstrap_journal j ON j.id = r.journal_id ORDER BY r.id"
        ) as cur:
            return [(row["journal_key"], _registration(row)) for row in await cur.fetchall()]

    async def register(
        self, conn: Connection, transition: Transition, *, created_branch: bool, created_worktree: bool,
        now: datetime,
    ) -> Registration:
        try:
            async with conn.execute(
                _INSERT_REGISTRATION,
                (
                    transition.id, transition.repo, transition.issue_number, transition.lease_id, transition.owner,
                    transition.branch, transition.worktree_path, int(created_branch), int(created_worktree),
                    to_db_time(now),
                ),
            ) as cur:
                row = await cur.fetchone()
        except IntegrityError as exc:
            raise JournalConflict(str(exc)) from exc
        assert row is not None
        return _registration(row)

    async def end_registration(self, conn: Connection, registration_id: int, *, reason: str,
                               now: datetime) -> bool:
        cursor = await conn.execute(
            "UPDATE worktree_registrations SET ended_at = ?, end_reason = ? WHERE id = ? AND ended_at IS NULL",
            (to_db_time(now), reason, registration_id),
        )
        return bool(cursor.rowcount == 1)

    async def keep_registration(
        self, conn: Connection, registration: Registration, *, kept_path: str, journal_id: int,
        created_worktree: bool, reason: str, now: datetime,
    ) -> Registration:
        """Record ``registration``'s worktree as kept at ``kept_path`` for its owner (taken over by another author):
        a row of the same owner, lease and branch, ended from the start (never the issue's live registration), with
        ``end_reason`` ``KEPT_PREFIX + reason`` until the issue's teardown removes the worktree. ``journal_id`` and
        ``created_worktree`` are those of the transition that created the worktree (the teardown's proof)."""
        moment = to_db_time(now)
        async with conn.execute(
            _INSERT_KEPT,
            (
                journal_id, registration.repo, registration.issue_number, registration.lease_id, registration.owner,
                registration.branch, kept_path, 0, int(created_worktree), moment, moment, f"{KEPT_PREFIX}{reason}",
            ),
        ) as cur:
            row = await cur.fetchone()
        assert row is not None
        return _registration(row)

    async def kept_registrations(self, repo: str, issue_number: int,
                                 conn: Connection | None = None) -> list[Registration]:
        """The issue's kept worktrees not yet removed by its teardown, oldest first."""
        async with self._source(conn).execute(
            f"SELECT {_R_COLUMNS} FROM worktree_registrations WHERE repo = ? AND issue_number = ?"  # noqa: S608
            " AND ended_at IS NOT NULL AND end_reason LIKE ? ORDER BY id",
            (repo, issue_number, f"{KEPT_PREFIX}%"),
        ) as cur:
            return [_registration(row) for row in await cur.fetchall()]

    async def clear_kept(self, conn: Connection, registration_id: int, *, reason: str) -> bool:
        """The kept worktree is gone (removed by the teardown): its row no longer says ``kept`` (its ``ended_at``
        stays when it was kept)."""
        cursor = await conn.execute(
            "UPDATE worktree_registrations SET end_reason = ? WHERE id = ? AND end_reason LIKE ?",
            (reason, registration_id, f"{KEPT_PREFIX}%"),
        )
        return bool(cursor.rowcount == 1)

    # --- issue locks --------------------------------------------------------------------------------------------------

    async def live_lock(
        self, repo: str, issue_number: int, conn: Connection | None = None
    ) -> IssueLock | None:
        row = await self._one(
            conn,
            f"SELECT {_L_COLUMNS} FROM issue_locks WHERE repo = ? AND issue_number = ? AND released_at IS NULL",  # noqa: S608
            (repo, issue_number),
        )
        return _lock(row) if row is not None else None

    async def lock(
        self, conn: Connection, registration: Registration, *, proof: dict[str, Any], now: datetime
    ) -> IssueLock:
        lock_id = f"lock-{uuid.uuid4().hex}"
        try:
            async with conn.execute(
                _INSERT_LOCK,
                (
                    lock_id, registration.repo, registration.issue_number, registration.lease_id, registration.owner,
                    registration.id, registration.branch, registration.worktree_path, _dumps(proof), to_db_time(now),
                ),
            ) as cur:
                row = await cur.fetchone()
        except IntegrityError as exc:
            raise JournalConflict(str(exc)) from exc
        assert row is not None
        return _lock(row)

    async def release_lock(self, conn: Connection, lock_id: str, *, reason: str, now: datetime) -> bool:
        cursor = await conn.execute(
            "UPDATE issue_locks SET released_at = ?, release_reason = ? WHERE lock_id = ? AND released_at IS NULL",
            (to_db_time(now), reason, lock_id),
        )
        return bool(cursor.rowcount == 1)
