"""The runtime-context verb: the caller's identity, leases, callable tools, default branch and next action."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from bot import gitops
from bot.core.gateway import GatewayContext
from bot.core.verbs import PRECONDITION_WORKTREE, VERBS, Verb, evaluate
from bot.gitea import Branch, GiteaError, Repository
from bot.verbs.bootstrap.context import BootstrapContext
from bot.verbs.handback import HAND_BACK_SOURCES
from bot.verbs.queue_view import work_queues
from bot.verbs.review import ReviewGitea
from bot.verbs.runtime import Caller, CallOptions, VerbResult, VerbRuntime, executes
from state.journal import JournalStore
from state.leases import Lease

#: How many issues a runtime context lists per verb (a controller may see every live lease).
_CONTEXT_ISSUE_LIMIT = 20


class BranchGitea(Protocol):
    """The Gitea reads the runtime context makes: the repository's default branch and that branch's head."""

    async def get_repo(self) -> Repository: ...

    async def get_branch(self, name: str) -> Branch: ...


class ContextGitea(BranchGitea, ReviewGitea, Protocol):
    """What the runtime context reads: the default branch, and the queues waiting for a reviewer or merger."""


@executes("get_runtime_context")
async def runtime_context(
    rt: VerbRuntime[ContextGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    now = rt.clock()
    open_leases = [lease for lease in await rt.leases.open_leases(rt.repo) if lease.is_live(now)]
    # A hand-back (changes requested on the caller's PR) first: work already under review before new work.
    mine = sorted((lease for lease in open_leases if lease.owner == caller.login),
                  key=lambda lease: (not _handed_back(lease), lease.acquired_at))
    # The reads of Gitea (the default branch; for a reviewer or merger holding nothing, the queues) go out together.
    branch_read = asyncio.ensure_future(_default_branch(rt))
    waiting_read = asyncio.ensure_future(_waiting_for_role(rt, caller, now)) if not mine else None
    try:
        callable_now = await _callable_now(rt, caller, open_leases)
        branch = await branch_read
        waiting = await waiting_read if waiting_read is not None else None
    finally:
        for read in (branch_read, waiting_read):
            if read is not None and not read.done():
                read.cancel()
    doc: dict[str, Any] = {
        "identity": {"login": caller.login, "roles": sorted(caller.roles), "channel": caller.channel},
        "role": sorted(caller.roles)[0] if len(caller.roles) == 1 else sorted(caller.roles),
        "repository": f"{rt.settings.repository.owner}/{rt.settings.repository.name}",
        "default_branch": branch,
        "leases": [await _lease_doc(rt, caller, lease, now) for lease in mine],
        "callable_now": callable_now,
        "exact_next_action": await _next_action(rt, caller, mine),
    }
    if waiting is not None:
        doc["work_waiting"] = waiting
    return rt.done(verb, caller, doc)


def _handed_back(lease: Lease) -> bool:
    return lease.request.get("source") in HAND_BACK_SOURCES


#: Hand-backs of a pull request behind its base (bot/verbs/handback.py): the author's next call updates it.
_OUTDATED = frozenset({"branch_outdated", "base_diverged"})


async def _lease_doc(rt: VerbRuntime[ContextGitea], caller: Caller, lease: Lease, now: datetime) -> dict[str, Any]:
    """The lease, its time left, whether it is a hand-back, its next step, and (an implement lease) its registered
    worktree: the absolute path as the agent sees it (``[mcp] worktree_roots``), and the service's own."""
    doc = lease.to_dict()
    doc["seconds_left"] = max(0, int((lease.expires_at - now).total_seconds()))
    doc["handed_back"] = _handed_back(lease)
    if lease.action == "implement":
        registration = await JournalStore(rt.db).live_registration(rt.repo, lease.issue_number)
        path = (registration.worktree_path if registration is not None and registration.owner == lease.owner
                else None)
        doc["worktree_path"] = worktree_as_seen(rt, lease.owner, path) if path is not None else None
        doc["service_worktree_path"] = path
    doc["next_action"] = await _lease_next(rt, caller, lease)
    return doc


def worktree_as_seen(rt: VerbRuntime[Any], login: str, path: str) -> str:
    """``path`` (under the service's checkout root) as ``login``'s agent sees it: the checkout root replaced by that
    login's ``[mcp] worktree_roots`` entry (or its ``*`` entry), for agents whose worktrees are bind-mounted into a
    sandbox or another host at another place; unchanged without one."""
    roots = rt.settings.mcp.worktree_roots
    seen = roots.get(login, roots.get("*"))
    if seen is None:
        return path
    root = BootstrapContext.from_service(rt).checkout_root
    try:
        relative = Path(path).relative_to(root)
    except ValueError:
        return path
    return str(PurePosixPath(seen) / relative.as_posix())


