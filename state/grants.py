"""Run grants in SQLite: sealed grants (immutable), each run's state (conditional writes), every decision recorded."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from bot.core.grants import Grant, InFlight, RunState, Verdict
from state.db import Database, from_row, to_db_time
from state.sql import Connection, IntegrityError, Row

log = logging.getLogger("foreman.grants")

DecisionKind = Literal["admitted", "denied", "accepted", "refused", "aborted", "reconciled", "broker_error"]


#: Called inside the transaction that closes a run (its teardown ran, failed or was reconciled), after the closing
#: write and its decision: what the run's end must be committed with (the evidence comment's outbox entry).
CloseHook = Callable[[Connection, Grant, RunState], Awaitable[None]]


class GrantConflict(Exception):
    """The grant could not be sealed: its run id or digest is taken, or its worktree already has an open run."""


class WorkloadFailed(Exception):
    """A run on this worktree failed: a failed workload is never retried on the same worktree."""


class GrantIntegrityError(Exception):
    """A stored grant does not match its digest (or its run row): the broker must not trust it."""


class StateRaced(Exception):
    """The run's row changed between read and conditional write (another broker decided first)."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run as stored: its grant's identity and where its plan stands."""

    run_id: str
    grant_digest: str
    policy_key: str
    repo: str
    issue_number: int
    owner: str
    worktree_uuid: str
    state: RunState
    created_at: str
    updated_at: str
    closed_at: str | None

    def summary(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "grant_digest": self.grant_digest,
            "policy": self.policy_key,
            "repo": self.repo,
            "issue_number": self.issue_number,
            "owner": self.owner,
            "worktree_uuid": self.worktree_uuid,
            **{k: v for k, v in self.state.to_dict().items() if k != "run_id"},
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "closed_at": self.closed_at,
        }


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    id: int
    run_id: str
    kind: DecisionKind
    category: str | None
    reason: str
    position: int | None
    call_id: str | None
    tool: str | None
    arguments_digest: str | None
    result_digest: str | None
    inert: bool
    host_id: str
    broker_id: str
    state_version: int
    at: str
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "category": self.category,
            "reason": self.reason,
            "position": self.position,
            "call_id": self.call_id,
            "tool": self.tool,
            "arguments_digest": self.arguments_digest,
            "result_digest": self.result_digest,
            "inert": self.inert,
            "host_id": self.host_id,
            "broker_id": self.broker_id,
            "state_version": self.state_version,
            "at": self.at,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionContext:
    """What the edge records beside a verdict: who decided where, and the digests of what was proposed/returned."""

    host_id: str
    broker_id: str
    now: datetime
    tool: str | None = None
    arguments_digest: str | None = None
    result_digest: str | None = None
    detail: dict[str, Any] | None = None


_RUN_COLUMNS = (
    "r.run_id, r.worktree_uuid, r.next_position, r.inflight_json, r.outcome, r.teardown, r.closed_at, r.version,"
    " r.created_at, r.updated_at, g.grant_digest, g.policy_key, g.repo, g.issue_number, g.owner"
)
_RUN_FROM = "grant_runs r JOIN grants g ON g.run_id = r.run_id"
_DECISION_COLUMNS = (
    "id, run_id, kind, category, reason, position, call_id, tool, arguments_digest, result_digest, inert,"
    " host_id, broker_id, state_version, at, detail_json"
)


def _state(row: Row) -> RunState:
    inflight = InFlight.from_dict(json.loads(row["inflight_json"])) if row["inflight_json"] else None
    return RunState(
        run_id=row["run_id"],
        next_position=row["next_position"],
        inflight=inflight,
        outcome=row["outcome"],
        teardown=row["teardown"],
        version=row["version"],
    )


def _run(row: Row) -> RunRecord:
    return from_row(RunRecord, row, state=_state(row))


def _decision(row: Row) -> DecisionRecord:
    return from_row(DecisionRecord, row, inert=bool(row["inert"]), detail=json.loads(row["detail_json"]))


def decision_kind(verdict: Verdict) -> DecisionKind:
    """How a verdict is recorded: admitted / denied (before a call), accepted / refused (a result), aborted,
    reconciled."""
    if not verdict.ok:
        return "refused" if verdict.kind == "complete" else "denied"
    if verdict.kind == "admit":
        return "admitted"
    if verdict.kind == "complete":
        return "accepted"
    return "aborted" if verdict.kind == "abort" else "reconciled"


class GrantStore:
    """Sealed grants, run state and decisions. Every decision is taken inside one write transaction, on the
    state read in it, and written with ``UPDATE ... WHERE version = ?``; unique indexes make a position
    admissible once and a call settle once, whichever broker (or process) decides."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @property
    def db(self) -> Database:
        return self._db

    # --- sealing ------------------------------------------------------------------------------------------------------

    async def seal(self, grant: Grant, *, token_sha256: str, sealed_by: str, now: datetime) -> RunRecord:
        """Store the grant and open its run. WorkloadFailed when a run on the same worktree failed; GrantConflict
        when the run id, grant digest or token is taken or the worktree already has an open run."""
        moment = to_db_time(now)
        async with self._db.transaction() as conn:
            async with conn.execute(
                "SELECT run_id FROM grant_runs WHERE worktree_uuid = ? AND outcome = 'failed' LIMIT 1",
                (grant.worktree.uuid,),
            ) as cur:
                failed = await cur.fetchone()
            if failed is not None:
                raise WorkloadFailed(
                    f"run {failed['run_id']} failed on worktree {grant.worktree.uuid}; it is never retried there"
                )
            try:
                await conn.execute(
                    "INSERT INTO grants (run_id, grant_digest, policy_key, policy_digest, contract_digest, host_id,"
                    " repo, issue_number, owner, lease_id, worktree_uuid, expires_at, body_json, sealed_at, sealed_by)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        grant.run_id,
                        grant.digest,
                        grant.policy_key,
                        grant.policy_digest,
                        grant.contract_digest,
                        grant.host_id,
                        grant.repo,
                        grant.issue_number,
                        grant.owner,
                        grant.lease_id,
                        grant.worktree.uuid,
                        to_db_time(grant.expires_at),
                        grant.canonical(),
                        moment,
                        sealed_by,
                    ),
                )
                await conn.execute(
                    "INSERT INTO grant_runs (run_id, token_sha256, worktree_uuid, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (grant.run_id, token_sha256, grant.worktree.uuid, moment, moment),
                )
            except IntegrityError as exc:
                raise GrantConflict(_conflict_message(str(exc), grant)) from exc
            record = await self.run(grant.run_id, conn)
        assert record is not None
        return record

    # --- reads --------------------------------------------------------------------------------------------------------

    async def grant(self, run_id: str, conn: Connection | None = None) -> Grant | None:
        """The sealed grant, checked against its digest (GrantIntegrityError if it does not match)."""
        async with (conn or self._db.reader).execute(
            "SELECT grant_digest, body_json FROM grants WHERE run_id = ?", (run_id,)
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return None
        try:
            grant = Grant.from_json(row["body_json"])
        except ValueError as exc:
            raise GrantIntegrityError(f"stored grant of {run_id} is not intact: {exc}") from None
        if grant.digest != row["grant_digest"] or grant.run_id != run_id:
            raise GrantIntegrityError(f"stored grant of {run_id} does not match its recorded digest")
        return grant

    async def run(self, run_id: str, conn: Connection | None = None) -> RunRecord | None:
        async with (conn or self._db.reader).execute(
            f"SELECT {_RUN_COLUMNS} FROM {_RUN_FROM} WHERE r.run_id = ?",  # noqa: S608
            (run_id,),
        ) as cur:
            row = await cur.fetchone()
        return _run(row) if row is not None else None

    async def run_for_token(self, token_sha256: str) -> RunRecord | None:
        async with self._db.reader.execute(
            f"SELECT {_RUN_COLUMNS} FROM {_RUN_FROM} WHERE r.token_sha256 = ?",  # noqa: S608
            (token_sha256,),
        ) as cur:
            row = await cur.fetchone()
        return _run(row) if row is not None else None

    async def runs(self, *, limit: int = 100) -> list[RunRecord]:
        async with self._db.reader.execute(
            f"SELECT {_RUN_COLUMNS} FROM {_RUN_FROM} ORDER BY r.created_at DESC, r.run_id LIMIT ?",  # noqa: S608
            (limit,),
        ) as cur:
            return [_run(row) for row in await cur.fetchall()]

    async def pending_teardowns(self, *, limit: int = 500) -> list[RunRecord]:
        """Runs whose reserved teardown never started (``teardown = 'pending'``), oldest first: the candidates of
        the automatic teardown. Once admitted, a teardown is never pending again, so it never runs twice."""
        async with self._db.reader.execute(
            f"SELECT {_RUN_COLUMNS} FROM {_RUN_FROM} WHERE r.teardown = 'pending'"  # noqa: S608
            " ORDER BY r.created_at, r.run_id LIMIT ?",
            (limit,),
        ) as cur:
            return [_run(row) for row in await cur.fetchall()]

    async def decisions(self, run_id: str) -> list[DecisionRecord]:
        async with self._db.reader.execute(
            f"SELECT {_DECISION_COLUMNS} FROM grant_decisions WHERE run_id = ? ORDER BY id",  # noqa: S608
            (run_id,),
        ) as cur:
            return [_decision(row) for row in await cur.fetchall()]

    # --- decisions ----------------------------------------------------------------------------------------------------

    async def decide(
        self,
        run_id: str,
        decide: Callable[[Grant, RunState], Verdict],
        context: DecisionContext,
        *,
        on_close: CloseHook | None = None,
    ) -> tuple[Grant, Verdict]:
        """Read the grant and the run state, decide, and record: all in one transaction.

        A changed state is written only if the row still has the version read (StateRaced otherwise: nothing is
        written); the decision row is inserted beside it, whether it admitted or refused. LookupError: no such
        run. GrantIntegrityError: the stored grant is not intact (nothing is written).

        ``on_close`` runs in the same transaction when this decision closes the run. It runs under a savepoint: if
        it fails, its writes are rolled back, the run still closes, and it is tried once more in a transaction of
        its own after the commit (it must be idempotent); a second failure is logged, never raised.
        """
        closed_state: RunState | None = None
        hook_failed = False
        async with self._db.transaction() as conn:
            grant = await self.grant(run_id, conn)
            record = await self.run(run_id, conn)
            if grant is None or record is None:
                raise LookupError(f"no run {run_id}")
            if record.grant_digest != grant.digest:
                raise GrantIntegrityError(f"run {run_id} is bound to another grant digest")
            verdict = decide(grant, record.state)
            version = record.state.version
            if verdict.state != record.state:
                version = await self._write_state(conn, record, verdict.state, context.now)
            try:
                await self._insert_decision(conn, verdict, version, context)
            except IntegrityError as exc:
                raise StateRaced(f"run {run_id}: {exc}") from exc
            if on_close is not None and verdict.state.closed and not record.state.closed:
                closed_state = replace(verdict.state, version=version)
                hook_failed = not await _guarded(conn, on_close, grant, closed_state)
        if hook_failed and on_close is not None and closed_state is not None:
            try:
                async with self._db.transaction() as conn:
                    await on_close(conn, grant, closed_state)
            except Exception:
                log.exception("run %s closed, but what its end records could not be written", run_id)
        return grant, verdict

    async def decision_counts(self, run_id: str, conn: Connection | None = None) -> dict[str, int]:
        """How many decisions of each kind the run has (``admitted``, ``denied``, ...)."""
        async with (conn or self._db.reader).execute(
            "SELECT kind, COUNT(*) AS n FROM grant_decisions WHERE run_id = ? GROUP BY kind ORDER BY kind", (run_id,)
        ) as cur:
            return {row["kind"]: int(row["n"]) for row in await cur.fetchall()}

    async def _write_state(self, conn: Connection, record: RunRecord, state: RunState, now: datetime) -> int:
        before = record.state
        moment = to_db_time(now)
        closing = state.closed and not before.closed
        cursor = await conn.execute(
            "UPDATE grant_runs SET next_position = ?, inflight_json = ?, outcome = ?, teardown = ?,"
            " closed_at = CASE WHEN ? = 1 THEN ? ELSE closed_at END, updated_at = ?, version = version + 1"
            " WHERE run_id = ? AND version = ?",
            (
                state.next_position,
                json.dumps(state.inflight.to_dict(), sort_keys=True) if state.inflight else None,
                state.outcome,
                state.teardown,
                int(closing),
                moment,
                moment,
                record.run_id,
                before.version,
            ),
        )
        if cursor.rowcount != 1:
            raise StateRaced(f"run {record.run_id} changed since version {before.version}")
        return before.version + 1

    async def _insert_decision(
        self, conn: Connection, verdict: Verdict, version: int, context: DecisionContext
    ) -> None:
        kind = decision_kind(verdict)
        call = verdict.call
        detail: dict[str, Any] = dict(context.detail or {})
        if verdict.unresolved_uuid is not None:
            detail["unresolved_worktree_uuid"] = verdict.unresolved_uuid
        if verdict.state.outcome is not None:
            detail["outcome"] = verdict.state.outcome
        await conn.execute(
            "INSERT INTO grant_decisions (run_id, kind, category, reason, position, call_id, tool, arguments_digest,"
            " result_digest, inert, settles, host_id, broker_id, state_version, at, detail_json)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                verdict.state.run_id,
                kind,
                verdict.category,
                verdict.reason,
                call.position if call is not None else None,
                verdict.call_id,
                context.tool or (call.tool if call is not None else None),
                context.arguments_digest,
                context.result_digest,
                int(verdict.inert),
                int(verdict.settles),
                context.host_id,
                context.broker_id,
                version,
                to_db_time(context.now),
                json.dumps(detail, sort_keys=True, default=str),
            ),
        )

    async def record_error(self, run_id: str, context: DecisionContext, *, call_id: str | None = None) -> bool:
        """Best effort: record a ``broker_error`` decision (never touching the run's state or outcome)."""
        try:
            async with self._db.transaction() as conn:
                async with conn.execute("SELECT version FROM grant_runs WHERE run_id = ?", (run_id,)) as cur:
                    row = await cur.fetchone()
                if row is None:
                    return False
                await conn.execute(
                    "INSERT INTO grant_decisions (run_id, kind, category, reason, call_id, tool, arguments_digest,"
                    " result_digest, host_id, broker_id, state_version, at, detail_json)"
                    " VALUES (?, 'broker_error', 'broker_error', 'broker_error', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        call_id,
                        context.tool,
                        context.arguments_digest,
                        context.result_digest,
                        context.host_id,
                        context.broker_id,
                        row["version"],
                        to_db_time(context.now),
                        json.dumps(context.detail or {}, sort_keys=True, default=str),
                    ),
                )
        except Exception:
            return False
        return True


async def _guarded(conn: Connection, hook: CloseHook, grant: Grant, state: RunState) -> bool:
    """Run a close hook under a savepoint; False (its writes rolled back, the transaction intact) if it failed."""
    await conn.execute("SAVEPOINT run_close")
    try:
        await hook(conn, grant, state)
    except Exception:
        log.exception("run %s: the close hook failed inside the closing transaction; retried after it", grant.run_id)
        await conn.execute("ROLLBACK TO run_close")
        await conn.execute("RELEASE run_close")
        return False
    await conn.execute("RELEASE run_close")
    return True


def _conflict_message(error: str, grant: Grant) -> str:
    if "grant_runs_open_worktree" in error or "grant_runs.worktree_uuid" in error:
        return f"worktree {grant.worktree.uuid} already has an open run"
    if "token" in error:
        return "the run token is already in use"
    return f"run {grant.run_id} (grant {grant.digest}) is already sealed"
