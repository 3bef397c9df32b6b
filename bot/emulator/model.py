"""In-memory records of the Gitea emulator: users, repositories, labels, issues, comments and hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

Perm = Literal["none", "read", "write", "admin", "owner"]
PERM_LEVEL: Final[dict[str, int]] = {"none": 0, "read": 1, "write": 2, "admin": 3, "owner": 4}
#: Timeline item kinds that are not plain comments (they take comment ids, but the comment API skips them).
TimelineKind = Literal["comment", "label", "close", "reopen", "assignees", "change_title", "dismiss_review"]


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
    #: An organization (``User.IsOrganization()``): owns repositories, labels and teams; cannot log in.
    is_org: bool = False


@dataclass(eq=False)
class EmuLabel:
    """A repository label."""

    id: int
    repo_id: int  # 0 for an organization label
    name: str
    color: str
    description: str
    exclusive: bool
    is_archived: bool = False
    org_id: int = 0  # the owning organization's id for an org label (``Label.BelongsToOrg``)

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
class EmuOrgHook:
    """An organization's webhook (``POST /orgs/{org}/hooks``): Gitea sends it every event of every repository
    the organization owns, besides the repository's own hooks (services/webhook/webhook.go ``PrepareWebhooks``:
    the repository's hooks, then its owner's when that is an organization), with the installation-target headers
    saying ``organization``."""

    id: int
    org: EmuUser
    url: str
    secret: str
    events: frozenset[str]
    content_type: str = "json"
    active: bool = True


@dataclass(eq=False)
class EmuSystemHook:
    """A site administrator's system webhook (``POST /admin/hooks`` with ``config.is_system_webhook = "true"``):
    Gitea sends it every event of every repository on the instance, whoever owns it, after the repository's and its
    owner's hooks (``PrepareWebhooks`` appends ``GetSystemWebhooks``), with the installation-target headers saying
    ``system`` (services/webhook/deliver.go)."""

    id: int
    url: str
    secret: str
    events: frozenset[str]
    content_type: str = "json"
    active: bool = True


#: Repository unit names as the team API spells them (``unit.Type.Name``/``units_map`` keys).
UNITS: Final = (
    "repo.code",
    "repo.issues",
    "repo.pulls",
    "repo.releases",
    "repo.wiki",
    "repo.ext_wiki",
    "repo.ext_issues",
    "repo.projects",
    "repo.packages",
    "repo.actions",
)


@dataclass(eq=False)
class EmuTeam:
    """An organization team (models/organization/team.go): ``access`` is the team's ``AccessMode`` (UI-made
    teams are ``read`` "general access" or ``admin``; the Owners team is ``owner``), ``units`` the per-unit
    modes (``team_unit``), which for a ``read`` team may be ``write`` on some units."""

    id: int
    org: EmuUser
    name: str
    access: Perm
    units: dict[str, Perm]
    members: list[EmuUser] = field(default_factory=list)
    repo_ids: set[int] = field(default_factory=set)
    includes_all: bool = False
    description: str = ""

    def covers(self, repo: EmuRepo) -> bool:
        """Whether the team has access to ``repo`` (``team_repo``, or every repository of the org)."""
        return repo.owner is self.org and (self.includes_all or repo.id in self.repo_ids)

    def unit_mode(self, unit: str) -> Perm:
        """``Team.UnitAccessMode``: admin/owner teams have their mode on every unit."""
        if PERM_LEVEL[self.access] >= PERM_LEVEL["admin"]:
            return self.access
        return self.units.get(unit, "none")


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
    #: Archived (read-only); ``archived_at`` its unix time.
    archived_at: int = 0

    @property
    def full_name(self) -> str:
        """``owner/name``."""
        return f"{self.owner.login}/{self.name}"
