"""An organization's repositories, discovered from Gitea: which ones are served, and the loop that asks again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from bot.config import repo_key_of
from bot.config_sections import OrganizationConfig, RepositoryEntry
from bot.tasks import cancel_and_wait

log = logging.getLogger("foreman.discovery")


class ListedRepository(Protocol):
    """What discovery reads of one listed repository (bot.gitea.values.Repository provides it)."""

    @property
    def owner(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def raw(self) -> Mapping[str, Any]: ...


class OrgListing(Protocol):
    """The one read discovery makes (bot.gitea.GiteaClient provides it)."""

    async def list_org_repos(self, org: str) -> Sequence[ListedRepository]: ...


@dataclass(frozen=True, slots=True)
class Discovered:
    """One listing's verdict: the repository names to serve (as Gitea spells them, in Gitea's id order) and,
    for each listed repository left out, why."""

    serve: tuple[str, ...]
    skipped: Mapping[str, str]


def plan_discovery(org: OrganizationConfig, listing: Sequence[ListedRepository]) -> Discovered:
    """Which listed repositories of ``org`` are served: not excluded, not archived, owned by the organization
    (the listing never returns another owner's, but a proxy or a rename must not widen the set)."""
    serve: list[str] = []
    skipped: dict[str, str] = {}
    for repo in listing:
        if repo.owner.casefold() != org.name.casefold():
            skipped[f"{repo.owner}/{repo.name}"] = f"owned by {repo.owner}, not {org.name}"
        elif org.excludes(repo.name):
            skipped[f"{repo.owner}/{repo.name}"] = "excluded (organization.exclude)"
        elif repo.raw.get("archived") is True:
            skipped[f"{repo.owner}/{repo.name}"] = "archived"
        else:
            serve.append(repo.name)
    return Discovered(tuple(serve), skipped)


@dataclass(frozen=True, slots=True)
class DiscoveryChanges:
    """What one verdict changes in a running service: entries to start serving, and keys to let go (why)."""

    serve: tuple[RepositoryEntry, ...]
    let_go: Mapping[str, str]


def discovery_changes(org: OrganizationConfig, verdict: Discovered, *, served: Collection[str],
                      discovered: Collection[str], explicit: Collection[str]) -> DiscoveryChanges:
    """Compare a verdict with what is served (keys as ``repo_key_of``): a listed repository not served yet is
    served with the organization's defaults, unless an explicit ``[[repositories]]`` entry already serves it (the
    entry's overrides win); a discovered one no longer listed, archived or excluded is let go. Explicit entries
    are never let go."""
    wanted = {repo_key_of(org.entry_for(name)): org.entry_for(name) for name in verdict.serve}
    reasons = {repo_key_of(org.entry_for(full.split("/", 1)[1])): why for full, why in verdict.skipped.items()}
    serve = tuple(entry for key, entry in wanted.items() if key not in served and key not in explicit)
    let_go = {key: reasons.get(key, f"no longer listed in {org.name}")
              for key in discovered if key not in wanted and key not in explicit}
    return DiscoveryChanges(serve, let_go)


@dataclass
class DiscoveryStatus:
    """What /readyz shows of the organization's discovery (this process's view)."""

    passes: int = 0
    last_success_at: float | None = None
    last_error: str | None = None
    errors_total: int = 0
    last: Discovered | None = None

    def to_dict(self, org: str, interval_s: float) -> dict[str, Any]:
        return {
            "ok": None if self.passes == 0 else self.last_error is None,
            "organization": org,
            "interval_s": interval_s,
            "passes": self.passes,
            "last_success_at": datetime.fromtimestamp(self.last_success_at, UTC).isoformat()
            if self.last_success_at else None,
            "last_error": self.last_error,
            "errors_total": self.errors_total,
            "discovered": list(self.last.serve) if self.last is not None else None,
            "skipped": dict(self.last.skipped) if self.last is not None else None,
        }


@dataclass
class OrgDiscovery:
    """Lists the organization's repositories at start and every ``interval_s`` (``[reconcile] interval_s``; 0:
    at start only, then again only after a failure, at ``retry_s``) and hands each successful verdict to
    ``apply``. A failed listing changes nothing: the service keeps serving what it served (fail closed: a
    guessed set is never served), and the error shows on /readyz."""

    org: OrganizationConfig
    gitea: OrgListing
    apply: Callable[[Discovered], Awaitable[None]]
    interval_s: float
    retry_s: float = 30.0
    status: DiscoveryStatus = field(default_factory=DiscoveryStatus)
    _task: asyncio.Task[None] | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    async def run_pass(self) -> Discovered | None:
        """One listing (with the client's retries); its verdict applied, or None when Gitea could not be read."""
        self.status.passes += 1
        try:
            listing = await self.gitea.list_org_repos(self.org.name)
        except Exception as exc:  # any failure: keep what is served, say so, try again
            self.status.last_error = f"{type(exc).__name__}: {exc}"
            self.status.errors_total += 1
            log.warning("discovery of organization %s failed (serving what was served; retrying): %s",
                        self.org.name, self.status.last_error)
            return None
        verdict = plan_discovery(self.org, listing)
        await self.apply(verdict)
        self.status.last, self.status.last_error, self.status.last_success_at = verdict, None, time.time()
        return verdict

    def start(self) -> None:
        """Run the timer in the background (the start-up pass is the caller's: ``run_pass``)."""
        self._task = asyncio.create_task(self._timer(), name="organization-discovery")

    async def stop(self) -> None:
        self._stopping.set()
        await cancel_and_wait(self._task)

    async def _timer(self) -> None:
        while not self._stopping.is_set():
            failed = self.status.last_error is not None
            wait = self.interval_s if self.interval_s > 0 else (self.retry_s if failed else 0)
            if wait <= 0:
                return  # the interval is off and the last pass worked
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=wait)
            if self._stopping.is_set():
                return
            try:
                await self.run_pass()
            except asyncio.CancelledError:
                raise
            except Exception:  # applying a verdict failed; the next pass applies it again
                log.exception("applying the discovery of organization %s failed", self.org.name)
