"""The allocate verb: gather candidates and leases, run the pure decision, and apply it atomically."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from bot.config import Settings
from bot.core.allocator import (
    AllocationDecision,
    AllocationRequest,
    InputError,
    InvalidDecision,
    RankingPolicy,
    ResumeDecision,
    SelectDecision,
    check_apply,
    decide,
    normalize_exclusions,
)
from bot.core.authors import AuthorPick, author_loads, rank_authors
from bot.core.canonical import CanonicalState
from bot.core.errors import Envelope
from bot.core.intents import StateChange
from bot.core.verbs import Verb
from bot.core.vocabulary import label_for_state
from bot.gitea import GiteaError
from bot.verbs.bootstrap import BootstrapContext, bootstrap_preflight
from bot.verbs.bootstrap.context import BootstrapGitea, ProofReads
from bot.verbs.bootstrap.preflight import PREFLIGHT_FAILED, Check, PreflightProof
from bot.verbs.bootstrap.service import bootstrap_for_owner
from bot.verbs.candidates import CandidatesGitea, ready_candidates
from bot.verbs.duplicates import DuplicatesGitea, mark_duplicates
from bot.verbs.leasing import ACTION_ROLES, Action, LeaseGrant, grant_lease
from bot.verbs.merge import MergeGitea
from bot.verbs.queue_facts import candidates_of, latest_leases, queued_pulls
from bot.verbs.review import ReviewGitea, review_lease_effects
from bot.verbs.runtime import (
    Caller,
    CallOptions,
    Channel,
    VerbResult,
    VerbRuntime,
    envelope,
    executes,
    refused,
)
from state.db import Database, utcnow
from state.exclusions import ExclusionStore
from state.issues import IssueStore
from state.leases import Lease, LeaseStore, LeaseTaken
from state.outbox import OutboxIntent, enqueue


def action_of(action: str) -> Action:
    """The lease action of an allocation call (checked against the tool's schema before; a guard here)."""
    if action not in ACTION_ROLES:
        raise ValueError(f"no lease is granted for {action!r}")
    return "review" if action == "review" else "merge" if action == "merge" else "implement"


class AllocatorGitea(CandidatesGitea, BootstrapGitea, ReviewGitea, MergeGitea, DuplicatesGitea, Protocol):
    """What the allocator uses and hands on: its candidate reads, the bootstrap's calls (preflight, bootstrap), the
    review candidates' reads, and (to the verbs auto-allocation runs) the merge's."""


@dataclass(frozen=True, slots=True)
class AllocationCall:
    """One allocation request as received from the CLI, a comment command or the MCP tool."""

    actor: str  # who asks (the verb's role gate at the door admitted it)
    owner: str  # who would receive the lease
    candidates_json: object = None  # None: open `status:ready` issues from Gitea (or the stored state)
    exclude_issue_numbers: object = None
    # Excluded too, never stated as standing: an in-process caller's (auto-allocation's union of every controller's
    # standing exclusions, the command line's ``--exclude``), unbounded by the tool schema.
    also_excluded: frozenset[int] = frozenset()
    dry_run: bool = True
    expected_fingerprint: str | None = None
    action: str = "implement"
    delivery_id: str | None = None
    actor_is_operator: bool = False  # the operator's command line or foreman itself: states no standing exclusions
    # Auto-allocation: False gives an owner that holds a live lease another issue (instead of resuming
    # it); ``max_live`` refuses the apply when the owner already holds that many live leases (checked inside the
    # lease transaction, so two concurrent runs cannot exceed it).
    resume_own: bool = True
    max_live: int | None = None
    #: By issue, its latest lease when its candidate was read (``CallOptions.lease_history``): checked at the grant.
    lease_history: Mapping[int, str | None] | None = None
    channel: Channel = "cli"  # the door the allocation came through; its own bootstrap goes through it too


@dataclass
class AllocationOutcome:
    """What happened: the decision, and for an apply the lease and the outbox entries written with it."""

    decision: AllocationDecision | None
    refusal: Envelope | None = None
    applied: bool = False
    lease: Lease | None = None
    outbox_keys: list[str] = field(default_factory=list)
    source: str = "candidates_json"
    dry_run: bool = True
    # AC10 of seed 004: the dry-run's proof that the owner could bootstrap the issue now, or the result of the
    # bootstrap that the apply ran (`[bootstrap] on_allocate`).
    bootstrap: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        refused = self.refusal is not None or self.decision is None or self.decision.kind in ("invalid", "blocked")
        return 1 if refused else 0

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.decision.to_dict() if self.decision is not None else {}
        if self.refusal is not None:
            doc = {**doc, **self.refusal.to_dict()}
            doc["decision"] = "refused"
        doc["dry_run"] = self.dry_run
        doc["applied"] = self.applied
        doc["candidate_source"] = self.source
        if self.lease is not None:
            doc["lease"] = self.lease.to_dict()
        if self.outbox_keys:
            doc["outbox"] = list(self.outbox_keys)
        if self.bootstrap is not None:
            doc["bootstrap"] = self.bootstrap
        return doc


def _refuse(kind: Literal["not_authorized", "invalid_input", "unavailable"], message: str, remediate: str,
            action: str) -> AllocationOutcome:
    return AllocationOutcome(
        decision=None,
        refusal=Envelope(error=kind, message=message, remediate=remediate, exact_next_action=action),
    )


class Allocator:
    """Runs allocation calls against the database (leases, outbox) and, for candidates and the bootstrap, Gitea."""

    def __init__(self, db: Database, settings: Settings, gitea: AllocatorGitea | None, *, bot_login: str) -> None:
        self.db = db
        self.settings = settings
        self.gitea = gitea
        self.bot_login = bot_login
        self.leases = LeaseStore(db)
        cfg = settings.allocator
        self.policy = RankingPolicy(
            priority_labels=tuple(cfg.priority_labels),
            protected_issue_numbers=frozenset(cfg.protected_issues),
            protected_labels=frozenset(cfg.protected_labels),
            lease_grace=timedelta(seconds=cfg.lease_grace_s),
        )

    @property
    def repo(self) -> str:
        return self.settings.repo_key

    def _check_owner(self, call: AllocationCall) -> AllocationOutcome | None:
        """The action is known and the owner holds its role (the caller's own role was checked at the door)."""
        roster = self.settings.roster
        role = ACTION_ROLES.get(call.action)
        if role is None:
            return _refuse(
                "invalid_input",
                f"unknown action {call.action!r}; one of {', '.join(sorted(ACTION_ROLES))}",
                "Use one of the documented actions.",
                "call again with action=implement",
            )
        if role not in roster.get(call.owner, []):
            return _refuse(
                "not_authorized",
                f"{call.owner} has no {role} role in the roster, so cannot receive a lease for {call.action}",
                f"Choose an owner whose roster roles include {role}.",
                f"call again with an owner listed as {role} in the roster",
            )
        return None

    async def stored_candidates(self) -> tuple[list[dict[str, Any]], frozenset[int]]:
        """Without a Gitea client: the open `status:ready` issues as the webhooks last reported them."""
        ready = label_for_state("ready")
        open_issues = await IssueStore(self.db).open_issues(self.repo)
        records = [
            {"issue_number": issue.number, "labels": sorted(issue.label_names)}
            for issue in open_issues
            if ready in issue.label_names
        ]
        return records, frozenset(issue.number for issue in open_issues)

    async def gather_candidates(self, action: str = "implement", *, owner: str | None = None) -> (
        tuple[list[dict[str, Any]], frozenset[int]]
    ):
        """Open `status:ready` issues (not PRs) from Gitea, with their dependencies' open state (for a review or a
        merge: the `status:review` issues whose pull request waits for one, bot/verbs/queue_facts.py). ``owner``: the
        candidates barred for that owner (released by them) are not assessed for duplicate work (their branch is not
        read): the decision skips them for that owner before it reads a duplicate finding (``self_review``)."""
        if self.gitea is None:
            raise LookupError("no Gitea client: give candidates_json, or configure gitea.token")
        if action in ("review", "merge"):
            return candidates_of(await queued_pulls(self.gitea, self.db, self.settings),
                                 "review" if action == "review" else "merge")
        records, open_numbers = await ready_candidates(self.gitea)
        gave_up = await self.leases.self_released(self.repo)
        for record in records:
            gave = gave_up.get(record["issue_number"])
            if gave is not None:  # released by its own author: never handed straight back to them
                record["barred_owners"] = sorted({*record.get("barred_owners", ()), gave})
        barred = {record["issue_number"] for record in records
                  if owner is not None and owner in record.get("barred_owners", ())}
        assessed, _ = await mark_duplicates(self.db, self.repo, self.gitea,
                                            ([r for r in records if r["issue_number"] not in barred], open_numbers))
        found = {record["issue_number"]: record for record in assessed}
        return [found.get(record["issue_number"], record) for record in records], open_numbers

    async def run(self, call: AllocationCall, *, now: datetime | None = None) -> AllocationOutcome:
        return await self._run(call, now=now)

    async def _candidates(self, call: AllocationCall) -> (
        tuple[str, Any, frozenset[int], AllocationCall] | AllocationOutcome
    ):
        """Where the candidates come from (the call's own, Gitea's, or the stored state without Gitea), what they
        are, and the call to apply them with; a refusal when they cannot be had. A review or merge read from Gitea
        carries its issues' latest leases as read (``lease_history``): a verdict recorded before the grant makes
        the read stale, and nothing is leased."""
        candidates = call.candidates_json
        if candidates is not None:
            return "candidates_json", candidates, frozenset(), call
        if self.gitea is None and call.action in ("review", "merge"):
            # Not a failure of the service: without Gitea this request needs its candidates given (as any other
            # allocation without Gitea reads the stored state, which has no pull requests).
            return _refuse("invalid_input", f"{call.action} candidates come from Gitea (the issues' pull requests), "
                           "and this foreman has no Gitea client", "Nothing was leased.",
                           "call again with candidates_json")
        if self.gitea is None:
            # No API to reconcile with: the stored issue state that the webhooks keep fresh.
            stored, open_numbers = await self.stored_candidates()
            return "stored_state", stored, open_numbers, call
        try:
            if call.action in ("review", "merge"):
                assert self.gitea is not None
                pulls = await queued_pulls(self.gitea, self.db, self.settings)
                gathered, open_numbers = candidates_of(pulls, "review" if call.action == "review" else "merge")
                call = replace(call, lease_history=latest_leases(pulls))
            else:
                gathered, open_numbers = await self.gather_candidates(call.action, owner=call.owner)
        except GiteaError as exc:
            return _refuse("unavailable", f"Gitea could not list the candidates: {exc}",
                           "Nothing was leased; Gitea must answer to reconcile the candidates.",
                           "call again later, or with candidates_json")
        return "gitea", gathered, open_numbers, call

    async def _run(self, call: AllocationCall, *, now: datetime | None = None) -> AllocationOutcome:
        refused = self._check_owner(call)
        if refused is not None:
            return refused
        found = await self._candidates(call)
        if isinstance(found, AllocationOutcome):
            return found
        source, candidates, open_numbers, call = found
        request = AllocationRequest(
            owner=call.owner,
            candidates=candidates,
            exclude_issue_numbers=_merged_exclusions(call),
            open_issue_numbers=open_numbers,
            resume_own=call.resume_own,
        )
        moment = now or utcnow()
        mode = self.settings.bootstrap.on_allocate if call.action == "implement" else "off"  # reviews need no worktree
        if not call.dry_run and not call.actor_is_operator and call.exclude_issue_numbers is not None:
            # A controller's exclusions stated in an apply stand for auto-allocation of the same action until it
            # states others for that action (a dry run decides only: it writes nothing).
            try:
                stated = normalize_exclusions(call.exclude_issue_numbers)
            except InputError:
                pass  # the decision below refuses the request
            else:
                await ExclusionStore(self.db).state(self.repo, call.actor, stated, action=call.action, at=moment,
                                                    via=call.delivery_id or "mcp")
        if call.dry_run:
            leases = [lease.as_live_lease() for lease in await self.leases.open_leases(self.repo)]
            decision = decide(request, self.policy, leases, moment)
            pinned = check_apply(call.expected_fingerprint, decision) if call.expected_fingerprint else None
            outcome = AllocationOutcome(decision=decision, refusal=pinned, source=source)
            if mode != "off" and self.gitea is not None and isinstance(decision, SelectDecision):
                outcome.bootstrap = (await bootstrap_preflight(
                    self._bootstrap_context(), decision.issue_number, call.owner, now=moment
                )).to_dict()
            return outcome
        proven: int | None = None
        proof_reads: ProofReads | None = None  # the proof's Gitea reads, for the bootstrap right after the lease
        if mode != "off" and self.gitea is not None:
            # Every apply proves first (seed 004 AC10): the same preflight the dry-run reports, on the
            # decision as it stands now; a failed proof leases nothing.
            leases = [lease.as_live_lease() for lease in await self.leases.open_leases(self.repo)]
            planned = decide(request, self.policy, leases, moment)
            if isinstance(planned, SelectDecision):
                proof = await bootstrap_preflight(self._bootstrap_context(), planned.issue_number, call.owner,
                                                  now=moment)
                if not proof.ok:
                    return AllocationOutcome(decision=planned, refusal=_proof_refusal(proof, planned, call),
                                             source=source, dry_run=False, bootstrap=proof.to_dict())
                proven, proof_reads = planned.issue_number, proof.reads
        # The lease is acquired now, after the proof (unless the caller pins the time).
        outcome = await self._apply(call, request, now or utcnow(), source, proven=proven)
        # The lease's label, assignee and evidence went out with its commit (the sender is woken by it) while its
        # bootstrap runs; each issue's entries stay in order: the bootstrap's evidence follows them.
        if mode == "run" and outcome.lease is not None and outcome.refusal is None and self.gitea is not None:
            # Outside the lease transaction: the bootstrap journals its own phases, and on failure it
            # compensates and releases the lease itself. A resumed lease runs it too (idempotent: a completed
            # transition is replayed, an unfinished one resumed), so a delivery retried after the process died
            # between the lease commit and the end of its bootstrap finishes that bootstrap.
            # It uses the proof's reads of the repository, its base and the issue while they are at most
            # PROOF_READS_FRESH_S old (bootstrap/context.py), and reads everything else itself.
            result = await bootstrap_for_owner(self._bootstrap_context(), issue_number=outcome.lease.issue_number,
                                               owner=outcome.lease.owner, proof_reads=proof_reads)
            outcome.bootstrap = result.to_dict()
            if result.status == "refused" and result.refusal is not None and result.refusal.error != "unavailable":
                # The owner cannot work on this issue (e.g. a worktree is still registered for an earlier owner):
                # a lease without a worktree would strand the issue, so it is released at once, the issue is
                # marked blocked for a person, and the refusal is posted (unavailable: the caller retries).
                outcome.outbox_keys += await self.release_unworkable(outcome.lease, result.refusal, call, moment)
            # The lease as the store holds it now (a compensated bootstrap released it itself).
            outcome.lease = await self.leases.get(outcome.lease.lease_id) or outcome.lease
        return outcome

    async def release_unworkable(
        self, lease: Lease, refusal: Envelope, call: AllocationCall, now: datetime
    ) -> list[str]:
        number, key = lease.issue_number, f"{lease.lease_id}:unworkable"
        state = CanonicalState(
            state="blocked",
            who_is_next="human",
            next_action=refusal.exact_next_action,
            next_prompt=f"{refusal.message}\n{refusal.remediate}",
            what_happened=f"leased #{number} to {lease.owner}, but its worktree could not be bootstrapped; released",
            why=f"{refusal.error}: a lease without a worktree would strand the issue",
            related_prs=(),
            blockers=refusal.message.replace("\n", " "),
            validation="lease released in the same transaction as this comment; read back by foreman",
            last_updated_by=self.bot_login or "foreman",
        )
        intents = StateChange(
            repo=self.repo, issue_number=number, state=state, cause=call.delivery_id,
            summary=f"Released the lease of {lease.owner} on #{number}: the worktree could not be bootstrapped.",
            evidence={"action": "release_unworkable_lease", "lease": lease.to_dict(), "refusal": refusal.to_dict()},
            comment_key=key, labels_key=f"{key}:labels", leaving=("ready", "in-progress"),
            assignees_key=f"{key}:assignee", assignees=(),
        ).intents()
        async with self.db.transaction() as conn:
            reason = f"unworkable: {refusal.error}"
            await self.leases.release(conn, lease.lease_id, actor="foreman", reason=reason, now=now)
            for intent in intents:
                await enqueue(conn, intent)
        return [intent.key for intent in intents]

    def _bootstrap_context(self) -> BootstrapContext:
        return BootstrapContext(db=self.db, settings=self.settings, gitea=self.gitea, bot_login=self.bot_login)

    async def _apply(
        self, call: AllocationCall, request: AllocationRequest, now: datetime, source: str, *, proven: int | None = None
    ) -> AllocationOutcome:
        """Decide again on the leases as they are inside the write transaction, then write atomically."""
        async with self.db.transaction() as conn:
            open_leases = await self.leases.open_leases(self.repo, conn)
            decision = decide(request, self.policy, [lease.as_live_lease() for lease in open_leases], now)
            refusal = check_apply(call.expected_fingerprint, decision)
            outcome = AllocationOutcome(decision=decision, refusal=refusal, source=source, dry_run=False)
            if refusal is not None or isinstance(decision, InvalidDecision):
                return outcome
            if isinstance(decision, ResumeDecision):
                lease = next(lease for lease in open_leases if lease.lease_id == decision.lease.lease_id)
                await self.leases.record_resume(conn, lease, actor=call.actor, now=now)
                outcome.lease = lease
                return outcome
            if not isinstance(decision, SelectDecision):
                return outcome  # wait or blocked: nothing is leased
            proving = self.settings.bootstrap.on_allocate != "off" and call.action == "implement"
            if self.gitea is not None and proving and proven != decision.issue_number:
                outcome.refusal = Envelope(
                    error="conflict",
                    message=f"the selection changed to #{decision.issue_number} after the proof; nothing was leased",
                    remediate="Another allocation changed the live leases meanwhile; allocate again.",
                    exact_next_action="call gitea_allocate_next_work again",
                    details={"proven": proven, "selected": decision.issue_number}, reason="selection_changed",
                )
                return outcome
            held = sum(1 for lease in open_leases if lease.owner == call.owner and lease.is_live(now))
            if call.max_live is not None and held >= call.max_live:
                outcome.refusal = Envelope(
                    error="conflict",
                    message=f"{call.owner} already holds {held} live lease(s); nothing was leased",
                    remediate="max_leases_per_author is reached; another allocation leased to this owner meanwhile.",
                    exact_next_action="call gitea_allocate_next_work again",
                    details={"live_leases": held, "max": call.max_live}, reason="owner_busy",
                )
                return outcome
            stale = [lease for lease in open_leases if lease.issue_number == decision.issue_number]
            try:
                grant = LeaseGrant(
                    issue_number=decision.issue_number, owner=call.owner, action=action_of(call.action),
                    actor=call.actor, fingerprint=decision.fingerprint,
                    # The caller's exclusions as the decision applied them (normalized): seed 000 AC9.
                    request={"exclude": sorted(decision.exclusions.get("exclude_issue_numbers", [])),
                             "source": source},
                    reclaim=stale[0] if stale else None,
                    check_history=call.lease_history is not None and decision.issue_number in call.lease_history,
                    seen_latest=(call.lease_history or {}).get(decision.issue_number),
                )
                lease = await grant_lease(conn, self.leases, self.settings, grant, now)
            except LeaseTaken as exc:
                outcome.refusal = Envelope(
                    error="conflict",
                    message=f"{exc}; nothing was leased",
                    remediate="Another allocation won the race for this issue; run a fresh dry-run.",
                    exact_next_action="call gitea_allocate_next_work as a dry-run again",
                )
                return outcome
            outcome.lease = lease
            outcome.applied = True
            for intent in self._effects(lease, decision, call):
                await enqueue(conn, intent)
                outcome.outbox_keys.append(intent.key)
        return outcome

    def _effects(self, lease: Lease, decision: SelectDecision, call: AllocationCall) -> Sequence[OutboxIntent]:
        """The Gitea side of a lease, in order: status label, assignee, then the evidence comment."""
        if lease.action in ("review", "merge"):
            return review_lease_effects(lease, self.bot_login, call.delivery_id)
        number, key = lease.issue_number, lease.lease_id
        branch_hint = f"issue-{number}"
        state = CanonicalState(
            state="in-progress",
            who_is_next="author",
            next_action=f"{lease.owner}: bootstrap the issue worktree (gitea_bootstrap_issue_worktree)",
            next_prompt=(
                f"You hold lease {lease.lease_id} on #{number} until {lease.expires_at.isoformat()}.\n"
                f"Call gitea_bootstrap_issue_worktree for #{number}, work only in the registered worktree\n"
                f"on its {branch_hint}-* branch, heartbeat the lease, and post the next state when done."
            ),
            what_happened=f"leased #{number} to {lease.owner} ({lease.role}, {lease.action})",
            why=_why(decision),
            related_prs=(),
            blockers="none",
            validation="lease row committed; this comment, the label and the assignee are read back by foreman",
            last_updated_by=self.bot_login,
        )
        evidence = {
            "action": "allocate",
            "lease": lease.to_dict(),
            "fingerprint": decision.fingerprint,
            # What the decision excluded; the lease row records the same (checked by `foreman invariants`).
            "exclusions": {k: list(v) for k, v in decision.exclusions.items()},
            "requested_by": call.actor,
            "delivery": call.delivery_id,
            "skipped": [s.to_dict() for s in decision.skipped][:20],
        }
        return StateChange(
            repo=lease.repo, issue_number=number, state=state, cause=call.delivery_id, evidence=evidence,
            summary=f"Leased #{number} to {lease.owner} for {lease.action} until "
            f"{lease.expires_at:%Y-%m-%d %H:%M} UTC.",
            comment_key=f"{key}:evidence", labels_key=f"{key}:labels", leaving=("ready",),
            assignees_key=f"{key}:assignee", assignees=(lease.owner,),
        ).intents()


#: Preflight checks whose failure means Gitea or its git remote could not answer now (retry), not the issue.
_TRANSIENT_CHECKS: frozenset[Check] = frozenset({"repo_reachable", "base_known"})


def _proof_refusal(proof: PreflightProof, decision: SelectDecision, call: AllocationCall) -> Envelope:
    """The typed refusal of an apply whose bootstrap preflight failed: which checks, and what the caller can do."""
    number = decision.issue_number
    failed = sorted(proof.failed)
    details = {"issue_number": number, "owner": call.owner, "failed_checks": failed, "preflight": proof.to_dict()}
    again = "call gitea_allocate_next_work again"
    if proof.failed & _TRANSIENT_CHECKS:
        return Envelope(
            error="unavailable",
            message=f"could not prove that {call.owner} can bootstrap #{number} now ({', '.join(failed)} failed); "
            "nothing was leased",
            remediate="Gitea or its git remote did not answer as needed; the proof is retried by the next call.",
            exact_next_action=f"{again} once Gitea answers",
            details=details,
            reason=PREFLIGHT_FAILED,
        )
    if "control_checkout" in proof.failed:
        where = proof.checks["control_checkout"].facts.get("head_ref")
        return Envelope(
            error="invalid_state",
            message=f"the control checkout is off its default branch or dirty ({where}); nothing was leased",
            remediate="foreman never changes the control checkout itself: an operator must put it back on its "
            "default branch, clean.",
            exact_next_action=f"ask an operator to clean the control checkout, then {again}",
            details=details,
            reason=PREFLIGHT_FAILED,
        )
    path = proof.worktree_path or "the canonical worktree path"
    return Envelope(
        error="invalid_state",
        message=f"{call.owner} could not bootstrap #{number}: {', '.join(failed)} failed (e.g. something that is not "
        f"foreman's worktree is at {path}); nothing was leased",
        remediate=f"#{number} can be allocated once {path} is free (an operator moves it aside: foreman keeps it "
        "byte for byte) or is the owner's registered worktree; the other candidates can be allocated now.",
        exact_next_action=f"{again} with exclude_issue_numbers=[{number}]",
        details=details,
        reason=PREFLIGHT_FAILED,
    )


def _merged_exclusions(call: AllocationCall) -> object:
    """The call's own exclusions with those an in-process caller adds; as received when they are refused (the
    decision then names every problem)."""
    if not call.also_excluded:
        return call.exclude_issue_numbers
    try:
        return sorted(normalize_exclusions(call.exclude_issue_numbers) | call.also_excluded)
    except InputError:
        return call.exclude_issue_numbers


def _why(decision: SelectDecision) -> str:
    top = decision.ranked[0] if decision.ranked else None
    skipped = len(decision.skipped)
    rank = f"ranked first of {len(decision.ranked)}" if top else "selected"
    return f"{rank} by priority, age and number; {skipped} candidate(s) skipped with reasons in the evidence"


async def author_pick(db: Database, settings: Settings, now: datetime) -> AuthorPick:
    """The roster authors in the order they receive work now (pure policy over the lease store's facts)."""
    named = settings.allocator.auto_allocate_owner or None
    authors = settings.authors()
    if named and named not in authors:
        authors = [*authors, named]
    return await _pick(db, settings, authors, settings.allocator.max_leases_per_author, now, named=named)


async def role_pick(db: Database, settings: Settings, role: Literal["reviewer", "merger"], now: datetime) -> (
    AuthorPick
):
    """The roster's reviewers (or mergers) in the order the queues hand them work now: the authors' policy (fewest
    live leases, then longest idle), capped by ``max_leases_per_reviewer`` (``max_leases_per_merger``)."""
    logins = sorted(login for login, roles in settings.roster.items() if role in roles)
    cfg = settings.allocator
    cap = cfg.max_leases_per_reviewer if role == "reviewer" else cfg.max_leases_per_merger
    return await _pick(db, settings, logins, cap, now, named=None)


async def _pick(db: Database, settings: Settings, logins: list[str], cap: int, now: datetime, *,
                named: str | None) -> AuthorPick:
    repo = settings.repo_key
    store = LeaseStore(db)
    rows: list[tuple[str, bool, datetime, datetime | None]] = []
    for lease in await store.open_leases(repo):
        alive = lease.is_live(now)
        rows.append((lease.owner, alive, lease.acquired_at, None if alive else lease.expires_at))
    for owner, ended in (await store.last_ended(repo, logins)).items():
        rows.append((owner, False, ended, ended))
    return rank_authors(author_loads(logins, rows), max_leases_per_author=cap, named_owner=named)


@executes("allocate_next_work")
async def allocate(
    rt: VerbRuntime[AllocatorGitea], verb: Verb, caller: Caller, values: Mapping[str, object], lease: Lease | None,
    delivery_id: str | None, options: CallOptions,
) -> VerbResult:
    action = str(values["action"])
    owner = values.get("owner")
    if owner is None:
        role = ACTION_ROLES.get(action, "author")
        fits = [login for login, roles in rt.settings.roster.items() if role in roles]
        if role == "author" and len(fits) > 1:
            # Several authors: the next idle one by the auto-allocation policy.
            pick = await author_pick(rt.db, rt.settings, rt.clock())
            if not pick.order:
                busy = ", ".join(s.login for s in pick.skipped)
                return refused(verb.name, envelope(
                    "conflict",
                    f"no owner given and every author is busy ({busy})",
                    "Wait for an author to free up (foreman allocates ready issues automatically when one "
                    "does), or name the owner.",
                    f"call {verb.tool} again with owner set, or once an author has released its lease",
                    reason="authors_busy", authors=pick.to_dict(),
                ))
            fits = [pick.order[0]]
        if len(fits) != 1:
            return refused(
                verb.name,
                envelope(
                    "invalid_input",
                    f"no owner given and the roster has {len(fits)} identities with the {role} role",
                    f"Name the owner: one of {', '.join(fits) or '(none: add one to [roster])'}.",
                    f"call {verb.tool} again with owner set",
                ),
            )
        owner = fits[0]
    assert isinstance(owner, str)
    expected = values.get("expected_fingerprint")
    call = AllocationCall(
        actor=caller.login,
        owner=owner.lstrip("@"),
        candidates_json=values.get("candidates_json") if options.candidates is None else options.candidates,
        exclude_issue_numbers=values.get("exclude_issue_numbers"),
        also_excluded=options.exclusions,
        dry_run=bool(values["dry_run"]),
        expected_fingerprint=expected if isinstance(expected, str) else None,
        action=action,
        delivery_id=delivery_id,
        actor_is_operator=caller.operator,
        channel=caller.channel,
        resume_own=options.resume_own,
        max_live=options.max_live,
        lease_history=options.lease_history,
    )
    outcome = await Allocator(rt.db, rt.settings, rt.gitea, bot_login=rt.bot_login).run(
        call, now=options.now)
    doc = {"verb": verb.name, **outcome.to_dict()}
    if outcome.exit_code == 0:
        doc["next"] = rt.next_tools(verb, caller)
        return VerbResult(verb=verb.name, doc=doc, outcome=outcome)
    refusal = outcome.refusal
    if refusal is None and outcome.decision is not None:
        refusal = getattr(outcome.decision, "envelope", None)
    if refusal is None:  # pragma: no cover - every refused outcome carries an envelope
        refusal = envelope("invalid_state", "allocation refused", "Run a dry-run.", f"call {verb.tool}")
    return VerbResult(verb=verb.name, doc=doc, refusal=refusal, outcome=outcome)
