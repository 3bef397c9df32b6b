"""Consistency invariants across foreman's database, Gitea and the control checkout (docs/operating.md, section 5)."""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bot.core.evidence import find_marker, parse_evidence
from bot.core.teardown import closing_issue
from bot.gitea import Comment, Issue, IssueState, IssueType, PullRequest
from bot.gitops.records import parse_worktree_porcelain
from state.db import read_only
from state.deliveries import DeliveryStore
from state.grants import GrantStore
from state.journal import JournalStore
from state.leases import LeaseStore
from state.outbox import OutboxStore
from state.teardowns import TeardownStore

#: Every invariant ``check`` knows, with what it means.
INVARIANTS: dict[str, str] = {
    "deliveries.settled": "no stored delivery is still queued or processing",
    "deliveries.not_failed": "no delivery was parked as failed",
    "deliveries.none_lost": "every delivery Gitea saw acknowledged (2xx) is stored, under its id or its body",
    "outbox.settled": "no outbox entry is still pending or sending",
    "outbox.not_stuck": "no outbox entry ended parked or verification_failed",
    "outbox.comment_once": "every sent comment entry's marker is on exactly one bot comment in Gitea, the one"
    " the entry recorded",
    "outbox.no_stray_comment": "every bot comment carrying a foreman marker has an outbox entry with that key",
    "outbox.filed_by_repository": "no outbox entry has repo '' (start-up adoption files every such entry under the"
    " first repository; one filed later is a door that set no repository)",
    "outbox.run_evidence_repository": "every run's evidence entry (run:<id>:summary) is filed under its grant's"
    " repository",
    "leases.one_live_per_issue": "no issue has two live leases",
    "leases.evidence": "every lease has its evidence comment (<lease>:evidence) sent, verified and in Gitea once",
    "leases.no_evidence_without_lease": "every lease key in the outbox or in a Gitea marker names a stored lease",
    "leases.end_evidence": "every released lease has evidence of its end: its release comment, the failure"
    " comment of the compensated bootstrap that released it, or the comment of an allocation that released it"
    " because its worktree could not be bootstrapped (<lease>:unworkable), the verdict comment of a review lease"
    " (<lease>:review), the evidence of the pull request whose opening ended it (pull_request_opened), or the"
    " teardown that ended it",
    "leases.assigned": "every live implement lease's owner is an assignee of its issue in Gitea (a review lease"
    " assigns nobody)",
    "leases.unassigned_after_failure": "the owner of a lease foreman released because its bootstrap failed or could"
    " not run (end reason `bootstrap failed: ...` or `unworkable: ...`) is no assignee of the issue in Gitea, unless"
    " that owner leased it again later (a live lease, or one that ended since)",
    "leases.exclusions_recorded": "every lease an allocation made records the exclusions its decision applied: the"
    " lease row's `exclude` equals `exclusions.exclude_issue_numbers` of its evidence comment",
    "leases.bootstrapped": "every live implement lease has a completed bootstrap transition, or an open one of that"
    " lease that start-up recovery finishes or compensates (when bootstrap runs on allocation): an allocation proves"
    " before it leases, and one whose bootstrap is refused releases the lease at once",
    "journal.terminal": "no bootstrap transition is left open (every one completed or compensated)",
    "journal.evidence": "a completed transition has its evidence comment, a compensated one its failure comment",
    "journal.no_evidence_without_transition": "every bootstrap evidence or failure key names a stored transition"
    " with that outcome",
    "journal.registered": "every completed transition registered its worktree",
    "journal.assignment_read_back": "every completed transition's proof has Gitea listing the owner as an assignee,"
    " read back after foreman assigned it (never an assumed or pending assignment)",
    "worktrees.no_orphan_dir": "every directory under branches/ is a worktree registered in git",
    "worktrees.journaled": "every git worktree under branches/ has a live registration of a completed transition,"
    " on the same branch",
    "worktrees.inside_branches": "git has no worktree outside branches/ (besides the control checkout itself)",
    "worktrees.on_disk": "every live registration's worktree is registered in git, on its branch, and on disk",
    "worktrees.one_per_issue": "no issue has two live worktree registrations",
    "branches.journaled": "every local issue-* branch is the branch of a completed transition",
    "lifecycle.merged_no_live_lease": "no merged issue (closed by a merged pull request) has a live lease",
    "lifecycle.merged_no_worktree": "no worktree the bootstrap journal created is left on disk for a merged issue,"
    " unless its teardown reported it kept (uncommitted or unmerged work)",
}


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant} [{self.subject}]: {self.detail}"

    def to_dict(self) -> dict[str, str]:
        return {"invariant": self.invariant, "subject": self.subject, "detail": self.detail}


