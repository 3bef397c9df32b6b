"""Typed values parsed from Gitea's JSON answers.

Each field says how it is read from the answer (``Annotated[type, reader]``: the reader is given the JSON object
and the field's name); ``GiteaValue.from_json`` reads them in the order they are declared and keeps the answer
as ``raw``."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Self

Json = Mapping[str, Any]
#: How one field is read: from the answer's JSON object and the field's name.
Reader = Callable[[Json, str], Any]


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def integer(data: Json, name: str) -> int:
    """A number the answer always has."""
    return int(data[name])


def count(data: Json, name: str) -> int:
    """A number, 0 when absent or null."""
    return int(data.get(name) or 0)


def word(data: Json, name: str) -> str:
    """A text the answer always has."""
    return str(data[name])


def text(data: Json, name: str) -> str:
    """A text, empty when absent or null."""
    return str(data.get(name) or "")


def flag(data: Json, name: str) -> bool:
    """A boolean, False when absent."""
    return bool(data.get(name, False))


def moment(data: Json, name: str) -> datetime | None:
    """An RFC 3339 time, None when absent, empty or unreadable."""
    return _time(data.get(name))


def text_or(default: str) -> Reader:
    """A text, ``default`` when absent or null."""
    return lambda data, name: str(data.get(name) or default)


def inner(outer: str, key: str) -> Reader:
    """The text at ``key`` of the object at ``outer`` (empty when either is missing)."""
    return lambda data, name: str((data.get(outer) or {}).get(key) or "")


def one(kind: type[GiteaValue]) -> Reader:
    """A value the answer always has."""
    return lambda data, name: kind.from_json(data[name])


def maybe(kind: type[GiteaValue]) -> Reader:
    """A value, None when absent or not an object (null)."""
    return lambda data, name: kind.from_json(found) if isinstance(found := data.get(name), Mapping) else None


def each(kind: type[GiteaValue]) -> Reader:
    """Every value of a list, () when absent or null."""
    return lambda data, name: tuple(kind.from_json(item) for item in data.get(name) or ())


#: The fields most answers have, by how they are read.
Int = Annotated[int, integer]
Count = Annotated[int, count]
Str = Annotated[str, word]
Text = Annotated[str, text]
Flag = Annotated[bool, flag]
When = Annotated[datetime | None, moment]


@dataclass(frozen=True, slots=True)
class GiteaValue:
    """A value read from one of Gitea's JSON answers, which ``raw`` keeps."""

    raw: Json = field(repr=False, compare=False, kw_only=True)

    @classmethod
    def from_json(cls, data: Json) -> Self:
        """Parse the answer: each field by its reader, in the order the fields are declared."""
        return cls(*[read(data, name) for name, read in _readers(cls)], raw=data)


#: ``_readers`` by class, read from its annotations once.
_READERS: dict[type[GiteaValue], tuple[tuple[str, Reader], ...]] = {}


def _readers(cls: type[GiteaValue]) -> tuple[tuple[str, Reader], ...]:
    """(field name, reader) of every field of ``cls`` but ``raw``, in declaration order."""
    found = _READERS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls, include_extras=True)
        found = tuple((f.name, hints[f.name].__metadata__[0]) for f in dataclasses.fields(cls) if f.name != "raw")
        _READERS[cls] = found
    return found


def _login(data: Json, name: str) -> str:
    return str(data.get("login") or data.get("username") or "")


@dataclass(frozen=True, slots=True)
class User(GiteaValue):
    """A Gitea account (``login`` is what to compare; payload e-mails may be placeholders)."""

    id: Int
    login: Annotated[str, _login]
    full_name: Text
    email: Text
    is_admin: Flag


def _color(data: Json, name: str) -> str:
    return str(data.get("color") or "").lstrip("#")


@dataclass(frozen=True, slots=True)
class Label(GiteaValue):
    """A repository label; ``color`` is hex without ``#``."""

    id: Int
    name: Str
    color: Annotated[str, _color]
    description: Text
    exclusive: Flag
    is_archived: Flag


