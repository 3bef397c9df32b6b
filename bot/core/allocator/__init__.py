"""The allocator's pure decision: normalize candidates, exclude, rank, fingerprint, decide (docs/allocator.md)."""

from __future__ import annotations

from bot.core.allocator.candidates import (
    MAX_INPUT_CHARS,
    NormalizedCandidates,
    forget_instants,
    normalize_candidates,
    normalize_exclusions,
    normalized_candidates,
)
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
    "NormalizedCandidates",
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
    "forget_instants",
    "normalize_candidates",
    "normalize_exclusions",
    "normalized_candidates",
]
