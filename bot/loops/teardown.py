"""The end of an issue's life: its leases ended, the bootstrap's worktree and branch removed when safe, one record."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from bot import gitops
from bot.config import Settings
from bot.core.bootstrap import KEPT_DIR, worktree_lock_reason
from bot.core.evidence import render_evidence
from bot.core.teardown import (
    BranchFacts,
    Decision,
    Reason,
    WorktreeFacts,
    closed_key,
    closing_issue,
    decide_branch,
    decide_worktree,
    done_labels,
    final_state,
    pull_key,
    summary,
)
from bot.gitea import Branch, GiteaNotFound, PullRequest, Repository, Review
from bot.gitea.endpoint import IssueState
from bot.verbs.bootstrap.context import BootstrapContext
from state.db import Database, utcnow
from state.journal import JournalStore, Registration, Transition
from state.leases import Lease, LeaseStore
from state.outbox import OutboxIntent, enqueue
from state.publications import PublicationStore
from state.teardowns import TeardownStore

log = logging.getLogger("foreman.teardown")

#: One teardown at a time per issue of a database (a duplicated webhook runs on another worker at once); per
#: database, because a lock belongs to the event loop that first waits on it and each service runs its own. An
#: issue's entry lives while a teardown holds or waits for it: kept, it was one more entry per life (issue 35).
_LOCKS: weakref.WeakKeyDictionary[Database, dict[str, tuple[asyncio.Lock, list[int]]]] = weakref.WeakKeyDictionary()


@contextlib.asynccontextmanager
async def _lock(db: Database, repo: str, issue_number: int) -> AsyncIterator[None]:
    locks, key = _LOCKS.setdefault(db, {}), f"{repo}#{issue_number}"
    lock, users = locks.setdefault(key, (asyncio.Lock(), [0]))
    users[0] += 1
    try:
        async with lock:
            yield
    finally:
        users[0] -= 1
        if not users[0]:
            del locks[key]


class TeardownGitea(Protocol):
    """The Gitea calls the teardown makes (``bot.gitea.GiteaClient`` has them); labels and the comment go through
    the outbox."""

    async def get_repo(self) -> Repository: ...
    async def get_pull(self, number: int) -> PullRequest: ...
    async def list_pulls(
        self, *, state: IssueState = ..., base_branch: str | None = ..., limit: int = ...
    ) -> list[PullRequest]: ...
    async def list_reviews(self, number: int) -> list[Review]: ...
    async def get_branch(self, name: str) -> Branch: ...
    async def delete_branch(self, name: str) -> None: ...


@dataclass(frozen=True, slots=True)
class TeardownCall:
    issue_number: int
    reason: Reason
    key: str
    pull: PullRequest | None
    trigger: str
    delivery_id: str | None = None


@dataclass
class TeardownReport:
    key: str
    status: Literal["done", "replayed", "skipped"]
    outcome: dict[str, Any] = field(default_factory=dict)
    outbox: list[str] = field(default_factory=list)
    #: the live leases this teardown ended (their owners are free: auto-allocation follows)
    ended: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Worktree:
    registration: Registration
    facts: WorktreeFacts
    decision: Decision
    lock_reason: str


async def governed(db: Database, repo: str, issue_number: int) -> bool:
    """The issue had a lease or a registered worktree: foreman took part in its life (only those end here)."""
    if await LeaseStore(db).history(repo, issue_number):
        return True
    return bool(await JournalStore(db).registrations(repo, issue_number))


async def teardown_for_pull(
    db: Database, settings: Settings, gitea: TeardownGitea, pull: PullRequest, *, bot_login: str, trigger: str,
    delivery_id: str | None = None,
) -> TeardownReport | None:
    """A closed pull request (merged or not) ends the life of the issue it closes. None: not ours to end."""
    number = closing_issue(body=pull.body, title=pull.title, head_ref=pull.head_ref)
    if number is None or number == pull.number or pull.state != "closed":
        return None
    reason: Reason = "merged" if pull.merged else "pr_closed"
    call = TeardownCall(number, reason, pull_key(settings.repo_key, number, pull.number), pull, trigger, delivery_id)
    return await teardown_issue(db, settings, gitea, call, bot_login=bot_login)


async def teardown_for_closed_issue(
    db: Database, settings: Settings, gitea: TeardownGitea, issue_number: int, closed_at: str, *, bot_login: str,
    trigger: str, delivery_id: str | None = None,
) -> TeardownReport | None:
    """An issue closed on Gitea. Closed by a merge (its webhooks come in any order), it is the merge's teardown,
    under the pull request's key; closed by a person, its own (``issue_closed``)."""
    if not await governed(db, settings.repo_key, issue_number):
        return None
    merging = await _merged_pull_closing(db, settings, gitea, issue_number)
    if merging is not None:
        return await teardown_for_pull(db, settings, gitea, merging, bot_login=bot_login, trigger=trigger,
                                       delivery_id=delivery_id)
    key = closed_key(settings.repo_key, issue_number, closed_at)
    call = TeardownCall(issue_number, "issue_closed", key, None, trigger, delivery_id)
    return await teardown_issue(db, settings, gitea, call, bot_login=bot_login)


