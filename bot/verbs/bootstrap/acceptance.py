"""The transition's acceptance: the inputs read from Gitea, git and the lease, checked and recorded (``accepted``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from bot import gitops, worktree_files
from bot.core.bootstrap import Blocked, PathRejected, branch_for, issue_branch_prefix, worktree_path_for
from bot.core.errors import Envelope
from bot.gitea import Branch, GiteaError, GiteaNotFound, Issue, Repository
from bot.verbs.bootstrap.checkout import PreparedCheckout, effective_clone_url
from bot.verbs.bootstrap.context import TOOL, BootstrapResult, live_lease_in
from bot.verbs.bootstrap.faults import FAULT_PHASE_ENV, crash_seam
from bot.verbs.bootstrap.refusals import (
    OperatorMustFix,
    StepFailed,
    api_refusal,
    blocked_envelope,
    call_again,
    lease_ended,
    make_envelope,
    refused_result,
    unavailable,
)
from bot.verbs.bootstrap.run import Run
from bot.verbs.bootstrap.takeover import find_stranded, plan_takeover
from state.journal import JournalConflict, NewTransition, Transition
from state.leases import Lease


@dataclass(frozen=True, slots=True)
class Request:
    """What the caller asked for, under which key, for which lease."""

    key: str
    source: Literal["caller", "derived"]
    lease: Lease
    expected_base: str | None
    attempt: int  # the lease's compensated transitions before this one


@dataclass(frozen=True, slots=True)
class Inputs:
    """What Gitea and the control checkout showed while accepting."""

    repo: Repository
    base: str  # the default branch's live commit
    checkout: PreparedCheckout
    issue: Issue
    branch: str
    remote_sha: str | None  # the branch on Gitea (None: not there)


@dataclass(frozen=True, slots=True)
class LocalChecks:
    """What the control checkout holds for the request."""

    escapes: bool  # the canonical path is or goes through a symbolic link out of branches/
    others: list[str]  # the issue's other branches
    have_base: bool  # the base commit is in the checkout
    have_remote: bool = True  # the branch's commit on Gitea is in the checkout (asked only for a takeover)


async def accept(run: Run, request: Request) -> Transition | BootstrapResult:
    """Accept the request from authoritative inputs (phase ``accepted``), or refuse it (nothing is recorded)."""
    n, key = run.issue_number, request.key
    prior = await run.journal.latest_completed(run.ctx.repo, n)
    same_owner = prior is not None and prior.owner == run.caller
    # Another owner's earlier work that no live lease holds is taken over (takeover.py), on its own branch.
    stranded = await find_stranded(run, prior, now=run.ctx.clock())
    read = await _read(run, prior.branch if prior is not None and (same_owner or stranded) else None, key)
    if isinstance(read, Envelope):
        return refused_result(n, read, key)
    path = _checked(run, read, request.expected_base)
    if isinstance(path, Envelope):
        return refused_result(n, path, key)
    try:
        local = await asyncio.to_thread(_local_checks, run, read, path, stranded is not None)
    except gitops.GitFailure as exc:
        return refused_result(n, unavailable(n, f"git failed: {exc}", key), key)
    refusal = _local_refusal(n, read, path, local, prior, same_owner=same_owner, taking_over=stranded is not None,
                             key=key)
    if refusal is not None:
        return refused_result(n, refusal, key)
    takeover: dict[str, Any] | None = None
    if stranded is not None:
        planned = await plan_takeover(run, stranded, branch=read.branch, path=path, base=read.base,
                                      remote_sha=read.remote_sha)
        if isinstance(planned, Blocked):
            return refused_result(n, blocked_envelope(n, planned, False, None), key)
        takeover = planned
    return await _record(run, request, read, path, prior.key if prior is not None and same_owner else None, takeover)


async def _read(run: Run, prior_branch: str | None, key: str) -> Inputs | Envelope:
    """The issue reads and the repository, base and fetch, side by side (they are independent)."""
    outcomes = await asyncio.gather(_base_and_checkout(run), _issue_and_branch(run, prior_branch),
                                    return_exceptions=True)
    failures = [o for o in outcomes if isinstance(o, BaseException)]
    if failures:
        return _failure_refusal(run.issue_number, failures, key)
    prepared, found = outcomes
    assert not isinstance(prepared, BaseException) and not isinstance(found, BaseException)
    (repo, base, head), (issue, branch, remote_sha) = prepared, found
    return Inputs(repo, base, head, issue, branch, remote_sha)


async def _issue_and_branch(run: Run, prior_branch: str | None) -> tuple[Issue, str, str | None]:
    reused = run.reused_reads()  # the allocation's proof read the issue moments ago
    issue = reused.issue if reused is not None else await run.gitea.get_issue(run.issue_number)
    name = prior_branch if prior_branch is not None else branch_for(
        run.issue_number, issue.title, slug_length=run.cfg.slug_length)
    try:
        remote: str | None = (await run.gitea.get_branch(name)).commit_id
    except GiteaNotFound:
        remote = None
    return issue, name, remote


async def _base_and_checkout(run: Run) -> tuple[Repository, str, PreparedCheckout]:
    # The checkout's own branch is the default branch as last seen: read it alongside the repository,
    # and read again only if Gitea's default branch turns out to be another one.
    gitea = run.gitea
    reused = run.reused_reads()  # the allocation's proof read the repository and its base moments ago
    if reused is not None:
        return await _checked_out(run, reused.repo, reused.base)
    head = gitops.symbolic_head(run.checkout.git_dir / "HEAD") if run.checkout.exists() else None
    guess = head.removeprefix("refs/heads/") if head else None
    early = gitea.get_branch(guess) if guess else None
    found = await asyncio.gather(gitea.get_repo(), *([early] if early else []), return_exceptions=True)
    if not isinstance(found[0], Repository):
        raise found[0] if isinstance(found[0], BaseException) else TypeError("no repository")
    repo = found[0]
    _use_clone_url(run, repo)
    guessed = found[1] if len(found) > 1 else None
    if guess == repo.default_branch and isinstance(guessed, Branch):
        live = guessed.commit_id
    else:
        live = (await gitea.get_branch(repo.default_branch)).commit_id
    return repo, live, await run.prepare(run.clone_url, repo.default_branch, live_base=live)


def _use_clone_url(run: Run, repo: Repository) -> None:
    """The URL the checkout is cloned and fetched from, refused when it cannot be used."""
    run.clone_url = effective_clone_url(run.ctx, repo.clone_url)
    url_problem = gitops.clone_url_problem(run.clone_url)
    if url_problem is not None or not repo.default_branch:
        raise StepFailed(Blocked("invalid_state", "clone_url_unusable", "the repository's clone_url cannot be"
                                 f" used: {url_problem or 'no default branch'}"))


async def _checked_out(run: Run, repo: Repository, live: str) -> tuple[Repository, str, PreparedCheckout]:
    """The repository and its base as the proof read them: the checkout prepared against them."""
    _use_clone_url(run, repo)
    return repo, live, await run.prepare(run.clone_url, repo.default_branch, live_base=live)


def _failure_refusal(n: int, failures: list[BaseException], key: str) -> Envelope:
    """The refusal for what the reads raised: what only the operator fixes first, then the token, a missing
    issue, a blocked read, and last an outage (a repeat resumes)."""
    for failure in failures:
        if not isinstance(failure, Exception):
            raise failure
    operator = next((f for f in failures if isinstance(f, OperatorMustFix)), None)
    if operator is not None:
        return operator.envelope
    token = next((r for f in failures if isinstance(f, GiteaError) and (r := api_refusal(f, call_again(n)))), None)
    if token is not None:
        return token
    if any(isinstance(f, GiteaNotFound) for f in failures):
        return make_envelope("not_found", f"issue #{n} or the repository is not visible to foreman",
                             "Check the issue number.",
                             "call gitea_get_runtime_context to see the issues leased to you")
    blocked = next((f for f in failures if isinstance(f, StepFailed)), None)
    if blocked is not None:
        return blocked_envelope(n, blocked.blocked, released=False, key=None)
    return unavailable(n, f"Gitea or git did not answer ({failures[0]})", key)


def _checked(run: Run, inputs: Inputs, expected_base: str | None) -> Path | Envelope:
    """The canonical worktree path, once the issue is open and the live base is the expected one."""
    n, issue, base = run.issue_number, inputs.issue, inputs.base
    if issue.is_pull or issue.state != "open":
        return make_envelope(
            "invalid_state", f"#{n} is {'a pull request' if issue.is_pull else 'closed'}",
            "Only open issues get a worktree.", "call gitea_get_runtime_context to find your work")
    if expected_base is not None and expected_base != base:
        return make_envelope(
            "stale_pin",
            f"the live base of {inputs.repo.default_branch} is {base}, not the expected {expected_base}",
            "The default branch moved since the pin was taken; nothing was created.",
            f"call {TOOL} for #{n} again with expected_base={base} (or without expected_base)",
            live_base=base)
    try:
        return Path(str(worktree_path_for(PurePosixPath(run.checkout.path), inputs.branch)))
    except PathRejected as exc:
        return make_envelope(
            "invalid_state", f"the canonical worktree path is refused: {exc}",
            "foreman never creates a worktree outside branches/.", "call gitea_get_runtime_context")


def _local_checks(run: Run, inputs: Inputs, path: Path, taking_over: bool = False) -> LocalChecks:
    """Run in a thread: the base is in the checkout (fetched once more if it moved between the fetch and the API
    read), the issue's other branches (found by name: the other branches are not read), the path's symlinks; for a
    takeover, the branch's commit on Gitea (fetched when the checkout does not have it)."""
    default, base = inputs.repo.default_branch, inputs.base
    tracking = f"refs/remotes/origin/{default}"
    refs = run.seen.refs or run.checkout.exact_refs(tracking)
    have_base = refs.get(tracking) == base or run.checkout.rev(base) is not None
    if not have_base:  # the base moved between the fetch and the API read: fetch once more
        run.checkout.fetch(default, auth=run.auth(run.clone_url))
        have_base = run.checkout.rev(base) is not None
    issue_refs = run.checkout.branch_refs(issue_branch_prefix(run.issue_number))
    run.seen.issue_refs = issue_refs
    others = [name.removeprefix("refs/heads/") for name in issue_refs]
    others = [b for b in others if b != inputs.branch]
    have_remote = True
    if taking_over and inputs.remote_sha is not None and run.checkout.rev(inputs.remote_sha) is None:
        run.checkout.fetch(inputs.branch, auth=run.auth(run.clone_url))
        have_remote = run.checkout.rev(inputs.remote_sha) is not None
    return LocalChecks(worktree_files.escapes_root(run.checkout.branches_root, path), others, have_base, have_remote)


