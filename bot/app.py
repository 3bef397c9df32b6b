"""Service wiring: the aiohttp app (webhook intake, health, metrics), the group-commit writer and the worker."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from bot.config import Settings, repo_key_of
from bot.config_sections import RepositoryEntry
from bot.core.dispatch import OrderedRouter
from bot.core.intake import Delivery, Rejection, admit, content_encoding_refusal, is_self_event, metric_event
from bot.core.intake_burst import ArrivalWindow, BurstPolicy
from bot.group_commit import GroupCommitWriter
from bot.handler_deps import HandlerDeps
from bot.http_server import read_body
from bot.metrics import LoopLagMonitor, Metrics
from bot.tasks import cancel_and_wait
from bot.worker import Worker
from state.db import Database, DatabaseNotWritable, open_database
from state.deliveries import DeliveryStore
from state.outbox import OUTBOX_TOPIC, OutboxEntry, OutboxStore, acting_for

if TYPE_CHECKING:
    from bot.discovery import Discovered, OrgDiscovery
    from bot.gitea import GiteaClient
    from bot.loops.run_teardowns import TeardownLoop
    from bot.mcp_http import McpHttp
    from bot.outbox import OutboxGitea, OutboxHooks, OutboxSender
    from bot.reconcile import Reconciler
    from bot.verbs.runtime import VerbRuntime

log = logging.getLogger("foreman.app")

SERVICE_KEY: web.AppKey[Service] = web.AppKey("service")
#: Where ``foreman serve`` serves MCP over Streamable HTTP.
MCP_PATH = "/mcp"

@dataclass
class GiteaStatus:
    reachable: bool | None = None
    detail: str = "not probed yet"
    login: str | None = None
    checked_at: float | None = None


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


@dataclass
class Service:
    """Everything one running instance owns; started and stopped as a unit."""

    settings: Settings
    router: OrderedRouter
    db: Database
    metrics: Metrics = field(default_factory=Metrics)
    gitea_status: GiteaStatus = field(default_factory=GiteaStatus)
    http: aiohttp.ClientSession | None = None
    gitea: GiteaClient | None = None
    #: Each repository's outbox hooks from its settings view (the composition root passes the issue state's).
    hooks_for: Callable[[Settings], OutboxHooks] | None = None

    def __post_init__(self) -> None:
        self.store = DeliveryStore(self.db)
        self.outbox = OutboxStore(self.db)
        self.outbox_sender: OutboxSender | None = None
        # Every committed outbox entry wakes the sender, whichever verb, handler or loop stored it.
        self.db.on_commit(OUTBOX_TOPIC, self.outbox_wakeup)
        self.writer = GroupCommitWriter(self.store)
        self.bot_login: str | None = self.settings.gitea.bot_login
        #: Every served repository's bundle by its key, in configuration order (the first is ``[repository]``'s).
        self.repositories: dict[str, RepositoryBundle] = {}
        for key in self.settings.repository_keys():
            self.repositories[key] = self._bundle(self.settings, key)
        self.metrics.serve_repositories(list(self.repositories))
        #: ``[organization]``: the explicit entries (always served) and the discovered ones (by key).
        self._explicit: list[RepositoryEntry] = list(self.settings.repositories)
        self._discovered: dict[str, RepositoryEntry] = {}
        self.discovery: OrgDiscovery | None = None
        worker = self.settings.worker
        #: The webhook door's admissions, which the worker's loops stand aside for while they come in a burst.
        self.intake_window = ArrivalWindow(
            BurstPolicy(burst_per_s=worker.intake_burst_per_s, max_stand_aside_s=worker.max_stand_aside_s)
        )
        self.worker = Worker(
            self.store, self.router, self.settings.worker, self.metrics,
            routes={key: bundle.deps for key, bundle in self.repositories.items()},
            intake=self.intake_window,
        )
        self.lag_monitor = LoopLagMonitor(self.metrics)
        self._delivery_counters: dict[tuple[str, str], Any] = {}
        self._probe_task: asyncio.Task[None] | None = None
        #: ``/mcp`` (bot/mcp_http.py), made with the app.
        self.mcp: McpHttp | None = None
        self._recovery_task: asyncio.Task[None] | None = None

    @property
    def first(self) -> RepositoryBundle:
        """The first configured repository's bundle (the one ``[repository]`` when there is one); StopIteration
        only with ``[organization]`` while nothing is served yet (``first_key`` is None then)."""
        return next(iter(self.repositories.values()))

    @property
    def first_key(self) -> str | None:
        """The first served repository's key, or None while none is (an organization not read yet)."""
        return next(iter(self.repositories), None)

    @property
    def reconciler(self) -> Reconciler | None:
        """The first repository's catch-up (every bundle has its own: ``repositories``)."""
        return self.first.reconciler if self.repositories else None

    @property
    def run_teardowns(self) -> TeardownLoop | None:
        """The first repository's runs' teardown loop (every bundle has its own)."""
        return self.first.run_teardowns if self.repositories else None

    def _bundle(self, settings: Settings, key: str) -> RepositoryBundle:
        view = settings.for_repository(key)
        hooks = self.hooks_for(view) if self.hooks_for is not None else None
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
        self.worker.routes = {key: bundle.deps for key, bundle in self.repositories.items()}

    async def _start_bundle(self, bundle: RepositoryBundle) -> None:
        """Start one repository's runs' teardown loop and, with a Gitea client, its catch-up."""
        with acting_for(bundle.key):  # the loop's task (created here) files its entries under its repository
            bundle.run_teardowns = self._make_teardown_loop(bundle)
            bundle.run_teardowns.start()
        if bundle.gitea is not None:
            with acting_for(bundle.key):
                bundle.reconciler = self._make_reconciler(bundle)
                await bundle.reconciler.start()

    async def _stop_bundle(self, bundle: RepositoryBundle) -> None:
        if bundle.run_teardowns is not None:
            await bundle.run_teardowns.stop()
        if bundle.reconciler is not None:
            await bundle.reconciler.stop()

    # An organization's repositories, served and let go while running (bot/discovery.py).

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
        self.repositories[key] = bundle
        self.metrics.serve_repositories([key])
        self._reroute()
        await self._start_bundle(bundle)
        return bundle

    async def stop_serving(self, key: str, reason: str) -> None:
        """Stop serving a discovered repository (removed, archived or excluded): from now on its deliveries are
        ignored as any unserved repository's; what it stored stays."""
        bundle = self.repositories.pop(key)
        self._discovered.pop(key, None)
        self._serve_entries()
        self._reroute()
        await self._stop_bundle(bundle)
        log.warning("organization: %s is no longer served (%s); its deliveries are ignored from now on", key, reason)

    async def _apply_discovery(self, verdict: Discovered) -> None:
        from bot.discovery import discovery_changes

        org = self.settings.organization
        assert org is not None
        changes = discovery_changes(org, verdict, served=self.repositories.keys(), discovered=self._discovered.keys(),
                                    explicit={repo_key_of(entry) for entry in self._explicit})
        for entry in changes.serve:
            bundle = await self.serve_discovered(entry)
            log.info("organization %s: serving %s (discovered)", org.name, bundle.key)
        for key, reason in changes.let_go.items():
            await self.stop_serving(key, reason)

    def _deps(self, settings: Settings) -> HandlerDeps:
        """What one repository's handlers may use, never this Service (the Gitea client joins in start()); each
        repository has its own permission cache (a login's permission is per repository)."""
        return HandlerDeps(
            settings=settings,
            db=self.db,
            bot_login=lambda: self.bot_login or "",
            door=self._door(settings, None),
            outbox_wakeup=self.outbox_wakeup,
        )

    def _door(self, settings: Settings, gitea: GiteaClient | None) -> VerbRuntime[GiteaClient]:
        """The one door of a served repository (its settings view and Gitea client), handed to every surface:
        comment commands and auto-allocation (through the handlers' dependencies), MCP over HTTP, catch-up's
        allocation, the runs' teardown loop. The bot's login is set again when the service learns it."""
        from bot.catalog import open_door

        return open_door(self.db, settings, gitea, bot_login=self.bot_login or "", wakeup=self.outbox_wakeup)

    def outbox_wakeup(self) -> None:
        """Tell the sender that new outbox entries were committed (it also polls)."""
        if self.outbox_sender is not None:
            self.outbox_sender.wakeup.set()

    async def start(self) -> None:
        if self.settings.gitea_token():
            from bot.gitea import client_for
            from bot.outbox import OutboxSender

            self.http = aiohttp.ClientSession()
            for bundle in self.repositories.values():
                self._connect(bundle)
            # With an organization and no explicit entry there is no bundle yet: a client of the service's own.
            self.gitea = self.first.gitea if self.repositories else client_for(self.http, self.settings)
            self._reroute()
            first = self.first_key
            adopted = await self.outbox.adopt_unscoped(first) if first is not None else 0
            if adopted:
                log.info("outbox: %d entries stored before entries were filed by repository are %s's", adopted,
                         first)
            self.outbox_sender = self._make_outbox_sender(OutboxSender)
            self.outbox_sender.start()
            self._probe_task = asyncio.create_task(self._probe_loop(), name="gitea-probe")
            self._recovery_task = asyncio.create_task(self._recover_bootstraps(), name="bootstrap-recovery")
        else:
            self.gitea_status = GiteaStatus(False, "no gitea.token configured: Gitea API calls are off")
            log.warning("gitea: %s", self.gitea_status.detail)
        self.writer.start()
        self.worker.start()
        self.lag_monitor.start()
        for bundle in list(self.repositories.values()):
            await self._start_bundle(bundle)
        await self._start_discovery()

    async def _start_discovery(self) -> None:
        """``[organization]``: list its repositories now (the client's retries; a failure leaves only the explicit
        entries served, never a guessed set) and again every ``[reconcile] interval_s``."""
        org = self.settings.organization
        if org is None:
            return
        if self.gitea is None:
            log.warning("organization %s: no gitea.token configured, so its repositories cannot be listed; serving "
                        "the explicit [[repositories]] entries only", org.name)
            return
        from bot.discovery import OrgDiscovery

        self.discovery = OrgDiscovery(org, self.gitea, self._apply_discovery,
                                      interval_s=self.settings.reconcile.interval_s)
        await self.discovery.run_pass()
        self.discovery.start()

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

            with acting_for(bundle.key):
                await auto_allocate(bundle.deps.door, trigger="catch_up")
            self.outbox_wakeup()

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
            bot_login=lambda: self.bot_login or "",
            wakeup=wake,
            after_pass=allocate,
        )

    def _make_teardown_loop(self, bundle: RepositoryBundle) -> TeardownLoop:
        """One repository's runs' reserved teardowns by themselves (bot/loops/run_teardowns.py): a grant's
        expiry is the passing of time, which no webhook or call announces, so the service checks at start-up and
        on an interval."""
        from bot.loops.run_teardowns import TeardownLoop

        return TeardownLoop(self.db, bundle.settings, bundle.deps.door,
                            interval_s=bundle.settings.lifecycle.run_teardown_interval_s, on_ran=self.outbox_wakeup,
                            served=tuple(self.repositories))

    async def _recover_bootstraps(self) -> None:
        """Worktree bootstraps a killed process left open are finished or compensated (docs/bootstrap.md), in
        each served repository."""
        from bot.loops.recovery import recover_open_transitions
        from bot.verbs.bootstrap import BootstrapContext

        for bundle in self.repositories.values():
            context = BootstrapContext(db=self.db, settings=bundle.settings, gitea=bundle.gitea,
                                       bot_login=self.bot_login or self.settings.gitea.bot_login)
            try:
                with acting_for(bundle.key):
                    if await recover_open_transitions(context):
                        self.outbox_wakeup()
            except Exception:
                log.exception("recovering open worktree bootstraps of %s failed (the next bootstrap of each issue "
                              "recovers it)", bundle.key)

    def _outbox_client(self, repo: str) -> OutboxGitea | None:
        """The client of an outbox entry's repository; None (the entry is parked) for one this process does not
        serve, and for one filed under no repository (start-up adoption gave every older entry the first's)."""
        bundle = self.repositories.get(repo)
        return bundle.gitea if bundle is not None else None

    async def _on_outbox_complete(self, entry: OutboxEntry, result: dict[str, Any]) -> None:
        bundle = self.repositories.get(entry.repo)
        hooks = bundle.hooks if bundle is not None else None
        if bundle is not None and hooks is not None and hooks.on_complete is not None:
            with acting_for(bundle.key):
                await hooks.on_complete(entry, result)

    async def _on_outbox_failure(self, entry: OutboxEntry) -> None:
        bundle = self.repositories.get(entry.repo)
        hooks = bundle.hooks if bundle is not None else None
        if bundle is not None and hooks is not None and hooks.on_failure is not None:
            with acting_for(bundle.key):
                await hooks.on_failure(entry)

    def _make_outbox_sender(self, sender_class: type[OutboxSender]) -> OutboxSender:
        """The one sender of every repository's entries, each sent with its repository's client, its result
        reported to its repository's hooks (``open_service``: the issue state's)."""
        assert self.gitea is not None
        return sender_class(
            self.outbox,
            self.gitea,
            self.settings.outbox,
            self.metrics,
            on_complete=self._on_outbox_complete,
            on_failure=self._on_outbox_failure,
            clients=self._outbox_client,
        )

    async def stop(self) -> None:
        if self.mcp is not None:  # its sessions end first: no verb runs while the rest stops
            await self.mcp.close()
        if self.discovery is not None:
            await self.discovery.stop()
        for bundle in self.repositories.values():
            await self._stop_bundle(bundle)
        await self.lag_monitor.stop()
        await self.worker.stop(self.settings.server.shutdown_grace_s)
        await self.writer.stop()
        if self.outbox_sender is not None:
            await self.outbox_sender.stop()
        await cancel_and_wait(self._probe_task, self._recovery_task)
        if self.http is not None:
            await self.http.close()
        await self.db.close()

    async def probe_gitea(self) -> GiteaStatus:
        """Ask Gitea who we are; learn the bot's login from it. Unreachable is reported, never fatal."""
        assert self.gitea is not None
        before = self.gitea_status.reachable
        try:
            user = await self.gitea.get_own_user()
        except Exception as exc:
            status = GiteaStatus(False, f"unreachable at {self.settings.gitea.url}: {type(exc).__name__}: {exc}")
        else:
            login = user.login
            if self.bot_login and login.lower() != self.bot_login.lower():
                log.warning("gitea.bot_login is %s but the token belongs to %s; using %s", self.bot_login, login, login)
            self.bot_login = login
            for bundle in self.repositories.values():
                bundle.deps.door.bot_login = login
            status = GiteaStatus(True, "ok", login=login)
        status.checked_at = time.time()
        self.gitea_status = status
        self.metrics.gitea_reachable.set(1 if status.reachable else 0)
        if status.reachable != before:
            (log.info if status.reachable else log.warning)("gitea: %s", status.detail)
        return status

    async def _probe_loop(self) -> None:
        while True:
            await self.probe_gitea()
            await asyncio.sleep(self.settings.gitea.probe_interval_s)

    # --- HTTP ---------------------------------------------------------------------------------------------------------
    async def handle_webhook(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            return await self._intake(request)
        except Exception:
            # A bug, never an answer to bad input (the fuzz tests hold it to that): still JSON, still logged.
            log.exception("webhook intake failed")
            return web.json_response(
                {"error": "internal_error", "message": "the delivery was not stored; see the service log"},
                status=500,
            )
        finally:
            self.metrics.intake_seconds.observe(time.perf_counter() - started)

    async def _read_body(self, request: web.Request) -> bytes | Rejection:
        webhook = self.settings.webhook
        # Before reading: aiohttp would try to decompress a body that claims a Content-Encoding.
        declared = request.content_length
        refused = content_encoding_refusal(request.headers) if declared is None or declared <= \
            webhook.max_body_bytes else None
        if refused is not None:
            return refused
        return await read_body(request, limit=webhook.max_body_bytes, timeout_s=webhook.read_timeout_s,
                               setting="[webhook] read_timeout_s", read_declared=True)

    async def _intake(self, request: web.Request) -> web.Response:
        body = await self._read_body(request)
        if isinstance(body, Rejection):
            verdict: Delivery | Rejection = body
        else:
            verdict = admit(
                request.headers,
                body,
                secrets=self.settings.webhook_secrets(),
                max_body_bytes=self.settings.webhook.max_body_bytes,
            )
        if isinstance(verdict, Rejection):
            # Nothing from an unverified request becomes a label: its event header is not trusted.
            self.metrics.deliveries.labels("unverified", f"rejected_{verdict.status}").inc()
            log.info("webhook refused %d %s: %s", verdict.status, verdict.error, verdict.message)
            refusal = web.json_response(verdict.body(), status=verdict.status)
            if verdict.error in ("request_timeout", "bad_body"):
                refusal.force_close()  # what is left of that body is not read as the next request
            return refusal
        self.intake_window.arrived(time.monotonic())
        is_self = is_self_event(verdict, self.bot_login)
        event_label = metric_event(verdict.event)
        try:
            result = await self.writer.submit(verdict, is_self)
        except Exception:
            self.metrics.deliveries.labels(event_label, "store_error").inc()
            return web.json_response(
                {
                    "error": "storage_unavailable",
                    "message": "the delivery could not be stored; it was not accepted",
                    "remediate": "check /readyz and the service log (disk space, database permissions)",
                    "exact_next_action": "resend the delivery from Gitea's webhook page (Replay) once /readyz is 200",
                },
                status=503,
            )
        self._delivery_counter(event_label, result.outcome).inc()
        if result.outcome == "queued":
            self.worker.wakeup.set()
        status = 200 if result.outcome == "duplicate" else 202
        return _json_answer({"delivery": verdict.delivery_id, "status": result.outcome}, status)

    def _delivery_counter(self, event: str, outcome: str) -> Any:
        """The ``foreman_deliveries_total`` child of (event, outcome), looked up once (labels() takes a lock and
        builds a key on every call; both labels come from closed sets, so the cache is bounded)."""
        key = (event, outcome)
        child = self._delivery_counters.get(key)
        if child is None:
            child = self._delivery_counters[key] = self.metrics.deliveries.labels(event, outcome)
        return child

    async def handle_healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def handle_readyz(self, request: web.Request) -> web.Response:
        checks: dict[str, Any] = {}
        ready = True
        try:
            await asyncio.wait_for(self.db.check_writable(), timeout=2.0)
            checks["database"] = {"ok": True}
        except Exception as exc:
            ready = False
            reason = exc.reason if isinstance(exc, DatabaseNotWritable) else "unavailable"
            checks["database"] = {"ok": False, "reason": reason, "detail": f"{type(exc).__name__}: {exc}"}
        worker_ok = self.worker.alive() and self.writer.alive()
        ready = ready and worker_ok
        checks["worker"] = {
            "ok": worker_ok,
            "loops_alive": self.worker.loops_alive(),
            "loops": self.settings.worker.concurrency,
            "writer_alive": self.writer.alive(),
            "settles_retrying": len(self.worker.settles_retrying),
            "oldest_settle_retry_s": round(time.time() - min(self.worker.settles_retrying.values()), 1)
            if self.worker.settles_retrying
            else None,
        }
        checks["event_loop"] = {"lag_max_s": round(self.lag_monitor.max_lag_s, 4)}
        checks["outbox"] = {
            "sender": "running" if self.outbox_sender and self.outbox_sender.alive() else "off (no Gitea token)",
            **await self.outbox.counts(),
        }
        status = self.gitea_status
        checks["gitea"] = {"ok": bool(status.reachable), "detail": status.detail, "login": status.login}
        # Informative, never failing readiness: the webhook door works while Gitea cannot be read, and what a
        # failed pass missed is read again by the next one (docs/operating.md "Catch-up").
        per_repository = {key: self._reconcile_check(bundle) for key, bundle in self.repositories.items()}
        first = self.first_key  # the first repository's (as with one repository)
        checks["reconcile"] = per_repository[first] if first is not None else {
            "ok": None, "detail": "no repository served yet (the organization's repositories are not listed yet)"}
        checks["repositories"] = {key: {"reconcile": check} for key, check in per_repository.items()}
        org = self.settings.organization
        if org is not None:  # informative, like catch-up: the explicit entries are served meanwhile
            checks["organization"] = self.discovery.status.to_dict(org.name, self.settings.reconcile.interval_s) \
                if self.discovery is not None else {"ok": None, "organization": org.name,
                                                    "detail": "off (no Gitea token: nothing can be listed)"}
        return web.json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)

    def _reconcile_check(self, bundle: RepositoryBundle) -> dict[str, Any]:
        if bundle.reconciler is None:
            return {"ok": None, "detail": "off (no Gitea token: nothing can be read back)"}
        return bundle.reconciler.status.to_dict(bundle.settings.reconcile.interval_s)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        self.metrics.worker_loops_alive.set(self.worker.loops_alive())
        for name, count in (await self.store.counts()).items():
            self.metrics.inbox_depth.labels(name).set(count)
        for name, count in (await self.outbox.counts()).items():
            self.metrics.outbox_depth.labels(name).set(count)
        await self.metrics.refresh_state(self.db)
        from bot.metrics import CONTENT_TYPE

        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def make_app(self) -> web.Application:
        # The body limit is enforced by _read_body with a JSON error; aiohttp's own cap sits above it.
        app = web.Application(client_max_size=self.settings.webhook.max_body_bytes + 1024)
        app[SERVICE_KEY] = self
        app.router.add_post(self.settings.webhook.path, self.handle_webhook)
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_get("/metrics", self.handle_metrics)
        from bot.dashboard.routes import add_dashboard

        add_dashboard(app, self.db, self.settings)  # only with [dashboard] token (off without one)
        from bot.mcp_http import McpHttp

        # MCP over Streamable HTTP (docs/mcp.md): agents hold only this URL and their own token.
        self.mcp = McpHttp(self)
        app.router.add_route("*", MCP_PATH, self.mcp.handle)

        async def on_startup(_: web.Application) -> None:
            await self.start()

        async def on_shutdown(_: web.Application) -> None:
            await self.stop()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_shutdown)
        return app


def _json_answer(doc: Mapping[str, Any], status: int) -> web.Response:
    """A JSON answer as ``web.json_response`` gives it (same Content-Type), encoded by orjson: the webhook door's
    every answer, where json.dumps cost ~5 us of the event loop per delivery."""
    return web.Response(body=orjson.dumps(doc), status=status, content_type="application/json", charset="utf-8")


async def open_service(settings: Settings, router: OrderedRouter) -> Service:
    """The composition root: the service, its handlers' router and the issue state's outbox hooks, wired."""
    from handlers import outbox_hooks

    db = await open_database(settings.database)
    return Service(settings=settings, router=router, db=db, hooks_for=lambda view: outbox_hooks(db, view))
