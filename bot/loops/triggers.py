"""Queued auto-allocation triggers: a verb that freed an author queues one auto-allocation for the service's
worker to run off the caller's path (handlers/auto_allocate.py runs it from the inbox)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from bot.config import Settings
from bot.core.intake import Delivery
from bot.verbs.runtime import VerbRuntime, queues_allocation
from state.db import Database
from state.deliveries import DeliveryStore

#: The inbox event of a queued auto-allocation trigger (handlers/auto_allocate.py runs it in the service).
TRIGGER_EVENT = "foreman_trigger"
TRIGGER_ACTION = "auto_allocate"
#: Queued triggers' delivery ids start so (``foreman deliveries`` lists them beside the webhooks).
TRIGGER_PREFIX = "foreman:auto-allocate:"


async def queue_auto_allocation(db: Database, settings: Settings, *, trigger: str, key: str) -> str | None:
    """Queue one auto-allocation for the service's worker to run (off the caller's path: a verb's caller never waits
    for another author's allocation and bootstrap); its delivery id is its key, so a replay queues nothing twice.

    The id of the queued trigger; None when auto-allocation is off. Queued after the caller's own commit: a crash
    in between loses only this trigger, and the next one (or catch-up's allocation after each pass) allocates."""
    if not settings.auto_allocation():
        return None
    repository = settings.repository
    delivery_id = f"{TRIGGER_PREFIX}{trigger}:{key}"
    payload = {"action": TRIGGER_ACTION, "trigger": trigger, "key": key,
               "repository": {"full_name": f"{repository.owner}/{repository.name}"}}
    body = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    delivery = Delivery(delivery_id=delivery_id, event=TRIGGER_EVENT, event_type=TRIGGER_EVENT, action=TRIGGER_ACTION,
                        sender_login=None, body=body, body_sha256=hashlib.sha256(body).hexdigest(),
                        headers={"X-Foreman-Trigger": trigger}, payload=payload)
    await DeliveryStore(db).insert_batch([(delivery, False)])
    return delivery_id


@queues_allocation
async def queue_after_hand_over(rt: VerbRuntime[Any], trigger: str, key: str) -> str | None:
    """A verb freed an author off its caller's path (the PR-open hand-over): one auto-allocation queued for the
    worker, in the verb's repository."""
    return await queue_auto_allocation(rt.db, rt.settings, trigger=trigger, key=key)
