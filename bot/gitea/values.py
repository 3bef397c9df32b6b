"""Typed values parsed from Gitea's JSON answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class User:
    """A Gitea account (``login`` is what to compare; payload e-mails may be placeholders)."""

    id: int
    login: str
    full_name: str
    email: str
    is_admin: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> User:
        """Parse ``User`` JSON."""
        return cls(
            id=int(data["id"]),
            login=str(data.get("login") or data.get("username") or ""),
            full_name=str(data.get("full_name") or ""),
            email=str(data.get("email") or ""),
            is_admin=bool(data.get("is_admin", False)),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Label:
    """A repository label; ``color`` is hex without ``#``."""

    id: int
    name: str
    color: str
    description: str
    exclusive: bool
    is_archived: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Label:
        """Parse ``Label`` JSON."""
        return cls(
            id=int(data["id"]),
            name=str(data["name"]),
            color=str(data.get("color") or "").lstrip("#"),
            description=str(data.get("description") or ""),
            exclusive=bool(data.get("exclusive", False)),
            is_archived=bool(data.get("is_archived", False)),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Issue:
    """An issue, or a pull request when ``is_pull`` (Gitea's non-null ``pull_request``)."""

    id: int
    number: int
    title: str
    body: str
    state: str
    user: User
    labels: tuple[Label, ...]
    assignees: tuple[User, ...]
    is_pull: bool
    comments: int
    created_at: datetime | None
    updated_at: datetime | None
    closed_at: datetime | None
    html_url: str
    content_version: int
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def label_names(self) -> frozenset[str]:
        """The names of the issue's labels."""
        return frozenset(label.name for label in self.labels)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Issue:
        """Parse ``Issue`` JSON (``assignees`` may be null)."""
        return cls(
            id=int(data["id"]),
            number=int(data["number"]),
            title=str(data.get("title") or ""),
            body=str(data.get("body") or ""),
            state=str(data.get("state") or "open"),
            user=User.from_json(data["user"]),
            labels=tuple(Label.from_json(x) for x in data.get("labels") or ()),
            assignees=tuple(User.from_json(x) for x in data.get("assignees") or ()),
            is_pull=data.get("pull_request") is not None,
            comments=int(data.get("comments") or 0),
            created_at=_time(data.get("created_at")),
            updated_at=_time(data.get("updated_at")),
            closed_at=_time(data.get("closed_at")),
            html_url=str(data.get("html_url") or ""),
            content_version=int(data.get("content_version") or 0),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Team:
    """An organization team: ``permission`` is its access mode, ``units_map`` the per-unit modes."""

    id: int
    name: str
    permission: str
    units_map: Mapping[str, str]
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Team:
        """Parse ``Team`` JSON."""
        units = data.get("units_map") or {}
        return cls(
            id=int(data["id"]),
            name=str(data.get("name") or ""),
            permission=str(data.get("permission") or "none"),
            units_map={str(k): str(v) for k, v in units.items()} if isinstance(units, Mapping) else {},
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Comment:
    """A plain issue or PR comment."""

    id: int
    body: str
    user: User
    created_at: datetime | None
    updated_at: datetime | None
    html_url: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Comment:
        """Parse ``Comment`` JSON."""
        return cls(
            id=int(data["id"]),
            body=str(data.get("body") or ""),
            user=User.from_json(data["user"]),
            created_at=_time(data.get("created_at")),
            updated_at=_time(data.get("updated_at")),
            html_url=str(data.get("html_url") or ""),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Repository:
    """A repository; clone from ``clone_url`` as reported, never from an assembled URL."""

    id: int
    owner: str
    name: str
    full_name: str
    default_branch: str
    clone_url: str
    html_url: str
    private: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Repository:
        """Parse ``Repository`` JSON."""
        owner = data.get("owner") or {}
        return cls(
            id=int(data["id"]),
            owner=str(owner.get("login") or "") if isinstance(owner, Mapping) else str(owner),
            name=str(data["name"]),
            full_name=str(data.get("full_name") or ""),
            default_branch=str(data.get("default_branch") or ""),
            clone_url=str(data.get("clone_url") or ""),
            html_url=str(data.get("html_url") or ""),
            private=bool(data.get("private", False)),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Branch:
    """A branch and its head commit."""

    name: str
    commit_id: str
    commit_message: str
    protected: bool
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Branch:
        """Parse ``Branch`` JSON."""
        commit = data.get("commit") or {}
        return cls(
            name=str(data["name"]),
            commit_id=str(commit.get("id") or ""),
            commit_message=str(commit.get("message") or ""),
            protected=bool(data.get("protected", False)),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Hook:
    """A repository webhook (the secret is never returned)."""

    id: int
    type: str
    active: bool
    events: tuple[str, ...]
    url: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Hook:
        """Parse ``Hook`` JSON."""
        config = data.get("config") or {}
        return cls(
            id=int(data["id"]),
            type=str(data.get("type") or ""),
            active=bool(data.get("active", False)),
            events=tuple(str(e) for e in data.get("events") or ()),
            url=str(config.get("url") or ""),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class PullRequest:
    """A pull request (``PullRequest`` JSON): ``head_sha`` is what ``merge_pull(head_commit_id=...)`` pins."""

    id: int
    number: int
    title: str
    body: str
    state: str
    user: User
    labels: tuple[Label, ...]
    head_ref: str
    head_sha: str
    base_ref: str
    base_sha: str
    mergeable: bool
    merged: bool
    merged_at: datetime | None
    merge_commit_sha: str | None
    merged_by: User | None
    html_url: str
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def label_names(self) -> frozenset[str]:
        """The names of the PR's labels."""
        return frozenset(label.name for label in self.labels)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PullRequest:
        """Parse ``PullRequest`` JSON (head/base are ``PRBranchInfo``; ``merged_by`` may be null)."""
        head = data.get("head") or {}
        base = data.get("base") or {}
        merged_by = data.get("merged_by")
        return cls(
            id=int(data["id"]),
            number=int(data["number"]),
            title=str(data.get("title") or ""),
            body=str(data.get("body") or ""),
            state=str(data.get("state") or "open"),
            user=User.from_json(data["user"]),
            labels=tuple(Label.from_json(x) for x in data.get("labels") or ()),
            head_ref=str(head.get("ref") or ""),
            head_sha=str(head.get("sha") or ""),
            base_ref=str(base.get("ref") or ""),
            base_sha=str(base.get("sha") or ""),
            mergeable=bool(data.get("mergeable", False)),
            merged=bool(data.get("merged", False)),
            merged_at=_time(data.get("merged_at")),
            merge_commit_sha=str(data["merge_commit_sha"]) if data.get("merge_commit_sha") else None,
            merged_by=User.from_json(merged_by) if isinstance(merged_by, Mapping) else None,
            html_url=str(data.get("html_url") or ""),
            raw=data,
        )


@dataclass(frozen=True, slots=True)
class Review:
    """A pull-request review: ``state`` is APPROVED, REQUEST_CHANGES, COMMENT, PENDING or REQUEST_REVIEW."""

    id: int
    user: User | None
    state: str
    body: str
    commit_id: str
    stale: bool
    official: bool
    dismissed: bool
    submitted_at: datetime | None
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Review:
        """Parse ``PullReview`` JSON (``user`` is null for a team review request)."""
        user = data.get("user")
        return cls(
            id=int(data["id"]),
            user=User.from_json(user) if isinstance(user, Mapping) else None,
            state=str(data.get("state") or ""),
            body=str(data.get("body") or ""),
            commit_id=str(data.get("commit_id") or ""),
            stale=bool(data.get("stale", False)),
            official=bool(data.get("official", False)),
            dismissed=bool(data.get("dismissed", False)),
            submitted_at=_time(data.get("submitted_at")),
            raw=data,
        )
