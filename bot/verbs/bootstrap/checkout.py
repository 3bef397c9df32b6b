"""The control checkout: its clone URL, its clone and fetch, and the operator's repoint of its origin."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot import gitops, worktree_files
from bot.core.bootstrap import Blocked
from bot.core.errors import Envelope
from bot.gitea import GiteaError
from bot.gitops.transport import TRANSPORT_CHECK_TIMEOUT_S
from bot.verbs.bootstrap.context import BootstrapContext
from bot.verbs.bootstrap.refusals import (
    REPOINT,
    OperatorMustFix,
    StepFailed,
    TransientFailure,
    api_refusal,
    call_again,
    git_envelope,
    make_envelope,
    origin_envelope,
    unavailable,
)

log = logging.getLogger("foreman.bootstrap")


def effective_clone_url(ctx: BootstrapContext, reported: str) -> str:
    """The URL the control checkout is cloned and fetched from: ``[repository] clone_url``, else the reported one
    through ``clone_url_rewrite``, else the ``clone_url`` Gitea reports."""
    return ctx.settings.repository.effective_clone_url(reported)


@dataclass(frozen=True, slots=True)
class PreparedCheckout:
    """The control checkout as its preparation left it: HEAD's branch and commit, and the refs it read."""

    head_ref: str | None
    head_sha: str | None
    refs: dict[str, str]


async def prepare_control_checkout(
    ctx: BootstrapContext,
    checkout: gitops.ControlCheckout,
    clone_url: str,
    default_branch: str,
    *,
    issue_number: int,
    live_base: str | None = None,
) -> PreparedCheckout:
    """Clone the control checkout on first use, fetch the default branch, check it is where it must be.

    The fetch is skipped only when ``origin/<default>`` already is ``live_base`` (what Gitea reported a moment
    ago): fetching would change nothing then. The refs read here (the tracking ref and HEAD's branch) are returned
    for the steps that follow.
    """
    cfg = ctx.settings.bootstrap
    auth = gitops.auth_env(clone_url, ctx.settings.gitea_token())
    every = cfg.control_clean_check == "every_transition"
    tracking = f"refs/remotes/origin/{default_branch}"

    def work() -> tuple[str | None, str | None, list[str], dict[str, str]]:
        if not checkout.exists():
            checkout.clone(clone_url, default_branch, auth=auth)
        elif (origin := checkout.origin_url()) != clone_url:  # read from git once per state of .git/config
            raise OperatorMustFix(origin_envelope(issue_number, origin, clone_url))
        checkout.ensure_excluded()
        # Only the refs needed here, each read on its own: listing refs/heads/ would cost one read per branch.
        head_ref = gitops.symbolic_head(checkout.git_dir / "HEAD")
        wanted = (tracking, head_ref) if head_ref else (tracking,)
        refs = checkout.exact_refs(*wanted)
        if live_base is None or refs.get(tracking) != live_base:
            checkout.fetch(default_branch, auth=auth)
            refs = checkout.exact_refs(*wanted)
        head_sha = refs.get(head_ref) if head_ref else checkout.rev("HEAD")
        return head_ref, head_sha, (checkout.status() if every else []), refs

    lock = ctx.locks_dir() / "checkout.lock"
    async with worktree_files.file_lock(lock, wait_s=max(cfg.lock_wait_s, 60)) as held:
        if not held:
            raise TransientFailure("the control checkout is busy (another clone or fetch did not finish)")
        try:
            head_ref, head_sha, dirty, refs = await asyncio.to_thread(work)
        except gitops.GitFailure as exc:
            reason = gitops.git_refusal(exc.stderr)
            if reason is not None:
                raise OperatorMustFix(git_envelope(reason, clone_url, str(exc), call_again(issue_number))) from exc
            raise TransientFailure(f"the control checkout could not be cloned or fetched: {exc}") from exc
    if head_ref != f"refs/heads/{default_branch}" or dirty:
        raise StepFailed(Blocked("invalid_state", "checkout_not_clean", f"the control checkout is on"
                                 f" {head_ref or 'a detached HEAD'}{' with changes' if dirty else ''}, not clean on"
                                 f" {default_branch}; foreman never changes it"))
    return PreparedCheckout(head_ref, head_sha, refs)


async def ensure_control_checkout(ctx: BootstrapContext) -> dict[str, Any]:
    """Clone the control checkout on first use (from the ``clone_url`` Gitea reports) and fetch its default
    branch; its working tree is never touched. Returns where it stands, or ``ok: False`` with the reason."""
    if ctx.gitea is None:
        return {"ok": False, "detail": "no Gitea connection configured"}
    try:
        repo = await ctx.gitea.get_repo()
    except GiteaError as exc:
        refusal = api_refusal(exc, "the next bootstrap clones the control checkout")
        return {"ok": False, "detail": str(exc), **(refusal.to_dict() if refusal else {})}
    url = effective_clone_url(ctx, repo.clone_url)
    problem = gitops.clone_url_problem(url)
    if problem is not None:
        return {"ok": False, "detail": problem}
    try:
        prepared = await prepare_control_checkout(ctx, ctx.checkout(), url, repo.default_branch, issue_number=1)
    except OperatorMustFix as exc:
        return {"ok": False, "detail": str(exc), **exc.envelope.to_dict()}
    except (TransientFailure, StepFailed) as exc:
        return {"ok": False, "detail": str(exc)}
    return {"ok": True, "path": str(ctx.checkout_path), "default_branch": repo.default_branch,
            "head_ref": prepared.head_ref, "head_sha": prepared.head_sha}


ORIGIN_RECORD = "foreman-origin.jsonl"


