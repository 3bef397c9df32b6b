"""The Gitea emulator's tables, clock and version, and the lookups over them."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta, timezone, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from bot.emulator import convert
from bot.emulator.faults import Faults
from bot.emulator.model import (
    PERM_LEVEL,
    EmuComment,
    EmuIssue,
    EmuLabel,
    EmuOrgHook,
    EmuRepo,
    EmuSystemHook,
    EmuTeam,
    EmuUser,
    Perm,
)
from bot.emulator.webhooks import WebhookSender

if TYPE_CHECKING:
    from aiohttp import web

    from bot.emulator.api import RecordedRequest

GITEA_VERSION: Final = "1.26.3"
DEFAULT_TZ: Final = timezone(timedelta(hours=-5))
JSON = dict[str, Any]


class ApiError(Exception):
    """A refusal the API answers as Gitea's JSON error ``{"message", "url"}`` with ``status``."""

    def __init__(self, status: int, message: str, *, bare: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        #: ``ctx.Status(status)``: the status alone, with an empty body (several of Gitea's 403s and 400s).
        self.bare = bare


@dataclass
class _Ids:
    """Per-table id sequences, as Gitea's autoincrement columns."""

    user: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    repo: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    label: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    issue: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    comment: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    hook: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    team: Iterator[int] = field(default_factory=lambda: itertools.count(1))


class EmulatorState:
    """The emulator's in-memory tables (users, repositories, labels, comments, teams) and their lookups."""

    def __init__(
        self,
        root: str | Path,
        *,
        app_url: str = "http://localhost:3000/",
        root_url: str | None = None,
        clone_protocol: Literal["file", "http"] = "file",
        tz: tzinfo = DEFAULT_TZ,
        clock: Callable[[], float] = time.time,
        webhook_workers: int = 4,
        webhook_timeout_s: float = 5.0,
        version: str = GITEA_VERSION,
    ) -> None:
        self.root = Path(root)
        #: ``[server] ROOT_URL`` (``setting.AppURL``): Link headers, html and API urls are built from it.
        #: With ``root_url`` given it stays put when the emulator is served on another address (as a Gitea
        #: behind a proxy or reached by an internal name); otherwise serving sets it to the listen address.
        self.app_url = (root_url or app_url).rstrip("/") + "/"
        self.root_url_fixed = root_url is not None
        #: ``file``: clone URLs are the bare repositories' ``file://`` URLs (an explicit option); ``http``:
        #: http(s) URLs by version rules, served as git smart HTTP with token auth (bot/emulator/githttp.py).
        self.clone_protocol = clone_protocol
        #: The address the emulator listens on (set by ``start_emulator``).
        self.listen_url = self.app_url.rstrip("/")
        self.tz = tz
        self.version = version
        self.faults = Faults()
        self.requests: list[RecordedRequest] = []
        self._clock = clock
        self._sender = WebhookSender(workers=webhook_workers, timeout_s=webhook_timeout_s)
        self._ids = _Ids()
        self._users: dict[str, EmuUser] = {}
        self._tokens: dict[str, EmuUser] = {}
        self._repos: dict[tuple[str, str], EmuRepo] = {}
        self._repos_by_id: dict[int, EmuRepo] = {}
        self._labels: dict[int, EmuLabel] = {}
        self._comments: dict[int, EmuComment] = {}
        self._teams: dict[int, EmuTeam] = {}
        self._org_hooks: list[EmuOrgHook] = []
        self._system_hooks: list[EmuSystemHook] = []
        self._app: web.Application | None = None

    def now(self) -> int:
        """The emulator clock in unix seconds (Gitea stores whole seconds)."""
        return int(self._clock())

    def at_least(self, version: str) -> bool:
        """Whether the emulated Gitea is ``version`` or newer (``1.25``, ``1.22.3``)."""
        return _version_key(self.version) >= _version_key(version)

    # --- lookups ------------------------------------------------------------------------------------------------------

    def user(self, login: str) -> EmuUser:
        """The user called ``login`` (case-insensitive); KeyError when missing."""
        return self._users[login.lower()]

    def users(self) -> list[EmuUser]:
        """Every account, organizations included, by id."""
        return sorted(self._users.values(), key=lambda u: u.id)

    def repos(self) -> list[EmuRepo]:
        """Every repository, by id."""
        return sorted(self._repos.values(), key=lambda r: r.id)

    def find_user(self, login: str) -> EmuUser | None:
        """The user called ``login``, or None."""
        return self._users.get(login.lower())

    def user_by_token(self, token: str) -> EmuUser | None:
        """The owner of an access token, or None."""
        return self._tokens.get(token)

    def user_by_email(self, email: str) -> EmuUser | None:
        """The user with this e-mail address, or None."""
        return next((u for u in self._users.values() if u.email.lower() == email.lower()), None)

    def repo(self, owner: str, name: str) -> EmuRepo:
        """The repository ``owner/name`` (case-insensitive); KeyError when missing."""
        return self._repos[(owner.lower(), name.lower())]

    def find_repo(self, owner: str, name: str) -> EmuRepo | None:
        """The repository ``owner/name``, or None."""
        return self._repos.get((owner.lower(), name.lower()))

    def repo_by_id(self, repo_id: int) -> EmuRepo:
        """The repository with this id."""
        return self._repos_by_id[repo_id]

    def issue(self, owner: str, name: str, number: int) -> EmuIssue:
        """Issue or PR ``number`` of ``owner/name``; KeyError when missing."""
        return self.repo(owner, name).issues[number]

    def comment(self, comment_id: int) -> EmuComment | None:
        """The timeline item with this id (plain comment or not), or None."""
        return self._comments.get(comment_id)

    def label(self, label_id: int) -> EmuLabel | None:
        """The label with this id in any repository, or None."""
        return self._labels.get(label_id)

    def label_names(self, owner: str, name: str, number: int) -> list[str]:
        """Names of the labels on an issue, ordered by name."""
        return [label.name for label in convert.issue_labels(self, self.issue(owner, name, number))]

    def perm_of(self, repo: EmuRepo, user: EmuUser | None) -> Perm:
        """The access mode the permission API reports (models/perm/access/repo_permission.go
        ``GetIndividualUserRepoPermission(...).AccessMode``): site admins, the owner and org owners get
        ``owner``; otherwise the highest of the collaborator grant and the *teams'* AccessMode (the access
        table, ``RecalculateTeamAccesses``). A team's per-unit Write never raises it; a public repository
        gives everyone at least ``read``."""
        if user is None:
            return "none" if repo.private else "read"
        if user.admin or user.id == repo.owner.id:
            return "owner"
        if repo.owner.is_org and self.is_org_owner(repo.owner, user):
            return "owner"
        modes: list[Perm] = [repo.perms.get(user.id, "none")]
        modes += [t.access for t in self.teams_of(repo.owner) if t.covers(repo) and user in t.members]
        if not repo.private:
            modes.append("read")
        return max(modes, key=lambda m: PERM_LEVEL[m])

    def unit_perm(self, repo: EmuRepo, user: EmuUser | None, unit: str) -> Perm:
        """The mode on one unit (``Permission.UnitAccessMode``): the access mode, raised by the per-unit modes
        of the user's teams (a "general access: read" team with Write on Issues gives ``write`` here)."""
        base = self.perm_of(repo, user)
        if user is None or not repo.owner.is_org or PERM_LEVEL[base] >= PERM_LEVEL["admin"]:
            return base
        modes: list[Perm] = [base]
        modes += [t.unit_mode(unit) for t in self.teams_of(repo.owner) if t.covers(repo) and user in t.members]
        return max(modes, key=lambda m: PERM_LEVEL[m])

    def team(self, team_id: int) -> EmuTeam | None:
        """The team with this id, or None."""
        return self._teams.get(team_id)

    def teams_of(self, org: EmuUser) -> list[EmuTeam]:
        """The org's teams, by id."""
        return [t for t in self._teams.values() if t.org is org]

    def is_org_owner(self, org: EmuUser, user: EmuUser) -> bool:
        """A member of the org's Owners team (``IsOrganizationOwner``)."""
        return any(t.access == "owner" and user in t.members for t in self.teams_of(org))

    def is_org_member(self, org: EmuUser, user: EmuUser) -> bool:
        """A member of any of the org's teams (``IsOrganizationMember``)."""
        return any(user in t.members for t in self.teams_of(org))

    def org_labels(self, org: EmuUser) -> list[EmuLabel]:
        """The org's labels."""
        return [label for label in self._labels.values() if label.org_id == org.id and org.id]


def _version_key(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("+", 1)[0].split("-", 1)[0].split("."):
        parts.append(int(part) if part.isdigit() else 0)
    return tuple(parts + [0] * (3 - len(parts)))
