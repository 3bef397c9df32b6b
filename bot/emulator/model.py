"""In-memory records of the Gitea emulator: users, repositories, labels, issues, comments and hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

Perm = Literal["none", "read", "write", "admin", "owner"]
PERM_LEVEL: Final[dict[str, int]] = {"none": 0, "read": 1, "write": 2, "admin": 3, "owner": 4}
#: Timeline item kinds that are not plain comments (they take comment ids, but the comment API skips them).
TimelineKind = Literal["comment", "label", "close", "reopen", "assignees", "change_title"]


@dataclass(eq=False)
class EmuUser:
    """A Gitea account and its access token."""

    id: int
    login: str
    token: str | None
    admin: bool
    full_name: str
    email: str
    created: int


@dataclass(eq=False)
class EmuLabel:
    """A repository label."""

    id: int
    repo_id: int
    name: str
    color: str
    description: str
    exclusive: bool
    is_archived: bool = False

    @property
    def exclusive_scope(self) -> str:
        """Gitea's ``Label.ExclusiveScope()``: the part before the last ``/`` of an exclusive label."""
        if not self.exclusive:
            return ""
        cut = self.name.rfind("/")
        if cut <= 0 or cut == len(self.name) - 1:
            return ""
        return self.name[:cut]


@dataclass(eq=False)
class EmuComment:
    """A timeline item; only ``kind == "comment"`` is a plain comment visible to the comment API."""

    id: int
    issue: EmuIssue
    poster: EmuUser
    body: str
    created: int
    updated: int
    kind: TimelineKind = "comment"


@dataclass(eq=False)
class EmuIssue:
    """An issue or, with ``is_pull``, a pull request (they share the per-repo number sequence)."""

    id: int
    repo: EmuRepo
    number: int
    title: str
    body: str
    poster: EmuUser
    is_pull: bool
    created: int
    updated: int
    closed: int | None = None
    label_ids: list[int] = field(default_factory=list)
    assignees: list[EmuUser] = field(default_factory=list)
    is_locked: bool = False
    content_version: int = 0
    head_branch: str = ""
    base_branch: str = ""
    timeline: list[EmuComment] = field(default_factory=list)

    @property
    def state(self) -> str:
        """``open`` or ``closed``."""
        return "closed" if self.closed is not None else "open"

    @property
    def comments(self) -> list[EmuComment]:
        """The plain comments, oldest first."""
        return [c for c in self.timeline if c.kind == "comment"]


@dataclass(eq=False)
class EmuHook:
    """A repository webhook created through the API."""

    id: int
    repo: EmuRepo
    url: str
    content_type: str
    secret: str
    events: frozenset[str]
    active: bool
    type: str = "gitea"
    branch_filter: str = ""
    authorization_header: str = ""
    name: str = ""
    created: int = 0
    updated: int = 0


@dataclass(eq=False)
class EmuRepo:
    """A repository, backed by the bare git repository at ``path``."""

    id: int
    owner: EmuUser
    name: str
    path: Path
    default_branch: str
    private: bool
    description: str
    created: int
    updated: int
    perms: dict[int, Perm] = field(default_factory=dict)
    labels: dict[int, EmuLabel] = field(default_factory=dict)
    issues: dict[int, EmuIssue] = field(default_factory=dict)
    hooks: list[EmuHook] = field(default_factory=list)
    next_number: int = 1

    @property
    def full_name(self) -> str:
        """``owner/name``."""
        return f"{self.owner.login}/{self.name}"
