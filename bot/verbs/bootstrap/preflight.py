"""The allocator's dry-run proof that an owner could bootstrap an issue now, changing nothing."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal

from bot import gitops, worktree_files
from bot.core.bootstrap import PathRejected, branch_for, worktree_path_for
from bot.core.errors import Envelope
from bot.gitea import GiteaError, Issue, Repository
from bot.verbs.bootstrap.checkout import effective_clone_url
from bot.verbs.bootstrap.context import BootstrapContext, ProofReads
from bot.verbs.bootstrap.refusals import api_refusal, git_envelope, origin_envelope
from bot.verbs.bootstrap.takeover import registration_stranded, stranded
from state.db import utcnow
from state.journal import JournalStore, Registration, Transition
from state.leases import LeaseStore

#: The preflight's checks, in the order they are made (and reported).
Check = Literal["owner_on_roster", "no_foreign_lease", "repo_reachable", "base_known", "control_checkout", "path_free"]
#: The ``reason`` of an allocation refused because the proof failed (its ``failed_checks`` name the checks).
PREFLIGHT_FAILED: Final = "bootstrap_preflight_failed"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check: whether it passed, and what it observed (failed, with a typed refusal: ``error``, ``reason``,
    ``exact_next_action``)."""

    ok: bool
    facts: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, **self.facts}


@dataclass(slots=True)
class PreflightProof:
    """The proof: each check made, and what was derived on the way (absent: the proof stopped before it)."""

    issue_number: int
    owner: str
    branch: str | None = None  # the issue branch the bootstrap would use
    base_sha: str | None = None  # the default branch's commit, as Gitea's API reports it
    worktree_path: str | None = None  # the canonical worktree path
    checks: dict[Check, CheckResult] = field(default_factory=dict)  # in the order made
    #: The Gitea reads the proof stood on, for the allocation's own bootstrap right after it (not shown).
    reads: ProofReads | None = None

    def check(self, name: Check, ok: bool, **facts: Any) -> None:
        self.checks[name] = CheckResult(ok, facts)

    @property
    def failed(self) -> frozenset[Check]:
        return frozenset(name for name, check in self.checks.items() if not check.ok)

    @property
    def ok(self) -> bool:
        """Every check made passed."""
        return bool(self.checks) and not self.failed

    def to_dict(self) -> dict[str, Any]:
        """The proof as the edges show it (MCP, the CLI, an allocation's ``bootstrap`` and refusal details)."""
        doc: dict[str, Any] = {"issue_number": self.issue_number, "owner": self.owner,
                               "checks": {name: check.to_dict() for name, check in self.checks.items()}}
        derived = {"branch": self.branch, "base_sha": self.base_sha, "worktree_path": self.worktree_path}
        doc.update({name: value for name, value in derived.items() if value is not None})
        doc["ok"] = self.ok
        return doc


