"""The worktree bootstrap behind the door: the bootstrap and lock verbs, their replay, and the seam's
implementation over ``bot.verbs.bootstrap`` (registered with the door as every door's worktree bootstrap)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from bot.core.errors import Envelope
from bot.core.verbs import Verb
from bot.verbs.bootstrap import (
    BootstrapContext,
    BootstrapResult,
    LockResult,
    bootstrap_issue_worktree,
    lock_issue,
)
from bot.verbs.bootstrap.transition import replay_finished
from bot.verbs.runtime import (
    BootstrapAnswer,
    Caller,
    CallOptions,
    VerbResult,
    VerbRuntime,
    WorktreeBootstrap,
    envelope,
    executes,
    issue_of,
    provides_bootstrap,
    refused,
    replays,
)
from state.journal import JournalStore
from state.leases import Lease, LeaseStore


class BootstrapService:
    """``bot.verbs.bootstrap``'s transition and lock behind the door's seam (``WorktreeBootstrap``); its facts read
    from the bootstrap journal."""

    def __init__(self, ctx: BootstrapContext) -> None:
        self._ctx = ctx
        self._journal = JournalStore(ctx.db)
        self._leases = LeaseStore(ctx.db)

    @staticmethod
    def _answer(result: BootstrapResult | LockResult) -> BootstrapAnswer:
        doc = result.to_dict()
        if result.exit_code == 0:
            return BootstrapAnswer(doc=doc, outcome=result)
        refusal = result.refusal or envelope(  # every refusal carries an envelope; this is a guard
            "invalid_state", f"the bootstrap ended {doc.get('status')}",
            "Read the issue's state before trying again.", "call gitea_get_runtime_context",
        )
        return BootstrapAnswer(doc=doc, refusal=refusal, outcome=result)

    async def bootstrap(
        self, *, issue_number: int, caller: str, idempotency_key: str | None, expected_base: str | None
    ) -> BootstrapAnswer:
        return self._answer(await bootstrap_issue_worktree(
            self._ctx, issue_number=issue_number, caller=caller, idempotency_key=idempotency_key,
            expected_base=expected_base,
        ))

    async def replay(
        self, *, issue_number: int, caller: str, idempotency_key: str, expected_base: str | None
    ) -> BootstrapAnswer | None:
        existing = await self._journal.get(idempotency_key)
        if existing is None or existing.owner != caller:
            return None  # not the caller's own request: the preconditions answer, whether or not the key exists
        result = await replay_finished(self._ctx, issue_number=issue_number, caller=caller,
                                       idempotency_key=idempotency_key, expected_base=expected_base)
        return None if result is None else self._answer(result)

    async def lock(self, *, issue_number: int, caller: str) -> BootstrapAnswer:
        return self._answer(await lock_issue(self._ctx, issue_number=issue_number, caller=caller))

    async def _lease(self, issue_number: int, owner: str) -> Lease | None:
        lease = await self._leases.live_for_issue(self._ctx.repo, issue_number)
        return lease if lease is not None and lease.owner == owner else None

    async def worktree_registered(self, *, issue_number: int, owner: str) -> bool:
        """A completed bootstrap of the owner's live lease registered a worktree that is still registered
        (``lock_issue`` checks the branches-only and anti-stomp guards on disk again)."""
        lease = await self._lease(issue_number, owner)
        if lease is None:
            return False
        done = await self._journal.completed_for_lease(lease.lease_id)
        registration = await self._journal.live_registration(self._ctx.repo, issue_number)
        return done is not None and registration is not None and registration.journal_id == done.id

    async def locked(self, *, issue_number: int, owner: str) -> bool:
        lease = await self._lease(issue_number, owner)
        lock = await self._journal.live_lock(self._ctx.repo, issue_number)
        return lease is not None and lock is not None and lock.lease_id == lease.lease_id

    def control_checkout(self) -> Path | None:
        return self._ctx.checkout_path


@provides_bootstrap
async def bootstrap_service(runtime: VerbRuntime[Any]) -> WorktreeBootstrap | None:
    """The worktree bootstrap of ``bot.verbs.bootstrap`` over the runtime's database, settings and Gitea."""
    return BootstrapService(BootstrapContext.from_service(runtime))


@executes("bootstrap_issue_worktree", "lock_issue")
async def bootstrap_verb(
    rt: VerbRuntime[Any], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    issue = issue_of(values)
    bootstrap = await rt.worktree_bootstrap()
    if bootstrap is None:
        return refused(verb.name, bootstrap_missing(verb, issue))
    if verb.name == "lock_issue":
        answer = await bootstrap.lock(issue_number=issue, caller=caller.login)
    else:
        key, base = values.get("idempotency_key"), values.get("expected_base")
        answer = await bootstrap.bootstrap(
            issue_number=issue,
            caller=caller.login,
            idempotency_key=key if isinstance(key, str) else None,
            expected_base=base if isinstance(base, str) else None,
        )
    return _answered(rt, verb, caller, answer)


@replays("bootstrap_issue_worktree")
async def bootstrap_replay(
    rt: VerbRuntime[Any], verb: Verb, caller: Caller, values: Mapping[str, object]
) -> VerbResult | None:
    """A bootstrap request that already finished, answered from its journal (before the preconditions: a replay
    changes nothing, so its lease may have ended since); None for a new or unfinished request."""
    key, base = values.get("idempotency_key"), values.get("expected_base")
    bootstrap = await rt.worktree_bootstrap() if isinstance(key, str) else None
    if bootstrap is None or not isinstance(key, str):
        return None
    answer = await bootstrap.replay(issue_number=issue_of(values), caller=caller.login, idempotency_key=key,
                                    expected_base=base if isinstance(base, str) else None)
    return None if answer is None else _answered(rt, verb, caller, answer)


def _answered(rt: VerbRuntime[Any], verb: Verb, caller: Caller, answer: BootstrapAnswer) -> VerbResult:
    if answer.refusal is not None:
        return VerbResult(verb=verb.name, doc={"verb": verb.name, **answer.doc}, refusal=answer.refusal,
                          outcome=answer.outcome)
    return replace(rt.done(verb, caller, answer.doc), outcome=answer.outcome)


def bootstrap_missing(verb: Verb, issue: int) -> Envelope:
    return envelope(
        "unavailable",
        f"{verb.tool} is not available: this foreman runs without the worktree bootstrap (bot.verbs.bootstrap)",
        "An operator must run foreman with the worktree bootstrap.",
        f"call gitea_post_issue_state with issue_number={issue}, state blocked and blockers naming the missing "
        "worktree bootstrap",
        missing_component="bot.verbs.bootstrap",
    )
