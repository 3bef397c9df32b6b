"""The allocator's pure decision: normalize candidates, apply exclusions, rank, fingerprint, decide.

Sans-I/O: the lease store, the Gitea fetch and the MCP tool call into this module with plain data
and act on the decision it returns. Dry-run and apply both go through :func:`decide` with the raw
request, so they share one normalization and one set of candidate semantics (seed AC4).

Order of evaluation inside :func:`decide` (each candidate gets exactly one outcome):

1. Normalize ``candidates`` and ``exclude_issue_numbers`` strictly; any problem makes the whole
   decision ``invalid`` (fail closed, nothing is leased). All problems are collected, not just the first.
2. Exclusions, before any ranking: the caller's ``exclude_issue_numbers`` (``excluded_by_controller``),
   then the configured protected issue numbers (``protected_issue``) and labels (``protected_label``).
   A live lease held by the requesting owner on an excluded issue blocks the whole decision
   (``blocked``, blocker ``excluded_owned_lease``) so the lease is never silently stranded.
3. Live ownership: a live lease held by anyone else is ``foreign_claim`` and never overridden; a
   foreign lease that expired less than ``policy.lease_grace`` ago is ``lease_grace``. A live lease held
   by the requesting owner makes the issue resumable (readiness and dependencies are not re-checked:
   the work is already under way).
4. Readiness (``not_ready``: the record says ``"ready": false``) and dependency holds
   (``dependency_open``: a ``depends_on`` number is an open issue).
5. Ranking of what is left: priority label (``policy.priority_labels`` order; unlabelled last), then
   ``created_at`` oldest first (undated after dated), then issue number ascending.

The decision is then, in this precedence: ``blocked`` > ``resume`` > ``select`` > ``wait``.
"""

from __future__ import annotations

from bot.core.allocator.candidates import MAX_INPUT_CHARS, normalize_candidates, normalize_exclusions
from bot.core.allocator.decide import check_apply, decide
from bot.core.allocator.decisions import (
    AllocationDecision,
    BlockedDecision,
    InvalidDecision,
    ResumeDecision,
    SelectDecision,
    WaitDecision,
)
from bot.core.allocator.fingerprint import FINGERPRINT_VERSION
from bot.core.allocator.records import (
    BLOCK_REASONS,
    CANDIDATE_FIELDS,
    DEFAULT_LEASE_GRACE,
    DEFAULT_PRIORITY_LABELS,
    EXCLUSION_REASONS,
    SKIP_REASONS,
    AllocationRequest,
    Blocker,
    BlockReason,
    Candidate,
    InputError,
    InputProblem,
    LiveLease,
    RankedCandidate,
    RankingPolicy,
    Skipped,
    SkipReason,
    WaitReason,
)

__all__ = [
    "BLOCK_REASONS",
    "CANDIDATE_FIELDS",
    "DEFAULT_LEASE_GRACE",
    "DEFAULT_PRIORITY_LABELS",
    "EXCLUSION_REASONS",
    "FINGERPRINT_VERSION",
    "MAX_INPUT_CHARS",
    "SKIP_REASONS",
    "AllocationDecision",
    "AllocationRequest",
    "BlockReason",
    "BlockedDecision",
    "Blocker",
    "Candidate",
    "InputError",
    "InputProblem",
    "InvalidDecision",
    "LiveLease",
    "RankedCandidate",
    "RankingPolicy",
    "ResumeDecision",
    "SelectDecision",
    "SkipReason",
    "Skipped",
    "WaitDecision",
    "WaitReason",
    "check_apply",
    "decide",
    "normalize_candidates",
    "normalize_exclusions",
]
