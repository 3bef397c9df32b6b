"""The trusted side of a run: its teardown, the broker a run token names, and `foreman grants`."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from bot.config import Settings
from bot.verbs.runs.broker import Broker
from state.db import Database
from state.grants import GrantIntegrityError, GrantStore

log = logging.getLogger("foreman.grants")


class ToolRunner(Protocol):
    """Runs one tool call the way the MCP server does (through the gateway); answers (ok, result document)."""

    async def __call__(self, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]: ...


async def run_teardown(broker: Broker, run_tool: ToolRunner) -> dict[str, Any]:
    """The trusted side's teardown: admit the reserved teardown, run it with its compiled arguments, settle it.

    Refused (nothing runs) while a call is in flight, once it ran, on another host or when the issue's worktree
    is no longer the bound one. A teardown that raises counts as failed: it is never run again, and the worktree
    UUID is reported unresolved.
    """
    admission = await broker.teardown()
    if not admission.allowed:
        return {"ok": False, "run_id": broker.run_id, "refusal": admission.refusal}
    try:
        ok, doc = await run_tool(admission.tool, admission.arguments())
    except Exception:
        log.exception("run %s: the teardown call failed", broker.run_id)
        ok, doc = False, {"error": "unavailable", "message": "the teardown call failed; see the service log"}
    completion = await broker.after_call(admission, ok=ok, result=doc)
    return {
        "ok": completion.accepted and ok,
        "run_id": broker.run_id,
        "teardown": admission.to_dict(),
        "result": completion.doc,
        "unresolved_worktree_uuid": completion.unresolved_worktree_uuid,
    }


async def open_broker_for_token(db: Database, settings: Settings, token: str) -> Broker | None:
    """``Broker.for_token`` over a database (what ``foreman mcp`` calls with FOREMAN_MCP_TOKEN)."""
    return await Broker.for_token(GrantStore(db), settings, token)


async def inspect(db: Database, run_id: str | None) -> dict[str, Any]:
    """What ``foreman grants [RUN_ID]`` prints: each run's grant, state and every decision, oldest first.

    LookupError: no such run. A grant whose stored form fails its digest is reported, not trusted.
    """
    store = GrantStore(db)
    if run_id is not None:
        record = await store.run(run_id)
        if record is None:
            raise LookupError(f"no run {run_id}")
        records = [record]
    else:
        records = await store.runs(limit=1000)
    runs: list[dict[str, Any]] = []
    for record in records:
        try:
            grant = await store.grant(record.run_id)
            grant_doc: dict[str, Any] | None = grant.to_dict() if grant is not None else None
            integrity = "intact"
        except GrantIntegrityError as exc:
            grant_doc, integrity = None, f"not intact: {exc}"
        runs.append(
            {
                "run": record.summary(),
                "grant": grant_doc,
                "grant_integrity": integrity,
                "decisions": [d.to_dict() for d in await store.decisions(record.run_id)],
            }
        )
    return {"runs": runs}
