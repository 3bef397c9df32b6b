"""The served repositories at run time: one ``RepositoryBundle`` per repository (its settings view, handlers'
dependencies, Gitea client, door, catch-up, runs' teardown loop and outbox hooks), started and stopped one by one,
and an ``[organization]``'s repositories served and let go while running (bot/discovery.py)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bot.config import Settings, repo_key_of
from bot.config_sections import RepositoryEntry
from bot.handler_deps import HandlerDeps
from bot.metrics import Metrics
from bot.worker import Worker
from state.db import Database
from state.deliveries import DeliveryStore
from state.outbox import OutboxEntry

if TYPE_CHECKING:
    import aiohttp

    from bot.discovery import Discovered, OrgDiscovery
    from bot.gitea import GiteaClient
    from bot.loops.run_teardowns import TeardownLoop
    from bot.outbox import OutboxGitea, OutboxHooks
    from bot.reconcile import Reconciler
    from bot.verbs.runtime import VerbRuntime

log = logging.getLogger("foreman.app")


@dataclass
class RepositoryBundle:
    """What the service holds for one served repository: its settings view (``Settings.for_repository``), its
    handlers' dependencies, its Gitea client (sharing the service's session and bot identity), its catch-up,
    its runs' teardown loop and its outbox hooks. Nothing in one bundle reads or writes another's repository."""

    key: str
    settings: Settings
    deps: HandlerDeps
    gitea: GiteaClient | None = None
    reconciler: Reconciler | None = None
    run_teardowns: TeardownLoop | None = None
    hooks: OutboxHooks | None = None

    @property
    def door(self) -> VerbRuntime[GiteaClient]:
        """The repository's one door to the verbs (built with its dependencies, renewed with its Gitea client)."""
        return self.deps.door


