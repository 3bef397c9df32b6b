"""The pure issue-state rules: comment revisions, the current state, label sync plans (docs/canonical-state.md)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from bot.core.canonical import CanonicalState, ParseResult
from bot.core.vocabulary import is_status_label, label_for_state, status_labels

CommentAction = Literal["created", "edited", "deleted"]
#: ``issues.label_sync``: whether the labels mirror the STATE. ``pending``: they do not yet, and the change is
#: in the outbox (sent by the outbox sender, or waiting there while no Gitea token is configured);
#: ``label_missing`` / ``failed``: the outbox entry for this state and label set failed (see issue_label_syncs).
LabelSync = Literal["no_state", "in_sync", "held", "pending", "label_missing", "failed"]
#: ``issue_label_syncs.outcome``: ``queued`` (an outbox entry was written), then what became of that entry
#: (``applied``, ``label_missing``, ``failed``); ``held`` (two status labels: nothing queued).
SyncOutcome = Literal["queued", "applied", "held", "label_missing", "failed"]
LABEL_SYNC_KEY_PREFIX = "label-sync:"

CONFLICTING_STATUS_LABELS = "conflicting_status_labels"
ISSUE_DELETED = "issue_deleted"
READY_LABEL = label_for_state("ready")
_ACTION_RANK: dict[str, int] = {"created": 0, "edited": 1, "deleted": 2}


def gitea_time(text: str) -> str:
    """An RFC 3339 time from Gitea (with a zone offset, or ``Z``) as the stored fixed-width UTC text."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def repo_key(full_name: str) -> str:
    """Repositories are keyed by ``owner/name`` in lower case (Gitea names are case-insensitive)."""
    return full_name.lower()


# --- records ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IssueLabel:
    """A label on an issue, as Gitea identifies it (removal by id needs the id)."""

    id: int
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name}


@dataclass(frozen=True, slots=True)
class IssueObservation:
    """What a payload's ``issue`` object says: open or closed, the full label set, and as of when."""

    number: int
    is_open: bool
    labels: tuple[IssueLabel, ...]
    updated_at: str | None  # stored form (gitea_time); None when the payload has none (then arrival order)

    @classmethod
    def from_payload(cls, issue: dict[str, Any]) -> IssueObservation:
        labels = tuple(IssueLabel(int(item["id"]), str(item["name"])) for item in issue.get("labels") or [])
        return cls(
            number=int(issue["number"]),
            is_open=issue.get("state", "open") != "closed",
            labels=sorted_labels(labels),
            updated_at=gitea_time(str(issue["updated_at"])) if issue.get("updated_at") else None,
        )

    @classmethod
    def from_event(cls, action: str, issue: dict[str, Any]) -> IssueObservation:
        """What an ``issues`` event says about the issue after the change.

        ``label_cleared`` lists the labels from *before* the clear (Gitea's models/issues/issue_label.go
        ``clearIssueLabels`` never reloads them, and services/webhook/notifier.go ``IssueClearLabels``
        converts that stale list; 1.22 to 1.26), so it is read as "no labels now".
        """
        observed = cls.from_payload(issue)
        if action == "label_cleared":
            return cls(observed.number, observed.is_open, (), observed.updated_at)
        return observed


@dataclass(frozen=True, slots=True)
class Trust:
    """Whether a comment's author may set the state, and why. ``trusted`` is None when there was no block."""

    trusted: bool | None
    reason: str


NO_BLOCK = Trust(None, "no_block")