# --- facts ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseFact:
    lease_id: str
    issue_number: int
    owner: str
    status: str  # live | released | expired
    end_reason: str | None = None
    #: the exclusions the lease row records (its request's ``exclude``); None: not made by an allocation
    exclude: tuple[int, ...] | None = None
    #: the exclusions its allocation decision applied, as its evidence comment records them; None: not recorded
    decided_exclude: tuple[int, ...] | None = None
    #: implement (bootstrapped and assigned), or review / merge (neither: only the evidence comment)
    action: str = "implement"


@dataclass(frozen=True, slots=True)
class OutboxFact:
    key: str
    issue_number: int
    kind: str
    status: str
    comment_id: int | None = None  # what a sent comment entry recorded
    #: the repository the entry is filed under (None: not gathered, as in hand-built facts)
    repo: str | None = None


@dataclass(frozen=True, slots=True)
class DeliveryFact:
    delivery_id: str
    body_sha256: str
    status: str


@dataclass(frozen=True, slots=True)
class TransitionFact:
    key: str
    issue_number: int
    lease_id: str
    owner: str
    phase: str
    outcome: str  # open | completed | compensated
    branch: str
    worktree_path: str
    #: a completed transition's proof: Gitea, read back, listed the owner as assignee. None: not looked at
    assignment_read_back: bool | None = None


@dataclass(frozen=True, slots=True)
class RegistrationFact:
    transition_key: str
    issue_number: int
    lease_id: str
    branch: str
    worktree_path: str
    live: bool


@dataclass(frozen=True, slots=True)
class TeardownFact:
    key: str
    issue_number: int
    #: the leases the teardown ended (its evidence comment is their end's evidence)
    ended_leases: tuple[str, ...]
    #: the worktree paths it reported kept
    kept: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DbFacts:
    leases: tuple[LeaseFact, ...] = ()  # oldest first (the store's order of acquisition)
    outbox: tuple[OutboxFact, ...] = ()
    deliveries: tuple[DeliveryFact, ...] = ()
    transitions: tuple[TransitionFact, ...] = ()
    registrations: tuple[RegistrationFact, ...] = ()
    teardowns: tuple[TeardownFact, ...] = ()
    #: (lease, the key of the pull request's evidence comment whose opening ended that lease)
    handovers: tuple[tuple[str, str], ...] = ()
    #: (run id, its grant's repository) of every run
    run_repos: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class CommentFact:
    issue_number: int
    comment_id: int
    author: str
    marker: str | None  # the foreman idempotency key in its body, if any


@dataclass(frozen=True, slots=True)
class GiteaFacts:
    comments: tuple[CommentFact, ...] = ()
    #: issue number -> logins assigned (lower case)
    assignees: dict[int, frozenset[str]] = field(default_factory=dict)
    #: the issues a merged pull request closes (by its closing keyword or its issue branch)
    merged: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class WorktreeFact:
    path: str
    branch: str | None  # short name; None when detached
    prunable: bool = False  # git's record points at a directory that is gone


@dataclass(frozen=True, slots=True)
class CheckoutFacts:
    """The control checkout: its path, the directories under ``branches/``, git's worktrees (the control
    checkout itself left out) and the local ``issue-*`` branches."""

    path: str
    directories: tuple[str, ...] = ()
    worktrees: tuple[WorktreeFact, ...] = ()
    issue_branches: tuple[str, ...] = ()

    @property
    def branches_root(self) -> str:
        return os.path.join(self.path, "branches")