async def bootstrap_preflight(
    ctx: BootstrapContext, issue_number: int, owner: str, *, now: datetime | None = None
) -> PreflightProof:
    """The allocator's dry-run proof that ``owner`` could bootstrap ``issue_number`` now, changing nothing:
    the repository is reachable (API and git), the canonical path is free (or the owner's own), the base is
    known, and the control checkout is on its default branch and clean. ``ok`` when every check passed.
    """
    proof = PreflightProof(issue_number, owner)
    roles = ctx.roles_of(owner)
    proof.check("owner_on_roster", bool(roles), roles=sorted(roles))
    lease = await LeaseStore(ctx.db).live_for_issue(ctx.repo, issue_number)
    # A foreign lease past its expiry and the grace is the allocator's to reclaim (docs/allocator.md): not a holder.
    grace = timedelta(seconds=ctx.settings.allocator.lease_grace_s)
    reclaimable = lease is not None and lease.expires_at + grace <= (now or utcnow())
    proof.check("no_foreign_lease", lease is None or lease.owner == owner or reclaimable,
                lease_owner=lease.owner if lease is not None else None, reclaimable=reclaimable)
    if ctx.gitea is None:
        proof.check("repo_reachable", False, detail="no Gitea connection configured")
        return proof
    gitea = ctx.gitea
    probes: list[asyncio.Task[dict[str, Any]]] = []
    tracked: dict[str, str | None] = {}

    async def repository() -> Repository:
        # git's own view of the remote (the slowest probe) starts as soon as the repository is known, beside the
        # API's read of the base, unless the control checkout may already hold the live base (decided with it).
        found = await gitea.get_repo()
        url = effective_clone_url(ctx, found.clone_url)
        if gitops.clone_url_problem(url) is None:
            tracked["sha"] = await asyncio.to_thread(_tracking_sha, ctx, url, found.default_branch)
            if tracked["sha"] is None:
                probes.append(asyncio.create_task(asyncio.to_thread(_remote, ctx, url, found.default_branch)))
        return found

    async def base_of(found: asyncio.Future[Repository]) -> str:
        return (await gitea.get_branch((await found).default_branch)).commit_id

    asked_at = time.monotonic()
    reading = asyncio.ensure_future(repository())
    try:
        base, issue = await asyncio.gather(base_of(reading), gitea.get_issue(issue_number))
        repo = await reading
        proof.reads = ProofReads(repo, base, issue, asked_at)
        if not probes and "sha" in tracked:
            # The live base is already the control checkout's (and git answered there lately: /readyz's transport
            # check): no ls-remote. A moved base asks git, as the bootstrap's fetch will.
            url = effective_clone_url(ctx, repo.clone_url)
            probes.append(asyncio.create_task(_known(ctx, url, base) if tracked["sha"] == base else
                                                asyncio.to_thread(_remote, ctx, url, repo.default_branch)))
        await _proved(ctx, proof, repo, issue, base, probes, now=now or utcnow())
    except GiteaError as exc:
        refusal = api_refusal(exc, "allocate again")
        proof.check("repo_reachable", False, detail=str(exc), **(_check_refusal(refusal) if refusal else {}))
    finally:
        # A proof that ended early drops what is still running (a git probe's process ends by itself, bounded by
        # git_timeout_s); its result is never read.
        for task in (reading, *probes):
            task.cancel()
    return proof


async def _proved(ctx: BootstrapContext, proof: PreflightProof, repo: Repository, issue: Issue, base: str,
                  probes: list[asyncio.Task[dict[str, Any]]], *, now: datetime) -> None:
    """The checks after the API reads: the local git probes beside the remote one already running. Another owner's
    earlier work that no live lease holds is what the bootstrap takes over (takeover.py): its branch is the one
    proved, and its registered worktree at the canonical path does not make the path taken (it is kept aside)."""
    n, owner = proof.issue_number, proof.owner
    clone_url = effective_clone_url(ctx, repo.clone_url)
    url_problem = gitops.clone_url_problem(clone_url)
    if url_problem is not None:
        proof.check("repo_reachable", False, detail=url_problem)
        return
    journal, leases = JournalStore(ctx.db), LeaseStore(ctx.db)
    grace = timedelta(seconds=ctx.settings.allocator.lease_grace_s)
    prior = await journal.latest_completed(ctx.repo, n)
    prior_lease = await leases.get(prior.lease_id) if prior is not None and prior.owner != owner else None
    taking_over = prior_lease is not None and stranded(prior_lease, now=now, grace=grace)
    branch = prior.branch if prior is not None and (prior.owner == owner or taking_over) else branch_for(
        n, issue.title, slug_length=ctx.settings.bootstrap.slug_length)
    proof.branch = branch
    path: Path | None = None
    rejected: str | None = None
    try:
        path = Path(str(worktree_path_for(PurePosixPath(ctx.checkout_path), branch)))
    except PathRejected as exc:
        rejected = str(exc)
    open_other = await journal.open_for_issue(ctx.repo, n)
    registration = await journal.live_registration(ctx.repo, n)
    kept_aside = (taking_over and registration is not None and registration.owner != owner
                  and await registration_stranded(leases, registration, now=now, grace=grace))
    # The git probes are read-only and independent: run side by side (the proof runs before every lease).
    local_probes = [asyncio.to_thread(_local, ctx)]
    if path is not None:
        local_probes.append(asyncio.to_thread(_path_state, ctx, path))
    found, *rest = await asyncio.gather(*local_probes)
    _check_remote(proof, repo, clone_url, base, await probes[0])
    _check_checkout(ctx, proof, repo, clone_url, found)
    if path is None:
        proof.check("path_free", False, detail=rejected)
        return
    proof.worktree_path = str(path)
    _check_path(proof, path, rest[0], open_other, registration, kept_aside=kept_aside)