async def _merged_pull_closing(
    db: Database, settings: Settings, gitea: TeardownGitea, issue_number: int
) -> PullRequest | None:
    """The merged pull request that closes the issue: the one foreman recorded opening for it, read alone (listing
    every closed pull request the repository ever had grew with every life: issue 35), else the newest merged one
    that names it among all closed ones (a pull request opened outside foreman)."""
    def closes(pull: PullRequest) -> bool:
        return pull.merged and closing_issue(body=pull.body, title=pull.title, head_ref=pull.head_ref) == issue_number

    recorded = await PublicationStore(db).pull_for_issue(settings.repo_key, issue_number)
    if recorded is not None:
        with contextlib.suppress(GiteaNotFound):
            if closes(pull := await gitea.get_pull(recorded.pr_number)):
                return pull
    return next((pull for pull in await gitea.list_pulls(state="closed") if closes(pull)), None)


async def teardown_issue(
    db: Database, settings: Settings, gitea: TeardownGitea, call: TeardownCall, *, bot_login: str
) -> TeardownReport | None:
    """Once per key: end every live lease, remove the journal's worktree only when clean and merged, delete the
    branch when configured and unmoved, then in one transaction the record, the lease ends, the registration's
    end, ``status:done`` and the final evidence comment. Every effect before the transaction is idempotent, so a
    crash before it is repaired by the next delivery or catch-up."""
    repo, number = settings.repo_key, call.issue_number
    async with _lock(db, repo, number):
        store = TeardownStore(db)
        recorded = await store.get(call.key)
        if recorded is not None:
            return TeardownReport(call.key, "replayed", recorded.outcome)
        leases = await LeaseStore(db).history(repo, number)
        journal = JournalStore(db)
        registrations = await journal.registrations(repo, number)
        if not leases and not registrations:
            return None
        live_regs = [r for r in registrations if r.ended_at is None]
        if call.reason == "issue_closed" and not live_regs and not any(x.status == "live" for x in leases):
            if await store.for_issue(repo, number):
                return TeardownReport(call.key, "skipped", {"why": "the issue's life was ended already"})
        transitions = {t.id: t for t in await journal.history(repo, number)}
        repository = await gitea.get_repo()
        context = BootstrapContext(db=db, settings=settings, gitea=None, bot_login=bot_login)
        checkout = context.checkout()
        auth = gitops.auth_env(settings.repository.effective_clone_url(repository.clone_url), settings.gitea_token())
        pull = call.pull
        # A worktree kept aside for an earlier owner when another author took the issue over is judged like the
        # live one (first: the live one stays the summary's ``worktree``).
        kept_regs = [r for r in registrations if r.kept]
        worktrees, commits, merged_head = await asyncio.to_thread(
            _judge, checkout, [*kept_regs, *live_regs], transitions, repository.default_branch, pull, auth,
            settings.lifecycle.remove_worktree, True, registrations,
        )
        worktrees = await asyncio.to_thread(_remove, checkout, worktrees)
        branch_name = pull.head_ref if pull is not None else (registrations[-1].branch if registrations else "")
        branch = await _branch(gitea, settings, call.reason, branch_name, repository.default_branch, merged_head)
        reviews = await gitea.list_reviews(pull.number) if pull is not None else []
        now = utcnow()
        outcome = _outcome(call, leases, worktrees, branch, pull, commits, reviews, merged_head)
        return await _commit(db, repo, call, outcome, worktrees, now=now, bot_login=bot_login)


