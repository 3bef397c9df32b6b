"""The five allocation decisions (select, resume, wait, blocked, invalid) and their JSON form."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from bot.core.allocator.records import (
    Blocker,
    Candidate,
    LiveLease,
    RankedCandidate,
    Skipped,
    WaitReason,
    ranked_dicts,
)
from bot.core.errors import Envelope


@dataclass(frozen=True, slots=True, kw_only=True)
class _DecisionBase:
    kind: ClassVar[str]
    fingerprint: str | None
    fingerprint_parts: Mapping[str, str]
    considered: int
    ranked: tuple[RankedCandidate, ...]
    skipped: tuple[Skipped, ...]
    exclusions: Mapping[str, list[Any]]

    @property
    def issue_number(self) -> int | None:
        """The issue selected or resumed; None for the kinds that lease nothing."""
        return None

    def _own_fields(self) -> dict[str, Any]:
        """The keys only this kind has, rendered after ``issue_number``."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.kind,
            "fingerprint": self.fingerprint,
            "fingerprint_parts": dict(self.fingerprint_parts),
            "considered": self.considered,
            "ranked": ranked_dicts(self.ranked),
            "skipped": [s.to_dict() for s in self.skipped],
            "exclusions": {k: list(v) for k, v in self.exclusions.items()},
            "issue_number": self.issue_number,
            **self._own_fields(),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class _RefusedDecision(_DecisionBase):
    """A decision that carries a refusal: its envelope's keys lead the rendering."""

    envelope: Envelope

    def to_dict(self) -> dict[str, Any]:
        return {**self.envelope.to_dict(), **_DecisionBase.to_dict(self)}


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectDecision(_DecisionBase):
    """Lease ``candidate`` (the top of ``ranked``) to the requesting owner."""

    kind: ClassVar[str] = "select"
    candidate: Candidate

    @property
    def issue_number(self) -> int:
        return self.candidate.issue_number

    def _own_fields(self) -> dict[str, Any]:
        return {"candidate": self.candidate.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeDecision(_DecisionBase):
    """The owner already holds a live lease on a non-excluded issue: continue it, lease nothing new."""

    kind: ClassVar[str] = "resume"
    lease: LiveLease

    @property
    def issue_number(self) -> int:
        return self.lease.issue_number

    def _own_fields(self) -> dict[str, Any]:
        return {"lease": self.lease.to_dict()}


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitDecision(_DecisionBase):
    """The canonical WAIT / no-candidate result: nothing is eligible, nothing is leased."""

    kind: ClassVar[str] = "wait"
    wait_reason: WaitReason

    def _own_fields(self) -> dict[str, Any]:
        return {"wait_reason": self.wait_reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockedDecision(_RefusedDecision):
    """The caller must resolve ``blockers`` first (release the lease or stop excluding the issue)."""

    kind: ClassVar[str] = "blocked"
    blockers: tuple[Blocker, ...]

    def _own_fields(self) -> dict[str, Any]:
        return {"blockers": [b.to_dict() for b in self.blockers]}


@dataclass(frozen=True, slots=True, kw_only=True)
class InvalidDecision(_RefusedDecision):
    """The request was refused before any decision (fail closed); ``envelope`` says why."""

    kind: ClassVar[str] = "invalid"


AllocationDecision = SelectDecision | ResumeDecision | WaitDecision | BlockedDecision | InvalidDecision
