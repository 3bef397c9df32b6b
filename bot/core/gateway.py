"""The gateway's pure decision: ordered preconditions, their rejection kinds, and the refusal envelope."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, get_args

from bot.core.errors import Envelope, ErrorKind

RejectionKind = Literal["tracing_gap", "not_authorized"]
Outcome = Literal["allow", "reject", "tracing_gap"]
Role = Literal["controller", "author", "reviewer", "merger"]

ROLES: tuple[Role, ...] = get_args(Role)
_REJECTION_KINDS: frozenset[str] = frozenset(get_args(RejectionKind))
_ERROR_KINDS: frozenset[str] = frozenset(get_args(ErrorKind))

Ctx = TypeVar("Ctx")


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayContext:
    """The facts the edge gathers before a verb is decided; checks read only these.

    ``worktree_registered`` means: a worktree registered under ``branches/`` on the issue's branch
    (the branches-only guard is the edge's job when it gathers this fact). ``commits_ahead`` counts
    commits on the issue branch beyond its base. ``pr_author`` is ``None`` when there is no PR. ``locked``: the
    issue is locked to the lease owner's registered worktree.
    """

    caller: str
    caller_roles: frozenset[Role] = frozenset()
    issue_number: int | None = None
    lease_owner: str | None = None
    lease_live: bool = False
    worktree_registered: bool = False
    commits_ahead: int = 0
    pr_number: int | None = None
    pr_author: str | None = None
    pr_approved: bool = False
    #: The owner of the issue's last ``implement`` lease (the self-review block), None if it never had one.
    implementer: str | None = None
    #: The issue's state as its ``status:*`` label says (``review``, ...), None when unknown or not gathered.
    issue_state: str | None = None
    locked: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.caller_roles) - set(ROLES)
        if unknown:
            raise ValueError(f"unknown role(s) {sorted(unknown)}; roles are {list(ROLES)}")
        if self.commits_ahead < 0:
            raise ValueError("commits_ahead cannot be negative")
        if (self.pr_number is None) != (self.pr_author is None):
            raise ValueError("a PR has both a number and an author, or neither")

    @property
    def owns_live_lease(self) -> bool:
        """The caller holds the issue's live lease."""
        return self.lease_live and self.lease_owner is not None and self.lease_owner == self.caller


@dataclass(frozen=True, slots=True)
class Precondition(Generic[Ctx]):
    """A declarative gate checked before a verb runs.

    ``check`` is a pure function of the context returning ``True`` when the precondition holds.
    ``message`` (optional) is the envelope message for a ``tracing_gap``; it defaults to
    ``"Missing required <missing_token>"``. ``next_action`` (optional) is the envelope's
    ``exact_next_action``; it defaults to ``remediate``.
    """

    key: str
    check: Callable[[Ctx], bool]
    remediate: str
    missing_token: str
    rejection_kind: RejectionKind = "tracing_gap"
    message: str = ""
    next_action: str = ""
    #: What the gate asks, in words an agent reads in a tool's description ("who holds the issue's live lease");
    #: its ``key`` is an internal name, kept for logs and audit.
    words: str = ""

    def __post_init__(self) -> None:
        if self.rejection_kind not in _REJECTION_KINDS:
            raise ValueError(f"rejection_kind must be one of {sorted(_REJECTION_KINDS)}")
        if not self.key or not self.remediate or not self.missing_token:
            raise ValueError("a precondition needs a key, a remediation and a missing token")

    @property
    def gap_message(self) -> str:
        return self.message or f"Missing required {self.missing_token}"

    @property
    def exact_next_action(self) -> str:
        return self.next_action or self.remediate


@dataclass(frozen=True, slots=True)
class Decision:
    """The gateway's verdict; its invariants hold by construction (``__post_init__`` raises).

    - ``allow``: no kind, message, remediation, missing[] or next action.
    - ``reject``: an error kind other than ``tracing_gap``, a message, a remediation, a next action,
      and no missing[].
    - ``tracing_gap``: kind ``tracing_gap``, a non-empty missing[], a message, a remediation and a
      next action.

    ``failed`` lists the keys of the failing preconditions (for logs and audit, never the envelope).
    """

    outcome: Outcome
    kind: ErrorKind | None = None
    message: str = ""
    remediate: str = ""
    missing: tuple[str, ...] = ()
    exact_next_action: str = ""
    failed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.outcome == "allow":
            if self.kind is not None or self.missing or self.remediate or self.message:
                raise ValueError("an allow decision carries no kind, message, remediation or missing[]")
            if self.exact_next_action or self.failed:
                raise ValueError("an allow decision carries no next action and no failed preconditions")
            return
        if self.outcome == "reject":
            if self.kind is None or self.kind == "tracing_gap" or self.kind not in _ERROR_KINDS:
                raise ValueError("a reject decision needs an error kind other than tracing_gap")
            if self.missing:
                raise ValueError("a reject decision carries no missing[]")
        elif self.outcome == "tracing_gap":
            if self.kind != "tracing_gap":
                raise ValueError("a tracing_gap decision has kind 'tracing_gap'")
            if not self.missing or not all(self.missing):
                raise ValueError("a tracing_gap decision must name what is missing")
        else:
            raise ValueError(f"unknown outcome {self.outcome!r}")
        if not self.remediate:
            raise ValueError("a refusal needs a remediation")
        if not self.message:
            raise ValueError("a refusal needs a message")
        if not self.exact_next_action:
            raise ValueError("a refusal needs an exact next action")

    @classmethod
    def allow(cls) -> Decision:
        return cls(outcome="allow")

    @classmethod
    def reject(
        cls,
        *,
        kind: ErrorKind,
        message: str,
        remediate: str,
        exact_next_action: str = "",
        failed: Sequence[str] = (),
    ) -> Decision:
        """A refusal without missing[]; ``exact_next_action`` defaults to ``remediate``."""
        return cls(
            outcome="reject",
            kind=kind,
            message=message,
            remediate=remediate,
            exact_next_action=exact_next_action or remediate,
            failed=tuple(failed),
        )

    @classmethod
    def tracing_gap(
        cls,
        *,
        missing: Sequence[str],
        remediate: str,
        message: str = "",
        exact_next_action: str = "",
        failed: Sequence[str] = (),
    ) -> Decision:
        """A missing-artifact refusal; the message defaults to ``Missing required <tokens>``."""
        missing_t = tuple(missing)
        return cls(
            outcome="tracing_gap",
            kind="tracing_gap",
            message=message or f"Missing required {', '.join(missing_t)}",
            remediate=remediate,
            missing=missing_t,
            exact_next_action=exact_next_action or remediate,
            failed=tuple(failed),
        )

    @property
    def allowed(self) -> bool:
        return self.outcome == "allow"

    def envelope(self) -> dict[str, Any]:
        """The refusal exactly as seed 001 shows it, with DESIGN's ``exact_next_action`` appended.

        Key order: ``error, message, missing (tracing_gap only), remediate, exact_next_action``.
        Raises ``ValueError`` for an allow decision, which has no envelope.
        """
        if self.kind is None:
            raise ValueError("an allow decision has no envelope")
        out: dict[str, Any] = {"error": self.kind, "message": self.message}
        if self.outcome == "tracing_gap":
            out["missing"] = list(self.missing)
        out["remediate"] = self.remediate
        out["exact_next_action"] = self.exact_next_action
        return out

    def to_error(self) -> Envelope:
        """The same refusal as ``bot.core.errors.Envelope`` (for ``EnvelopeError`` at the edges).

        Same values as ``envelope()``; ``Envelope.to_dict`` puts ``remediate`` before ``missing``.
        """
        if self.kind is None:
            raise ValueError("an allow decision has no envelope")
        return Envelope(
            error=self.kind,
            message=self.message,
            remediate=self.remediate,
            exact_next_action=self.exact_next_action,
            missing=self.missing,
        )


def evaluate_preconditions(preconditions: Sequence[Precondition[Ctx]], context: Ctx) -> Decision:
    """Seed 001's ``_check_intent_preconditions``: check all, then dispatch on the first failure.

    Every precondition is checked (in order). No failure: allow. First failure ``not_authorized``:
    reject with its remediation as message and remediation, no missing[]. Otherwise: tracing_gap
    listing the missing token of *every* failing precondition in order (a later
    ``not_authorized`` failure included, as the seed's comprehension does), with the first one's
    remediation. The first failure is taken by position, not by looking its token up again.
    """
    failing = [p for p in preconditions if not p.check(context)]
    if not failing:
        return Decision.allow()
    first = failing[0]
    keys = [p.key for p in failing]
    if first.rejection_kind == "not_authorized":
        return Decision.reject(
            kind="not_authorized",
            message=first.remediate,
            remediate=first.remediate,
            exact_next_action=first.exact_next_action,
            failed=keys,
        )
    return Decision.tracing_gap(
        missing=[p.missing_token for p in failing],
        remediate=first.remediate,
        message="; ".join(dict.fromkeys(p.gap_message for p in failing)),
        exact_next_action=first.exact_next_action,
        failed=keys,
    )
