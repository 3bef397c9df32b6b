"""The service's wiring: the aiohttp app (the webhook door, health, readiness, metrics, MCP over HTTP), what one
running instance owns and the order it starts and stops in, the Gitea probe, and the composition root
(``open_service``). The webhook door is bot/intake.py; the served repositories are bot/repositories.py."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from bot.config import Settings
from bot.core.dispatch import OrderedRouter
from bot.core.intake_burst import ArrivalWindow, BurstPolicy
from bot.group_commit import GroupCommitWriter
from bot.intake import WebhookIntake
from bot.metrics import LoopLagMonitor, Metrics
from bot.repositories import RepositoryBundle, ServedRepositories
from bot.tasks import cancel_and_wait
from bot.worker import Worker
from state.db import Database, DatabaseNotWritable, open_database
from state.deliveries import DeliveryStore
from state.outbox import OUTBOX_TOPIC, OutboxStore

if TYPE_CHECKING:
    from bot.gitea import GiteaClient
    from bot.loops.run_teardowns import TeardownLoop
    from bot.mcp_http import McpHttp
    from bot.outbox import OutboxHooks, OutboxSender
    from bot.reconcile import Reconciler
    from bot.verbs.bootstrap import BootstrapContext

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


class Service:
    """Everything one running instance owns, started and stopped as a unit: the webhook door (bot/intake.py), the
    served repositories (bot/repositories.py), the group-commit writer, the worker, the outbox sender and the
    probes. Built by ``open_service``; the handlers get their repository's ``HandlerDeps``, never this."""

    def __init__(
        self, settings: Settings, router: OrderedRouter, db: Database, *, metrics: Metrics | None = None,
        hooks_for: Callable[[Settings], OutboxHooks] | None = None,
    ) -> None:
        self.router = router
        self.db = db
        self.metrics = metrics if metrics is not None else Metrics()
        self.gitea_status = GiteaStatus()
        self.http: aiohttp.ClientSession | None = None
        self.gitea: GiteaClient | None = None
        self.store = DeliveryStore(db)
        self.outbox = OutboxStore(db)
        self.outbox_sender: OutboxSender | None = None
        # Every committed outbox entry wakes the sender, whichever verb, handler or loop stored it.
        self.db.on_commit(OUTBOX_TOPIC, self.outbox_wakeup)
        self.writer = GroupCommitWriter(self.store)
        self.bot_login: str | None = settings.gitea.bot_login
        worker = settings.worker
        #: The webhook door's admissions, which the worker's loops stand aside for while they come in a burst.
        window = ArrivalWindow(
            BurstPolicy(burst_per_s=worker.intake_burst_per_s, max_stand_aside_s=worker.max_stand_aside_s)
        )
        self.worker = Worker(self.store, router, worker, self.metrics, routes={}, intake=window)
        self.served = ServedRepositories(settings, db, self.store, self.metrics, self.worker,
                                         bot_login=lambda: self.bot_login,
                                         hooks_for=hooks_for)
        self.intake = WebhookIntake(settings, self.metrics, self.writer, window, wakeup=self._wake_worker,
                                    bot_login=lambda: self.bot_login)
        self.lag_monitor = LoopLagMonitor(self.metrics)
        self._probe_task: asyncio.Task[None] | None = None
        #: ``/mcp`` (bot/mcp_http.py), made with the app.
        self.mcp: McpHttp | None = None
        self._recovery_task: asyncio.Task[None] | None = None
        self._transport_task: asyncio.Task[None] | None = None

    @property
    def settings(self) -> Settings:
        """The settings as served now (an organization's discovery changes the served repositories)."""
        return self.served.settings

    @property
    def repositories(self) -> dict[str, RepositoryBundle]:
        """Every served repository's bundle by its key, in configuration order (the first is ``[repository]``'s)."""
        return self.served.bundles

    @property
    def intake_window(self) -> ArrivalWindow:
        """The webhook door's admissions, which the worker's loops stand aside for while they come in a burst."""
        return self.intake.window

    @intake_window.setter
    def intake_window(self, window: ArrivalWindow) -> None:
        self.intake.window = window

    @property
    def reconciler(self) -> Reconciler | None:
        """The first repository's catch-up (every bundle has its own: ``repositories``)."""
        return self.served.first.reconciler if self.repositories else None

    @property
    def run_teardowns(self) -> TeardownLoop | None:
        """The first repository's runs' teardown loop (every bundle has its own)."""
        return self.served.first.run_teardowns if self.repositories else None

    def outbox_wakeup(self) -> None:
        """Tell the sender that new outbox entries were committed (it also polls)."""
        if self.outbox_sender is not None:
            self.outbox_sender.wakeup.set()

    def _wake_worker(self) -> None:
        self.worker.wakeup.set()

    async def start(self) -> None:
        if self.settings.gitea_token():
            from bot.gitea import client_for
            from bot.outbox import OutboxSender

            self.http = aiohttp.ClientSession()
            self.served.connect(self.http)
            # With an organization and no explicit entry there is no bundle yet: a client of the service's own.
            self.gitea = self.served.first.gitea if self.repositories else client_for(self.http, self.settings)
            first = self.served.first_key
            adopted = await self.outbox.adopt_unscoped(first) if first is not None else 0
            if adopted:
                log.info("outbox: %d entries stored before entries were filed by repository are %s's", adopted,
                         first)
            self.outbox_sender = self._make_outbox_sender(OutboxSender)
            self.outbox_sender.start()
            self._probe_task = asyncio.create_task(self._probe_loop(), name="gitea-probe")
            self._transport_task = asyncio.create_task(self._transport_loop(), name="git-transport-check")
            self._recovery_task = asyncio.create_task(self.served.recover_bootstraps(), name="bootstrap-recovery")
        else:
            self.gitea_status = GiteaStatus(False, "no gitea.token configured: Gitea API calls are off")
            log.warning("gitea: %s", self.gitea_status.detail)
        self.writer.start()
        self.worker.start()
        self.lag_monitor.start()
        await self.served.start(self.gitea)

    def _make_outbox_sender(self, sender_class: type[OutboxSender]) -> OutboxSender:
        """The one sender of every repository's entries, each sent with its repository's client, its result
        reported to its repository's hooks (``open_service``: the issue state's)."""
        assert self.gitea is not None
        return sender_class(
            self.outbox,
            self.gitea,
            self.settings.outbox,
            self.metrics,
            on_complete=self.served.on_outbox_complete,
            on_failure=self.served.on_outbox_failure,
            clients=self.served.outbox_client,
        )

    async def stop(self) -> None:
        if self.mcp is not None:  # its sessions end first: no verb runs while the rest stops
            await self.mcp.close()
        await self.served.stop()  # an organization's discovery, then each repository's loops
        await self.lag_monitor.stop()
        await self.worker.stop(self.settings.server.shutdown_grace_s)
        await self.writer.stop()
        if self.outbox_sender is not None:
            await self.outbox_sender.stop()
        await cancel_and_wait(self._probe_task, self._recovery_task, self._transport_task)
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
            self.served.learned_login(login)
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

    def _bootstrap_context(self, bundle: RepositoryBundle) -> BootstrapContext:
        from bot.verbs.bootstrap import BootstrapContext

        return BootstrapContext(db=self.db, settings=bundle.settings, gitea=bundle.gitea,
                                bot_login=self.bot_login or bundle.settings.gitea.bot_login)

    async def check_transports(self) -> None:
        """Each served repository's git transport checked once, one repository after the other (each check bounded
        by its timeout; a check still running is not started twice): ``/readyz``'s ``git_transport``."""
        from bot.verbs.bootstrap.checkout import check_transport

        for bundle in list(self.repositories.values()):
            try:
                await check_transport(self._bootstrap_context(bundle))
            except Exception:  # a check that cannot run is shown by its age; the schedule goes on
                log.exception("git transport check of %s failed to run", bundle.key)

    async def _transport_loop(self) -> None:
        from bot.gitops.transport import TRANSPORT_CHECK_INTERVAL_S

        while True:
            await self.check_transports()
            await asyncio.sleep(TRANSPORT_CHECK_INTERVAL_S)

    # --- HTTP: the webhook door is bot/intake.py; the probes are here -------------------------------------------
    async def handle_healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def handle_readyz(self, request: web.Request) -> web.Response:
        doc = await self.readiness()
        return web.json_response(doc, status=200 if doc["ready"] else 503)

    async def readiness(self) -> dict[str, Any]:
        """What ``/readyz`` answers (``ready`` and every check); the dashboard's health reads the same document."""
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
        checks["gitea"] = {"ok": bool(status.reachable), "reachable": status.reachable, "detail": status.detail,
                           "login": status.login}
        # Informative, never failing readiness: the webhook door works while Gitea cannot be read, and what a
        # failed pass missed is read again by the next one (docs/operating.md "Catch-up").
        per_repository = {key: _reconcile_check(bundle) for key, bundle in self.repositories.items()}
        # Informative too: git over HTTP with the bot's credentials, as the last scheduled check found it (its age
        # says how old); the allocation's proof asks git itself while it is not a recent success.
        transports = {key: self._transport_check(bundle) for key, bundle in self.repositories.items()}
        first = self.served.first_key  # the first repository's (as with one repository)
        checks["reconcile"] = per_repository[first] if first is not None else {
            "ok": None, "detail": "no repository served yet (the organization's repositories are not listed yet)"}
        if first is not None:
            checks["git_transport"] = transports[first]
        checks["repositories"] = {key: {"reconcile": check, "git_transport": transports[key]}
                                  for key, check in per_repository.items()}
        org = self.settings.organization
        if org is not None:  # informative, like catch-up: the explicit entries are served meanwhile
            discovery = self.served.discovery
            checks["organization"] = discovery.status.to_dict(org.name, self.settings.reconcile.interval_s) \
                if discovery is not None else {"ok": None, "organization": org.name,
                                               "detail": "off (no Gitea token: nothing can be listed)"}
        return {"ready": ready, "checks": checks}

    def _transport_check(self, bundle: RepositoryBundle) -> dict[str, Any]:
        from bot.gitops.transport import TRANSPORT_CHECK_INTERVAL_S, transport_check

        if bundle.gitea is None:
            return {"ok": None, "detail": "off (no Gitea token: nothing is checked)"}
        found = transport_check(self._bootstrap_context(bundle).checkout_path).to_dict()
        return {**found, "interval_s": TRANSPORT_CHECK_INTERVAL_S}

    async def handle_metrics(self, request: web.Request) -> web.Response:
        self.metrics.worker_loops_alive.set(self.worker.loops_alive())
        self.metrics.worker_loops_configured.set(self.settings.worker.concurrency)
        for name, count in (await self.store.counts()).items():
            self.metrics.inbox_depth.labels(name).set(count)
        for name, count in (await self.outbox.counts()).items():
            self.metrics.outbox_depth.labels(name).set(count)
        await self.metrics.refresh_state(self.db, lease_grace_s=self.settings.allocator.lease_grace_s,
                                         repositories=list(self.repositories))
        from bot.metrics import CONTENT_TYPE

        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    def make_app(self) -> web.Application:
        # The body limit is enforced by the webhook door (bot/intake.py) with a JSON error; aiohttp's own cap sits
        # above it.
        app = web.Application(client_max_size=self.settings.webhook.max_body_bytes + 1024)
        app[SERVICE_KEY] = self
        app.router.add_post(self.settings.webhook.path, self.intake.handle)
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_get("/metrics", self.handle_metrics)
        from bot.dashboard.routes import add_dashboard

        # Only with [dashboard] token (off without one); the queues are read through the served repositories' doors.
        # Its health is /readyz's document, its refused deliveries the webhook door's.
        add_dashboard(app, self.db, self.settings, self.served.door_of, health=self.readiness,
                      refused=self.intake.refused.to_dict)
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


def _reconcile_check(bundle: RepositoryBundle) -> dict[str, Any]:
    if bundle.reconciler is None:
        return {"ok": None, "detail": "off (no Gitea token: nothing can be read back)"}
    return bundle.reconciler.status.to_dict(bundle.settings.reconcile.interval_s)


async def open_service(settings: Settings, router: OrderedRouter) -> Service:
    """The composition root: the service, its handlers' router and the issue state's outbox hooks, wired."""
    from handlers import outbox_hooks

    db = await open_database(settings.database)
    return Service(settings=settings, router=router, db=db, hooks_for=lambda view: outbox_hooks(db, view))