def _local_refusal(n: int, inputs: Inputs, path: Path, local: LocalChecks, prior: Transition | None, *,
                   same_owner: bool, taking_over: bool, key: str) -> Envelope | None:
    """Work that is not provably this owner's (another branch, an earlier owner, the branch on Gitea elsewhere)
    is never taken over, but an earlier owner's whose lease no longer holds it (``taking_over``); a base that could
    not be fetched is an outage."""
    blocked: Blocked | None = None
    if not local.have_base:
        return unavailable(n, f"the base commit {inputs.base} could not be fetched", key)
    if not local.have_remote:
        return unavailable(n, f"{inputs.branch} at {inputs.remote_sha} could not be fetched from Gitea", key)
    if local.escapes:
        blocked = Blocked("invalid_state", "path_escapes_root", f"{path} is or goes through a symbolic link out of"
                          " branches/")
    elif local.others and not same_owner:
        blocked = Blocked("invalid_state", "ambiguous_branches", f"other branches of #{n} exist:"
                          f" {', '.join(local.others)}")
    elif prior is not None and not same_owner and not taking_over:
        blocked = Blocked("invalid_state", "foreign_work", f"#{n} was bootstrapped for {prior.owner} before, and"
                          " that work is not provably stranded (a live lease holds it); it is not taken over")
    elif inputs.remote_sha is not None and inputs.remote_sha != inputs.base and not same_owner and not taking_over:
        blocked = Blocked("invalid_state", "remote_branch_exists", f"{inputs.branch} exists on Gitea at"
                          f" {inputs.remote_sha}, not at the base")
    return blocked_envelope(n, blocked, False, None) if blocked is not None else None


