"""`foreman serve`: the webhook service until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys

from aiohttp import web

from bot.cli.common import EXIT_OK, EXIT_USAGE
from bot.cli.parsing import Commands
from bot.config import Settings, ensure_webhook_secret
from bot.core.dispatch import OrderedRouter

log = logging.getLogger("foreman.cli")


async def serve(settings: Settings, router: OrderedRouter | None = None) -> int:
    """Run the service until SIGTERM/SIGINT, then shut down gracefully."""
    from bot.app import open_service
    from bot.http_server import ServiceRunner, runner_options
    from handlers import build_router

    settings, secret_path = ensure_webhook_secret(settings)
    if secret_path is not None:
        log.warning(
            "no webhook secret configured: using the generated one stored in %s (mode 0600); "
            "paste its contents into the Gitea webhook's Secret field",
            secret_path.resolve(),
        )
    service = await open_service(settings, router or build_router())
    app = service.make_app()
    runner = ServiceRunner(app, handle_signals=False, access_log=None, **runner_options(settings))
    await runner.setup()
    site = web.TCPSite(runner, settings.server.host, settings.server.port)
    try:
        await site.start()
    except OSError as exc:  # a taken port, an address that is not this host's, a privileged port
        from bot.emulator_cli import listen_refusal

        await runner.cleanup()
        print(json.dumps(listen_refusal("serve", settings.server.host, settings.server.port, exc), sort_keys=True),
              file=sys.stderr)
        return EXIT_USAGE
    port = runner.addresses[0][1] if runner.addresses else settings.server.port
    log.info(
        "listening on http://%s:%s%s (database %s)",
        settings.server.host,
        port,
        settings.webhook.path,
        settings.database.describe(),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: finishing in-flight deliveries (grace %.1fs)", settings.server.shutdown_grace_s)
    await runner.cleanup()
    log.info("stopped")
    return EXIT_OK


def register(commands: Commands) -> None:
    """``foreman serve``."""
    commands.add("serve", "run the webhook service (and the dashboard at /dashboard with [dashboard] token)")
