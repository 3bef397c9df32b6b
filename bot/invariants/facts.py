"""The invariants foreman keeps, what a violation says, and the facts they are checked on (docs/operating.md,
section 5)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime

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
    " (<lease>:review), the evidence of the pull request whose opening or update ended it (pull_request_opened,"
    " pull_request_updated), or the"
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
    "leases.in_progress_without_lease": "no open `status:in-progress` issue is without a live lease past the grace"
    " period: its last lease ended (or expired) more than `[allocator] lease_grace_s` ago, or it never had one",
    "queues.review_waits": "while the review queue runs by itself, no pull request waits for review (stage review,"
    " no live lease) longer than `[allocator] queue_wait_bound_s` since its issue's last lease ended while a roster"
    " reviewer who may review it is idle",
    "queues.merge_waits": "while the merge queue runs by itself, no approved, mergeable pull request (stage merge,"
    " no live lease) waits longer than `[allocator] queue_wait_bound_s` since its issue's last lease ended while a"
    " roster merger who may merge it is idle (or foreman merges itself: `[merge] by = \"foreman\"`)",
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
    #: when it expires (a live one) or expired; None: not gathered (hand-built facts), a live one counts as live
    expires_at: datetime | None = None
    #: when it ended (released or expired); None: still marked live, or not gathered
    ended_at: datetime | None = None

    def live_at(self, now: datetime) -> bool:
        """Marked live and not past its expiry at ``now``."""
        return self.status == "live" and (self.expires_at is None or self.expires_at > now)

    def end(self) -> datetime | None:
        """When it stopped holding its issue: its end, else (marked live) its expiry."""
        return self.ended_at if self.ended_at is not None else self.expires_at


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
    #: a worktree kept aside for its earlier owner (another author took the issue over), not yet torn down
    kept: bool = False


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
    #: the open issues (not pull requests) labelled `status:in-progress`
    in_progress: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class WaitingPullFact:
    """A pull request waiting in the review or merge queue (no live lease holds its issue)."""

    issue_number: int
    pull_number: int
    #: the roster logins (lower case) who may not take it: its poster and its issue's implementer
    barred: frozenset[str] = frozenset()
    #: when it entered the queue: the end of its issue's last lease (the hand-over, a verdict, a stranded lease);
    #: None: foreman never leased the issue, so it cannot tell (not judged)
    since: datetime | None = None
    #: Gitea can merge it (no conflict); a merge waits only while it can
    mergeable: bool = True


@dataclass(frozen=True, slots=True)
class QueueFacts:
    """The review and merge queues as ``work_queues`` reads them (bot/verbs/queue_view.py), and their settings."""

    reviews: tuple[WaitingPullFact, ...] = ()
    merges: tuple[WaitingPullFact, ...] = ()  # in approval order
    idle_reviewers: tuple[str, ...] = ()
    idle_mergers: tuple[str, ...] = ()
    #: the queues that run by themselves: auto-allocation on and the queue listed in `[allocator] queues`
    running: frozenset[str] = frozenset()
    merge_by: str = "merger"
    wait_bound_s: float = 600.0


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
    #: When the facts were read. None: the invariants that need the time (leases.in_progress_without_lease,
    #: queues.*) are not checked.
    now: datetime | None = None
    #: ``[allocator] lease_grace_s``: how long an issue may stay `status:in-progress` after its last lease ended.
    lease_grace_s: float = 120.0
    #: The review and merge queues. None: not read (queues.* are not checked).
    queues: QueueFacts | None = None
