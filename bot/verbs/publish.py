"""The publish verb: commit the worktree's changes as the author, push the issue branch (never forced), read it back."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from bot import gitops, worktree_access, worktree_files
from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope
from bot.core.evidence import render_evidence
from bot.core.verbs import Verb
from bot.gitea import Branch, GiteaError, GiteaNotFound
from bot.verbs.bootstrap.context import BootstrapContext, BootstrapGitea
from bot.verbs.gitea_refusals import GiteaAsk, gitea_refusal
from bot.verbs.runtime import Caller, CallOptions, VerbResult, VerbRuntime, envelope, executes, issue_of, refused
from state.journal import JournalStore, Registration
from state.leases import Lease
from state.outbox import OutboxIntent, enqueue
from state.publications import Publication, PublicationStore

log = logging.getLogger("foreman.verbs")

#: The trailer that ties a commit to its publish: a replay (or a resume after a crash) adopts the commit carrying it.
TRAILER = "Foreman-Publish"


class PublishGitea(BootstrapGitea, Protocol):
    """The Gitea read the publish makes (the branch it pushed, read back), beside the bootstrap context's."""

    async def get_branch(self, name: str) -> Branch: ...


class _Refused(Exception):
    def __init__(self, envelope: Envelope) -> None:
        super().__init__(envelope.message)
        self.envelope = envelope


def _key(values: Mapping[str, object], lease: Lease, message: str, parent: str | None) -> str:
    given = values.get("idempotency_key")
    if isinstance(given, str):
        return f"publish:{lease.issue_number}:{given}"
    digest = hashlib.sha256(f"{lease.lease_id}\0{message}\0{parent}".encode()).hexdigest()[:20]
    return f"publish:{lease.issue_number}:{digest}"


def _digest(message: str) -> str:
    return hashlib.sha256(message.encode()).hexdigest()