@dataclass(frozen=True, slots=True)
class Facts:
    db: DbFacts
    gitea: GiteaFacts
    bot_login: str
    #: None: no control checkout was made (or it was not looked at): the worktree invariants see no worktrees.
    checkout: CheckoutFacts | None = None
    #: Deliveries Gitea recorded as acknowledged: (delivery id, sha256 of the body). None: not known.
    acknowledged: tuple[tuple[str, str], ...] | None = None
    #: ``[bootstrap] on_allocate = "run"``: every live lease must have been bootstrapped.
    require_bootstrap: bool = False


# --- check ------------------------------------------------------------------------------------------------------------


def check(facts: Facts) -> list[Violation]:
    """Every violation of every invariant in ``INVARIANTS``, in a stable order."""
    found: list[Violation] = []
    for part in (_deliveries, _outbox, _leases, _journal, _worktrees, _lifecycle):
        found.extend(part(facts))
    return found


def _split(key: str) -> tuple[str, str]:
    """``<subject>:<suffix>`` (the suffix after the last colon)."""
    prefix, _, suffix = key.rpartition(":")
    return prefix, suffix


def _bot_markers(facts: Facts) -> Counter[str]:
    bot = facts.bot_login.lower()
    return Counter(c.marker for c in facts.gitea.comments if c.marker and c.author.lower() == bot)


