"""Starting a run: this host's identity, run tokens, and compiling and sealing the grant of a leased issue."""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.config import Settings
from bot.core.digest import canonical_json
from bot.core.errors import Envelope, EnvelopeError, ErrorKind
from bot.core.grants import BoundWorktree, Grant, PolicyTemplate, RunFacts, TemplateError, compile_grant
from state.db import Database, utcnow
from state.grants import GrantConflict, GrantStore, RunRecord, WorkloadFailed
from state.journal import JournalStore, Registration
from state.leases import Lease, LeaseStore

HOST_ID_FILE = "host-id"
TOKEN_PREFIX = "frun_"  # noqa: S105 (a prefix, not a token)
#: Worktree UUIDs derived from a registration row (the journal records no UUID of its own).
WORKTREE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "urn:gitea-foreman:worktree-registration")


def host_identity(database_path: Path) -> str:
    """This service's host identity: ``<hostname>/<uuid>``, the UUID stored once in ``<database folder>/host-id``.

    The file is created on first use (mode 0600) and read on every call, so a database copied to another machine
    (other hostname) or a replaced file (other UUID) is a different host: grants sealed here are refused there.
    """
    path = database_path.parent / HOST_ID_FILE
    try:
        stored = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        stored = str(uuid.uuid4())
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            stored = path.read_text(encoding="utf-8").strip()
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(stored + "\n")
    if not stored:
        raise ValueError(f"the host identity file {path} is empty")
    return f"{socket.gethostname()}/{stored}"


def token_digest(token: str) -> str:
    """Run tokens are stored only as this SHA-256."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_run_token(token: str | None) -> bool:
    return bool(token) and str(token).startswith(TOKEN_PREFIX)


def registration_uuid(registration: Registration) -> str:
    """A stable UUID for one worktree registration row: the same row always gives the same UUID, a new
    registration (the worktree recreated) another one."""
    key = canonical_json(
        {
            "repo": registration.repo,
            "issue_number": registration.issue_number,
            "registration_id": registration.id,
            "journal_id": registration.journal_id,
            "lease_id": registration.lease_id,
            "branch": registration.branch,
            "worktree_path": registration.worktree_path,
            "registered_at": registration.registered_at,
        }
    )
    return str(uuid.uuid5(WORKTREE_NAMESPACE, key))


async def registered_worktree(db: Database, repo: str, issue_number: int) -> tuple[BoundWorktree, Registration] | None:
    """The issue's live worktree registration (bootstrap journal) as grant facts, or None."""
    registration = await JournalStore(db).live_registration(repo, issue_number)
    if registration is None:
        return None
    facts = BoundWorktree(
        path=registration.worktree_path, uuid=registration_uuid(registration), branch=registration.branch
    )
    return facts, registration


def policy_template(settings: Settings, key: str) -> PolicyTemplate | None:
    """The configured template for ``role.action`` (config validation already checked it)."""
    found = settings.grants.get(key)
    return found.template(key) if found is not None else None




@dataclass(frozen=True, slots=True)
class StartedRun:
    """A sealed run: the token is shown once (only its SHA-256 is stored)."""

    run_id: str
    token: str
    grant: Grant
    record: RunRecord

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "token": self.token,
            "grant": self.grant.to_dict(),
            "run": self.record.summary(),
        }


def _refuse(error: ErrorKind, message: str, remediate: str, next_action: str, **details: Any) -> EnvelopeError:
    return EnvelopeError(
        Envelope(error=error, message=message, remediate=remediate, exact_next_action=next_action, details=details)
    )