def _judge(
    checkout: gitops.ControlCheckout, registrations: Sequence[Registration], transitions: dict[int, Transition],
    default_branch: str, pull: PullRequest | None, auth: dict[str, str], remove_enabled: bool, fetch: bool = True,
    history: Sequence[Registration] = (),
) -> tuple[list[_Worktree], list[tuple[str, str]], str | None]:
    """In a thread: fetch the default branch and the PR's head as it closed (the merged head: the PR's reported
    head follows its branch even after the merge), judge each live registration's worktree; the PR's commits."""
    if not checkout.exists():
        return [], [], pull.head_sha if pull is not None and pull.merged else None
    tracking = f"refs/remotes/origin/{default_branch}"
    # Both refs in one fetch; when it fails, each on its own (one may fail without the other).
    closed_head = (gitops.fetch_base_and_pull_head(checkout, default_branch, pull.number, auth=auth)
                   if pull is not None and fetch else None)
    if closed_head is None and fetch:
        try:
            checkout.fetch(default_branch, auth=auth)
        except gitops.GitFailure as exc:
            log.warning("teardown: could not fetch %s (%s); only a worktree at the merged head is removed",
                        default_branch, exc)
        closed_head = gitops.fetch_pull_head(checkout, pull.number, auth=auth) if pull is not None else None
    merged_head = (closed_head or pull.head_sha) if pull is not None and pull.merged else None
    judged: list[_Worktree] = []
    for registration in registrations:
        path = Path(registration.worktree_path)
        exists = path.is_dir() and not path.is_symlink() and checkout.worktree_at(path) is not None
        status: tuple[str, ...] = ()
        head: str | None = None
        refused: str | None = None
        try:
            status = tuple(gitops.losses(checkout.worktree_status(path))) if exists else ()
            head = gitops.worktree_head(checkout, path) if exists else None
        except gitops.WorktreeRefused as exc:  # kept as it is; the report says why and how it is restored
            refused = str(exc) + (f"; an operator restores it with: {exc.restore}" if exc.restore else "")
        origin = _origin(registration, history)
        facts = WorktreeFacts(
            path=str(path), exists=exists, created_by_foreman=origin.created_worktree, status=status,
            head=head, merged_head=merged_head,
            head_in_default=head is not None and gitops.is_ancestor(checkout, head, tracking), refused=refused,
            registered=not exists and not os.path.lexists(path) and checkout.listed_worktree_at(path) is not None,
        )
        transition = transitions.get(origin.journal_id)
        reason = worktree_lock_reason(transition.key) if transition is not None else ""
        judged.append(_Worktree(registration, facts, decide_worktree(facts, remove_enabled=remove_enabled), reason))
    commits: list[tuple[str, str]] = []
    if pull is not None:
        base = next((t.base_sha for t in transitions.values() if t.phase == "completed"), None) or pull.base_sha
        commits = gitops.commit_subjects(checkout, base, closed_head or pull.head_sha)
    return judged, commits, merged_head


def _origin(registration: Registration, history: Sequence[Registration]) -> Registration:
    """The registration that created this worktree: itself, or the one of the same path a later bootstrap of the
    same owner superseded (a request for changes resumes the work in the worktree foreman created and locked)."""
    if registration.created_worktree:
        return registration
    earlier = [r for r in history if r.id < registration.id and r.worktree_path == registration.worktree_path
               and r.owner == registration.owner and (r.end_reason or "").startswith("superseded by ")]
    return next((r for r in sorted(earlier, key=lambda r: -r.id) if r.created_worktree), registration)


