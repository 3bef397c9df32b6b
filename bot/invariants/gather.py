"""The edges: the facts read from foreman's database, from Gitea and from the control checkout."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

# The facts' classes by their module (facts.LeaseFact): the package's __init__ lists the API for its callers.
import bot.invariants.facts as facts
from bot.core.bootstrap import KEPT_DIR
from bot.core.evidence import find_marker, parse_evidence
from bot.core.teardown import closing_issue
from bot.core.vocabulary import label_for_state
from bot.gitea import Comment, Issue, IssueState, IssueType, PullRequest
from bot.gitops.records import parse_worktree_porcelain
from bot.invariants.checks import HANDOVER_REASONS, real_path
from state.db import read_only
from state.deliveries import DeliveryStore
from state.grants import GrantStore
from state.journal import JournalStore
from state.leases import LeaseStore
from state.outbox import OutboxStore
from state.teardowns import TeardownStore

if TYPE_CHECKING:
    from bot.config import Settings
    from bot.verbs.allocate import AllocatorGitea
    from bot.verbs.queue_facts import QueuedPull
    from bot.verbs.queue_view import WorkQueues

# --- edges ------------------------------------------------------------------------------------------------------------


def _numbers(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return tuple(sorted(value))


def _recorded_exclusions(request: dict[str, Any]) -> tuple[int, ...] | None:
    """The lease row's ``exclude`` (None when the row has none: the lease was not made by an allocation)."""
    return _numbers(request.get("exclude")) if isinstance(request, dict) and "exclude" in request else None


def _decided_exclusions(payload: dict[str, Any]) -> tuple[int, ...] | None:
    """``exclusions.exclude_issue_numbers`` from a lease's evidence comment, as queued (None: not recorded)."""
    doc = parse_evidence(payload.get("body", "")) if isinstance(payload, dict) else None
    exclusions = doc.get("exclusions") if doc is not None else None
    return _numbers(exclusions.get("exclude_issue_numbers")) if isinstance(exclusions, dict) else None


def _handed_over(payload: dict[str, Any]) -> str | None:
    """``handed_over.lease_id`` from a pull request's evidence comment, as queued (None: no lease ended)."""
    doc = parse_evidence(payload.get("body", "")) if isinstance(payload, dict) else None
    handed = doc.get("handed_over") if doc is not None else None
    lease_id = handed.get("lease_id") if isinstance(handed, dict) else None
    return lease_id if isinstance(lease_id, str) else None


def _assignment_read_back(owner: str, result: dict[str, Any] | None) -> bool:
    """A completed transition's proof says Gitea, read back after the assignment, lists the owner."""
    assignment = result.get("assignment") if isinstance(result, dict) else None
    if not isinstance(assignment, dict):
        return False
    listed = {str(a).lower() for a in assignment.get("gitea_assignees") or ()}
    return assignment.get("assigned") is True and assignment.get("read_back") is True and owner.lower() in listed


