"""The merge gate: which recorded approvals let a pull request merge, under its base branch's protection and the
head's required statuses (a plain function over what was read), and the reads that feed it (``MergeChecks``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from bot.config import Settings
from bot.core.protection import MergeRules, StatusCheck, merge_rules, rule_for, status_check
from bot.core.reasons import MergeBlock
from bot.gitea import GiteaError
from bot.gitea.values import BranchProtection, CombinedStatus, PullRequest, Review
from bot.verbs.review import RecordedVerdict

#: Why a review on Gitea does not count.
NotCountedWhy = Literal["not_recorded", "dismissed", "superseded", "changed_on_gitea", "not_official",
                        "by_implementer", "by_pr_poster", "reviewer_not_allowed", "stale"]


@dataclass(frozen=True, slots=True)
class NotCounted:
    """A review on Gitea the merge gate does not count, and why (shown in the refusal and the merge's evidence)."""

    review_id: int
    user: str
    state: str
    commit_id: str
    why: NotCountedWhy

    def to_dict(self) -> dict[str, Any]:
        return {"review_id": self.review_id, "user": self.user, "state": self.state, "commit_id": self.commit_id,
                "why": self.why}


@dataclass(frozen=True, slots=True)
class MergeGate:
    """The merge gate's decision. ``approvals``: the recorded approvals that count on exactly the head, one per
    reviewer, oldest first; ``counted``: the approval the merge is pinned to (the latest that counts, on any
    commit: a head that moved since is a stale pin), None when ``block`` says why none does; ``block``: why the
    merge cannot go now (None: it can); ``blocking``: the request-changes verdicts that block; every other verdict on
    Gitea is in ``not_counted``."""

    counted: RecordedVerdict | None
    block: MergeBlock | None
    blocking: tuple[Review, ...]
    not_counted: tuple[NotCounted, ...]
    approvals: tuple[RecordedVerdict, ...] = ()
    rules: MergeRules = field(default_factory=lambda: MergeRules(""))
    checks: StatusCheck | None = None

    @property
    def required(self) -> int:
        return self.rules.required_approvals

    @property
    def approved(self) -> bool:
        """As many counted approvals on exactly the head as the rules require."""
        return len(self.approvals) >= self.required

    @property
    def approvers(self) -> frozenset[str]:
        """Who already approved the head (lower case): a further review goes to someone else."""
        return frozenset(v.reviewer.lower() for v in self.approvals)

    def not_counted_docs(self) -> list[dict[str, Any]]:
        return [n.to_dict() for n in self.not_counted]

    def missing(self) -> str:
        """What is missing, in words (``approvals 1 of 2``, ``status check ci/build pending``)."""
        if self.block == "changes_requested":
            return "blocked by request_changes from " + ", ".join(sorted({reviewer_login(r) for r in self.blocking}))
        if self.block in ("status_pending", "status_failed") and self.checks is not None:
            return self.checks.summary()
        if self.block == "branch_outdated":
            return f"the head is behind {self.rules.branch} (block_on_outdated_branch)"
        if not self.approved:
            return f"approvals {len(self.approvals)} of {self.required}"
        return "nothing"

    def to_dict(self) -> dict[str, Any]:
        return {"block": self.block, "missing": self.missing(), "approvals": len(self.approvals),
                "required_approvals": self.required, "approved_by": [v.reviewer for v in self.approvals],
                "rules": self.rules.to_dict(), "checks": self.checks.to_dict() if self.checks is not None else None}


def reviewer_login(review: Review) -> str:
    """Who posted ``review`` (empty for a team request)."""
    return review.user.login if review.user is not None else ""


def _changed(recorded: RecordedVerdict, review: Review | None, rules: MergeRules) -> NotCountedWhy | None:
    """Why Gitea's review no longer is the verdict foreman recorded (None when it still is)."""
    if review is None:
        return "changed_on_gitea"
    if review.dismissed:
        return "dismissed"
    state = "APPROVED" if recorded.verdict == "approve" else "REQUEST_CHANGES"
    if (review.state, review.commit_id) != (state, recorded.commit_id) or (
            recorded.posted_as and reviewer_login(review).lower() != recorded.posted_as.lower()):
        return "changed_on_gitea"
    if not review.official:
        return "not_official"
    if rules.ignore_stale_approvals and review.stale:
        return "stale"
    return None


def merge_gate(
    recorded: Sequence[RecordedVerdict], reviews: Sequence[Review], pull: PullRequest, *, implementer: str | None,
    reviewers: frozenset[str], rules: MergeRules | None = None, checks: StatusCheck | None = None,
) -> MergeGate:
    """Which approvals let ``pull`` merge under ``rules`` (its base's protection: one approval without one).

    Only verdicts foreman's review verb recorded count, from the latest recorded request-changes on (it starts a
    new round), one per reviewer (the latest), each while Gitea still shows that review as recorded (same id,
    verdict, commit and account, official, not dismissed, not stale when the rule ignores stale approvals) and while
    its reviewer may approve the PR now (a roster reviewer (``reviewers``, lower case), neither the implementer nor
    the PR's poster). ``rules.required_approvals`` of them on exactly the head let it merge. Any request-changes
    verdict Gitea counts (official, not dismissed) on exactly the head blocks, whoever posted it, and with
    ``block_on_rejected_reviews`` on any commit, as Gitea's ``MergeBlockedByRejectedReview`` does. A failing
    required status or a head behind its base (``block_on_outdated_branch``) blocks before approvals; a pending
    status only once the approvals are there. Every other approval or request-changes on Gitea is listed as not
    counted."""
    rules = rules or MergeRules(pull.base_ref)
    mine = [v for v in recorded if v.pull_number == pull.number]
    latest = mine[-1] if mine else None
    last_reject = max((i for i, v in enumerate(mine) if v.verdict != "approve"), default=-1)
    by_id = {r.id: r for r in reviews}
    poster = pull.user.login.lower()
    barred = {poster} | ({implementer.lower()} if implementer else set())
    why: dict[int, NotCountedWhy] = {}
    per_reviewer: dict[str, RecordedVerdict] = {}
    for verdict in mine[last_reject + 1:]:
        per_reviewer[verdict.reviewer.lower()] = verdict
    valid: list[RecordedVerdict] = []
    for verdict in mine:
        if per_reviewer.get(verdict.reviewer.lower()) is not verdict:
            why[verdict.review_id] = "superseded"
            continue
        changed = _changed(verdict, by_id.get(verdict.review_id), rules)
        if changed is not None:
            why[verdict.review_id] = changed
        elif verdict.reviewer.lower() not in reviewers or verdict.reviewer.lower() in barred:
            why[verdict.review_id] = "reviewer_not_allowed"
        else:
            valid.append(verdict)
    valid.sort(key=lambda v: mine.index(v))
    approvals = tuple(v for v in valid if v.commit_id == pull.head_sha)
    counted = valid[-1] if len(valid) >= rules.required_approvals else None
    block: MergeBlock | None = None
    if counted is not None and counted.commit_id == pull.head_sha and len(approvals) < rules.required_approvals:
        counted = None  # some approvals are on an older commit: the head needs more of its own
    if latest is None or (latest.verdict != "approve" and latest.review_id not in why):
        block = "approval_not_recorded"
    elif counted is None and latest.review_id in why and why[latest.review_id] != "superseded":
        block = "reviewer_not_allowed" if why[latest.review_id] == "reviewer_not_allowed" else "approval_withdrawn"
    elif counted is None:
        block = "approvals_missing" if valid else "approval_not_recorded"
    blocking = tuple(r for r in reviews if r.state == "REQUEST_CHANGES" and r.official and not r.dismissed
                     and (r.commit_id == pull.head_sha or rules.block_on_rejected_reviews))
    outdated = rules.block_on_outdated_branch and bool(pull.merge_base) and pull.merge_base != pull.base_sha
    if blocking:
        block, counted = "changes_requested", None
    elif checks is not None and checks.state == "failure":
        block, counted = "status_failed", None
    elif outdated:
        block, counted = "branch_outdated", None
    elif block is None and checks is not None and checks.state == "pending" and \
            len(approvals) >= rules.required_approvals:
        block, counted = "status_pending", None
    # An approval that holds but is not on the head (and not the one a stale pin names) is listed as stale.
    counted_ids = {v.review_id for v in approvals} | ({counted.review_id} if counted is not None else set())
    for verdict in valid:
        if verdict.review_id not in counted_ids:
            why[verdict.review_id] = "stale"
    not_counted: list[NotCounted] = []
    for review in reviews:
        if review.state not in ("APPROVED", "REQUEST_CHANGES") or review.id in counted_ids:
            continue
        user = reviewer_login(review)
        reason: NotCountedWhy
        if review.id in why:
            reason = why[review.id]
        elif review.dismissed:
            reason = "dismissed"
        elif user.lower() == poster:
            reason = "by_pr_poster"
        elif implementer and user.lower() == implementer.lower():
            reason = "by_implementer"
        else:
            reason = "not_recorded"
        not_counted.append(NotCounted(review.id, user, review.state, review.commit_id, reason))
    return MergeGate(counted, block, blocking, tuple(not_counted), approvals, rules, checks)


def reviewers_of(settings: Settings) -> frozenset[str]:
    """The roster's reviewers, in lower case (the merge gate compares so)."""
    return frozenset(login.lower() for login, roles in settings.roster.items() if "reviewer" in roles)


class ChecksGitea(Protocol):
    """The reads of a merge's requirements: the branch protection rules and a commit's statuses."""

    async def list_branch_protections(self) -> list[BranchProtection]: ...

    async def combined_status(self, ref: str) -> CombinedStatus: ...


class MergeChecks:
    """The merge requirements of one read (a queue run, one verb call): the protection rules read once, each base
    branch's rules and base contexts once, each head's statuses once. A Gitea without these reads (a test double)
    or one that refuses them (no admin on the repository: the rules are unreadable) falls back to no rule: Gitea
    still enforces its rule at the merge, whose refusal is then typed from Gitea's words."""

    def __init__(self, gitea: object, settings: Settings) -> None:
        self._gitea = gitea
        self._require = settings.merge.require_status
        self._protections: list[BranchProtection] | None = None
        self._rules: dict[str, MergeRules] = {}
        self._checks: dict[tuple[str, tuple[str, ...]], StatusCheck] = {}
        #: Why the rules could not be read (None: read, or nothing to read them with).
        self.unreadable: str | None = None

    def _reads(self) -> ChecksGitea | None:
        gitea = self._gitea
        if hasattr(gitea, "list_branch_protections") and hasattr(gitea, "combined_status"):
            return gitea
        return None

    async def rules_for(self, base: str) -> MergeRules:
        if base in self._rules:
            return self._rules[base]
        reads = self._reads()
        rule: BranchProtection | None = None
        base_contexts: list[str] = []
        if reads is not None:
            if self._protections is None:
                try:
                    self._protections = await reads.list_branch_protections()
                except GiteaError as exc:
                    self._protections, self.unreadable = [], f"{exc.status}: {exc.message}"[:200]
            rule = rule_for(base, self._protections)
            if self._require is None and (rule is None or not rule.enable_status_check):
                try:
                    base_contexts = [s.context for s in (await reads.combined_status(base)).statuses]
                except GiteaError:
                    base_contexts = []
        rules = merge_rules(base, rule, require_status=self._require, base_contexts=base_contexts)
        self._rules[base] = rules
        return rules

    async def checks_for(self, pull: PullRequest, rules: MergeRules) -> StatusCheck | None:
        """The head's required statuses (None: none is required)."""
        if not rules.required_contexts and rules.contexts_from != "protection":
            return None
        key = (pull.head_sha, rules.required_contexts)
        if key in self._checks:
            return self._checks[key]
        reads = self._reads()
        statuses: Sequence[Any] = ()
        if reads is not None:
            try:
                statuses = (await reads.combined_status(pull.head_sha)).statuses
            except GiteaError:
                statuses = ()
        found = status_check(statuses, rules.required_contexts) if rules.required_contexts else status_check(
            statuses, ["**"]) if statuses else StatusCheck("pending", ())
        self._checks[key] = found
        return found
