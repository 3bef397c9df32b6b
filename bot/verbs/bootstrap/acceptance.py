"""The transition's acceptance: the inputs read from Gitea, git and the lease, checked and recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path, PurePosixPath
from typing import Literal

from bot import gitops, worktree_files
from bot.core.bootstrap import Blocked, PathRejected, branch_for, issue_branch_prefix, worktree_path_for
from bot.core.errors import Envelope
from bot.gitea import Branch, GiteaError, GiteaNotFound, Issue, Repository
from bot.verbs.bootstrap.checkout import effective_clone_url
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
from bot.verbs.bootstrap.run import RunState
from state.journal import JournalConflict, NewTransition, Transition
from state.leases import Lease


class Acceptance(RunState):
    """Accepts a request from authoritative inputs (phase ``accepted``), or refuses it."""

    # --- acceptance: the inputs read from Gitea, git and the lease ----------------------------------------------------

    async def _accept(
        self, key: str, source: Literal["caller", "derived"], lease: Lease, expected_base: str | None, attempt: int
    ) -> Transition | BootstrapResult:
        gitea = self.gitea
        not_found = make_envelope("not_found", f"issue #{self.n} or the repository is not visible to foreman",
                                  "Check the issue number.",
                                  "call gitea_get_runtime_context to see the issues leased to you")
        prior = await self.journal.latest_completed(self.ctx.repo, self.n)
        same_owner = prior is not None and prior.owner == self.caller

        async def issue_and_branch() -> tuple[Issue, str, str | None]:
            issue = await gitea.get_issue(self.n)
            self.seen["issue"] = issue
            name = prior.branch if prior is not None and same_owner else branch_for(
                self.n, issue.title, slug_length=self.cfg.slug_length)
            try:
                remote: str | None = (await gitea.get_branch(name)).commit_id
            except GiteaNotFound:
                remote = None
            return issue, name, remote

        async def base_and_checkout() -> tuple[Repository, str, tuple[str | None, str | None]]:
            # The checkout's own branch is the default branch as last seen: read it alongside the repository,
            # and read again only if Gitea's default branch turns out to be another one.
            head = gitops.symbolic_head(self.checkout.git_dir / "HEAD") if self.checkout.exists() else None
            guess = head.removeprefix("refs/heads/") if head else None
            early = gitea.get_branch(guess) if guess else None
            found = await asyncio.gather(gitea.get_repo(), *([early] if early else []), return_exceptions=True)
            if not isinstance(found[0], Repository):
                raise found[0] if isinstance(found[0], BaseException) else TypeError("no repository")
            repo = found[0]
            self.clone_url = effective_clone_url(self.ctx, repo.clone_url)
            url_problem = gitops.clone_url_problem(self.clone_url)
            if url_problem is not None or not repo.default_branch:
                raise StepFailed(Blocked("invalid_state", "clone_url_unusable", "the repository's clone_url cannot be"
                                         f" used: {url_problem or 'no default branch'}"))
            guessed = found[1] if len(found) > 1 else None
            if guess == repo.default_branch and isinstance(guessed, Branch):
                live = guessed.commit_id
            else:
                live = (await gitea.get_branch(repo.default_branch)).commit_id
            return repo, live, await self._prepare(self.clone_url, repo.default_branch, live_base=live)

        # The issue reads and the repository, base and fetch are independent: run them side by side.
        outcomes = await asyncio.gather(base_and_checkout(), issue_and_branch(), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        for failure in failures:
            if not isinstance(failure, Exception):
                raise failure
        operator = next((f for f in failures if isinstance(f, OperatorMustFix)), None)
        if operator is not None:
            return refused_result(self.n, operator.envelope, key)
        token = next((r for f in failures if isinstance(f, GiteaError) and (r := api_refusal(f, call_again(self.n)))),
                     None)
        if token is not None:
            return refused_result(self.n, token, key)
        if any(isinstance(f, GiteaNotFound) for f in failures):
            return refused_result(self.n, not_found, key)
        blocked = next((f for f in failures if isinstance(f, StepFailed)), None)
        if blocked is not None:
            return refused_result(self.n, blocked_envelope(self.n, blocked.blocked, released=False, key=None), key)
        if failures:
            return refused_result(self.n, unavailable(self.n, f"Gitea or git did not answer ({failures[0]})", key), key)
        prepared, found = outcomes
        assert not isinstance(prepared, BaseException) and not isinstance(found, BaseException)
        (repo, base, head), (issue, branch, remote_sha) = prepared, found
        if issue.is_pull or issue.state != "open":
            return refused_result(self.n, make_envelope(
                "invalid_state", f"#{self.n} is {'a pull request' if issue.is_pull else 'closed'}",
                "Only open issues get a worktree.", "call gitea_get_runtime_context to find your work"), key)
        if expected_base is not None and expected_base != base:
            return refused_result(self.n, make_envelope(
                "stale_pin",
                f"the live base of {repo.default_branch} is {base}, not the expected {expected_base}",
                "The default branch moved since the pin was taken; nothing was created.",
                f"call {TOOL} for #{self.n} again with expected_base={base} (or without expected_base)",
                live_base=base), key)
        try:
            path = Path(str(worktree_path_for(PurePosixPath(self.checkout.path), branch)))
        except PathRejected as exc:
            return refused_result(self.n, make_envelope(
                "invalid_state", f"the canonical worktree path is refused: {exc}",
                "foreman never creates a worktree outside branches/.", "call gitea_get_runtime_context"), key)

        def local_checks() -> tuple[bool, list[str], bool]:
            tracking = f"refs/remotes/origin/{repo.default_branch}"
            refs: dict[str, str] = self.seen.get("refs") or self.checkout.exact_refs(tracking)
            have_base = refs.get(tracking) == base or self.checkout.rev(base) is not None
            if not have_base:  # the base moved between the fetch and the API read: fetch once more
                self.checkout.fetch(repo.default_branch, auth=self._auth(self.clone_url))
                have_base = self.checkout.rev(base) is not None
            # This issue's branches only (found by name: the other branches are not read).
            issue_refs = self.checkout.branch_refs(issue_branch_prefix(self.n))
            self.seen["issue_refs"] = issue_refs
            others = [name.removeprefix("refs/heads/") for name in issue_refs]
            others = [b for b in others if b != branch]
            return worktree_files.escapes_root(self.checkout.branches_root, path), others, have_base

        try:
            escapes, others, have_base = await asyncio.to_thread(local_checks)
        except gitops.GitFailure as exc:
            return refused_result(self.n, unavailable(self.n, f"git failed: {exc}", key), key)
        refusal: Envelope | None = None
        if not have_base:
            refusal = unavailable(self.n, f"the base commit {base} could not be fetched", key)
        elif escapes:
            refusal = blocked_envelope(self.n, Blocked("invalid_state", "path_escapes_root", f"{path} is or goes"
                                                       " through a symbolic link out of branches/"), False, None)
        elif others and not same_owner:
            refusal = blocked_envelope(self.n, Blocked("invalid_state", "ambiguous_branches", "other branches of"
                                                       f" #{self.n} exist: {', '.join(others)}"), False, None)
        elif prior is not None and not same_owner:
            refusal = blocked_envelope(self.n, Blocked("invalid_state", "foreign_work", f"#{self.n} was bootstrapped"
                                                       f" for {prior.owner} before; that work is not reclaimed"),
                                       False, None)
        elif remote_sha is not None and remote_sha != base and not same_owner:
            refusal = blocked_envelope(self.n, Blocked("invalid_state", "remote_branch_exists", f"{branch} exists on"
                                                       f" Gitea at {remote_sha}, not at the base"), False, None)
        if refusal is not None:
            return refused_result(self.n, refusal, key)
        inputs = {
            "repo": self.ctx.repo,
            "clone_url": self.clone_url,
            "reported_clone_url": repo.clone_url,
            "default_branch": repo.default_branch,
            "issue": {"number": self.n, "title": issue.title, "state": issue.state},
            "caller": self.caller,
            "lease": lease.to_dict(),
            "expected_base": expected_base,
            "base_sha": base,
            "branch": branch,
            "worktree_path": str(path),
            "remote_branch_sha": remote_sha,
            "prior_key": prior.key if prior is not None and same_owner else None,
            "control_checkout": {"path": str(self.checkout.path), "head_ref": head[0], "head_sha": head[1]},
        }
        new = NewTransition(
            key=key, key_source=source, repo=self.ctx.repo, issue_number=self.n, lease_id=lease.lease_id,
            owner=lease.owner, role=lease.role, attempt=attempt, base_branch=repo.default_branch, base_sha=base,
            branch=branch, checkout_path=str(self.checkout.path), worktree_path=str(path), inputs=inputs,
        )
        now = self.ctx.clock()
        try:
            async with self.ctx.db.transaction() as conn:
                live = await live_lease_in(conn, self.leases, self.ctx.repo, lease.lease_id)
                if live is None or not live.is_live(now) or live.owner != self.caller:
                    return refused_result(self.n, lease_ended(), key)
                transition = await self.journal.accept(conn, new, proof=inputs, runner=self.runner, now=now)
        except JournalConflict as exc:
            return refused_result(self.n, make_envelope(
                "conflict", f"another transition holds #{self.n} or its path ({exc})",
                "Only one bootstrap per issue, path and lease runs at a time.", call_again(self.n)), key)
        self.base_fresh = True
        crash_seam(FAULT_PHASE_ENV, "accepted")
        return transition
