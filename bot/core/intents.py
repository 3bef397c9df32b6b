"""What the bot intends Gitea to hold, as pure values: an outbox intent (a comment, an edit, a label change, the
assignees of an issue), and ``StateChange``, the one builder of the intents that move an issue's Canonical Issue
State on Gitea (its status label, its assignees, the evidence comment saying why) together."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.core.canonical import CanonicalState
from bot.core.evidence import find_marker, render_evidence
from bot.core.vocabulary import label_for_state

OutboxKind = Literal["comment", "edit_comment", "labels", "assignees"]
KINDS: tuple[OutboxKind, ...] = ("comment", "edit_comment", "labels", "assignees")


class OutboxInputError(ValueError):
    """An intent that cannot be sent as given (refused before it is stored)."""


@dataclass(frozen=True, slots=True)
class OutboxIntent:
    """What the bot wants Gitea to hold. Payloads by kind:

    - ``comment``: ``{"body": str}`` (the body must carry the marker of ``key``)
    - ``edit_comment``: ``{"comment_id": int, "body": str}``
    - ``labels``: ``{"add": [names], "remove": [names]}``
    - ``assignees``: ``{"assignees": [logins]}`` (the whole set)
    """

    key: str
    issue_number: int
    kind: OutboxKind
    payload: dict[str, Any]
    delivery_id: str | None = None
    #: The repository (its repo key, ``owner/name`` in lower case) whose issue this is: the entry is filed under it
    #: and sent with that repository's client.
    repo: str = ""

    def __post_init__(self) -> None:
        problems = _validate(self)
        if problems:
            raise OutboxInputError(f"outbox intent {self.key!r}: {'; '.join(problems)}")


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) and v for v in value)


def _validate(intent: OutboxIntent) -> list[str]:
    problems: list[str] = []
    if isinstance(intent.issue_number, bool) or not isinstance(intent.issue_number, int) or intent.issue_number < 1:
        problems.append("issue_number must be a positive integer")
    payload = intent.payload
    if intent.kind in ("comment", "edit_comment"):
        body = payload.get("body")
        if not isinstance(body, str) or not body.strip():
            problems.append("body must be a non-empty string")
        elif find_marker(body) != intent.key:
            problems.append("body must end with the marker of its idempotency key (bot.core.evidence.marker)")
    if intent.kind == "edit_comment":
        cid = payload.get("comment_id")
        if isinstance(cid, bool) or not isinstance(cid, int) or cid < 1:
            problems.append("comment_id must be a positive integer")
    if intent.kind == "labels":
        add, remove = payload.get("add", []), payload.get("remove", [])
        if not _names(add) or not _names(remove) or not (add or remove):
            problems.append("labels needs add and/or remove as lists of label names")
        elif set(add) & set(remove):
            problems.append("a label cannot be both added and removed")
    if intent.kind == "assignees" and not _names(payload.get("assignees")):
        problems.append("assignees must be a list of logins (empty list: unassign all)")
    if intent.kind not in KINDS:
        problems.append(f"kind must be one of {', '.join(KINDS)}")
    return problems


@dataclass(frozen=True, slots=True)
class StateChange:
    """One decision's effect on an issue, as its outbox intents in the order they must reach Gitea: the status label
    of ``state`` added (the labels of ``leaving`` removed), the assignees set (when ``assignees`` is given), then
    the evidence comment rendered with the state. Each intent's key is given: it is its idempotency key."""

    repo: str
    issue_number: int
    state: CanonicalState
    summary: str
    evidence: Mapping[str, Any]
    comment_key: str
    labels_key: str | None = None
    leaving: Sequence[str] = ()
    assignees_key: str | None = None
    assignees: Sequence[str] = field(default=())
    cause: str | None = None

    def intents(self) -> tuple[OutboxIntent, ...]:
        number, repo, cause = self.issue_number, self.repo, self.cause
        out: list[OutboxIntent] = []
        if self.labels_key is not None:
            change = {"add": [label_for_state(self.state.state)], "remove": [label_for_state(s) for s in self.leaving]}
            out.append(OutboxIntent(self.labels_key, number, "labels", change, cause, repo=repo))
        if self.assignees_key is not None:
            out.append(OutboxIntent(self.assignees_key, number, "assignees", {"assignees": list(self.assignees)},
                                    cause, repo=repo))
        body = render_evidence(key=self.comment_key, summary=self.summary, state=self.state,
                               evidence=dict(self.evidence))
        out.append(OutboxIntent(self.comment_key, number, "comment", {"body": body}, cause, repo=repo))
        return tuple(out)