def _tracking_sha(ctx: BootstrapContext, clone_url: str, default_branch: str) -> str | None:
    """The control checkout's ``refs/remotes/origin/<default>``, read by name (no process), when the proof may stand
    on it: the checkout exists with ``clone_url`` as its origin and git answered at that URL with the bot's credentials
    lately (``gitops.transport_check``: /readyz's, or this process's last ``ls-remote``). None: ask git (ls-remote)."""
    checkout = ctx.checkout()
    if not gitops.transport_check(ctx.checkout_path).trusted(clone_url) or not checkout.exists():
        return None
    if checkout.origin_url() != clone_url:
        return None
    return checkout.exact_refs(f"refs/remotes/origin/{default_branch}").get(f"refs/remotes/origin/{default_branch}")


async def _known(ctx: BootstrapContext, clone_url: str, base: str) -> dict[str, Any]:
    """The remote as the control checkout and the transport check know it (the live base is already fetched)."""
    latest = gitops.transport_check(ctx.checkout_path).latest
    return {"git_reachable": True, "git_base": base, "git_error": None, "git_source": "control_checkout",
            "transport_age_s": round(latest.age_s(), 1) if latest is not None else None}


def _remote(ctx: BootstrapContext, clone_url: str, default_branch: str) -> dict[str, Any]:
    """git's own view of the remote's default branch (``ls-remote``); its result is the transport check's latest."""
    result = gitops.ls_remote(clone_url, default_branch, cwd=ctx.checkout_root if ctx.checkout_root.is_dir() else
                              Path("/"), env=gitops.git_env(ctx.bot_login),
                              auth=gitops.auth_env(clone_url, ctx.settings.gitea_token()),
                              timeout_s=ctx.settings.bootstrap.git_timeout_s)
    gitops.transport_check(ctx.checkout_path).record(result)
    return {"git_reachable": result.ok, "git_base": result.remote_sha, "git_error": result.detail,
            "git_source": "ls-remote"}


def _local(ctx: BootstrapContext) -> dict[str, Any]:
    """The control checkout as it is (or what is where it goes)."""
    checkout = ctx.checkout()
    found: dict[str, Any] = {"checkout_exists": checkout.exists()}
    found["checkout_path_used"] = not found["checkout_exists"] and ctx.checkout_path.exists() and any(
        ctx.checkout_path.iterdir())
    if checkout.exists():
        # HEAD's branch and commit read from git's files (no process; detached: asked of git), and whether its tree
        # tracks branches/ once per commit: the one git process of every proof is the status (clean or not).
        head_ref = gitops.symbolic_head(checkout.git_dir / "HEAD")
        head_sha = checkout.read_ref(head_ref) if head_ref else checkout.rev("HEAD")
        found["head_ref"], found["head_sha"] = head_ref, head_sha
        found["checkout_status"] = checkout.status()
        found["tracks_branches"] = checkout.tracks_at(head_sha, "branches") if head_sha else checkout.tracks(
            "branches")
        found["origin"] = checkout.origin_url()
    return found


