"""The Gitea emulator's state and operations: what a change does, and which webhooks it sends."""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta, timezone, tzinfo
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from bot.emulator import convert, gitrepo
from bot.emulator.faults import Faults
from bot.emulator.model import (
    PERM_LEVEL,
    UNITS,
    EmuComment,
    EmuHook,
    EmuIssue,
    EmuLabel,
    EmuRepo,
    EmuTeam,
    EmuUser,
    Perm,
    TimelineKind,
)
from bot.emulator.webhooks import Delivery, HookTarget, WebhookSender, expand_hook_events

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


class Emulator:
    """An in-memory Gitea v1.26.3 for the API subset the bot uses, with repositories on disk.

    Setup helpers (``add_user``, ``create_repo``, ``create_issue``, ...) change state directly and send
    webhooks only when asked (``notify=True``). Changes made through the HTTP API (``app``) always send
    webhooks to the repository's active hooks, in the background; ``await drain_webhooks()`` waits for
    them and ``deliveries`` records every attempt. ``faults`` arms injected failures; ``requests``
    records every HTTP request the app served.
    """

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
        self._app: web.Application | None = None

    # ------------------------------------------------------------------ serving and webhooks

    @property
    def app(self) -> web.Application:
        """The aiohttp application serving ``/api/v1`` (built once)."""
        if self._app is None:
            from bot.emulator.api import build_app

            self._app = build_app(self)
        return self._app

    @property
    def base_url(self) -> str:
        """The server root without a trailing slash (what a client's ``base_url`` is)."""
        return self.app_url.rstrip("/")

    @property
    def deliveries(self) -> list[Delivery]:
        """Every webhook delivery attempt so far, in the order they were queued."""
        return self._sender.deliveries

    async def drain_webhooks(self) -> list[Delivery]:
        """Wait until every pending delivery has finished; returns all deliveries so far."""
        await self._sender.drain()
        return self.deliveries

    def replay_delivery(self, delivery_id: str) -> Delivery:
        """Gitea's UI "Replay": send the same body again under a new delivery uuid."""
        original = next(d for d in self.deliveries if d.delivery_id == delivery_id)
        hook = next(h for r in self._repos.values() for h in r.hooks if h.id == original.hook_id)
        return self._sender.replay(original, _target(hook, self))

    async def aclose(self) -> None:
        """Stop pending deliveries and release the delivery HTTP session."""
        await self._sender.close()

    def now(self) -> int:
        """The emulator clock in unix seconds (Gitea stores whole seconds)."""
        return int(self._clock())

    # ------------------------------------------------------------------ setup helpers (no HTTP)

    def add_user(
        self,
        login: str,
        *,
        token: str | None = None,
        admin: bool = False,
        full_name: str = "",
        email: str | None = None,
    ) -> EmuUser:
        """Create an account; ``token`` (generated when omitted) authenticates it on the API."""
        if login.lower() in self._users:
            raise ValueError(f"user {login!r} exists")
        host = self.app_url.split("//", 1)[-1].split("/", 1)[0].split(":", 1)[0] or "localhost"
        user = EmuUser(
            id=next(self._ids.user),
            login=login,
            token=token if token is not None else secrets.token_hex(20),
            admin=admin,
            full_name=full_name,
            email=email or f"{login.lower()}@{host}",
            created=self.now(),
        )
        self._users[login.lower()] = user
        if user.token:
            self._tokens[user.token] = user
        return user

    def add_org(self, name: str, *, full_name: str = "") -> EmuUser:
        """Create an organization (an account that owns repositories, labels and teams; no token), with
        its Owners team (``access="owner"``), as models/organization/org.go ``CreateOrganization`` does."""
        org = self.add_user(name, token="", full_name=full_name)
        org.is_org = True
        self.add_team(name, "Owners", access="owner", includes_all=True)
        return org

    def make_org(self, name: str) -> EmuUser:
        """Turn an existing account into an organization (for worlds seeded with a user owner)."""
        user = self.user(name)
        if user.token:
            self._tokens.pop(user.token, None)
            user.token = ""
        user.is_org = True
        if not any(t.org is user and t.access == "owner" for t in self._teams.values()):
            self.add_team(name, "Owners", access="owner", includes_all=True)
        return user

    def add_team(
        self,
        org: str,
        name: str,
        *,
        access: Perm = "read",
        units: Mapping[str, Perm] | None = None,
        members: Sequence[str] = (),
        repos: Sequence[str] = (),
        includes_all: bool = False,
    ) -> EmuTeam:
        """A team of ``org``: ``access`` is the team's AccessMode, ``units`` the per-unit modes (default:
        ``access`` on every unit), ``repos`` the repository names it covers."""
        owner = self.user(org)
        team = EmuTeam(
            id=next(self._ids.team),
            org=owner,
            name=name,
            access=access,
            units=dict(units) if units is not None else dict.fromkeys(UNITS, access),
            members=[self.user(m) for m in members],
            repo_ids={self.repo(org, r).id for r in repos},
            includes_all=includes_all,
        )
        self._teams[team.id] = team
        return team

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

    def create_org_label(
        self, org: str, label: str, *, color: str = "#ee0701", description: str = "", exclusive: bool = False
    ) -> EmuLabel:
        """An organization label (usable on every repository of the org)."""
        owner = self.user(org)
        made = EmuLabel(
            id=next(self._ids.label),
            repo_id=0,
            org_id=owner.id,
            name=label,
            color=color if color.startswith("#") else f"#{color}",
            description=description,
            exclusive=exclusive,
        )
        self._labels[made.id] = made
        return made

    def org_labels(self, org: EmuUser) -> list[EmuLabel]:
        """The org's labels."""
        return [label for label in self._labels.values() if label.org_id == org.id and org.id]

    def delete_label(self, owner: str, name: str, label: str) -> None:
        """Delete a repository label (and take it off every issue), as ``DELETE /repos/.../labels/{id}``."""
        repo = self.repo(owner, name)
        for found in [x for x in repo.labels.values() if x.name == label]:
            del repo.labels[found.id]
            del self._labels[found.id]
            for issue in repo.issues.values():
                if found.id in issue.label_ids:
                    issue.label_ids.remove(found.id)

    def create_repo(
        self,
        owner: str,
        name: str,
        *,
        default_branch: str = "main",
        files: Mapping[str, str | bytes] | None = None,
        private: bool = False,
        description: str = "",
    ) -> EmuRepo:
        """Create a repository with a real bare git repository holding one commit of ``files``."""
        owner_user = self.user(owner)
        if (owner.lower(), name.lower()) in self._repos:
            raise ValueError(f"repository {owner}/{name} exists")
        path = self.root / owner_user.login / f"{name}.git"
        gitrepo.init_bare(path, default_branch=default_branch, files=files or {"README.md": f"# {name}\n"})
        now = self.now()
        repo = EmuRepo(
            id=next(self._ids.repo),
            owner=owner_user,
            name=name,
            path=path,
            default_branch=default_branch,
            private=private,
            description=description,
            created=now,
            updated=now,
        )
        self._repos[(owner.lower(), name.lower())] = repo
        self._repos_by_id[repo.id] = repo
        return repo

    def create_branch(
        self,
        owner: str,
        name: str,
        branch: str,
        *,
        files: Mapping[str, str | bytes] | None = None,
        from_branch: str | None = None,
        message: str = "Update",
    ) -> str:
        """Commit ``files`` on a new or existing ``branch`` (from ``from_branch``); returns the new sha."""
        repo = self.repo(owner, name)
        base = gitrepo.branch_head(repo.path, branch) or gitrepo.branch_head(
            repo.path, from_branch or repo.default_branch
        )
        parent = base.sha if base else None
        return gitrepo.commit_files(repo.path, branch, files or {}, message=message, parent=parent)

    def set_permission(self, owner: str, name: str, login: str, perm: Perm) -> None:
        """Make ``login`` a collaborator with ``perm`` (``none`` removes the grant)."""
        repo, user = self.repo(owner, name), self.user(login)
        if perm not in PERM_LEVEL:
            raise ValueError(f"unknown permission {perm!r}")
        if perm == "none":
            repo.perms.pop(user.id, None)
        else:
            repo.perms[user.id] = perm

    def create_label(
        self,
        owner: str,
        name: str,
        label: str,
        *,
        color: str = "#ee0701",
        description: str = "",
        exclusive: bool = False,
    ) -> EmuLabel:
        """Create a repository label."""
        return self._op_create_label(self.repo(owner, name), label, color, description, exclusive, False)

    def add_hook(
        self,
        owner: str,
        name: str,
        *,
        url: str,
        secret: str = "",
        events: Sequence[str] = ("issues",),
        content_type: str = "json",
        active: bool = True,
        authorization_header: str = "",
    ) -> EmuHook:
        """Register a ``gitea`` webhook as ``POST /repos/{owner}/{repo}/hooks`` would."""
        return self._op_create_hook(
            self.repo(owner, name),
            url=url,
            secret=secret,
            events=events,
            content_type=content_type,
            active=active,
            authorization_header=authorization_header,
        )

    def create_issue(
        self,
        owner: str,
        name: str,
        *,
        title: str,
        author: str,
        body: str = "",
        labels: Sequence[int | str] = (),
        assignees: Sequence[str] = (),
        pull: bool = False,
        head: str | None = None,
        base: str | None = None,
        closed: bool = False,
        notify: bool = False,
    ) -> EmuIssue:
        """Open an issue (or a PR with ``pull=True``) as ``author``; labels by name or id (unknown: KeyError)."""
        repo = self.repo(owner, name)
        return self._op_create_issue(
            repo,
            self.user(author),
            title=title,
            body=body,
            labels=self._labels_by_ref(repo, labels),
            assignees=[self.user(a) for a in assignees],
            closed=closed,
            pull=pull,
            head=head or (f"pr-{repo.next_number}" if pull else ""),
            base=base or (repo.default_branch if pull else ""),
            notify=notify,
        )

    def edit_issue(
        self,
        owner: str,
        name: str,
        number: int,
        *,
        actor: str,
        title: str | None = None,
        body: str | None = None,
        state: str | None = None,
        assignees: Sequence[str] | None = None,
        notify: bool = False,
    ) -> EmuIssue:
        """Edit an issue as ``actor`` would through ``PATCH .../issues/{index}``."""
        issue = self.issue(owner, name, number)
        self._op_edit_issue(
            issue,
            self.user(actor),
            title=title,
            body=body,
            state=state,
            assignees=None if assignees is None else [self.user(a) for a in assignees],
            content_version=None,
            notify=notify,
        )
        return issue

    def add_labels(
        self, owner: str, name: str, number: int, labels: Sequence[int | str], *, actor: str, notify: bool = False
    ) -> list[EmuLabel]:
        """Add labels (names or ids) as ``actor``; returns the issue's labels after the change."""
        issue = self.issue(owner, name, number)
        self._op_add_labels(issue, self.user(actor), self._labels_by_ref(issue.repo, labels), notify=notify)
        return convert.issue_labels(self, issue)

    def set_labels(
        self, owner: str, name: str, number: int, labels: Sequence[int | str], *, actor: str, notify: bool = False
    ) -> list[EmuLabel]:
        """Replace the issue's labels (names or ids) as ``actor``; an empty list clears them."""
        issue = self.issue(owner, name, number)
        self._op_replace_labels(issue, self.user(actor), self._labels_by_ref(issue.repo, labels), notify=notify)
        return convert.issue_labels(self, issue)

    def create_comment(
        self, owner: str, name: str, number: int, *, author: str, body: str, notify: bool = False
    ) -> EmuComment:
        """Comment on an issue or PR as ``author``."""
        return self._op_create_comment(self.issue(owner, name, number), self.user(author), body, notify=notify)

    # ------------------------------------------------------------------ lookups

    def user(self, login: str) -> EmuUser:
        """The user called ``login`` (case-insensitive); KeyError when missing."""
        return self._users[login.lower()]

    def users(self) -> list[EmuUser]:
        """Every account, organizations included, by id."""
        return sorted(self._users.values(), key=lambda u: u.id)

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

    # ------------------------------------------------------------------ operations (used by the API)

    def resolve_issue_labels(self, repo: EmuRepo, items: Sequence[object]) -> list[EmuLabel]:
        """``IssueLabelsOption`` elements: all ids or all names (a mix is 400); unknown ones are ignored."""
        ids = [int(x) for x in items if isinstance(x, int | float) and not isinstance(x, bool)]
        names = [x for x in items if isinstance(x, str)]
        if self.at_least("1.23") and len(ids) + len(names) != len(items):
            # prepareForReplaceOrAdd from 1.23 (audit #16); 1.22 skips such elements silently.
            raise ApiError(400, "a label must be an integer or a string")
        if ids and names:
            raise ApiError(400, "labels should be an array of strings or integers")
        if names:
            # routers/api/v1/repo/issue_label.go prepareForReplaceOrAdd: GetLabelIDsInRepoByNames, and from
            # 1.23 also GetLabelIDsInOrgByNames for an org-owned repository (1.22.3/1.22.6: repo labels only).
            wanted = set(names)
            found = [label for label in repo.labels.values() if label.name in wanted]
            if repo.owner.is_org and self.at_least("1.23"):
                found += [label for label in self.org_labels(repo.owner) if label.name in wanted]
            return found
        # By id (GetLabelsByIDs, then NewIssueLabels keeps the repo's and its org's labels): every version.
        return [label for i in ids if (label := self._labels.get(i)) is not None and self.usable_label(repo, label)]

    def usable_label(self, repo: EmuRepo, label: EmuLabel) -> bool:
        """A label of the repository, or of the organization that owns it."""
        return label.repo_id == repo.id or (label.org_id != 0 and label.org_id == repo.owner.id)

    def _labels_by_ref(self, repo: EmuRepo, refs: Iterable[int | str]) -> list[EmuLabel]:
        found: list[EmuLabel] = []
        for ref in refs:
            if isinstance(ref, str):
                matches = [label for label in repo.labels.values() if label.name == ref]
                matches = matches or [label for label in self.org_labels(repo.owner) if label.name == ref]
                if not matches:
                    raise KeyError(f"no label {ref!r} in {repo.full_name}")
                found.extend(matches)
            else:
                label = self._labels[ref]
                if not self.usable_label(repo, label):
                    raise KeyError(f"label {ref} is not usable in {repo.full_name}")
                found.append(label)
        return found

    def _op_create_label(
        self, repo: EmuRepo, name: str, color: str, description: str, exclusive: bool, is_archived: bool
    ) -> EmuLabel:
        label = EmuLabel(
            id=next(self._ids.label),
            repo_id=repo.id,
            name=name,
            color=color if color.startswith("#") else f"#{color}",
            description=description,
            exclusive=exclusive,
            is_archived=is_archived,
        )
        repo.labels[label.id] = label
        self._labels[label.id] = label
        return label

    def _op_create_hook(
        self,
        repo: EmuRepo,
        *,
        url: str,
        secret: str,
        events: Sequence[str],
        content_type: str,
        active: bool,
        authorization_header: str = "",
        branch_filter: str = "",
        name: str = "",
        hook_type: str = "gitea",
    ) -> EmuHook:
        now = self.now()
        hook = EmuHook(
            id=next(self._ids.hook),
            repo=repo,
            url=url,
            content_type=content_type,
            secret=secret,
            events=expand_hook_events(events),
            active=active,
            type=hook_type,
            branch_filter=branch_filter,
            authorization_header=authorization_header,
            name=name,
            created=now,
            updated=now,
        )
        repo.hooks.append(hook)
        return hook

    def _timeline(self, issue: EmuIssue, doer: EmuUser, kind: TimelineKind, body: str = "") -> EmuComment:
        now = self.now()
        item = EmuComment(
            id=next(self._ids.comment), issue=issue, poster=doer, body=body, created=now, updated=now, kind=kind
        )
        issue.timeline.append(item)
        self._comments[item.id] = item
        issue.updated = now
        return item

    def _op_create_issue(
        self,
        repo: EmuRepo,
        doer: EmuUser,
        *,
        title: str,
        body: str,
        labels: list[EmuLabel],
        assignees: list[EmuUser],
        closed: bool,
        pull: bool,
        head: str,
        base: str,
        notify: bool,
    ) -> EmuIssue:
        now = self.now()
        issue = EmuIssue(
            id=next(self._ids.issue),
            repo=repo,
            number=repo.next_number,
            title=title,
            body=body,
            poster=doer,
            is_pull=pull,
            created=now,
            updated=now,
            head_branch=head,
            base_branch=base,
        )
        repo.next_number += 1
        repo.issues[issue.number] = issue
        for label in _dedupe_exclusive(labels):
            if label.id not in issue.label_ids:
                issue.label_ids.append(label.id)
                self._timeline(issue, doer, "label", "1")
        # Gitea assigns inside the creating transaction, so these deliveries are queued before "opened".
        for user in assignees:
            if user not in issue.assignees:
                issue.assignees.append(user)
                self._timeline(issue, doer, "assignees")
                if notify:
                    self._emit_issue(issue, "assigned", doer)
        if notify:
            self._emit_issue(issue, "opened", doer)
            if issue.label_ids:
                self._emit_issue(issue, "label_updated", doer)
        if closed:
            self._op_set_state(issue, doer, closed=True, notify=notify)
        return issue

    def _op_edit_issue(
        self,
        issue: EmuIssue,
        doer: EmuUser,
        *,
        title: str | None,
        body: str | None,
        state: str | None,
        assignees: list[EmuUser] | None,
        content_version: int | None,
        notify: bool,
    ) -> None:
        if (
            body is not None
            and content_version is not None
            and self.at_least("1.26")  # content_version: 1.26.0; before, the field is unknown and ignored
            and content_version != issue.content_version
        ):
            raise ApiError(409, "the issue content was changed by someone else; reload and retry")
        if title and title != issue.title:
            old_title, issue.title = issue.title, title
            self._timeline(issue, doer, "change_title")
            if notify:
                self._emit_issue(issue, "edited", doer, changes={"title": {"from": old_title}})
        if body is not None:
            # ChangeContent notifies even when the body is unchanged (only comment edits check that).
            old_body, issue.body = issue.body, body
            issue.content_version += 1
            issue.updated = self.now()
            if notify:
                self._emit_issue(issue, "edited", doer, changes={"body": {"from": old_body}})
        if assignees is not None:
            wanted = list(dict.fromkeys(assignees))
            for user in [u for u in issue.assignees if u not in wanted]:
                issue.assignees.remove(user)
                self._timeline(issue, doer, "assignees")
                if notify:
                    self._emit_issue(issue, "unassigned", doer)
            for user in [u for u in wanted if u not in issue.assignees]:
                issue.assignees.append(user)
                self._timeline(issue, doer, "assignees")
                if notify:
                    self._emit_issue(issue, "assigned", doer)
        if state is not None:
            self._op_set_state(issue, doer, closed=state == "closed", notify=notify)

    def _op_set_state(self, issue: EmuIssue, doer: EmuUser, *, closed: bool, notify: bool) -> None:
        if closed == (issue.closed is not None):
            return
        issue.closed = self.now() if closed else None
        self._timeline(issue, doer, "close" if closed else "reopen")
        if notify:
            self._emit_issue(issue, "closed" if closed else "reopened", doer)

    def _add_label(self, issue: EmuIssue, doer: EmuUser, label: EmuLabel) -> None:
        if label.id in issue.label_ids or not self.usable_label(issue.repo, label):
            return
        scope = label.exclusive_scope
        if scope:
            for other_id in list(issue.label_ids):
                other = self._labels.get(other_id)
                if other is not None and other.exclusive_scope == scope:
                    self._remove_label(issue, doer, other)
        issue.label_ids.append(label.id)
        self._timeline(issue, doer, "label", "1")

    def _remove_label(self, issue: EmuIssue, doer: EmuUser, label: EmuLabel) -> None:
        if label.id in issue.label_ids:
            issue.label_ids.remove(label.id)
            self._timeline(issue, doer, "label", "")

    def _op_add_labels(self, issue: EmuIssue, doer: EmuUser, labels: list[EmuLabel], *, notify: bool) -> None:
        for label in labels:
            self._add_label(issue, doer, label)
        if notify:
            self._emit_issue(issue, "label_updated", doer)

    def _op_replace_labels(self, issue: EmuIssue, doer: EmuUser, labels: list[EmuLabel], *, notify: bool) -> None:
        wanted = _dedupe_exclusive(labels)
        wanted_ids = {label.id for label in wanted}
        for label_id in list(issue.label_ids):
            if label_id not in wanted_ids:
                self._remove_label(issue, doer, self._labels[label_id])
        for label in wanted:
            self._add_label(issue, doer, label)
        if notify:
            self._emit_issue(issue, "label_updated", doer)

    def _op_remove_label(self, issue: EmuIssue, doer: EmuUser, label: EmuLabel, *, notify: bool) -> None:
        self._remove_label(issue, doer, label)
        if notify:
            self._emit_issue(issue, "label_updated", doer)

    def _op_clear_labels(self, issue: EmuIssue, doer: EmuUser, *, notify: bool) -> None:
        # models/issues/issue_label.go clearIssueLabels: issue.LoadLabels, then deleteIssueLabel per label,
        # and (unlike DeleteIssueLabel/NewIssueLabels/ReplaceIssueLabels) no reload; the notifier
        # (services/webhook/notifier.go IssueClearLabels) converts that stale list. Same in 1.22.3 and 1.26.3.
        before = convert.issue_labels(self, issue)
        for label_id in list(issue.label_ids):
            self._remove_label(issue, doer, self._labels[label_id])
        if notify:
            self._emit_issue(issue, "label_cleared", doer, labels_as=before)

    def _op_delete_issue(self, issue: EmuIssue, doer: EmuUser, *, notify: bool) -> None:
        # services/issue/issue.go DeleteIssue: the rows go (comments included), then the notifier runs.
        rendered = convert.issue_json(self, issue, doer)
        repo = issue.repo
        del repo.issues[issue.number]
        for item in issue.timeline:
            self._comments.pop(item.id, None)
        if notify and self.at_least("1.25"):
            self._emit_issue(issue, "deleted", doer, rendered=rendered)

    def at_least(self, version: str) -> bool:
        """Whether the emulated Gitea is ``version`` or newer (``1.25``, ``1.22.3``)."""
        return _version_key(self.version) >= _version_key(version)

    def _op_create_comment(self, issue: EmuIssue, doer: EmuUser, body: str, *, notify: bool) -> EmuComment:
        comment = self._timeline(issue, doer, "comment", body)
        if notify:
            self._emit_comment(comment, "created", doer)
        return comment

    def _op_edit_comment(self, comment: EmuComment, doer: EmuUser, body: str, *, notify: bool) -> None:
        if body == comment.body:
            return
        old_body, comment.body = comment.body, body
        comment.updated = self.now()
        if notify:
            self._emit_comment(comment, "edited", doer, changes={"body": {"from": old_body}})

    def _op_delete_comment(self, comment: EmuComment, doer: EmuUser, *, notify: bool) -> None:
        rendered = convert.comment_json(self, comment)
        comment.issue.timeline.remove(comment)
        del self._comments[comment.id]
        if notify:
            self._emit_comment(comment, "deleted", doer, rendered=rendered)

    # ------------------------------------------------------------------ webhook payloads (FACTS §3)

    def _emit(self, repo: EmuRepo, event_type: str, payload: JSON) -> None:
        for hook in repo.hooks:
            if hook.active and event_type in hook.events:
                self._sender.enqueue(_target(hook, self), event_type, payload)

    def _emit_issue(
        self,
        issue: EmuIssue,
        action: str,
        doer: EmuUser,
        *,
        changes: JSON | None = None,
        labels_as: Sequence[EmuLabel] | None = None,
        rendered: JSON | None = None,
    ) -> None:
        """Queue an issue (or PR) event; ``labels_as`` renders these labels instead of the current ones."""
        repo = issue.repo
        if action in ("assigned", "unassigned"):
            kind, perm_user = "assign", doer
        elif action in ("label_updated", "label_cleared"):
            kind, perm_user = "label", issue.poster
        else:
            kind, perm_user = "", issue.poster
        payload: JSON = {"action": action, "number": issue.number}
        if changes is not None:
            payload["changes"] = {**changes, "added_labels": None, "removed_labels": None}
        repository = convert.repo_json(self, repo, self.perm_of(repo, perm_user))
        sender = convert.user_json(self, doer, None)
        if issue.is_pull:
            payload |= {
                "pull_request": convert.pull_json(self, issue, None),
                "requested_reviewer": None,
                "repository": repository,
                "sender": sender,
                "commit_id": "",
                "review": None,
            }
            event_type = f"pull_request_{kind}" if kind else "pull_request"
        else:
            payload |= {
                "issue": rendered if rendered is not None else convert.issue_json(self, issue, doer),
                "repository": repository,
                "sender": sender,
                "commit_id": "",
            }
            event_type = f"issue_{kind}" if kind else "issues"
        if labels_as is not None:
            stale = [convert.label_json(self, label) for label in labels_as]
            payload["pull_request" if issue.is_pull else "issue"]["labels"] = stale
        self._emit(repo, event_type, payload)

    def _emit_comment(
        self,
        comment: EmuComment,
        action: str,
        doer: EmuUser,
        *,
        changes: JSON | None = None,
        rendered: JSON | None = None,
    ) -> None:
        issue = comment.issue
        payload: JSON = {"action": action, "issue": convert.issue_json(self, issue, doer)}
        if issue.is_pull and self.at_least("1.23"):  # IssueCommentPayload.PullRequest: 1.23.0 (#26178)
            payload["pull_request"] = convert.pull_json(self, issue, None)
        payload["comment"] = rendered if rendered is not None else convert.comment_json(self, comment)
        if changes is not None:
            payload["changes"] = {**changes, "added_labels": None, "removed_labels": None}
        payload |= {
            "repository": convert.repo_json(self, issue.repo, self.perm_of(issue.repo, doer)),
            "sender": convert.user_json(self, doer, None),
            "is_pull": issue.is_pull,
        }
        self._emit(issue.repo, "pull_request_comment" if issue.is_pull else "issue_comment", payload)


def _target(hook: EmuHook, emu: Emulator) -> HookTarget:
    return HookTarget(
        target_headers=emu.at_least("1.24"),
        hook_id=hook.id,
        url=hook.url,
        secret=hook.secret.encode("utf-8"),
        content_type=hook.content_type,
        authorization=hook.authorization_header,
    )


def _version_key(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("+", 1)[0].split("-", 1)[0].split("."):
        parts.append(int(part) if part.isdigit() else 0)
    return tuple(parts + [0] * (3 - len(parts)))


def _dedupe_exclusive(labels: Sequence[EmuLabel]) -> list[EmuLabel]:
    """``RemoveDuplicateExclusiveLabels``: of several labels in one exclusive scope, the last one wins."""
    kept: list[EmuLabel] = []
    for i, label in enumerate(labels):
        scope = label.exclusive_scope
        if scope and any(other.exclusive_scope == scope for other in labels[i + 1 :]):
            continue
        if label not in kept:
            kept.append(label)
    return kept
