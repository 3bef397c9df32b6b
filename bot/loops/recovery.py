"""Start-up recovery: finish or undo the transitions a dead process left open, and bootstrap unstarted leases."""

from __future__ import annotations

import logging

from bot import worktree_files
from bot.verbs.bootstrap.context import BootstrapContext, BootstrapResult
from bot.verbs.bootstrap.run import Run
from bot.verbs.bootstrap.service import bootstrap_for_owner
from bot.verbs.bootstrap.transition import compensate_ended
from state.journal import JournalStore
from state.leases import LeaseStore

log = logging.getLogger("foreman.bootstrap")


async def recover_open_transitions(ctx: BootstrapContext) -> list[BootstrapResult]:
    """The recovery of ``ctx``'s repository, acting for it (its entries are filed under it)."""
    return await _recover_open_transitions(ctx)


async def _recover_open_transitions(ctx: BootstrapContext) -> list[BootstrapResult]:
    """Finish or undo what a dead process left half-way (the service runs this when it starts): a transition of
    a live lease is resumed for its owner (the transition itself checks the live lease), as the owner's replay of the
    same key would; a
    transition whose lease has ended meanwhile (released, expired) is compensated now instead of when the next lease
    of the issue asks for its worktree. Each holds the per-issue lock; a transition someone else is driving (the
    lock is held) is left to them. A refusal is logged and returned, never raised."""
    if ctx.gitea is None:
        return []
    results: list[BootstrapResult] = []
    journal, leases = JournalStore(ctx.db), LeaseStore(ctx.db)
    for t in await journal.open_transitions(ctx.repo):
        lease = await leases.get(t.lease_id)
        if lease is not None and lease.is_live(ctx.clock()) and lease.owner == t.owner:
            result = await bootstrap_for_owner(ctx, issue_number=t.issue_number, owner=t.owner, idempotency_key=t.key)
        else:
            lock_path = ctx.locks_dir() / f"issue-{t.issue_number}.lock"
            async with worktree_files.file_lock(lock_path, wait_s=ctx.settings.bootstrap.lock_wait_s) as held:
                current = await journal.get(t.key) if held else None
                if current is None or current.outcome != "open":
                    continue
                result = await compensate_ended(Run.start(ctx, t.issue_number, t.owner), current)
        _logged(f"recovered the open bootstrap {t.key} of #{t.issue_number}", result)
        results.append(result)
    if ctx.settings.bootstrap.on_allocate == "run":
        results += await _bootstrap_unstarted_leases(ctx)
    return results


async def _bootstrap_unstarted_leases(ctx: BootstrapContext) -> list[BootstrapResult]:
    """A process killed between an allocation's lease commit and its bootstrap's first phase left a live implement
    lease with no transition at all: its bootstrap is run now for the owner, as the allocation would have; refused
    (not `unavailable`), the lease is released as unworkable, exactly as the allocation does.
    Review and merge leases need no worktree and are left alone."""
    from bot.verbs.allocate import AllocationCall, Allocator

    results: list[BootstrapResult] = []
    journal, leases = JournalStore(ctx.db), LeaseStore(ctx.db)
    for lease in await leases.open_leases(ctx.repo):
        if not lease.is_live(ctx.clock()) or lease.action != "implement":
            continue  # only an implement lease has a worktree (a review or merge lease never bootstraps)
        if any(t.lease_id == lease.lease_id for t in await journal.history(ctx.repo, lease.issue_number)):
            continue
        result = await bootstrap_for_owner(ctx, issue_number=lease.issue_number, owner=lease.owner)
        if result.status == "refused" and result.refusal is not None and result.refusal.error != "unavailable":
            # The release writes the lease, its evidence and the outbox only: the allocator needs no Gitea for it.
            allocator = Allocator(ctx.db, ctx.settings, None, bot_login=ctx.bot_login or "")
            call = AllocationCall(actor="foreman:recovery", owner=lease.owner, actor_is_operator=True)
            await allocator.release_unworkable(lease, result.refusal, call, ctx.clock())
        _logged(f"bootstrapped the unstarted lease {lease.lease_id} of #{lease.issue_number}", result)
        results.append(result)
    return results


def _logged(what: str, result: BootstrapResult) -> None:
    if result.refusal is not None:
        log.warning("%s: %s (%s: %s)", what, result.status, result.refusal.error, result.refusal.message)
    else:
        log.info("%s: %s", what, result.status)