def _recorded_comment_id(result: dict[str, Any] | None) -> int | None:
    value = result.get("comment_id") if isinstance(result, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def gather_db(path: Path | str, *, repo: str | None = None) -> facts.DbFacts:
    """Read the facts from a foreman database, read-only (safe beside a running service: WAL readers); with
    ``repo`` (a repo key), only that repository's rows (the deliveries are the whole inbox's)."""
    async with read_only(path) as db:
        entries = await OutboxStore(db).every_entry()
        lease_rows = await LeaseStore(db).every_lease()
        digests = await DeliveryStore(db).digests()
        journal = JournalStore(db)
        transition_rows = await journal.every_transition()
        registration_rows = await journal.every_registration()
        teardown_rows = await TeardownStore(db).every()
        run_rows = await GrantStore(db).runs(limit=1_000_000)
    if repo is not None:
        # An entry filed under no repository belongs to none: shown in every repository's check, a violation.
        entries = [e for e in entries if e.repo in (repo, "")]
        lease_rows = [lease for lease in lease_rows if lease.repo == repo]
        transition_rows = [t for t in transition_rows if t.repo == repo]
        registration_rows = [(key, r) for key, r in registration_rows if r.repo == repo]
        teardown_rows = [t for t in teardown_rows if t.repo == repo]
    outbox = tuple(
        facts.OutboxFact(e.key, e.issue_number, e.kind, e.status, _recorded_comment_id(e.result) if e.kind == "comment"
                   else None, e.repo)
        for e in entries
    )
    decided = {e.key.removesuffix(":evidence"): _decided_exclusions(e.payload) for e in entries
               if e.kind == "comment" and e.key.startswith("lease-") and e.key.endswith(":evidence")}
    leases = tuple(
        facts.LeaseFact(lease.lease_id, lease.issue_number, lease.owner, lease.status, lease.end_reason,
                  _recorded_exclusions(lease.request), decided.get(lease.lease_id), lease.action, lease.expires_at,
                  lease.ended_at)
        for lease in lease_rows
    )
    deliveries = tuple(facts.DeliveryFact(*digest) for digest in digests)
    transitions = tuple(
        facts.TransitionFact(t.key, t.issue_number, t.lease_id, t.owner, t.phase, t.outcome, t.branch,
                       real_path(t.worktree_path),
                       _assignment_read_back(t.owner, t.result) if t.outcome == "completed" else None)
        for t in transition_rows
    )
    registrations = tuple(
        facts.RegistrationFact(key, r.issue_number, r.lease_id, r.branch, real_path(r.worktree_path),
                               r.ended_at is None, r.kept)
        for key, r in registration_rows
    )
    teardowns = tuple(
        facts.TeardownFact(
            t.key, t.issue_number,
            tuple(x["lease_id"] for x in t.outcome.get("leases") or () if x.get("end_reason") == t.reason),
            tuple(w["path"] for w in t.outcome.get("worktrees") or () if w.get("action") == "kept"),
        )
        for t in teardown_rows
    )
    # A PR's evidence is a lease's end record only when the PR's opening really ended it (a lease released or
    # expired meanwhile has its own end record to show).
    handed_over = {lease.lease_id for lease in lease_rows if lease.end_reason in HANDOVER_REASONS}
    handovers = tuple(
        (lease_id, e.key) for e in entries if e.kind == "comment" and e.key.startswith("pr:")
        and e.key.endswith(":evidence") and (lease_id := _handed_over(e.payload)) in handed_over
    )
    run_repos = tuple((run.run_id, run.repo) for run in run_rows)
    return facts.DbFacts(leases, outbox, deliveries, transitions, registrations, teardowns, handovers, run_repos)


class GiteaReads(Protocol):
    """The Gitea reads the checker makes (``GiteaClient`` has them)."""

    async def list_issues(self, *, state: IssueState = "open", type_: IssueType | None = "issues") -> list[Issue]: ...

    async def get_issue(self, number: int) -> Issue: ...

    async def list_issue_comments(self, number: int) -> list[Comment]: ...

    async def list_pulls(self, *, state: IssueState = "open") -> list[PullRequest]: ...


async def gather_gitea(client: GiteaReads, *, numbers: Iterable[int] | None = None) -> facts.GiteaFacts:
    """Every comment (with its foreman marker), the assignees of every issue and pull request (or of ``numbers``),
    and which of those are open issues in `status:in-progress`."""
    if numbers is None:
        issues = await client.list_issues(state="all", type_=None)
    else:
        issues = [await client.get_issue(number) for number in numbers]
    assignees = {i.number: frozenset(u.login.lower() for u in i.assignees) for i in issues}
    working = label_for_state("in-progress")
    in_progress = frozenset(i.number for i in issues
                            if i.state == "open" and not i.is_pull and working in i.label_names)
    comments: list[facts.CommentFact] = []
    for number in sorted(assignees):
        for c in await client.list_issue_comments(number):
            comments.append(facts.CommentFact(number, c.id, c.user.login, find_marker(c.body)))
    merged = set()
    for pull in await client.list_pulls(state="closed"):
        closes = closing_issue(body=pull.body, title=pull.title, head_ref=pull.head_ref) if pull.merged else None
        if closes is not None and closes != pull.number:
            merged.add(closes)
    return facts.GiteaFacts(tuple(comments), assignees, frozenset(merged), in_progress)


def queue_facts(queues: WorkQueues, settings: Settings) -> facts.QueueFacts:
    """The facts of the queues ``work_queues`` read, with when each waiting pull request entered its queue."""

    def waiting(q: QueuedPull) -> facts.WaitingPullFact:
        return facts.WaitingPullFact(q.issue.number, q.pull.number, frozenset(login.lower() for login in q.barred),
                                     queues.since.get(q.issue.number), bool(q.pull.mergeable))

    running = frozenset(settings.allocator.queues) if settings.auto_allocation() else frozenset()
    return facts.QueueFacts(tuple(waiting(q) for q in queues.reviews), tuple(waiting(q) for q in queues.merges),
                            queues.idle_reviewers, queues.idle_mergers, running, queues.merge_by,
                            settings.allocator.queue_wait_bound_s)


async def gather_queues(client: AllocatorGitea, database: Path | str, settings: Settings, *,
                        now: datetime) -> facts.QueueFacts:
    """The review and merge queues of ``settings``' repository (``client`` must be its own), as
    ``work_queues`` reads them, from a database read read-only. Raises GiteaError when Gitea cannot answer."""
    from bot.catalog import open_door
    from bot.verbs.queue_view import work_queues

    async with read_only(database) as db:
        door = open_door(db, settings, client, bot_login=settings.gitea.bot_login)
        queues = await work_queues(door, now)
    return queue_facts(queues, settings)


def _git(checkout: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, check=True, timeout=60)
    return done.stdout


def _directories(branches: Path) -> tuple[str, ...]:
    """The directories under ``branches/``: its children, the kept worktrees' folder (``KEPT_DIR``) looked into."""
    if not branches.is_dir():
        return ()
    found = [child for child in branches.iterdir() if child.name != KEPT_DIR]
    kept = branches / KEPT_DIR
    if kept.is_dir() and not kept.is_symlink():
        found.extend(kept.iterdir())
    elif os.path.lexists(kept):
        found.append(kept)
    return tuple(sorted(str(child) for child in found))


def gather_checkout(path: Path | str) -> facts.CheckoutFacts | None:
    """Git's view of the control checkout at ``path``; None when there is none (nothing was bootstrapped)."""
    checkout = Path(real_path(str(path)))
    if not (checkout / ".git" / "HEAD").is_file():
        return None
    branches = checkout / "branches"
    directories = _directories(branches)
    entries = parse_worktree_porcelain(_git(checkout, "worktree", "list", "--porcelain", "-z"))
    worktrees = tuple(
        facts.WorktreeFact(real_path(e.path), e.branch, e.prunable is not None)
        for e in entries
        if real_path(e.path) != str(checkout)
    )
    refs = _git(checkout, "for-each-ref", "--format=%(refname:short)", "refs/heads/issue-*")
    return facts.CheckoutFacts(str(checkout), directories, worktrees, tuple(sorted(refs.split())))


async def gather(
    *,
    database: Path | str,
    client: GiteaReads,
    bot_login: str,
    checkout: Path | str | None,
    acknowledged: Sequence[tuple[str, str]] | None = None,
    require_bootstrap: bool = False,
    repo: str | None = None,
    now: datetime | None = None,
    lease_grace_s: float = 120.0,
    queues: facts.QueueFacts | None = None,
) -> facts.Facts:
    """All facts, from a quiet service's database, Gitea and control checkout; with ``repo``, of that one
    repository (``client`` and ``checkout`` must be its own). ``now`` (and the queues, ``gather_queues``) for the
    invariants that need the time."""
    db = await gather_db(database, repo=repo)
    gitea = await gather_gitea(client)
    return facts.Facts(
        db=db,
        gitea=gitea,
        bot_login=bot_login,
        checkout=gather_checkout(checkout) if checkout is not None else None,
        acknowledged=tuple(acknowledged) if acknowledged is not None else None,
        require_bootstrap=require_bootstrap,
        now=now,
        lease_grace_s=lease_grace_s,
        queues=queues,
    )
