"""The workflow vocabulary in one place: STATE values, WHO_IS_NEXT roles and their `status:*` labels."""

from __future__ import annotations

from dataclasses import dataclass

STATUS_LABEL_PREFIX = "status:"
#: Gitea stores an issue's index as int64 (and so does our database): anything larger is refused as input.
MAX_ISSUE_NUMBER = 2**63 - 1


def is_issue_number(value: object) -> bool:
    """A positive int64 and not a bool (``true`` must never be issue #1)."""
    return type(value) is int and 0 < value <= MAX_ISSUE_NUMBER


@dataclass(frozen=True, slots=True)
class StateRow:
    """One allowed ``STATE`` value and the Gitea label that mirrors it on the issue."""

    state: str
    label: str
    meaning: str

    def __post_init__(self) -> None:
        if self.label != STATUS_LABEL_PREFIX + self.state:
            raise ValueError(f"state {self.state!r} must be mirrored by {STATUS_LABEL_PREFIX}{self.state}")


@dataclass(frozen=True, slots=True)
class RoleRow:
    """One allowed ``WHO_IS_NEXT`` value.

    ``roster`` says whether the role is held by configured roster identities (which receive leases);
    ``human`` is the hand-off to a person and never receives a lease.
    """

    role: str
    roster: bool
    meaning: str


# Order is the workflow's usual order; docs and `foreman state parse` list values in this order.
STATES: tuple[StateRow, ...] = (
    StateRow("ready", "status:ready", "Specified and eligible; the controller may allocate it."),
    StateRow("in-progress", "status:in-progress", "Allocated; the lease owner works in the issue worktree."),
    StateRow("pr-open", "status:pr-open", "A pull request implements it and waits for review."),
    StateRow("review", "status:review", "A reviewer is reviewing the pull request."),
    StateRow("blocked", "status:blocked", "Cannot go on until the BLOCKERS are resolved."),
    StateRow("done", "status:done", "Finished: merged or closed, with evidence."),
)

ROLES: tuple[RoleRow, ...] = (
    RoleRow("controller", True, "Allocates work and routes the next action."),
    RoleRow("author", True, "Implements the issue in its worktree and opens the pull request."),
    RoleRow("reviewer", True, "Reviews the pull request."),
    RoleRow("merger", True, "Merges the approved pull request."),
    RoleRow("human", False, "A person with write permission must act; no lease is granted."),
)

STATE_VALUES: frozenset[str] = frozenset(row.state for row in STATES)
ROLE_VALUES: frozenset[str] = frozenset(row.role for row in ROLES)
ROSTER_ROLES: frozenset[str] = frozenset(row.role for row in ROLES if row.roster)

_BY_STATE: dict[str, StateRow] = {row.state: row for row in STATES}
_BY_LABEL: dict[str, StateRow] = {row.label: row for row in STATES}


def is_state(value: str) -> bool:
    """True when ``value`` is an allowed ``STATE`` (exact, case-sensitive)."""
    return value in _BY_STATE


def is_role(value: str) -> bool:
    """True when ``value`` is an allowed ``WHO_IS_NEXT`` role (exact, case-sensitive)."""
    return value in ROLE_VALUES


def label_for_state(state: str) -> str:
    """The ``status:*`` label mirroring ``state``; ValueError for a value outside the vocabulary."""
    row = _BY_STATE.get(state)
    if row is None:
        raise ValueError(f"unknown STATE {state!r}; allowed: {', '.join(r.state for r in STATES)}")
    return row.label


def state_for_label(label: str) -> str | None:
    """The ``STATE`` a label mirrors, or None when it is not one of the vocabulary's ``status:*`` labels."""
    row = _BY_LABEL.get(label)
    return None if row is None else row.state


def is_status_label(label: str) -> bool:
    """True for any label in the ``status:`` namespace, known or not (a handler may want to flag unknown ones)."""
    return label.startswith(STATUS_LABEL_PREFIX)


def status_labels() -> tuple[str, ...]:
    """Every ``status:*`` label of the vocabulary, in table order."""
    return tuple(row.label for row in STATES)


def vocabulary_markdown() -> str:
    """The vocabulary as two Markdown tables (STATE with its label, then WHO_IS_NEXT), for docs."""
    lines = ["| STATE | label | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{row.state}` | `{row.label}` | {row.meaning} |" for row in STATES]
    lines += ["", "| WHO_IS_NEXT | receives a lease | meaning |", "| --- | --- | --- |"]
    lines += [f"| `{row.role}` | {'yes' if row.roster else 'no'} | {row.meaning} |" for row in ROLES]
    return "\n".join(lines) + "\n"
