"""The Gitea emulator: an in-memory Gitea for the bot's API subset, serving its app and webhooks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.emulator.payloads import hook_target, org_hook_target, system_hook_target
from bot.emulator.pullchecks import EmulatorPullChecks
from bot.emulator.webhooks import SentWebhook

if TYPE_CHECKING:
    from aiohttp import web


class Emulator(EmulatorPullChecks):
    """An in-memory Gitea v1.26.3 for the API subset the bot uses, with repositories on disk.

    Setup helpers (``add_user``, ``create_repo``, ``create_issue``, ...) change state directly and send
    webhooks only when asked (``notify=True``). Changes made through the HTTP API (``app``) always send
    webhooks to the repository's active hooks, in the background; ``await drain_webhooks()`` waits for
    them and ``deliveries`` records every attempt. ``faults`` arms injected failures; ``requests``
    records every HTTP request the app served.
    """

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
    def deliveries(self) -> list[SentWebhook]:
        """Every webhook delivery attempt so far, in the order they were queued."""
        return self._sender.deliveries

    async def drain_webhooks(self) -> list[SentWebhook]:
        """Wait until every pending delivery has finished; returns all deliveries so far."""
        await self._sender.drain()
        return self.deliveries

    def replay_delivery(self, delivery_id: str) -> SentWebhook:
        """Gitea's UI "Replay": send the same body again under a new delivery uuid."""
        original = next(d for d in self.deliveries if d.delivery_id == delivery_id)
        hook = next((h for r in self._repos.values() for h in r.hooks if h.id == original.hook_id), None)
        if hook is not None:
            return self._sender.replay(original, hook_target(hook, self))
        org_hook = next((h for h in self._org_hooks if h.id == original.hook_id), None)
        if org_hook is not None:
            return self._sender.replay(original, org_hook_target(org_hook, self))
        system_hook = next(h for h in self._system_hooks if h.id == original.hook_id)
        return self._sender.replay(original, system_hook_target(system_hook, self))

    async def aclose(self) -> None:
        """Stop pending deliveries and release the delivery HTTP session."""
        await self._sender.close()