def _path_state(ctx: BootstrapContext, path: Path) -> dict[str, Any]:
    """What is at the canonical worktree path."""
    root = ctx.checkout_path / "branches"
    escapes = ctx.checkout_path.exists() and worktree_files.escapes_root(root, path)
    entry = ctx.checkout().worktree_at(path) if ctx.checkout().exists() else None
    return {"exists": os.path.lexists(path), "escapes_root": escapes,
            "registered": entry.to_dict() if entry is not None else None}


def _check_remote(proof: PreflightProof, repo: Repository, clone_url: str, base: str, remote: dict[str, Any]) -> None:
    """``repo_reachable`` (git answers at the clone URL) and ``base_known`` (git and the API agree on the base)."""
    git_reason = gitops.git_refusal(remote["git_error"] or "") if not remote["git_reachable"] else None
    refusal = _check_refusal(git_envelope(git_reason, clone_url, remote["git_error"], "allocate again")) if (
        git_reason is not None) else {}
    proof.check("repo_reachable", bool(remote["git_reachable"]), clone_url=clone_url,
                reported_clone_url=repo.clone_url, default_branch=repo.default_branch, detail=remote["git_error"],
                checked_by=remote["git_source"], **({"transport_age_s": remote["transport_age_s"]} if (
                    "transport_age_s" in remote) else {}), **refusal)
    proof.check("base_known", bool(base) and remote["git_base"] == base, api_sha=base, git_sha=remote["git_base"],
                git_source=remote["git_source"])
    proof.base_sha = base


def _check_checkout(ctx: BootstrapContext, proof: PreflightProof, repo: Repository, clone_url: str,
                    found: dict[str, Any]) -> None:
    """``control_checkout``: on its default branch, clean, with the clone URL as its origin (or not cloned yet)."""
    if found["checkout_exists"]:
        same_origin = found["origin"] == clone_url
        proof.check(
            "control_checkout",
            found["head_ref"] == f"refs/heads/{repo.default_branch}" and not found["checkout_status"] and same_origin,
            head_ref=found["head_ref"], head_sha=found["head_sha"], dirty=found["checkout_status"][:20],
            tracks_branches_dir=found["tracks_branches"], origin=found["origin"],
            **({} if same_origin else _check_refusal(origin_envelope(proof.issue_number, found["origin"], clone_url))),
        )
    elif found["checkout_path_used"]:
        # Something that is not a checkout is where the control checkout goes: the first clone would fail.
        proof.check("control_checkout", False, head_ref=None,
                    detail=f"{ctx.checkout_path} exists and is not a git checkout")
    else:
        proof.check("control_checkout", True, detail="not cloned yet: the first bootstrap clones it")


def _check_path(proof: PreflightProof, path: Path, state: dict[str, Any], open_other: Transition | None,
                registration: Registration | None, *, kept_aside: bool = False) -> None:
    """``path_free``: nothing at the canonical path but the owner's own registered worktree, or another owner's
    stranded one the bootstrap keeps aside (``kept_aside``: registered there, no live lease holding it); no other
    owner's open transition or live registration for the issue."""
    owner = proof.owner
    here = registration is not None and registration.worktree_path == str(path)
    own = here and registration is not None and registration.owner == owner
    aside = kept_aside and here and (not state["exists"] or state["registered"] is not None)
    proof.check(
        "path_free",
        not state["escapes_root"] and (not state["exists"] or own or aside)
        and (open_other is None or open_other.owner == owner)
        and (registration is None or registration.owner == owner or aside),
        **state,
        open_transition=open_other.key if open_other is not None else None,
        registered_to=registration.owner if registration is not None else None,
        taken_over_from=registration.owner if aside and registration is not None else None,
    )


def _check_refusal(envelope: Envelope) -> dict[str, Any]:
    """A preflight check's typed refusal: ``error``, ``reason``, ``exact_next_action`` beside ``ok: False``."""
    return {"error": envelope.error, "reason": envelope.reason,
            "exact_next_action": envelope.exact_next_action}
