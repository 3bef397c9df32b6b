"""The allocator's dry-run proof that an owner could bootstrap an issue now, changing nothing."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from bot import gitops, worktree_files
from bot.core.bootstrap import PathRejected, branch_for, worktree_path_for
from bot.core.errors import Envelope
from bot.gitea import GiteaError, Issue, Repository
from bot.verbs.bootstrap.checkout import effective_clone_url
from bot.verbs.bootstrap.context import BootstrapContext
from bot.verbs.bootstrap.refusals import api_refusal, git_envelope, origin_envelope
from state.db import utcnow
from state.journal import JournalStore
from state.leases import LeaseStore


async def bootstrap_preflight(
    ctx: BootstrapContext, issue_number: int, owner: str, *, now: datetime | None = None
) -> dict[str, Any]:
    """The allocator's dry-run proof that ``owner`` could bootstrap ``issue_number`` now, changing nothing:
    the repository is reachable (API and git), the canonical path is free (or the owner's own), the base is
    known, and the control checkout is on its default branch and clean. ``ok`` is True when every check passed.
    """
    checks: dict[str, dict[str, Any]] = {}
    doc: dict[str, Any] = {"issue_number": issue_number, "owner": owner, "checks": checks}

    def done() -> dict[str, Any]:
        doc["ok"] = bool(checks) and all(c.get("ok") for c in checks.values())
        return doc

    roles = ctx.roles_of(owner)
    checks["owner_on_roster"] = {"ok": bool(roles), "roles": sorted(roles)}
    lease = await LeaseStore(ctx.db).live_for_issue(ctx.repo, issue_number)
    # A foreign lease past its expiry and the grace is the allocator's to reclaim (docs/allocator.md): not a holder.
    grace = timedelta(seconds=ctx.settings.allocator.lease_grace_s)
    reclaimable = lease is not None and lease.expires_at + grace <= (now or utcnow())
    checks["no_foreign_lease"] = {"ok": lease is None or lease.owner == owner or reclaimable,
                                  "lease_owner": lease.owner if lease is not None else None,
                                  "reclaimable": reclaimable}
    if ctx.gitea is None:
        checks["repo_reachable"] = {"ok": False, "detail": "no Gitea connection configured"}
        return done()
    gitea = ctx.gitea
    token = ctx.settings.gitea_token()

    def remote(clone_url: str, default_branch: str) -> dict[str, Any]:
        runner = gitops.GitRunner(ctx.checkout_root if ctx.checkout_root.is_dir() else Path("/"),
                                  env=gitops.git_env(ctx.bot_login), timeout_s=ctx.settings.bootstrap.git_timeout_s)
        status, out, err = runner.attempt("ls-remote", "--", clone_url, f"refs/heads/{default_branch}",
                                          extra_env=gitops.auth_env(clone_url, token))
        remote_sha = out.split("\t", 1)[0].strip() if status == 0 and out.strip() else None
        return {"git_reachable": status == 0, "git_base": remote_sha,
                "git_error": err.strip()[-300:] if status else None}

    probes: list[asyncio.Task[dict[str, Any]]] = []

    async def repository() -> Repository:
        # git's own view of the remote (the slowest probe) starts as soon as the repository is known, beside the
        # API's read of the base.
        found = await gitea.get_repo()
        url = effective_clone_url(ctx, found.clone_url)
        if gitops.clone_url_problem(url) is None:
            probes.append(asyncio.create_task(asyncio.to_thread(remote, url, found.default_branch)))
        return found

    async def base_of(found: asyncio.Future[Repository]) -> str:
        return (await gitea.get_branch((await found).default_branch)).commit_id

    reading = asyncio.ensure_future(repository())
    try:
        base, issue = await asyncio.gather(base_of(reading), gitea.get_issue(issue_number))
        repo = await reading
        return await _proved(ctx, issue_number, owner, checks, doc, done, repo, issue, base, probes)
    except GiteaError as exc:
        refusal = api_refusal(exc, "allocate again")
        checks["repo_reachable"] = {"ok": False, "detail": str(exc), **(_check_refusal(refusal) if refusal else {})}
        return done()
    finally:
        # A proof that ended early drops what is still running (a git probe's process ends by itself, bounded by
        # git_timeout_s); its result is never read.
        for task in (reading, *probes):
            task.cancel()


async def _proved(ctx: BootstrapContext, issue_number: int, owner: str, checks: dict[str, dict[str, Any]],
                  doc: dict[str, Any], done: Callable[[], dict[str, Any]], repo: Repository, issue: Issue, base: str,
                  probes: list[asyncio.Task[dict[str, Any]]]) -> dict[str, Any]:
    """The checks after the API reads: the local git probes beside the remote one already running."""
    clone_url = effective_clone_url(ctx, repo.clone_url)
    url_problem = gitops.clone_url_problem(clone_url)

    def local() -> dict[str, Any]:
        checkout = ctx.checkout()
        found: dict[str, Any] = {"checkout_exists": checkout.exists()}
        found["checkout_path_used"] = not found["checkout_exists"] and ctx.checkout_path.exists() and any(
            ctx.checkout_path.iterdir())
        if checkout.exists():
            head_ref, head_sha = checkout.head()
            found["head_ref"], found["head_sha"] = head_ref, head_sha
            found["checkout_status"] = checkout.status()
            found["tracks_branches"] = checkout.tracks("branches")
            found["origin"] = checkout.origin_url()
        return found

    if url_problem is not None:
        checks["repo_reachable"] = {"ok": False, "detail": url_problem}
        return done()
    journal = JournalStore(ctx.db)
    prior = await journal.latest_completed(ctx.repo, issue_number)
    branch = prior.branch if prior is not None and prior.owner == owner else branch_for(
        issue_number, issue.title, slug_length=ctx.settings.bootstrap.slug_length)
    doc["branch"] = branch
    path: Path | None = None
    rejected: str | None = None
    try:
        path = Path(str(worktree_path_for(PurePosixPath(ctx.checkout_path), branch)))
    except PathRejected as exc:
        rejected = str(exc)
    open_other = await journal.open_for_issue(ctx.repo, issue_number)
    registration = await journal.live_registration(ctx.repo, issue_number)

    def path_state() -> dict[str, Any]:
        assert path is not None
        root = ctx.checkout_path / "branches"
        escapes = ctx.checkout_path.exists() and worktree_files.escapes_root(root, path)
        entry = ctx.checkout().worktree_at(path) if ctx.checkout().exists() else None
        return {"exists": os.path.lexists(path), "escapes_root": escapes,
                "registered": entry.to_dict() if entry is not None else None}

    # The git probes are read-only and independent: run side by side (the proof runs before every lease).
    local_probes = [asyncio.to_thread(local)]
    if path is not None:
        local_probes.append(asyncio.to_thread(path_state))
    found, *rest = await asyncio.gather(*local_probes)
    found_remote = await probes[0]
    checks["repo_reachable"] = {"ok": bool(found_remote["git_reachable"]), "clone_url": clone_url,
                                "reported_clone_url": repo.clone_url,
                                "default_branch": repo.default_branch, "detail": found_remote["git_error"]}
    git_reason = gitops.git_refusal(found_remote["git_error"] or "") if not found_remote["git_reachable"] else None
    if git_reason is not None:
        checks["repo_reachable"].update(_check_refusal(git_envelope(
            git_reason, clone_url, found_remote["git_error"], "allocate again")))
    checks["base_known"] = {"ok": bool(base) and found_remote["git_base"] == base, "api_sha": base,
                            "git_sha": found_remote["git_base"]}
    doc["base_sha"] = base
    if found["checkout_exists"]:
        same_origin = found["origin"] == clone_url
        checks["control_checkout"] = {
            "ok": found["head_ref"] == f"refs/heads/{repo.default_branch}" and not found["checkout_status"]
            and same_origin,
            "head_ref": found["head_ref"], "head_sha": found["head_sha"], "dirty": found["checkout_status"][:20],
            "tracks_branches_dir": found["tracks_branches"], "origin": found["origin"],
            **({} if same_origin else _check_refusal(origin_envelope(issue_number, found["origin"], clone_url))),
        }
    elif found["checkout_path_used"]:
        # Something that is not a checkout is where the control checkout goes: the first clone would fail.
        checks["control_checkout"] = {"ok": False, "head_ref": None,
                                      "detail": f"{ctx.checkout_path} exists and is not a git checkout"}
    else:
        checks["control_checkout"] = {"ok": True, "detail": "not cloned yet: the first bootstrap clones it"}
    if path is None:
        checks["path_free"] = {"ok": False, "detail": rejected}
        return done()
    doc["worktree_path"] = str(path)
    state = rest[0]
    own = registration is not None and registration.owner == owner and registration.worktree_path == str(path)
    checks["path_free"] = {
        "ok": not state["escapes_root"] and (not state["exists"] or own)
        and (open_other is None or open_other.owner == owner)
        and (registration is None or registration.owner == owner),
        **state,
        "open_transition": open_other.key if open_other is not None else None,
        "registered_to": registration.owner if registration is not None else None,
    }
    return done()


def _check_refusal(envelope: Envelope) -> dict[str, Any]:
    """A preflight check's typed refusal: ``error``, ``reason``, ``exact_next_action`` beside ``ok: False``."""
    return {"error": envelope.error, "reason": envelope.details.get("reason"),
            "exact_next_action": envelope.exact_next_action}