async def _record(run: Run, request: Request, found: Inputs, path: Path, prior_key: str | None,
                  takeover: dict[str, Any] | None) -> Transition | BootstrapResult:
    """Record the transition (``accepted``) with its inputs (a takeover's plan among them), while the lease is still
    live."""
    n, key, lease, repo = run.issue_number, request.key, request.lease, found.repo
    inputs = {
        "repo": run.ctx.repo,
        "clone_url": run.clone_url,
        "reported_clone_url": repo.clone_url,
        "default_branch": repo.default_branch,
        "issue": {"number": n, "title": found.issue.title, "state": found.issue.state},
        "caller": run.caller,
        "lease": lease.to_dict(),
        "expected_base": request.expected_base,
        "base_sha": found.base,
        "branch": found.branch,
        "worktree_path": str(path),
        "remote_branch_sha": found.remote_sha,
        "prior_key": prior_key,
        "takeover": takeover,
        "control_checkout": {"path": str(run.checkout.path), "head_ref": found.checkout.head_ref,
                             "head_sha": found.checkout.head_sha},
    }
    new = NewTransition(
        key=key, key_source=request.source, repo=run.ctx.repo, issue_number=n, lease_id=lease.lease_id,
        owner=lease.owner, role=lease.role, attempt=request.attempt, base_branch=repo.default_branch,
        base_sha=found.base, branch=found.branch, checkout_path=str(run.checkout.path), worktree_path=str(path),
        inputs=inputs,
    )
    now = run.ctx.clock()
    try:
        async with run.ctx.db.transaction() as conn:
            live = await live_lease_in(conn, run.leases, run.ctx.repo, lease.lease_id)
            if live is None or not live.is_live(now) or live.owner != run.caller:
                return refused_result(n, lease_ended(), key)
            transition = await run.journal.accept(conn, new, proof=inputs, runner=run.runner, now=now)
    except JournalConflict as exc:
        return refused_result(n, make_envelope(
            "conflict", f"another transition holds #{n} or its path ({exc})",
            "Only one bootstrap per issue, path and lease runs at a time.", call_again(n)), key)
    run.base_fresh = True
    crash_seam(FAULT_PHASE_ENV, "accepted")
    return transition