async def _waiting_for_role(rt: VerbRuntime[ContextGitea], caller: Caller, now: datetime) -> dict[str, Any] | None:
    """For a reviewer or merger holding nothing: what waits for its role now (the queues hand it out by themselves,
    bot/loops/queues.py), never "wait for a controller"."""
    if not caller.roles & {"reviewer", "merger"} or rt.gitea is None:
        return None
    try:
        queues = await work_queues(rt, now)
    except GiteaError as exc:  # the context still answers; it says the queues could not be read
        return {"error": f"the queues could not be read: {type(exc).__name__}"}
    out: dict[str, Any] = {"merge_by": queues.merge_by, "queues_running": list(rt.settings.allocator.queues)}
    if "reviewer" in caller.roles:
        out["reviews"] = [q.to_dict() for q in queues.reviews if caller.login not in q.barred]
    if "merger" in caller.roles:
        out["merges"] = [q.to_dict() for q in queues.merges if caller.login not in q.barred]
    return out


async def _callable_now(rt: VerbRuntime[ContextGitea], caller: Caller, live: list[Lease]) -> list[dict[str, Any]]:
    """Each offered verb the gateway allows this caller now; issue verbs once per issue it applies to."""
    out: list[dict[str, Any]] = []
    relevant = [lease for lease in live if lease.owner == caller.login or "controller" in caller.roles]
    for verb in VERBS.values():
        if not verb.executable:
            continue
        if not verb.issue_scoped:
            if evaluate(verb.name, GatewayContext(caller=caller.login, caller_roles=caller.roles)).allowed:
                out.append({"tool": verb.tool})
            continue
        issues: list[int] = []
        for lease in relevant[:_CONTEXT_ISSUE_LIMIT]:
            worktree = False
            if PRECONDITION_WORKTREE in verb.preconditions:
                worktree = await rt.worktree_registered(lease.issue_number, lease.owner)
            ctx = GatewayContext(
                caller=caller.login,
                caller_roles=caller.roles,
                issue_number=lease.issue_number,
                lease_owner=lease.owner,
                lease_live=True,
                worktree_registered=worktree,
            )
            if evaluate(verb.name, ctx).allowed:
                issues.append(lease.issue_number)
        if issues:
            out.append({"tool": verb.tool, "issue_numbers": issues})
        elif verb.name == "get_issue_state":
            out.append({"tool": verb.tool, "issue_numbers": "any"})
    return out


async def _next_action(rt: VerbRuntime[ContextGitea], caller: Caller, mine: list[Lease]) -> str:
    if mine:
        return await _lease_next(rt, caller, mine[0])
    return _idle_next(rt, caller)


async def _lease_next(rt: VerbRuntime[ContextGitea], caller: Caller, lease: Lease) -> str:
    """The next step on one of the caller's live leases."""
    n = lease.issue_number
    until = lease.expires_at.isoformat()
    if lease.action == "review":  # a review needs no worktree
        return (f"review the pull request of #{n} and call gitea_submit_review with issue_number={n}; "
                f"call gitea_heartbeat_lease with issue_number={n} before {until}")
    if lease.action == "merge":
        return (f"call gitea_merge_pull_request with issue_number={n} (it merges exactly the approved commit); "
                f"call gitea_heartbeat_lease with issue_number={n} before {until}")
    if lease.request.get("source") in _OUTDATED:  # handed back behind its base: Gitea updates it, no worktree
        return (f"call gitea_update_pull_request with issue_number={n} (Gitea brings its pull request up to date "
                f"with the base; it then goes back to review); call gitea_heartbeat_lease with issue_number={n} "
                f"before {until}")
    bootstrap = await rt.worktree_bootstrap()
    if bootstrap is not None and not await bootstrap.worktree_registered(issue_number=n, owner=caller.login):
        return f"call gitea_bootstrap_issue_worktree with issue_number={n}"
    if bootstrap is not None and not await bootstrap.locked(issue_number=n, owner=caller.login):
        return f"call gitea_lock_issue with issue_number={n}"
    if bootstrap is None:
        return (
            f"call gitea_get_issue_state with issue_number={n} and follow its next_action; "
            f"call gitea_heartbeat_lease with issue_number={n} before {until}"
        )
    return (
        f"work on #{n} in its registered worktree; call gitea_heartbeat_lease with issue_number={n} "
        f"before {until}, and gitea_post_issue_state with issue_number={n} when the step is done"
    )