def _remove(checkout: gitops.ControlCheckout, worktrees: list[_Worktree]) -> list[_Worktree]:
    """In a thread: remove what was judged removable; git's own refusal (something appeared since) keeps it."""
    done: list[_Worktree] = []
    for item in worktrees:
        if item.decision.action == "remove":
            try:
                gitops.remove_clean_worktree(checkout, Path(item.facts.path), item.lock_reason)
            except gitops.GitFailure as exc:
                item = _Worktree(item.registration, item.facts, Decision("keep", f"git refused to remove it: {exc}"),
                                 item.lock_reason)
            else:
                kept_dir = Path(item.facts.path).parent
                if item.registration.kept and kept_dir.name == KEPT_DIR:
                    with contextlib.suppress(OSError):  # the folder of kept worktrees goes with its last one
                        os.rmdir(kept_dir)
        done.append(item)
    return done


async def _branch(
    gitea: TeardownGitea, settings: Settings, reason: Reason, name: str, default_branch: str, merged_head: str | None
) -> dict[str, Any] | None:
    if not name:
        return None
    try:
        remote: str | None = (await gitea.get_branch(name)).commit_id
    except GiteaNotFound:
        remote = None
    facts = BranchFacts(branch=name, default_branch=default_branch, remote_sha=remote, merged_head=merged_head)
    decision = decide_branch(facts, reason=reason, delete_enabled=settings.lifecycle.delete_branch_after_merge)
    if decision.action == "delete":
        try:
            await gitea.delete_branch(name)
        except GiteaNotFound:
            return {"name": name, **decision.to_dict("absent")}
        return {"name": name, **decision.to_dict("deleted")}
    return {"name": name, **decision.to_dict("kept" if decision.action == "keep" else None)}


def _lease_doc(lease: Lease, reason: Reason) -> dict[str, Any]:
    live = lease.status == "live"
    return {
        "lease_id": lease.lease_id, "owner": lease.owner, "role": lease.role, "action": lease.action,
        "acquired_at": lease.acquired_at.isoformat(),
        "ended_at": None if live or lease.ended_at is None else lease.ended_at.isoformat(),
        "end_reason": reason if live else lease.end_reason,
    }


def _worktree_doc(item: _Worktree) -> dict[str, Any]:
    action = {"remove": "removed", "keep": "kept"}.get(item.decision.action, item.decision.action)
    return {"path": item.facts.path, "action": action, "reason": item.decision.reason, "head": item.facts.head,
            "status": list(item.facts.status[:50])}


def _outcome(
    call: TeardownCall, leases: Sequence[Lease], worktrees: Sequence[_Worktree], branch: dict[str, Any] | None,
    pull: PullRequest | None, commits: Sequence[tuple[str, str]], reviews: Sequence[Review], merged_head: str | None,
) -> dict[str, Any]:
    pr_doc: dict[str, Any] | None = None
    if pull is not None:
        pr_doc = {
            "number": pull.number, "title": pull.title, "author": pull.user.login, "head": pull.head_ref,
            "head_sha": pull.head_sha, "merged_head": merged_head, "merged": pull.merged,
            "merge_commit": pull.merge_commit_sha,
            "merged_by": pull.merged_by.login if pull.merged_by is not None else None,
            "commits": [{"sha": sha, "subject": subject} for sha, subject in commits],
            "reviews": [{"reviewer": r.user.login if r.user else None, "state": r.state, "commit_id": r.commit_id,
                         "stale": r.stale, "official": r.official} for r in reviews],
        }
    worktree_docs = [_worktree_doc(item) for item in worktrees]
    return {
        "reason": call.reason, "trigger": call.trigger, "issue_number": call.issue_number,
        "leases": [_lease_doc(lease, call.reason) for lease in leases],
        "worktree": worktree_docs[-1] if worktree_docs else None,
        "worktrees": worktree_docs,
        "branch": branch,
        "pull_request": pr_doc,
    }