def _deliveries(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    for d in facts.db.deliveries:
        if d.status in ("queued", "processing"):
            out.append(Violation("deliveries.settled", d.delivery_id, f"still {d.status}"))
        elif d.status == "failed":
            out.append(Violation("deliveries.not_failed", d.delivery_id, "parked as failed"))
    if facts.acknowledged is not None:
        ids = {d.delivery_id for d in facts.db.deliveries}
        bodies = {d.body_sha256 for d in facts.db.deliveries}
        for delivery_id, body in facts.acknowledged:
            if delivery_id not in ids and body not in bodies:
                out.append(Violation("deliveries.none_lost", delivery_id, "acknowledged to Gitea but not stored"))
    return out


def _outbox(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    markers = _bot_markers(facts)
    by_marker: dict[str, list[int]] = {}
    bot = facts.bot_login.lower()
    for c in facts.gitea.comments:
        if c.marker and c.author.lower() == bot:
            by_marker.setdefault(c.marker, []).append(c.comment_id)
    keys = {e.key for e in facts.db.outbox}
    for e in facts.db.outbox:
        if e.status in ("pending", "sending"):
            out.append(Violation("outbox.settled", e.key, f"still {e.status}"))
        elif e.status in ("parked", "verification_failed"):
            out.append(Violation("outbox.not_stuck", e.key, f"ended {e.status}"))
        if e.kind == "comment" and e.status == "done":
            count = markers.get(e.key, 0)
            if count != 1:
                out.append(Violation("outbox.comment_once", e.key, f"its marker is on {count} bot comments in Gitea"))
            elif e.comment_id is not None and by_marker[e.key] != [e.comment_id]:
                out.append(Violation("outbox.comment_once", e.key, f"recorded comment {e.comment_id}, Gitea has"
                                     f" the marker on {by_marker[e.key]}"))
    out.extend(_filed_by_repository(facts))
    for marker, count in sorted(markers.items()):
        if marker not in keys:
            out.append(Violation("outbox.no_stray_comment", marker, f"on {count} bot comment(s) with no outbox entry"))
    return out


def _filed_by_repository(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    run_repos = dict(facts.db.run_repos)
    for e in facts.db.outbox:
        if e.repo == "":
            out.append(Violation("outbox.filed_by_repository", e.key, "filed under no repository (repo '')"))
        prefix, suffix = _split(e.key)
        run_id = prefix.removeprefix("run:")
        if e.repo is not None and suffix == "summary" and prefix.startswith("run:") and run_id in run_repos \
                and run_repos[run_id] != e.repo:
            out.append(Violation("outbox.run_evidence_repository", e.key,
                                 f"filed under {e.repo!r}, its run's grant is of {run_repos[run_id]!r}"))
    return out


def _once(markers: Counter[str], key: str) -> str | None:
    count = markers.get(key, 0)
    return None if count == 1 else f"{key} is on {count} bot comments in Gitea"


#: How the end reason of a lease foreman released for a failed or impossible bootstrap begins (bot.verbs.bootstrap,
#: bot.verbs.allocate): such a release also takes the owner off the issue's assignees.
_FAILED_ENDS = ("bootstrap failed", "unworkable")
#: The end reason of an authoring lease the opening of its issue's pull request ended (bot/verbs/pulls.py).
HANDOVER_REASON = "pull_request_opened"


def _leases(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    db = facts.db
    markers = _bot_markers(facts)
    entries = {e.key: e for e in db.outbox}
    lease_ids = {lease.lease_id for lease in db.leases}
    live = Counter(lease.issue_number for lease in db.leases if lease.status == "live")
    # The leases come oldest first: a failed lease followed by a later lease of the same owner on the same issue
    # (live, or ended as any lease may) leaves the assignment to that later lease.
    latest_of_owner = {(lease.issue_number, lease.owner.lower()): lease.lease_id for lease in db.leases}
    for number, count in sorted(live.items()):
        if count > 1:
            out.append(Violation("leases.one_live_per_issue", f"#{number}", f"{count} live leases"))
    completed = {t.lease_id for t in db.transitions if t.outcome == "completed"}
    # An open transition of the lease itself: `foreman serve` resumes it at start-up (journal.terminal reports it).
    bootstrapping = {t.lease_id for t in db.transitions if t.outcome == "open"}
    failures: dict[str, list[str]] = {}  # lease -> the failure comment keys of its compensated transitions
    for t in db.transitions:
        if t.outcome == "compensated":
            failures.setdefault(t.lease_id, []).append(f"{t.key}:failure")
    for teardown in db.teardowns:
        for lease_id in teardown.ended_leases:
            failures.setdefault(lease_id, []).append(f"{teardown.key}:evidence")
    for lease_id, pr_key in db.handovers:
        failures.setdefault(lease_id, []).append(pr_key)
    for lease in db.leases:
        subject = f"{lease.lease_id} (#{lease.issue_number}, {lease.owner}, {lease.status})"
        key = f"{lease.lease_id}:evidence"
        entry = entries.get(key)
        if entry is None:
            out.append(Violation("leases.evidence", subject, "no evidence comment in the outbox"))
        elif entry.status != "done":
            out.append(Violation("leases.evidence", subject, f"its evidence comment is {entry.status}"))
        elif (problem := _once(markers, key)) is not None:
            out.append(Violation("leases.evidence", subject, problem))
        if lease.status == "released":
            ends = [f"{lease.lease_id}:release", f"{lease.lease_id}:unworkable", f"{lease.lease_id}:review",
                    *failures.get(lease.lease_id, [])]
            if not any(markers.get(k, 0) == 1 and entries.get(k) is not None for k in ends):
                out.append(Violation("leases.end_evidence", subject, f"none of {ends} is in Gitea exactly once"))
        assigned = facts.gitea.assignees.get(lease.issue_number, frozenset())
        if lease.status == "live" and lease.action == "implement":
            if lease.owner.lower() not in assigned:
                out.append(Violation("leases.assigned", subject, f"Gitea's assignees are {sorted(assigned)}"))
            if facts.require_bootstrap and lease.lease_id not in completed | bootstrapping:
                out.append(Violation("leases.bootstrapped", subject, "no completed bootstrap transition, and no open"
                                     " one of this lease for start-up recovery to finish"))
        elif (lease.status == "released" and (lease.end_reason or "").startswith(_FAILED_ENDS)
              and lease.owner.lower() in assigned
              and latest_of_owner[(lease.issue_number, lease.owner.lower())] == lease.lease_id):
            out.append(Violation("leases.unassigned_after_failure", subject, f"released ({lease.end_reason}) but"
                                 f" still assigned in Gitea: {sorted(assigned)}"))
        if (lease.exclude is not None and lease.decided_exclude is not None
                and sorted(lease.exclude) != sorted(lease.decided_exclude)):
            out.append(Violation("leases.exclusions_recorded", subject, f"the lease records {sorted(lease.exclude)},"
                                 f" its decision excluded {sorted(lease.decided_exclude)}"))
    named = {(k, "outbox") for k in entries} | {(k, "Gitea") for k in markers}
    for key, where in sorted(named):
        if key.startswith("lease-"):
            lease_id = key.split(":", 1)[0]
            if lease_id not in lease_ids:
                out.append(Violation("leases.no_evidence_without_lease", key, f"in the {where}; no lease {lease_id}"))
    return out


def _journal(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    db = facts.db
    markers = _bot_markers(facts)
    by_key = {t.key: t for t in db.transitions}
    registered = {r.transition_key for r in db.registrations}
    for t in db.transitions:
        subject = f"{t.key} (#{t.issue_number}, {t.lease_id})"
        if t.outcome == "open":
            out.append(Violation("journal.terminal", subject, f"left open in phase {t.phase}"))
            continue
        suffix = "evidence" if t.outcome == "completed" else "failure"
        problem = _once(markers, f"{t.key}:{suffix}")
        if problem is not None:
            out.append(Violation("journal.evidence", subject, problem))
        if t.outcome == "completed" and t.key not in registered:
            out.append(Violation("journal.registered", subject, "completed without a worktree registration"))
        if t.outcome == "completed" and t.assignment_read_back is False:
            out.append(Violation("journal.assignment_read_back", subject, "its proof does not show Gitea listing"
                                 f" {t.owner} as assignee, read back"))
    named = {e.key for e in db.outbox} | set(markers)
    for key in sorted(named):
        prefix, suffix = _split(key)
        if suffix not in ("evidence", "failure") or prefix.startswith(_NOT_BOOTSTRAP):
            continue
        found = by_key.get(prefix)
        wanted = "completed" if suffix == "evidence" else "compensated"
        if found is None:
            out.append(Violation("journal.no_evidence_without_transition", key, "no transition with this key"))
        elif found.outcome != wanted:
            out.append(Violation("journal.no_evidence_without_transition", key,
                                 f"the transition is {found.outcome}"))
    return out


def _worktrees(facts: Facts) -> list[Violation]:
    out: list[Violation] = []
    db = facts.db
    live_regs = [r for r in db.registrations if r.live]
    per_issue = Counter(r.issue_number for r in live_regs)
    for number, count in sorted(per_issue.items()):
        if count > 1:
            out.append(Violation("worktrees.one_per_issue", f"#{number}", f"{count} live registrations"))
    checkout = facts.checkout
    worktrees = {w.path: w for w in checkout.worktrees} if checkout is not None else {}
    directories = set(checkout.directories) if checkout is not None else set()
    outcome = {t.key: t.outcome for t in db.transitions}
    regs_by_path: dict[str, list[RegistrationFact]] = {}
    for r in live_regs:
        regs_by_path.setdefault(r.worktree_path, []).append(r)
    if checkout is not None:
        root = checkout.branches_root + os.sep
        for directory in sorted(directories):
            if directory not in worktrees:
                out.append(Violation("worktrees.no_orphan_dir", directory, "not a worktree registered in git"))
        for path, w in sorted(worktrees.items()):
            if not path.startswith(root):
                out.append(Violation("worktrees.inside_branches", path, "a git worktree outside branches/"))
                continue
            regs = regs_by_path.get(path, [])
            if not regs:
                out.append(Violation("worktrees.journaled", path, "registered in git, no live registration row"))
            for r in regs:
                if outcome.get(r.transition_key) != "completed":
                    out.append(Violation("worktrees.journaled", path, f"its transition {r.transition_key} is"
                                         f" {outcome.get(r.transition_key, 'missing')}"))
                if w.branch != r.branch:
                    out.append(Violation("worktrees.journaled", path, f"git has it on {w.branch}, the registration"
                                         f" says {r.branch}"))
        completed_branches = {t.branch for t in db.transitions if t.outcome == "completed"}
        for branch in sorted(checkout.issue_branches):
            if branch not in completed_branches:
                out.append(Violation("branches.journaled", branch, "no completed transition has this branch"))
    for r in live_regs:
        subject = f"{r.worktree_path} ({r.transition_key})"
        entry = worktrees.get(r.worktree_path)
        if entry is None:
            out.append(Violation("worktrees.on_disk", subject, "git has no worktree there"))
        elif entry.prunable or r.worktree_path not in directories:
            out.append(Violation("worktrees.on_disk", subject, "git's worktree there has no directory"))
    return out


# --- edges ------------------------------------------------------------------------------------------------------------


#: Evidence keys of other verbs than the bootstrap (their own invariants check them).
_NOT_BOOTSTRAP = ("lease-", "command:", "label-sync:", "teardown:", "publish:", "pr:")


def _lifecycle(facts: Facts) -> list[Violation]:
    """After the merge: the issue's leases ended, the journal's worktrees gone (or reported kept)."""
    out: list[Violation] = []
    merged = facts.gitea.merged
    for lease in facts.db.leases:
        if lease.status == "live" and lease.issue_number in merged:
            out.append(Violation("lifecycle.merged_no_live_lease", f"{lease.lease_id} (#{lease.issue_number})",
                                 f"live lease of {lease.owner} on a merged issue"))
    kept = {_real(path) for t in facts.db.teardowns for path in t.kept}
    created = {t.key for t in facts.db.transitions if t.outcome == "completed"}
    checkout = facts.checkout
    on_disk = set(checkout.directories) | {w.path for w in checkout.worktrees} if checkout is not None else set()
    seen: set[str] = set()
    for r in facts.db.registrations:
        if r.issue_number not in merged or r.transition_key not in created or r.worktree_path in seen:
            continue
        seen.add(r.worktree_path)
        if r.worktree_path in on_disk and r.worktree_path not in kept:
            out.append(Violation("lifecycle.merged_no_worktree", f"{r.worktree_path} (#{r.issue_number})",
                                 "the bootstrap's worktree is still on disk and no teardown reported it kept"))
    return out


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


async def gather_db(path: Path | str, *, repo: str | None = None) -> DbFacts:
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
        OutboxFact(e.key, e.issue_number, e.kind, e.status, _recorded_comment_id(e.result) if e.kind == "comment"
                   else None, e.repo)
        for e in entries
    )
    decided = {e.key.removesuffix(":evidence"): _decided_exclusions(e.payload) for e in entries
               if e.kind == "comment" and e.key.startswith("lease-") and e.key.endswith(":evidence")}
    leases = tuple(
        LeaseFact(lease.lease_id, lease.issue_number, lease.owner, lease.status, lease.end_reason,
                  _recorded_exclusions(lease.request), decided.get(lease.lease_id), lease.action)
        for lease in lease_rows
    )
    deliveries = tuple(DeliveryFact(*digest) for digest in digests)
    transitions = tuple(
        TransitionFact(t.key, t.issue_number, t.lease_id, t.owner, t.phase, t.outcome, t.branch,
                       _real(t.worktree_path),
                       _assignment_read_back(t.owner, t.result) if t.outcome == "completed" else None)
        for t in transition_rows
    )
    registrations = tuple(
        RegistrationFact(key, r.issue_number, r.lease_id, r.branch, _real(r.worktree_path), r.ended_at is None)
        for key, r in registration_rows
    )
    teardowns = tuple(
        TeardownFact(
            t.key, t.issue_number,
            tuple(x["lease_id"] for x in t.outcome.get("leases") or () if x.get("end_reason") == t.reason),
            tuple(w["path"] for w in t.outcome.get("worktrees") or () if w.get("action") == "kept"),
        )
        for t in teardown_rows
    )
    # A PR's evidence is a lease's end record only when the PR's opening really ended it (a lease released or
    # expired meanwhile has its own end record to show).
    handed_over = {lease.lease_id for lease in lease_rows if lease.end_reason == HANDOVER_REASON}
    handovers = tuple(
        (lease_id, e.key) for e in entries if e.kind == "comment" and e.key.startswith("pr:")
        and e.key.endswith(":evidence") and (lease_id := _handed_over(e.payload)) in handed_over
    )
    run_repos = tuple((run.run_id, run.repo) for run in run_rows)
    return DbFacts(leases, outbox, deliveries, transitions, registrations, teardowns, handovers, run_repos)


class GiteaReads(Protocol):
    """The Gitea reads the checker makes (``GiteaClient`` has them)."""

    async def list_issues(self, *, state: IssueState = "open", type_: IssueType | None = "issues") -> list[Issue]: ...

    async def get_issue(self, number: int) -> Issue: ...

    async def list_issue_comments(self, number: int) -> list[Comment]: ...

    async def list_pulls(self, *, state: IssueState = "open") -> list[PullRequest]: ...


async def gather_gitea(client: GiteaReads, *, numbers: Iterable[int] | None = None) -> GiteaFacts:
    """Every comment (with its foreman marker) and the assignees of every issue and pull request, or of
    ``numbers``."""
    if numbers is None:
        issues = await client.list_issues(state="all", type_=None)
        assignees = {i.number: frozenset(u.login.lower() for u in i.assignees) for i in issues}
    else:
        assignees = {}
        for number in numbers:
            issue = await client.get_issue(number)
            assignees[number] = frozenset(u.login.lower() for u in issue.assignees)
    comments: list[CommentFact] = []
    for number in sorted(assignees):
        for c in await client.list_issue_comments(number):
            comments.append(CommentFact(number, c.id, c.user.login, find_marker(c.body)))
    merged = set()
    for pull in await client.list_pulls(state="closed"):
        closes = closing_issue(body=pull.body, title=pull.title, head_ref=pull.head_ref) if pull.merged else None
        if closes is not None and closes != pull.number:
            merged.add(closes)
    return GiteaFacts(tuple(comments), assignees, frozenset(merged))


def _real(path: str) -> str:
    return os.path.realpath(path)


def _git(checkout: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, check=True, timeout=60)
    return done.stdout


def gather_checkout(path: Path | str) -> CheckoutFacts | None:
    """Git's view of the control checkout at ``path``; None when there is none (nothing was bootstrapped)."""
    checkout = Path(_real(str(path)))
    if not (checkout / ".git" / "HEAD").is_file():
        return None
    branches = checkout / "branches"
    directories = tuple(sorted(str(child) for child in branches.iterdir())) if branches.is_dir() else ()
    entries = parse_worktree_porcelain(_git(checkout, "worktree", "list", "--porcelain", "-z"))
    worktrees = tuple(
        WorktreeFact(_real(e.path), e.branch, e.prunable is not None)
        for e in entries
        if _real(e.path) != str(checkout)
    )
    refs = _git(checkout, "for-each-ref", "--format=%(refname:short)", "refs/heads/issue-*")
    return CheckoutFacts(str(checkout), directories, worktrees, tuple(sorted(refs.split())))


async def gather(
    *,
    database: Path | str,
    client: GiteaReads,
    bot_login: str,
    checkout: Path | str | None,
    acknowledged: Sequence[tuple[str, str]] | None = None,
    require_bootstrap: bool = False,
    repo: str | None = None,
) -> Facts:
    """All facts, from a quiet service's database, Gitea and control checkout; with ``repo``, of that one
    repository (``client`` and ``checkout`` must be its own)."""
    db = await gather_db(database, repo=repo)
    gitea = await gather_gitea(client)
    return Facts(
        db=db,
        gitea=gitea,
        bot_login=bot_login,
        checkout=gather_checkout(checkout) if checkout is not None else None,
        acknowledged=tuple(acknowledged) if acknowledged is not None else None,
        require_bootstrap=require_bootstrap,
    )


def report(violations: Sequence[Violation]) -> dict[str, Any]:
    """A JSON-ready summary: ok, the count per invariant, and every violation."""
    return {
        "ok": not violations,
        "checked": sorted(INVARIANTS),
        "counts": dict(sorted(Counter(v.invariant for v in violations).items())),
        "violations": [v.to_dict() for v in violations],
    }
