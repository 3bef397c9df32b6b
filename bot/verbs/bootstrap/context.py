"""What a bootstrap or lock call runs against (the service's database, settings, Gitea) and what it returns."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from bot import gitops
from bot.config import Settings
from bot.core.bootstrap import Phase
from bot.core.errors import Envelope
from bot.core.gateway import ROLES, Role
from bot.gitea import Branch, Issue, Repository
from state.db import Database, utcnow
from state.leases import Lease, LeaseStore
from state.sql import Connection

TOOL = "gitea_bootstrap_issue_worktree"

ResultStatus = Literal["completed", "compensated", "refused", "blocked"]

#: How old (seconds) the allocation's proof's Gitea reads (the repository, its base, the issue) may be for the
#: bootstrap the allocation runs right after it to use them instead of reading them again. Older: read again.
PROOF_READS_FRESH_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class ProofReads:
    """The Gitea reads a proof took (``bootstrap_preflight``), for the bootstrap that follows it in the same
    allocation: the repository, its default branch's commit and the issue, and when they were asked for."""

    repo: Repository
    base: str
    issue: Issue
    asked_at: float  # time.monotonic() before the first of them was sent

    def age_s(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.asked_at

    def fresh_for(self, issue_number: int, now: float | None = None) -> bool:
        """These are ``issue_number``'s reads and at most ``PROOF_READS_FRESH_S`` old."""
        return self.issue.number == issue_number and 0.0 <= self.age_s(now) <= PROOF_READS_FRESH_S


class BootstrapGitea(Protocol):
    """The Gitea calls the bootstrap makes (``bot.gitea.GiteaClient`` has them)."""

    async def get_repo(self) -> Repository: ...
    async def get_branch(self, name: str) -> Branch: ...
    async def get_issue(self, number: int) -> Issue: ...
    async def set_assignees(self, number: int, logins: Sequence[str]) -> Issue: ...


class ServiceLike(Protocol):
    """What ``BootstrapContext.from_service`` reads (``bot.app.Service`` has all of it)."""

    @property
    def db(self) -> Database: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def gitea(self) -> BootstrapGitea | None: ...
    @property
    def bot_login(self) -> str | None: ...


@dataclass
class BootstrapContext:
    """Everything a bootstrap or lock call needs; built once per service (or per CLI run)."""

    db: Database
    settings: Settings
    gitea: BootstrapGitea | None
    bot_login: str
    clock: Callable[[], datetime] = utcnow

    @classmethod
    def from_service(cls, service: ServiceLike) -> BootstrapContext:
        return cls(
            db=service.db,
            settings=service.settings,
            gitea=service.gitea,
            bot_login=service.bot_login or service.settings.gitea.bot_login,
        )

    @property
    def repo(self) -> str:
        return self.settings.repo_key

    @property
    def checkout_root(self) -> Path:
        root = self.settings.repository.checkout_root
        return Path(os.path.realpath(root if root.is_absolute() else Path.cwd() / root))

    @property
    def checkout_path(self) -> Path:
        return self.checkout_root / self.settings.repository.owner / self.settings.repository.name

    def locks_dir(self) -> Path:
        return self.checkout_root / ".foreman-locks" / self.settings.repository.owner / self.settings.repository.name

    def roles_of(self, login: str) -> frozenset[Role]:
        return frozenset(r for r in self.settings.roster.get(login, []) if r in ROLES)

    def checkout(self) -> gitops.ControlCheckout:
        return gitops.ControlCheckout(
            self.checkout_path, env=gitops.git_env(self.bot_login), timeout_s=self.settings.bootstrap.git_timeout_s
        )


@dataclass
class BootstrapResult:
    """What a bootstrap call returns (and the CLI prints). ``exit_code``: 0 completed, 1 anything else."""

    issue_number: int
    status: ResultStatus
    idempotency_key: str | None = None
    phase: Phase | None = None
    refusal: Envelope | None = None
    proof: dict[str, Any] = field(default_factory=dict)
    replayed: bool = False
    journal: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "completed" else 1

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "status": self.status,
            "issue_number": self.issue_number,
            "idempotency_key": self.idempotency_key,
            "phase": self.phase,
            "replayed": self.replayed,
            "proof": self.proof,
            "journal": self.journal,
            "outbox": self.outbox,
        }
        if self.refusal is not None:
            doc.update(self.refusal.to_dict())
        return doc


@dataclass
class LockResult:
    """What a lock call returns. ``exit_code``: 0 locked (or already locked by the same lease), 1 refused."""

    issue_number: int
    status: Literal["locked", "refused"]
    lock: dict[str, Any] | None = None
    proof: dict[str, Any] = field(default_factory=dict)
    refusal: Envelope | None = None
    already_locked: bool = False

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "locked" else 1

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "status": self.status,
            "issue_number": self.issue_number,
            "lock": self.lock,
            "already_locked": self.already_locked,
            "proof": self.proof,
        }
        if self.refusal is not None:
            doc.update(self.refusal.to_dict())
        return doc


async def live_lease_in(conn: Connection, leases: LeaseStore, repo: str, lease_id: str) -> Lease | None:
    """The lease ``lease_id`` if it is still marked live, read inside the caller's transaction."""
    return next((lease for lease in await leases.open_leases(repo, conn) if lease.lease_id == lease_id), None)
