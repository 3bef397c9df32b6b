"""The structured refusal every part of the service returns: docs/mcp.md, "Envelopes"."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from bot.core.reasons import REFUSAL_REASONS, RefusalReason

ErrorKind = Literal[
    "not_authorized",
    "tracing_gap",
    "invalid_state",
    "stale_pin",
    "invalid_input",
    "not_found",
    "conflict",
    "unavailable",
    # The run broker's bounded categories (docs/grants.md): a call refused by a run's sealed grant.
    "grant_denied",
    "grant_expired",
    "host_mismatch",
    "inflight_unresolved",
    "broker_error",
]


@dataclass(frozen=True, slots=True)
class Envelope:
    """A refusal with a typed reason and a next action the caller can take with its own tools.

    ``missing`` is only allowed (and required to be non-empty) for ``tracing_gap``.
    """

    error: ErrorKind
    message: str
    remediate: str
    exact_next_action: str
    missing: tuple[str, ...] = field(default=())
    details: dict[str, Any] = field(default_factory=dict)
    #: Why, within ``error``: a stable token (``details.reason`` in the JSON, first among the details).
    reason: RefusalReason | None = None

    def __post_init__(self) -> None:
        if self.error == "tracing_gap" and not self.missing:
            raise ValueError("a tracing_gap envelope must name what is missing")
        if self.error != "tracing_gap" and self.missing:
            raise ValueError("only a tracing_gap envelope carries missing[]")
        if not self.message or not self.remediate or not self.exact_next_action:
            raise ValueError("an envelope needs a message, a remediation and an exact next action")

    @classmethod
    def recorded(cls, doc: Mapping[str, Any], *, error: ErrorKind, message: str, remediate: str,
                 exact_next_action: str) -> Envelope:
        """An envelope as ``to_dict`` recorded it (a journal's failure read back), each missing part from the
        arguments; a recorded reason this foreman does not know stays among the details."""
        details = dict(doc.get("details") or {})
        reason = details.get("reason")
        known = reason if isinstance(reason, str) and reason in REFUSAL_REASONS else None
        if known is not None:
            del details["reason"]
        return cls(error=doc.get("error") or error, message=str(doc.get("message") or message),
                   remediate=str(doc.get("remediate") or remediate),
                   exact_next_action=str(doc.get("exact_next_action") or exact_next_action),
                   details=details, reason=cast("RefusalReason | None", known))

    def to_dict(self) -> dict[str, Any]:
        # Key order follows seed 001's envelopes: error, message, missing (tracing_gap only), remediate.
        out: dict[str, Any] = {"error": self.error, "message": self.message}
        if self.error == "tracing_gap":
            out["missing"] = list(self.missing)
        out["remediate"] = self.remediate
        out["exact_next_action"] = self.exact_next_action
        if self.reason is not None:
            out["details"] = {"reason": self.reason, **self.details}
        elif self.details:
            out["details"] = dict(self.details)
        return out


class EnvelopeError(Exception):
    """Raised at the edges to carry an Envelope up to whoever renders it (CLI, HTTP, MCP)."""

    def __init__(self, envelope: Envelope) -> None:
        super().__init__(envelope.message)
        self.envelope = envelope