class ServedRepositories:
    """Every served repository's bundle by its key, in configuration order (the first is ``[repository]``'s), and
    the settings that serve them (``settings``: an organization's discovery changes them while running). The worker
    is routed to the served bundles' dependencies, and routed again whenever a repository is served or let go."""

    def __init__(
        self, settings: Settings, db: Database, store: DeliveryStore, metrics: Metrics, worker: Worker, *,
        bot_login: Callable[[], str | None],
        hooks_for: Callable[[Settings], OutboxHooks] | None = None,
    ) -> None:
        self.settings = settings
        self.db = db
        self.store = store
        self.metrics = metrics
        self.worker = worker
        self._bot_login = bot_login
        #: Each repository's outbox hooks from its settings view (the composition root passes the issue state's).
        self._hooks_for = hooks_for
        #: The service's session, once it has a Gitea token (``connect``): every bundle's client shares it.
        self.http: aiohttp.ClientSession | None = None
        self.bundles: dict[str, RepositoryBundle] = {}
        for key in settings.repository_keys():
            self.bundles[key] = self._bundle(settings, key)
        metrics.serve_repositories(list(self.bundles))
        #: ``[organization]``: the explicit entries (always served) and the discovered ones (by key).
        self._explicit: list[RepositoryEntry] = list(settings.repositories)
        self._discovered: dict[str, RepositoryEntry] = {}
        self.discovery: OrgDiscovery | None = None
        self._reroute()

    @property
    def first(self) -> RepositoryBundle:
        """The first configured repository's bundle (the one ``[repository]`` when there is one); StopIteration
        only with ``[organization]`` while nothing is served yet (``first_key`` is None then)."""
        return next(iter(self.bundles.values()))

    @property
    def first_key(self) -> str | None:
        """The first served repository's key, or None while none is (an organization not read yet)."""
        return next(iter(self.bundles), None)

    def connect(self, http: aiohttp.ClientSession) -> None:
        """Give every bundle its Gitea client over the service's session, and route the worker to them."""
        self.http = http
        for bundle in self.bundles.values():
            self._connect(bundle)
        self._reroute()

    async def start(self, gitea: GiteaClient | None) -> None:
        """Start every bundle's loops, then an organization's discovery with the service's client ``gitea``."""
        for bundle in list(self.bundles.values()):
            await self._start_bundle(bundle)
        await self._start_discovery(gitea)

    async def stop(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        for bundle in self.bundles.values():
            await self._stop_bundle(bundle)

    def learned_login(self, login: str) -> None:
        """The bot's login as Gitea told it: every door acts as it from now on."""
        for bundle in self.bundles.values():
            bundle.deps.door.learned_login(login)

    def _bundle(self, settings: Settings, key: str) -> RepositoryBundle:
        view = settings.for_repository(key)
        hooks = self._hooks_for(view) if self._hooks_for is not None else None
        return RepositoryBundle(key, view, self._deps(view), hooks=hooks)

    def _connect(self, bundle: RepositoryBundle) -> None:
        """Give a bundle its Gitea client: one session and one bot identity, bound to its own repository."""
        from bot.gitea import client_for

        assert self.http is not None
        bundle.gitea = client_for(self.http, bundle.settings)
        bundle.deps = dataclasses.replace(bundle.deps, gitea=bundle.gitea, door=self._door(bundle.settings,
                                                                                             bundle.gitea))

    def _reroute(self) -> None:
        """The worker's routes from the served bundles (replaced, never mutated: a running loop keeps its own)."""
        self.worker.routes = {key: bundle.deps for key, bundle in self.bundles.items()}

    def _deps(self, settings: Settings) -> HandlerDeps:
        """What one repository's handlers may use, never the Service (the Gitea client joins in ``connect``); each
        repository has its own permission cache (a login's permission is per repository)."""
        return HandlerDeps(
            settings=settings,
            db=self.db,
            bot_login=lambda: self._bot_login() or "",
            door=self._door(settings, None),
        )

    def _door(self, settings: Settings, gitea: GiteaClient | None) -> VerbRuntime[GiteaClient]:
        """The one door of a served repository (its settings view and Gitea client), handed to every surface:
        comment commands and auto-allocation (through the handlers' dependencies), MCP over HTTP, catch-up's
        allocation, the runs' teardown loop. The bot's login is set again when the service learns it."""
        from bot.catalog import open_door

        return open_door(self.db, settings, gitea, bot_login=self._bot_login() or "")

    # One repository's loops: its catch-up and its runs' teardowns.

    async def _start_bundle(self, bundle: RepositoryBundle) -> None:
        """Start one repository's runs' teardown loop and, with a Gitea client, its catch-up."""
        bundle.run_teardowns = self._make_teardown_loop(bundle)
        bundle.run_teardowns.start()
        if bundle.gitea is not None:
            bundle.reconciler = self._make_reconciler(bundle)
            await bundle.reconciler.start()

    async def _stop_bundle(self, bundle: RepositoryBundle) -> None:
        if bundle.run_teardowns is not None:
            await bundle.run_teardowns.stop()
        if bundle.reconciler is not None:
            await bundle.reconciler.stop()

    def _make_reconciler(self, bundle: RepositoryBundle) -> Reconciler:
        """Catch-up of one repository (bot/reconcile.py): feeds what no webhook brought through the inbox; after
        each pass one auto-allocation (trigger ``catch_up``), so an expired lease frees its author."""
        from bot.reconcile import Reconciler

        assert bundle.gitea is not None
        gitea, settings = bundle.gitea, bundle.settings

        def wake() -> None:
            self.worker.wakeup.set()

        async def allocate() -> None:
            if not settings.auto_allocation():
                return
            from bot.loops.auto_allocate import auto_allocate

            await auto_allocate(bundle.deps.door, trigger="catch_up")

        repository = settings.repository
        return Reconciler(
            db=self.db,
            store=self.store,
            gitea=gitea,
            owner=repository.owner,
            name=repository.name,
            interval_s=settings.reconcile.interval_s,
            overlap_s=settings.reconcile.overlap_s,
            metrics=self.metrics,
            bot_login=lambda: self._bot_login() or "",
            wakeup=wake,
            after_pass=allocate,
        )

    def _make_teardown_loop(self, bundle: RepositoryBundle) -> TeardownLoop:
        """One repository's runs' reserved teardowns by themselves (bot/loops/run_teardowns.py): a grant's
        expiry is the passing of time, which no webhook or call announces, so the service checks at start-up and
        on an interval."""
        from bot.loops.run_teardowns import TeardownLoop

        return TeardownLoop(self.db, bundle.settings, bundle.deps.door,
                            interval_s=bundle.settings.lifecycle.run_teardown_interval_s,
                            served=tuple(self.bundles))

    async def recover_bootstraps(self) -> None:
        """Worktree bootstraps a killed process left open are finished or compensated (docs/bootstrap.md), in
        each served repository."""
        from bot.loops.recovery import recover_open_transitions
        from bot.verbs.bootstrap import BootstrapContext

        for bundle in self.bundles.values():
            context = BootstrapContext(db=self.db, settings=bundle.settings, gitea=bundle.gitea,
                                       bot_login=self._bot_login() or self.settings.gitea.bot_login)
            try:
                await recover_open_transitions(context)
            except Exception:
                log.exception("recovering open worktree bootstraps of %s failed (the next bootstrap of each issue "
                              "recovers it)", bundle.key)

    def door_of(self, key: str) -> VerbRuntime[GiteaClient] | None:
        """The served repository ``key``'s one door (None when it is not served)."""
        bundle = self.bundles.get(key)
        return bundle.door if bundle is not None else None

    # The outbox's entries, each sent with its repository's client and reported to its repository's hooks.

    def outbox_client(self, repo: str) -> OutboxGitea | None:
        """The client of an outbox entry's repository; None (the entry is parked) for one this process does not
        serve, and for one filed under no repository (start-up adoption gave every older entry the first's)."""
        bundle = self.bundles.get(repo)
        return bundle.gitea if bundle is not None else None

    async def on_outbox_complete(self, entry: OutboxEntry, result: dict[str, Any]) -> None:
        bundle = self.bundles.get(entry.repo)
        hooks = bundle.hooks if bundle is not None else None
        if bundle is not None and hooks is not None and hooks.on_complete is not None:
            await hooks.on_complete(entry, result)

    async def on_outbox_failure(self, entry: OutboxEntry) -> None:
        bundle = self.bundles.get(entry.repo)
        hooks = bundle.hooks if bundle is not None else None
        if bundle is not None and hooks is not None and hooks.on_failure is not None:
            await hooks.on_failure(entry)

    # An organization's repositories, served and let go while running (bot/discovery.py).

    async def _start_discovery(self, gitea: GiteaClient | None) -> None:
        """``[organization]``: list its repositories now (the client's retries; a failure leaves only the explicit
        entries served, never a guessed set) and again every ``[reconcile] interval_s``."""
        org = self.settings.organization
        if org is None:
            return
        if gitea is None:
            log.warning("organization %s: no gitea.token configured, so its repositories cannot be listed; serving "
                        "the explicit [[repositories]] entries only", org.name)
            return
        from bot.discovery import OrgDiscovery

        self.discovery = OrgDiscovery(org, gitea, self._apply_discovery, interval_s=self.settings.reconcile.interval_s)
        await self.discovery.run_pass()
        self.discovery.start()

    def _serve_entries(self) -> None:
        self.settings = self.settings.with_repositories([*self._explicit, *self._discovered.values()])

    async def serve_discovered(self, entry: RepositoryEntry) -> RepositoryBundle:
        """Serve a repository discovered while running: its bundle built, connected, routed and started."""
        key = repo_key_of(entry)
        self._discovered[key] = entry
        self._serve_entries()
        bundle = self._bundle(self.settings, key)
        if self.http is not None:
            self._connect(bundle)
        self.bundles[key] = bundle
        self.metrics.serve_repositories([key])
        self._reroute()
        await self._start_bundle(bundle)
        return bundle

    async def stop_serving(self, key: str, reason: str) -> None:
        """Stop serving a discovered repository (removed, archived or excluded): from now on its deliveries are
        ignored as any unserved repository's; what it stored stays."""
        bundle = self.bundles.pop(key)
        self._discovered.pop(key, None)
        self._serve_entries()
        self._reroute()
        await self._stop_bundle(bundle)
        log.warning("organization: %s is no longer served (%s); its deliveries are ignored from now on", key, reason)

    async def _apply_discovery(self, verdict: Discovered) -> None:
        from bot.discovery import discovery_changes

        org = self.settings.organization
        assert org is not None
        changes = discovery_changes(org, verdict, served=self.bundles.keys(), discovered=self._discovered.keys(),
                                    explicit={repo_key_of(entry) for entry in self._explicit})
        for entry in changes.serve:
            bundle = await self.serve_discovered(entry)
            log.info("organization %s: serving %s (discovered)", org.name, bundle.key)
        for key, reason in changes.let_go.items():
            await self.stop_serving(key, reason)