@dataclass(frozen=True, slots=True)
class Posted(GiteaValue):
    """What an issue and a pull request both begin with: who posted what, where it stands, and its labels."""

    id: Int
    number: Int
    title: Text
    body: Text
    state: Annotated[str, text_or("open")]
    user: Annotated[User, one(User)]
    labels: Annotated[tuple[Label, ...], each(Label)]

    @property
    def label_names(self) -> frozenset[str]:
        """The names of its labels."""
        return frozenset(label.name for label in self.labels)


def _is_pull(data: Json, name: str) -> bool:
    return data.get("pull_request") is not None


@dataclass(frozen=True, slots=True)
class Issue(Posted):
    """An issue, or a pull request when ``is_pull`` (Gitea's non-null ``pull_request``); ``assignees`` may be null."""

    assignees: Annotated[tuple[User, ...], each(User)]
    is_pull: Annotated[bool, _is_pull]
    comments: Count
    created_at: When
    updated_at: When
    closed_at: When
    html_url: Text
    content_version: Count


def _units(data: Json, name: str) -> Mapping[str, str]:
    units = data.get("units_map") or {}
    return {str(k): str(v) for k, v in units.items()} if isinstance(units, Mapping) else {}


@dataclass(frozen=True, slots=True)
class Team(GiteaValue):
    """An organization team: ``permission`` is its access mode, ``units_map`` the per-unit modes."""

    id: Int
    name: Text
    permission: Annotated[str, text_or("none")]
    units_map: Annotated[Mapping[str, str], _units]


@dataclass(frozen=True, slots=True)
class Comment(GiteaValue):
    """A plain issue or PR comment."""

    id: Int
    body: Text
    user: Annotated[User, one(User)]
    created_at: When
    updated_at: When
    html_url: Text


def _owner(data: Json, name: str) -> str:
    owner = data.get("owner") or {}
    return str(owner.get("login") or "") if isinstance(owner, Mapping) else str(owner)


@dataclass(frozen=True, slots=True)
class Repository(GiteaValue):
    """A repository; clone from ``clone_url`` as reported, never from an assembled URL."""

    id: Int
    owner: Annotated[str, _owner]
    name: Str
    full_name: Text
    default_branch: Text
    clone_url: Text
    html_url: Text
    private: Flag


@dataclass(frozen=True, slots=True)
class Branch(GiteaValue):
    """A branch and its head commit."""

    name: Str
    commit_id: Annotated[str, inner("commit", "id")]
    commit_message: Annotated[str, inner("commit", "message")]
    protected: Flag


def _events(data: Json, name: str) -> tuple[str, ...]:
    return tuple(str(e) for e in data.get("events") or ())


@dataclass(frozen=True, slots=True)
class Hook(GiteaValue):
    """A repository webhook (the secret is never returned)."""

    id: Int
    type: Text
    active: Flag
    events: Annotated[tuple[str, ...], _events]
    url: Annotated[str, inner("config", "url")]


def _merge_commit_sha(data: Json, name: str) -> str | None:
    return str(data["merge_commit_sha"]) if data.get("merge_commit_sha") else None


@dataclass(frozen=True, slots=True)
class PullRequest(Posted):
    """A pull request (``PullRequest`` JSON): ``head_sha`` is what ``merge_pull(head_commit_id=...)`` pins. head and
    base are ``PRBranchInfo``; ``merged_by`` may be null."""

    head_ref: Annotated[str, inner("head", "ref")]
    head_sha: Annotated[str, inner("head", "sha")]
    base_ref: Annotated[str, inner("base", "ref")]
    base_sha: Annotated[str, inner("base", "sha")]
    #: Where head and base last met (Gitea recomputes it when it re-checks the PR): behind its base when it is not
    #: ``base_sha``.
    merge_base: Text
    mergeable: Flag
    merged: Flag
    merged_at: When
    merge_commit_sha: Annotated[str | None, _merge_commit_sha]
    merged_by: Annotated[User | None, maybe(User)]
    html_url: Text