@executes("publish_worktree")
async def publish(
    rt: VerbRuntime[PublishGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    assert lease is not None  # the ownership precondition held
    issue = issue_of(values)
    message = str(values["message"])
    registration = await JournalStore(rt.db).live_registration(rt.repo, issue)
    if rt.gitea is None or registration is None:
        return refused(verb.name, envelope(
            "unavailable", f"{verb.tool} needs foreman's Gitea connection and the issue's registered worktree",
            "An operator must run foreman with gitea.token and the worktree bootstrap.",
            f"call gitea_get_issue_state with issue_number={issue}"))
    ctx = BootstrapContext.from_service(rt)
    checkout = ctx.checkout()
    async with worktree_files.file_lock(ctx.locks_dir() / f"publish-{issue}.lock", wait_s=30) as held:
        if not held:
            return refused(verb.name, envelope(
                "conflict", f"another publish of #{issue} is running", "Wait for it to finish.",
                f"call {verb.tool} again with issue_number={issue} and the same idempotency_key"))
        try:
            return await _run(rt, verb, caller, values, lease, registration, checkout, ctx, message, delivery_id)
        except _Refused as exc:
            return refused(verb.name, exc.envelope)


async def _run(
    rt: VerbRuntime[PublishGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease,
    registration: Registration, checkout: gitops.ControlCheckout, ctx: BootstrapContext, message: str,
    delivery_id: str | None,
) -> VerbResult:
    store = PublicationStore(rt.db)
    issue, branch = lease.issue_number, registration.branch
    worktree = Path(registration.worktree_path)
    if worktree_files.escapes_root(checkout.branches_root, worktree):
        raise _Refused(envelope(
            "invalid_state", f"the registered worktree {worktree} is not below {checkout.branches_root}",
            "foreman publishes only a worktree under branches/.", f"call gitea_bootstrap_issue_worktree for #{issue}"))
    try:  # before any git runs (and again before each of the worktree's git commands)
        await asyncio.to_thread(checkout.check_worktree, worktree)
    except gitops.WorktreeRefused as exc:
        raise _Refused(worktree_refused(exc, issue)) from exc
    pub, parent, key = await _find(rt, store, checkout, values, lease, branch, message)
    caught_up: dict[str, str] | None = None
    seen: dict[str, str | None] = {}  # the branch on Gitea as this call read it (``_catch_up``), for the push
    if pub is None or pub.phase == "started":  # nothing committed yet: build on the branch as Gitea has it
        caught_up = await asyncio.to_thread(_catch_up, checkout, ctx, branch, worktree, issue, lease.owner, seen)
        if caught_up is not None:
            seen.clear()
        if caught_up is not None and pub is None:
            pub, parent, key = await _find(rt, store, checkout, values, lease, branch, message)
    if pub is not None and pub.message_digest != _digest(message):
        raise _Refused(envelope(
            "conflict", f"idempotency key {values.get('idempotency_key')!r} was used with another message",
            "A key names one publish.", f"call {verb.tool} with a new idempotency_key"))
    if pub is not None and pub.phase == "verified":
        return rt.done(verb, caller, {**(pub.result or {}), "replayed": True})
    if pub is None:
        async with rt.db.transaction() as conn:
            pub = await store.start(conn, repo=rt.repo, issue_number=issue, key=key, lease_id=lease.lease_id,
                                    owner=lease.owner, branch=branch, worktree_path=str(worktree),
                                    message_digest=_digest(message), parent_sha=parent, now=rt.clock())
    if pub.phase == "started":
        author = rt.settings.publish.author_of(caller.login)
        try:
            sha = await asyncio.to_thread(_commit, checkout, worktree, branch, pub, message, author)
        except gitops.WorktreeRefused as exc:  # changed since the check above: nothing was committed
            raise _Refused(worktree_refused(exc, issue)) from exc
        async with rt.db.transaction() as conn:
            pub = await store.advance(conn, pub, "committed", commit_sha=sha, now=rt.clock())
    if pub.phase == "committed":
        remote = await asyncio.to_thread(_push, checkout, ctx, pub, seen)
        async with rt.db.transaction() as conn:
            pub = await store.advance(conn, pub, "pushed", remote_before=remote or "", now=rt.clock())
    return await _verify(rt, verb, caller, pub, delivery_id, caught_up)


async def _find(
    rt: VerbRuntime[PublishGitea], store: PublicationStore, checkout: gitops.ControlCheckout,
    values: Mapping[str, object], lease: Lease, branch: str, message: str,
) -> tuple[Publication | None, str | None, str]:
    """The publish this call names, the branch head and the call's key (derived from the head without one)."""
    parent = await asyncio.to_thread(checkout.branch_sha, branch)
    key = _key(values, lease, message, parent)
    pub = await store.get(rt.repo, key)
    if pub is None and not isinstance(values.get("idempotency_key"), str):
        # Without a key, the same message again resumes this lease's publish that a crash or a refusal left
        # unfinished (its commit may already be the branch head, which changed the derived key).
        pub = await store.unfinished(rt.repo, lease.issue_number, lease.lease_id, _digest(message))
    return pub, parent, key


def _catch_up(checkout: gitops.ControlCheckout, ctx: BootstrapContext, branch: str, worktree: Path, issue: int,
              owner: str, seen: dict[str, str | None]) -> dict[str, str] | None:
    """The issue branch on Gitea moved past the worktree's by exactly an update of its pull request from its base
    (gitea_update_pull_request, or Gitea's "Update branch"; ``update_from_base``). By a merge: the worktree is
    fast-forwarded to it before anything is committed (``fast_forward_worktree``: uncommitted changes are carried
    along, never overwritten), so the publish builds on it and its push is a fast-forward; returns where it moved. By
    a rebase (the branch rewritten on Gitea), or a fast-forward git refuses (it would overwrite an uncommitted
    change): refused before anything is committed, with the git command that brings the worktree there. None for
    anything else, left to the push as before (a branch behind the worktree's is pushed; one moved otherwise, by a
    foreign push, is a ``stale_pin`` for the controller)."""
    local = checkout.branch_sha(branch)
    auth = gitops.auth_env(checkout.origin_url() or "", ctx.settings.gitea_token())
    remote = seen["remote"] = checkout.remote_branch(branch, auth=auth)
    head = gitops.symbolic_head(checkout.git_dir / "HEAD")
    if local is None or remote is None or remote == local or head is None:
        return None
    default = head.removeprefix("refs/heads/")
    for name in (branch, default):  # the branch as Gitea has it, and the base it was updated from
        checkout.fetch(name, auth=auth)
    base = checkout.rev(f"refs/remotes/origin/{default}")
    style = checkout.update_from_base(local, remote, base) if base and checkout.rev(remote) else None
    if style is None:
        return None
    if style == "rebase":
        raise _Refused(envelope(
            "conflict",
            f"branch {branch} on Gitea is at {remote[:12]}: its pull request was rebased onto {default} there, so it "
            f"no longer builds on your worktree's {local[:12]}; nothing was committed or pushed",
            "Your changes stay in the worktree. Bring it onto the rebased branch (foreman fetched it: your commits "
            "are in it already), then publish again; foreman never force-pushes.",
            f"in your worktree run `git rebase --autostash {remote}` (resolve any conflict, then `git rebase "
            f"--continue`), then call gitea_publish_worktree again with issue_number={issue}",
            reason="branch_behind_remote", branch=branch, remote_sha=remote, local_sha=local, update=style))
    refusal = checkout.fast_forward_worktree(worktree, remote)
    if refusal is not None:
        raise _Refused(envelope(
            "conflict",
            f"branch {branch} on Gitea is at {remote[:12]}: its pull request was updated from {default} there, ahead "
            f"of your worktree's {local[:12]}, and moving the worktree there would overwrite uncommitted changes; "
            "nothing was committed or pushed",
            "Your changes stay in the worktree: set them aside, move the worktree to the branch as Gitea has it "
            "(foreman fetched it), bring them back and resolve what conflicts.",
            f"in your worktree run `git stash && git merge --ff-only {remote} && git stash pop`, resolve any "
            f"conflict, then call gitea_publish_worktree again with issue_number={issue}",
            reason="branch_behind_remote", branch=branch, remote_sha=remote, local_sha=local, update=style,
            git=refusal))
    group = worktree_access.group_for(ctx.settings.bootstrap.worktree_groups, owner)
    if group is not None:  # what the fast-forward wrote (as the service) is the agent's too, as the bootstrap's was
        try:
            worktree_access.grant(worktree, ctx.checkout_root, group)
        except worktree_access.WorktreeAccessError as exc:
            raise _Refused(envelope(
                "invalid_state", f"the worktree of #{issue} was fast-forwarded to {remote[:12]} but could not be "
                f"handed back to the group {group}: {exc}; nothing was committed or pushed",
                "The agent may not be able to read or change what the fast-forward wrote.",
                f"an operator makes the service a member of {group} (or fixes [bootstrap] worktree_groups), then "
                f"call gitea_publish_worktree again with issue_number={issue}", reason="worktree_access")) from exc
    log.info("publish of #%s: worktree fast-forwarded from %s to %s (updated from %s on Gitea)", issue, local, remote,
             default)
    return {"from": local, "to": remote, "update": style}


def _commit(checkout: gitops.ControlCheckout, worktree: Path, branch: str, pub: Publication, message: str,
            author: tuple[str, str]) -> str:
    """The publish's commit: adopted when the branch head already carries its trailer (a crash after the commit),
    else made from every change inside the worktree (a path that leaves it is refused, nothing committed)."""
    trailer = f"{TRAILER}: {pub.key}"
    head = checkout.branch_sha(branch)
    if head is not None and head != pub.parent_sha and trailer in checkout.commit_message(head):
        return head
    changes = checkout.worktree_changes(worktree)
    escaping = sorted(p for p in changes if worktree_files.escapes_root(worktree, worktree / p))
    if escaping:
        raise _Refused(envelope(
            "invalid_input",
            f"{len(escaping)} changed path(s) leave the worktree (a symbolic link or a path outside it): "
            + ", ".join(escaping[:10]),
            "Nothing was committed: foreman commits only files inside the worktree.",
            f"remove the symbolic link(s) {', '.join(escaping[:3])} from the worktree, then call "
            f"gitea_publish_worktree again for #{pub.issue_number}",
            paths=escaping[:50]))
    nested = worktree_files.nested_repositories(worktree, changes)
    if nested:
        raise _Refused(nested_refused(nested, pub.issue_number))
    try:
        sha = checkout.commit_worktree(worktree, f"{message}\n\n{trailer}\n", author=author) if (
            changes) else None
    except gitops.GitlinksStaged as exc:  # a repository nested since the look above: unstaged, nothing committed
        raise _Refused(nested_refused(list(exc.paths), pub.issue_number)) from exc
    if sha is None:
        raise _Refused(Envelope(
            error="tracing_gap", message="Missing required commit(s): the worktree has no change to commit",
            remediate="change files in the worktree before publishing",
            exact_next_action=f"edit files in {worktree}, then call gitea_publish_worktree for #{pub.issue_number}",
            missing=("commits",)))
    return sha


def nested_refused(paths: list[str], issue: int) -> Envelope:
    """A repository nested in the worktree: git would commit it as a gitlink (mode 160000) to a commit nobody can
    fetch, with no ``.gitmodules``; nothing was committed."""
    return envelope(
        "invalid_input",
        f"{len(paths)} directory(ies) in the worktree hold a repository of their own (a .git directory or file): "
        + ", ".join(paths[:10]),
        "Nothing was committed: git would record each as a gitlink (mode 160000) to a commit that is nowhere on "
        "Gitea, not as its files. foreman commits plain files only (no submodules).",
        f"remove the nested .git of {', '.join(paths[:3])} (its files are then committed as plain files) or remove "
        f"the directory, then call gitea_publish_worktree again for #{issue}",
        paths=paths[:50], reason="nested_repository")


def _push(checkout: gitops.ControlCheckout, ctx: BootstrapContext, pub: Publication,
          seen: Mapping[str, str | None]) -> str | None:
    """Push the publish's commit; a remote branch that is not an ancestor of it is a ``stale_pin`` (never forced).
    Returns where the remote branch was before (None: it did not exist).

    Where the remote branch is comes from ``seen`` when this call read it before committing (``_catch_up``,
    moments earlier), else from Gitea now: a branch moved in between is refused by the push itself (never
    forced), the same ``stale_pin``."""
    assert pub.commit_sha is not None
    url = checkout.origin_url() or ""
    auth = gitops.auth_env(url, ctx.settings.gitea_token())
    remote = seen["remote"] if "remote" in seen else checkout.remote_branch(pub.branch, auth=auth)
    if remote == pub.commit_sha:
        return remote
    refusal = None
    if remote is not None and not checkout.is_ancestor(remote, pub.commit_sha):
        refusal = f"{pub.branch} on Gitea is at {remote}, not an ancestor of {pub.commit_sha}"
    else:
        refusal = checkout.push_branch(pub.branch, pub.commit_sha, auth=auth)
    if refusal is not None:
        raise _Refused(stale_branch(pub, remote, refusal))
    return remote


def worktree_refused(exc: gitops.WorktreeRefused, issue: int) -> Envelope:
    """The worktree's ``.git`` file or registration is not what foreman wrote: git was not run on it."""
    restore = exc.restore
    then = (f"An operator who has looked at the worktree writes back what git wrote with: {restore}" if restore
            else "Only a fresh bootstrap of the issue registers a worktree again.")
    return envelope(
        "invalid_state", str(exc),
        "foreman runs git on a worktree only through the registration it made; nothing was committed or pushed. "
        + then,
        f"call gitea_post_issue_state with issue_number={issue}, state blocked, who_is_next controller and blockers "
        f"naming the worktree's .git file",
        worktree=str(exc.worktree), registration=str(exc.admin) if exc.admin is not None else None,
        problems=list(exc.problems), restore=restore)


def stale_branch(pub: Publication, remote: str | None, detail: str) -> Envelope:
    return envelope(
        "stale_pin",
        f"branch {pub.branch} moved on Gitea (now {(remote or 'unknown')[:12]}) and your commit "
        f"{(pub.commit_sha or '')[:12]} does not build on it; nothing was pushed (foreman never force-pushes)",
        "Your commit stays in the worktree; someone must bring the branch and the worktree together.",
        f"call gitea_post_issue_state with issue_number={pub.issue_number}, state blocked, who_is_next controller "
        f"and blockers naming branch {pub.branch} moved on Gitea",
        branch=pub.branch, remote_sha=remote, local_sha=pub.commit_sha, git=detail[-300:])


async def _verify(rt: VerbRuntime[PublishGitea], verb: Verb, caller: Caller, pub: Publication,
                  delivery_id: str | None, caught_up: dict[str, str] | None = None) -> VerbResult:
    """Read the branch back from Gitea; when it is the commit, record ``verified`` and queue the evidence in one
    transaction."""
    gitea: PublishGitea | None = rt.gitea
    assert gitea is not None and pub.commit_sha is not None
    try:
        seen: str | None = (await gitea.get_branch(pub.branch)).commit_id
    except GiteaNotFound:
        seen = None
    except GiteaError as exc:
        again = f"call {verb.tool} again for #{pub.issue_number} with the same idempotency_key"
        return refused(verb.name, gitea_refusal(exc, GiteaAsk(
            what=f"read back the branch {pub.branch}", refused_because="The branch name is not one Gitea reads.",
            after_failure="The push may have landed.", retry=again, read_state=again)))
    if seen != pub.commit_sha:
        return refused(verb.name, envelope(
            "conflict", f"after the push Gitea shows {pub.branch} at {seen}, not {pub.commit_sha}",
            "The branch changed right after the push (or the push did not land).",
            f"call gitea_get_issue_state with issue_number={pub.issue_number}",
            branch=pub.branch, seen=seen, commit=pub.commit_sha))
    key = f"{pub.key}:evidence"
    result: dict[str, Any] = {
        "issue_number": pub.issue_number, "branch": pub.branch, "commit": pub.commit_sha,
        "parent": pub.parent_sha, "remote_before": pub.remote_before or None, "publication": pub.key,
        "read_back": {"branch": pub.branch, "commit_id": seen}, "outbox": [key], "replayed": False,
        **({"caught_up": caught_up} if caught_up is not None else {}),
    }
    state = CanonicalState(
        state="in-progress",
        who_is_next="author",
        next_action="open the pull request with gitea_open_pull_request",
        next_prompt=f"{pub.branch} is on Gitea at {pub.commit_sha[:12]}. Call gitea_open_pull_request for "
                    f"#{pub.issue_number}, or publish more changes first.",
        what_happened=f"{caller.login} committed {pub.commit_sha[:12]} in branches/{pub.branch} and pushed it",
        why=f"{caller.login} holds the lease and the lock of #{pub.issue_number} and published its worktree",
        related_prs=(),
        blockers="none",
        validation=f"Gitea's branch {pub.branch} read back at {seen}",
        last_updated_by=rt.bot_login or rt.settings.gitea.bot_login or "foreman",
    )
    body = render_evidence(key=key, summary=f"Published {pub.branch} at {pub.commit_sha[:12]} for {caller.login}.",
                           state=state, evidence={"action": "publish_worktree", "channel": caller.channel,
                                                  "delivery": delivery_id, **result})
    store = PublicationStore(rt.db)
    async with rt.db.transaction() as conn:
        await store.advance(conn, pub, "verified", result=result, now=rt.clock())
        await enqueue(conn, OutboxIntent(key, pub.issue_number, "comment", {"body": body}, delivery_id, repo=rt.repo))
    return rt.done(verb, caller, result)