async def _commit(
    db: Database, repo: str, call: TeardownCall, outcome: dict[str, Any], worktrees: Sequence[_Worktree], *,
    now: datetime, bot_login: str,
) -> TeardownReport:
    """One transaction: the record (the once), every live lease ended, removed worktrees' registrations ended,
    the issue lock released, ``status:done`` and the final comment queued."""
    store, lease_store, journal = TeardownStore(db), LeaseStore(db), JournalStore(db)
    number, pr = call.issue_number, outcome["pull_request"]["number"] if outcome["pull_request"] else None
    kept = [f"worktree {w['path']}: {w['reason']}" for w in outcome["worktrees"] if w["action"] == "kept"]
    if outcome["branch"] and outcome["branch"]["action"] == "kept" and call.reason == "merged":
        kept.append(f"branch {outcome['branch']['name']}: {outcome['branch']['reason']}")
    body = render_evidence(
        key=f"{call.key}:evidence",
        summary=summary(call.reason, pr, outcome["worktree"], outcome["branch"]),
        state=final_state(call.reason, pr, kept=kept, bot_login=bot_login),
        evidence={"action": "teardown", **outcome},
    )
    intents = (
        OutboxIntent(f"{call.key}:labels", number, "labels", done_labels(), call.delivery_id, repo=repo),
        OutboxIntent(f"{call.key}:evidence", number, "comment", {"body": body}, call.delivery_id, repo=repo),
    )
    queued: list[str] = []
    async with db.transaction() as conn:
        if not await store.record(conn, key=call.key, repo=repo, issue_number=number,
                                  reason=call.reason, pr_number=pr, trigger=call.trigger,
                                  delivery_id=call.delivery_id, outcome=outcome, now=now):
            recorded = await store.get(call.key, conn)
            return TeardownReport(call.key, "replayed", recorded.outcome if recorded else {})
        ended: list[str] = []
        for lease in await lease_store.open_leases(repo, conn):
            if lease.issue_number == number:
                await lease_store.release(conn, lease.lease_id, actor="foreman", reason=call.reason, now=now)
                ended.append(lease.lease_id)
        for item in worktrees:
            if item.decision.action in ("remove", "absent"):
                where = f" (pr #{pr})" if pr else ""
                what = "removed" if item.decision.action == "remove" else "gone"
                if item.registration.kept:
                    await journal.clear_kept(conn, item.registration.id,
                                             reason=f"teardown {call.reason}: kept worktree {what}{where}")
                    continue
                await journal.end_registration(
                    conn, item.registration.id, reason=f"teardown {call.reason}: {what}{where}", now=now
                )
        held = await journal.live_lock(repo, number, conn)
        if held is not None:
            await journal.release_lock(conn, held.lock_id, reason=f"teardown {call.reason}", now=now)
        for intent in intents:
            if await enqueue(conn, intent, now=now):
                queued.append(intent.key)
    log.info("teardown %s of #%d (%s): worktree %s, branch %s", call.key, number, call.reason,
             (outcome["worktree"] or {}).get("action"), (outcome["branch"] or {}).get("action"))
    return TeardownReport(call.key, "done", outcome, queued, ended)


async def remove_run_worktree(
    db: Database, settings: Settings, issue_number: int, *, bot_login: str, reason: str
) -> dict[str, Any] | None:
    """After a run's reserved teardown (``[lifecycle] remove_worktree_on_run_teardown``): the issue's registered
    worktree is removed by the same rule as after a merge (clean, and its HEAD already in the default branch as
    the control checkout last fetched it) once no lease holds the issue; anything else is kept and reported."""
    repo = settings.repo_key
    if await LeaseStore(db).live_for_issue(repo, issue_number) is not None:
        return None
    journal = JournalStore(db)
    registrations = await journal.registrations(repo, issue_number)
    live = [r for r in registrations if r.ended_at is None]
    if not live:
        return None
    transitions = {t.id: t for t in await journal.history(repo, issue_number)}
    checkout = BootstrapContext(db=db, settings=settings, gitea=None, bot_login=bot_login).checkout()
    default = next((t.base_branch for t in transitions.values()), "")
    async with _lock(db, repo, issue_number):
        judged, _, _ = await asyncio.to_thread(_judge, checkout, live, transitions, default, None, {},
                                               settings.lifecycle.remove_worktree, False, registrations)
        judged = await asyncio.to_thread(_remove, checkout, judged)
        now = utcnow()
        async with db.transaction() as conn:
            for item in judged:
                if item.decision.action in ("remove", "absent"):
                    await journal.end_registration(conn, item.registration.id, reason=f"run teardown: {reason}",
                                                   now=now)
    return {"worktrees": [_worktree_doc(item) for item in judged]}
