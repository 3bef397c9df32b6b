"""The worktree bootstrap as a service for in-process callers (the allocation's own bootstrap, start-up recovery):
the owner's roster role decided as the door decides it, then the journaled transition, without a second door."""

from __future__ import annotations

from bot.core import verbs as verb_table
from bot.core.gateway import GatewayContext, evaluate_preconditions
from bot.verbs.bootstrap.context import BootstrapContext, BootstrapResult, ProofReads
from bot.verbs.bootstrap.refusals import refused_result
from bot.verbs.bootstrap.transition import bootstrap_issue_worktree


async def bootstrap_for_owner(
    ctx: BootstrapContext, *, issue_number: int, owner: str, idempotency_key: str | None = None,
    proof_reads: ProofReads | None = None,
) -> BootstrapResult:
    """Bootstrap ``owner``'s live lease on ``issue_number``: refused with the verb's own role gate when ``owner``
    has not the role on the roster now (an owner who left it since the lease), else the transition, which itself
    admits only the live lease's owner. ``proof_reads``: the allocation's proof's Gitea reads (bootstrap/context.py,
    ``PROOF_READS_FRESH_S``)."""
    roles = frozenset(ctx.settings.roster.get(owner, []))
    verb = verb_table.VERBS["bootstrap_issue_worktree"]  # read at the call: the table as it stands now
    gate = evaluate_preconditions(verb_table.identity_gate(verb),
                                  GatewayContext(caller=owner, caller_roles=roles))
    if not gate.allowed:
        return refused_result(issue_number, gate.to_error(), idempotency_key)
    return await bootstrap_issue_worktree(ctx, issue_number=issue_number, caller=owner,
                                          idempotency_key=idempotency_key, expected_base=None,
                                          proof_reads=proof_reads)
