"""Setting up an emulator's world without HTTP: accounts, organizations, repositories, issues."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence

from bot.emulator import convert, gitrepo
from bot.emulator.model import (
    PERM_LEVEL,
    UNITS,
    EmuComment,
    EmuHook,
    EmuIssue,
    EmuLabel,
    EmuOrgHook,
    EmuRepo,
    EmuSystemHook,
    EmuTeam,
    EmuUser,
    Perm,
)
from bot.emulator.operations import EmulatorOperations
from bot.emulator.webhooks import expand_hook_events


class EmulatorSeeding(EmulatorOperations):
    """Setup helpers that change state directly and send webhooks only when asked (``notify=True``)."""

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

    def archive_repo(self, owner: str, name: str) -> EmuRepo:
        """Archive a repository (``POST /repos/{owner}/{repo}/archive`` / ``PATCH archived: true``): listings
        report ``archived: true``."""
        repo = self.repo(owner, name)
        repo.archived_at = self.now()
        return repo

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

    def add_org_hook(
        self, org: str, *, url: str, secret: str = "", events: Sequence[str] = ("issues",), active: bool = True
    ) -> EmuOrgHook:
        """Register an organization's ``gitea`` webhook as ``POST /orgs/{org}/hooks`` would: it is sent every
        event of every repository ``org`` owns (``PrepareWebhooks``), headers naming the target ``organization``."""
        owner = self.user(org)
        if not owner.is_org:
            raise ValueError(f"{org} is not an organization")
        hook = EmuOrgHook(id=next(self._ids.hook), org=owner, url=url, secret=secret,
                          events=expand_hook_events(events), active=active)
        self._org_hooks.append(hook)
        return hook

    def add_system_hook(
        self, *, url: str, secret: str = "", events: Sequence[str] = ("issues",), active: bool = True
    ) -> EmuSystemHook:
        """Register a system webhook as a site administrator's ``POST /admin/hooks`` with
        ``config.is_system_webhook = "true"`` would: it is sent every event of every repository on the instance,
        user-owned ones included (``PrepareWebhooks``), headers naming the target ``system``."""
        hook = EmuSystemHook(id=next(self._ids.hook), url=url, secret=secret, events=expand_hook_events(events),
                             active=active)
        self._system_hooks.append(hook)
        return hook

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