@dataclass(frozen=True, slots=True)
class Review(GiteaValue):
    """A pull-request review: ``state`` is APPROVED, REQUEST_CHANGES, COMMENT, PENDING or REQUEST_REVIEW; ``user``
    is null for a team review request."""

    id: Int
    user: Annotated[User | None, maybe(User)]
    state: Text
    body: Text
    commit_id: Text
    stale: Flag
    official: Flag
    dismissed: Flag
    submitted_at: When


def _names(data: Json, name: str) -> tuple[str, ...]:
    return tuple(str(item) for item in data.get(name) or () if isinstance(item, str))


def _rule_name(data: Json, name: str) -> str:
    # ``rule_name`` since 1.19; ``branch_name`` (deprecated) carries the same text.
    return str(data.get("rule_name") or data.get("branch_name") or "")


@dataclass(frozen=True, slots=True)
class BranchProtection(GiteaValue):
    """A branch protection rule (``BranchProtection`` JSON, routers/api/v1/repo/branch.go): what Gitea asks of a
    merge into the branches its ``rule_name`` matches (a plain name or a glob)."""

    rule_name: Annotated[str, _rule_name]
    priority: Count
    required_approvals: Count
    enable_approvals_whitelist: Flag
    approvals_whitelist_username: Annotated[tuple[str, ...], _names]
    approvals_whitelist_teams: Annotated[tuple[str, ...], _names]
    block_on_rejected_reviews: Flag
    block_on_official_review_requests: Flag
    block_on_outdated_branch: Flag
    dismiss_stale_approvals: Flag
    ignore_stale_approvals: Flag
    enable_merge_whitelist: Flag
    merge_whitelist_usernames: Annotated[tuple[str, ...], _names]
    merge_whitelist_teams: Annotated[tuple[str, ...], _names]
    enable_status_check: Flag
    status_check_contexts: Annotated[tuple[str, ...], _names]
    created_at: When


def _state(data: Json, name: str) -> str:
    # ``CommitStatus.status`` (the state); a combined status names it ``state``.
    return str(data.get("status") or data.get("state") or "")


@dataclass(frozen=True, slots=True)
class CommitStatus(GiteaValue):
    """One commit status (``CommitStatus`` JSON): a CI context's state on a commit, with where to read more."""

    id: Count
    context: Text
    state: Annotated[str, _state]
    target_url: Text
    description: Text
    created_at: When


@dataclass(frozen=True, slots=True)
class CombinedStatus(GiteaValue):
    """A commit's combined status (``CombinedStatus`` JSON): the latest status of each context and their
    combination (``state``: pending, success, failure, ...; empty when the commit has none)."""

    sha: Text
    state: Text
    statuses: Annotated[tuple[CommitStatus, ...], each(CommitStatus)]
    total_count: Count


@dataclass(frozen=True, slots=True)
class ChangedFile(GiteaValue):
    """One file a pull request changes (``ChangedFile`` JSON; services/convert/convert.go ``ToChangedFile``):
    ``status`` is added, deleted, renamed (with ``previous_filename``), copied, changed or unchanged."""

    filename: Text
    status: Text
    additions: Count
    deletions: Count
    changes: Count
    previous_filename: Text
    html_url: Text


@dataclass(frozen=True, slots=True)
class ReviewComment(GiteaValue):
    """A code comment of a review (``PullReviewComment`` JSON; services/convert/pull_review.go
    ``ToPullReviewComment``): on ``path``, at new-side line ``position`` or old-side ``original_position`` (the
    other is 0)."""

    id: Int
    body: Text
    user: Annotated[User | None, maybe(User)]
    path: Text
    position: Count
    original_position: Count
    commit_id: Text
    diff_hunk: Text
    pull_request_review_id: Count
    created_at: When
    updated_at: When
    html_url: Text