def _idle_next(rt: VerbRuntime[ContextGitea], caller: Caller) -> str:
    """The next step of a caller holding no live lease."""
    if "controller" in caller.roles:
        return (
            "call gitea_allocate_next_work with dry_run=true, then with dry_run=false and "
            "expected_fingerprint set to the dry run's fingerprint"
        )
    running = set(rt.settings.allocator.queues) if rt.settings.auto_allocation() else set()
    if ("reviewer" in caller.roles and "review" in running) or ("merger" in caller.roles and "merge" in running):
        return ("nothing is leased to you now: foreman hands you the next review or merge that waits for your role "
                "by itself (see work_waiting); call gitea_get_runtime_context again in a minute")
    if "reviewer" in caller.roles and "controller" not in caller.roles:
        return ("nothing is leased to you: the review queue does not run by itself here; claim a review listed in "
                "work_waiting with gitea_claim_review, or call gitea_get_runtime_context again later")
    if "merger" in caller.roles and "controller" not in caller.roles:
        return ("nothing is leased to you: the merge queue does not run by itself here; merge an approved pull "
                "request listed in work_waiting with gitea_merge_pull_request, or call gitea_get_runtime_context "
                "again later")
    if "author" in caller.roles and rt.settings.auto_allocation():
        return ("nothing is leased to you now: foreman leases you the next status:ready issue by itself; call "
                "gitea_get_runtime_context again in a minute")
    return "nothing is leased to you: call gitea_get_runtime_context again after a controller allocates work to you"


async def _default_branch(rt: VerbRuntime[ContextGitea]) -> dict[str, Any]:
    """The default branch's SHA live on Gitea and in the control checkout, side by side."""
    out: dict[str, Any] = {"name": None, "live_sha": None, "checkout_sha": None, "checkout": None}
    notes: list[str] = []
    gitea: BranchGitea | None = rt.gitea
    if gitea is None:
        notes.append("no gitea.token configured: the live SHA cannot be read")
    else:
        try:
            out["name"], out["live_sha"] = await rt.shared_reads.get(
                ("default_branch", rt.repo), LIVE_BRANCH_SHARED_S, lambda: _live_default_branch(gitea))
        except Exception as exc:
            notes.append(f"Gitea did not answer: {type(exc).__name__}")
    bootstrap = await rt.worktree_bootstrap()
    checkout = bootstrap.control_checkout() if bootstrap is not None else None
    if checkout is None:
        notes.append("no control checkout: the worktree bootstrap is not available in this foreman")
    elif not (checkout / ".git").exists():
        out["checkout"] = str(checkout)
        notes.append("no control checkout yet: the first worktree bootstrap clones it")
    else:
        out["checkout"] = str(checkout)
        ref = f"refs/heads/{out['name']}" if out["name"] else "HEAD"
        out["checkout_sha"] = await asyncio.to_thread(_checkout_rev, checkout, ref)
    live, held = out["live_sha"], out["checkout_sha"]
    out["in_sync"] = (live == held) if live and held else None
    if live and held and live != held:
        notes.append("the control checkout is behind or ahead of Gitea; the next bootstrap fetches first")
    out["detail"] = "; ".join(notes) or "live and checkout agree"
    return out


#: How long one read of the default branch on Gitea answers every runtime context of the repository (seconds): at
#: most this old when shown, one read of Gitea per bound however many agents poll their context.
LIVE_BRANCH_SHARED_S = 2.0


async def _live_default_branch(gitea: BranchGitea) -> tuple[str, str]:
    """The repository's default branch and its commit on Gitea now."""
    default = (await gitea.get_repo()).default_branch
    return default, (await gitea.get_branch(default)).commit_id


def _checkout_rev(checkout: Path, ref: str) -> str | None:
    """``ref`` in the control checkout, read as git stored it (the loose ref file, else ``packed-refs``; no process
    for a branch), else resolved by git (argument list, never a shell; ``gitops.hardened_env``), or None."""
    repository = gitops.ControlCheckout(checkout, env={}, timeout_s=10)
    try:
        return repository.read_ref(ref) if ref.startswith("refs/") else repository.rev(ref)
    except gitops.GitFailure:
        return None