@dataclass(frozen=True, slots=True)
class CommentObservation:
    """One issue_comment event, reduced to what the history keeps."""

    repo: str
    number: int
    comment_id: int
    action: CommentAction
    author: str
    created_at: str  # stored form
    updated_at: str  # stored form
    delivery_id: str
    body_sha256: str
    parsed: ParseResult | None  # None for a deletion
    trust: Trust

    @staticmethod
    def body_hash(body: str) -> str:
        return hashlib.sha256(body.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class CommentRecord:
    """One stored evaluation of one revision of one comment (a row of ``issue_comment_records``)."""

    id: int
    comment_id: int
    action: CommentAction
    author: str
    created_at: str
    updated_at: str
    trusted: bool | None
    trust_reason: str
    state: CanonicalState | None
    delivery_id: str = ""
    block_count: int = 0
    errors: tuple[dict[str, Any], ...] = ()
    superseded_by: int | None = None
    recorded_at: str = ""

    @property
    def counts(self) -> bool:
        """Whether this revision, if effective, can be the issue's state: trusted and valid."""
        return self.action != "deleted" and self.trusted is True and self.state is not None


@dataclass(frozen=True, slots=True)
class IssueSnapshot:
    """The issues row: current state and the last known labels and status."""

    repo: str
    number: int
    is_open: bool | None
    labels: tuple[IssueLabel, ...] | None
    snapshot_as_of: str | None
    state: CanonicalState | None
    state_record_id: int | None
    state_comment_id: int | None
    candidate: bool
    label_sync: LabelSync
    version: int
    open_blockers: tuple[str, ...] = ()

    @property
    def label_names(self) -> tuple[str, ...]:
        return tuple(label.name for label in self.labels or ())

    @property
    def status_labels(self) -> tuple[str, ...]:
        return tuple(name for name in self.label_names if is_status_label(name))


@dataclass(frozen=True, slots=True)
class IssueEventResult:
    """What one issues event changed."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    applied: bool
    first_snapshot: bool
    made_candidate: bool
    duplicate: bool
    snapshot: IssueSnapshot


@dataclass(frozen=True, slots=True)
class SyncPlan:
    """What label sync should do for a snapshot: nothing, hold, or add ``target`` and remove ``remove``."""

    status: LabelSync
    target: str | None = None
    remove: tuple[str, ...] = field(default=())

    @property
    def needs_change(self) -> bool:
        return self.status == "pending"


# --- rules ------------------------------------------------------------------------------------------------------------


def _revision_key(record: CommentRecord) -> tuple[int, str, int, int]:
    if record.action == "deleted":
        # A deletion wins over every revision; among repeated deletions the first recorded one stands.
        return (1, "", 0, -record.id)
    # Same updated_at (Gitea keeps whole seconds): an edit is newer than the creation, then arrival order.
    return (0, record.updated_at, _ACTION_RANK[record.action], record.id)


def effective_revisions(records: Iterable[CommentRecord]) -> dict[int, CommentRecord]:
    """Per comment id, the revision that stands (docs/canonical-state.md, Ordering), whatever the arrival order."""
    best: dict[int, CommentRecord] = {}
    for record in records:
        held = best.get(record.comment_id)
        if held is None or _revision_key(record) > _revision_key(held):
            best[record.comment_id] = record
    return best


def current_record(records: Iterable[CommentRecord]) -> CommentRecord | None:
    """The record whose block is the issue's current state, or None: the latest trusted valid block.

    Latest means Gitea's comment order ``(created_at, comment id)``, never arrival order; each comment is
    represented by its effective revision, so edits replace and deletions withdraw that comment's block.
    """
    standing = [record for record in effective_revisions(records).values() if record.counts]
    if not standing:
        return None
    return max(standing, key=lambda record: (record.created_at, record.comment_id))


def plan_label_sync(state: CanonicalState | None, labels: Sequence[str] | None, *, conflict: bool) -> SyncPlan:
    """Whether the labels mirror ``state`` with exactly one ``status:*`` label, and what to change if not.

    Two or more status labels are a conflict for the controller: sync holds off rather than guess.
    """
    if state is None:
        return SyncPlan("no_state")
    target = label_for_state(state.state)
    status = [name for name in labels or () if is_status_label(name)]
    if conflict or len(status) > 1:
        return SyncPlan("held", target)
    if status == [target]:
        return SyncPlan("in_sync", target)
    return SyncPlan("pending", target, tuple(name for name in status if name != target))


def project_labels(names: Iterable[str], changes: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The label names after the outbox's still-open ``labels`` entries (their payloads, in order) are applied."""
    projected = set(names)
    for change in changes:
        projected |= set(change.get("add", []))
        projected -= set(change.get("remove", []))
    return tuple(sorted(projected))


def sync_change(target: str, *label_sets: Iterable[str]) -> dict[str, list[str]]:
    """The outbox ``labels`` payload that makes ``target`` the only status label.

    Every other status label is removed: the vocabulary's and any other ``status:*`` label seen in
    ``label_sets``. The sender removes only what the issue carries, so listing them all costs nothing, and an
    entry planned against a label set that an earlier entry is still changing cannot leave two status labels.
    """
    others = set(status_labels()).union(*(filter(is_status_label, names) for names in label_sets))
    return {"add": [target], "remove": sorted(others - {target})}


def label_sync_key(repo: str, number: int, record_id: int, target: str, basis: Sequence[Any]) -> str:
    """The idempotency key of the label sync for one state record, target and label basis.

    ``basis`` is what the plan was made from (the stored label set and its time, the projected set): the same
    cause processed again (a retried or replayed delivery) yields the same key, so nothing is queued twice;
    a later label change by someone else yields a new one, so the status label is put back again.
    """
    digest = hashlib.sha256(json.dumps(list(basis), sort_keys=True).encode()).hexdigest()[:16]
    return f"{LABEL_SYNC_KEY_PREFIX}{repo_key(repo)}#{number}:record-{record_id}:{target}:basis-{digest}"


def diff_labels(before: Iterable[str], after: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(added, removed) label names, each sorted."""
    old, new = set(before), set(after)
    return tuple(sorted(new - old)), tuple(sorted(old - new))


def not_older(issue: IssueObservation, snapshot: IssueSnapshot) -> bool:
    """Whether a payload's issue may replace the stored snapshot (same second: arrival order decides)."""
    return issue.updated_at is None or snapshot.snapshot_as_of is None or issue.updated_at >= snapshot.snapshot_as_of


def sorted_labels(labels: Iterable[IssueLabel]) -> tuple[IssueLabel, ...]:
    """Labels in Gitea's order (by name), without repeats."""
    return tuple(sorted(set(labels), key=lambda label: (label.name, label.id)))