async def start_run(
    db: Database,
    settings: Settings,
    *,
    issue_number: int,
    action: str | None = None,
    sealed_by: str,
    now: datetime | None = None,
    host_id: str | None = None,
) -> StartedRun:
    """Compile the grant for the issue's live lease and registered worktree, seal it and open the run.

    Raises EnvelopeError: no live lease (``invalid_state``), no template for the lease's ``role.action``
    (``not_found``), no registered worktree or one bound to another lease (``invalid_state``), a template that
    does not compile for these facts (``invalid_input``), an open run on the worktree or a failed one there
    (``conflict``).
    """
    moment = now or utcnow()
    repo = settings.repo_key
    lease = await _live_lease(db, repo, issue_number, moment)
    key = f"{lease.role}.{action or lease.action}"
    template = _template(settings, key)
    worktree = await _bound_worktree(db, repo, issue_number, lease)
    facts = RunFacts(
        repo=repo,
        issue_number=issue_number,
        owner=lease.owner,
        role=lease.role,
        action=action or lease.action,
        lease_id=lease.lease_id,
        worktree=worktree,
    )
    run_id = f"run-{uuid.uuid4().hex}"
    grant = _compiled(template, facts, key, run_id=run_id,
                      host_id=host_id or host_identity(settings.database.path), now=moment)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = await _sealed(db, grant, token, issue_number, sealed_by=sealed_by, now=moment)
    return StartedRun(run_id=run_id, token=token, grant=grant, record=record)


async def _live_lease(db: Database, repo: str, issue_number: int, moment: datetime) -> Lease:
    lease = await LeaseStore(db).live_for_issue(repo, issue_number)
    if lease is None or not lease.is_live(moment):
        raise _refuse(
            "invalid_state",
            f"issue #{issue_number} has no live lease",
            "a run is bound to a live lease: allocate the issue first",
            f"run foreman allocate --apply, then foreman run start --issue {issue_number}",
        )
    return lease


def _template(settings: Settings, key: str) -> PolicyTemplate:
    template = policy_template(settings, key)
    if template is None:
        raise _refuse(
            "not_found",
            f'no run grant template grants."{key}" is configured',
            f'add [grants."{key}"] to the configuration (see config/foreman.example.toml)',
            "run foreman check-config after adding the template",
            key=f"grants.{key}",
        )
    return template


async def _bound_worktree(db: Database, repo: str, issue_number: int, lease: Lease) -> BoundWorktree:
    """The worktree the bootstrap registered for the issue, for this very lease."""
    found = await registered_worktree(db, repo, issue_number)
    if found is None:
        raise _refuse(
            "invalid_state",
            f"issue #{issue_number} has no registered worktree",
            "a run is bound to the worktree the bootstrap registered: bootstrap it first",
            f"run foreman bootstrap --issue {issue_number} --owner {lease.owner}",
        )
    worktree, registration = found
    if registration.lease_id != lease.lease_id or registration.owner != lease.owner:
        raise _refuse(
            "invalid_state",
            f"the worktree registered for #{issue_number} belongs to lease {registration.lease_id}, not the live one",
            "bootstrap the issue again for the live lease",
            f"run foreman bootstrap --issue {issue_number} --owner {lease.owner}",
        )
    return worktree


def _compiled(template: PolicyTemplate, facts: RunFacts, key: str, *, run_id: str, host_id: str,
              now: datetime) -> Grant:
    try:
        return compile_grant(template, facts, run_id=run_id, host_id=host_id, now=now)
    except TemplateError as exc:
        raise _refuse(
            "invalid_input",
            f'grants."{key}" does not compile for #{facts.issue_number}: {exc}',
            f'fix grants."{key}" in the configuration',
            "run foreman check-config",
            problems=[{"path": p, "problem": m} for p, m in exc.problems],
        ) from None


async def _sealed(db: Database, grant: Grant, token: str, issue_number: int, *, sealed_by: str,
                  now: datetime) -> RunRecord:
    try:
        return await GrantStore(db).seal(grant, token_sha256=token_digest(token), sealed_by=sealed_by, now=now)
    except WorkloadFailed as exc:
        raise _refuse(
            "conflict",
            str(exc),
            "a failed workload is never retried on the same worktree: bootstrap a fresh worktree for a new run",
            f"run foreman grants to see the failed run of #{issue_number}",
        ) from None
    except GrantConflict as exc:
        raise _refuse(
            "conflict",
            str(exc),
            "finish or abort the open run first",
            f"run foreman grants to find the open run of #{issue_number}",
        ) from None