async def repoint_control_checkout(ctx: BootstrapContext) -> dict[str, Any]:
    """``foreman checkout repoint``: point the control checkout's origin at the clone URL foreman uses now (the
    one Gitea reports, through ``[repository] clone_url`` / ``clone_url_rewrite``), after proving that URL serves
    the same repository: git there must show the default branch at the commit Gitea's API reports for it.

    Only ``.git/config``'s ``remote.origin.url`` and ``refs/remotes/origin/<default>`` (the fetch) change: no
    branch, worktree, index or working tree is touched. Each change is appended to ``.git/foreman-origin.jsonl``
    (time, from, to, the reported URL, the proven commit) and logged. ``ok: False`` carries the error envelope.
    """

    def refused(envelope: Envelope) -> dict[str, Any]:
        return {"ok": False, "changed": False, "path": str(ctx.checkout_path), **envelope.to_dict()}

    again = f"run `{REPOINT}` again"
    if ctx.gitea is None:
        return refused(unavailable(0, "foreman has no Gitea connection configured"))
    try:
        repo = await ctx.gitea.get_repo()
        base = (await ctx.gitea.get_branch(repo.default_branch)).commit_id
    except GiteaError as exc:
        return refused(api_refusal(exc, again) or make_envelope(
            "unavailable", f"Gitea did not show the repository: {exc}", "Nothing was changed.",
            f"{again} when Gitea answers"))
    url = effective_clone_url(ctx, repo.clone_url)
    problem = gitops.clone_url_problem(url)
    if problem is not None:
        return refused(make_envelope("invalid_input", problem, "Nothing was changed.",
                                     f"correct repository.clone_url or repository.clone_url_rewrite, then {again}"))
    checkout = ctx.checkout()
    doc: dict[str, Any] = {"path": str(checkout.path), "to": url, "reported_clone_url": repo.clone_url,
                           "default_branch": repo.default_branch}
    token = ctx.settings.gitea_token()

    def work() -> dict[str, Any]:
        if not checkout.exists():
            return {"ok": True, "changed": False, "from": None,
                    "detail": "no control checkout yet: the first bootstrap clones it from this URL"}
        old = checkout.origin_url()
        if old == url:
            return {"ok": True, "changed": False, "from": old, "detail": "origin already is this URL"}
        status, out, err = checkout.git.attempt("ls-remote", "--", url, f"refs/heads/{repo.default_branch}",
                                                extra_env=gitops.auth_env(url, token))
        if status != 0:
            reason = gitops.git_refusal(err)
            return refused(git_envelope(reason, url, err.strip()[-300:], again) if reason else make_envelope(
                "unavailable", f"git could not reach {url}: {err.strip()[-300:]}", "Nothing was changed.",
                f"{again} when {url} is reachable (or correct repository.clone_url)"))
        seen = out.split("\t", 1)[0].strip() or None
        if seen != base:
            return refused(make_envelope(
                "invalid_state",
                f"{url} does not serve {repo.full_name}: its {repo.default_branch} is {seen or 'absent'}, Gitea's API"
                f" says {base}", "The origin was left as it is.",
                f"correct repository.clone_url or repository.clone_url_rewrite to name {repo.full_name}, then {again}",
                reason="origin_not_same_repository", clone_url=url, remote_sha=seen, api_sha=base))
        checkout.set_origin(url)
        checkout.fetch(repo.default_branch, auth=gitops.auth_env(url, token))
        record = {"at": ctx.clock().isoformat(), "from": old, "to": url, "reported_clone_url": repo.clone_url,
                  "default_branch": repo.default_branch, "sha": base, "by": REPOINT}
        with (checkout.git_dir / ORIGIN_RECORD).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        log.warning("control checkout %s: origin repointed from %s to %s (same repository: %s at %s)",
                    checkout.path, old, url, repo.default_branch, base)
        return {"ok": True, "changed": True, "from": old, "sha": base, "record": str(checkout.git_dir / ORIGIN_RECORD)}

    lock = ctx.locks_dir() / "checkout.lock"
    async with worktree_files.file_lock(lock, wait_s=max(ctx.settings.bootstrap.lock_wait_s, 60)) as held:
        if not held:
            return refused(make_envelope("conflict", "the control checkout is busy (a clone or fetch is running)",
                                         "Nothing was changed.", again))
        try:
            found = await asyncio.to_thread(work)
        except gitops.GitFailure as exc:
            return refused(make_envelope("unavailable", f"git failed: {exc}", "origin may point at the new URL; a"
                                         " repeat checks and fetches again.", again))
    return {**doc, **found}


async def check_transport(ctx: BootstrapContext) -> gitops.TransportResult | None:
    """One scheduled check of the repository's git transport (``gitops.transport_check``): ``git ls-remote`` of its
    default branch at the clone URL foreman uses, with the bot's credentials, killed after
    ``TRANSPORT_CHECK_TIMEOUT_S``. None when nothing was checked: no Gitea, its API did not answer (``/readyz``'s
    Gitea check says so), an unusable clone URL, or a check of this checkout still running."""
    if ctx.gitea is None:
        return None
    try:
        repo = await ctx.gitea.get_repo()
    except GiteaError:
        return None
    url = effective_clone_url(ctx, repo.clone_url)
    if gitops.clone_url_problem(url) is not None or not repo.default_branch:
        return None
    cwd = ctx.checkout_root if ctx.checkout_root.is_dir() else Path("/")
    return await asyncio.to_thread(
        gitops.transport_check(ctx.checkout_path).run, url, repo.default_branch, cwd=cwd,
        env=gitops.git_env(ctx.bot_login), auth=gitops.auth_env(url, ctx.settings.gitea_token()),
        timeout_s=min(TRANSPORT_CHECK_TIMEOUT_S, ctx.settings.bootstrap.git_timeout_s))
