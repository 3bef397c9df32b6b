"""Drains the inbox: claims a delivery, runs every matching handler in isolation, settles it exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from gidgethub import sansio

from bot.config_sections import WorkerConfig
from bot.core import backoff, jsontext
from bot.core.dispatch import OrderedRouter, Refusal, refuse_dispatch
from bot.core.intake import metric_event
from bot.core.intake_burst import ArrivalWindow, stand_aside_for
from bot.handler_deps import HandlerDeps
from bot.logs import delivery_var
from bot.metrics import Metrics
from bot.tasks import cancel_and_wait
from state.db import utcnow
from state.deliveries import DeliveryStore, StoredDelivery

log = logging.getLogger("foreman.worker")


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What a handler gets besides the event: dependencies arrive here, never as imported globals."""

    delivery: StoredDelivery
    log: logging.LoggerAdapter[logging.Logger]
    deps: HandlerDeps


def handler_name(callback: Callable[..., Any]) -> str:
    return f"{callback.__module__}.{callback.__qualname__}"


class Worker:
    """Several concurrent loops over one inbox. Each delivery is settled once: done, retried or failed."""

    def __init__(
        self,
        store: DeliveryStore,
        router: OrderedRouter,
        config: WorkerConfig,
        metrics: Metrics,
        *,
        routes: Mapping[str, HandlerDeps],
        intake: ArrivalWindow | None = None,
    ) -> None:
        self.store = store
        self.router = router
        self.config = config
        self.metrics = metrics
        #: Each served repository's key (``owner/name`` in lower case) -> its handlers' dependencies. Replaced
        #: (never mutated) by the composition root when the Gitea clients exist, before start().
        self.routes: dict[str, HandlerDeps] = dict(routes)
        #: The webhook door's recent admissions: while they come in a burst, a loop waits before its claim.
        self.intake = intake
        self.worker_id = f"worker-{uuid.uuid4().hex[:12]}"
        self.wakeup = asyncio.Event()
        self.last_tick = time.monotonic()
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight: dict[int, asyncio.Task[None]] = {}
        #: Deliveries whose settling commit is being retried (pk -> since when, epoch seconds).
        self.settles_retrying: dict[int, float] = {}

    @property
    def served(self) -> frozenset[str]:
        """The served repositories' ``owner/name``, case-folded (what ``refuse_dispatch`` checks)."""
        return frozenset(key.casefold() for key in self.routes)

    def route(self, payload: Any) -> tuple[str, HandlerDeps]:
        """The repository key and dependencies of a delivery ``refuse_dispatch`` let through (its
        ``repository.full_name`` is served, compared case-insensitively)."""
        folded = str(payload["repository"]["full_name"]).casefold()
        key = next(key for key in self.routes if key.casefold() == folded)
        return key, self.routes[key]

    # --- lifecycle ----------------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._loop(i), name=f"{self.worker_id}-{i}") for i in range(self.config.concurrency)
        ]
        self._tasks.append(asyncio.create_task(self._reaper(), name=f"{self.worker_id}-reaper"))

    def alive(self) -> bool:
        return bool(self._tasks) and not any(t.done() for t in self._tasks) and not self._stopping.is_set()

    def loops_alive(self) -> int:
        """How many of the drain loops are running (a loop never ends but by shutdown; this shows it)."""
        return sum(1 for task in self._tasks[: self.config.concurrency] if not task.done())

    async def stop(self, grace_s: float) -> None:
        """Stop claiming; let in-flight deliveries finish within grace_s, then abandon them safely."""
        self._stopping.set()
        self.wakeup.set()
        inflight = list(self._inflight.values())
        if inflight:
            log.info("waiting up to %.1fs for %d in-flight deliveries", grace_s, len(inflight))
            await asyncio.wait(inflight, timeout=grace_s)
        await cancel_and_wait(*self._tasks)
        self._tasks = []

    # --- loops --------------------------------------------------------------------------------------------------------
    def _pause_after(self, failures: int) -> float:
        """The pause after a failed pass of a loop or a failed settle: a quarter of a delivery's backoff."""
        config = self.config
        return backoff.delay(failures, base=config.backoff_base_s / 4, cap=config.backoff_max_s, jitter="full")

    def _beat_s(self) -> float:
        """The period of claim heartbeats and reaper passes: three in each claim's time to live."""
        return max(0.05, self.config.claim_ttl_s / 3)

    async def _loop(self, index: int) -> None:
        """One drain loop. It never dies: whatever one pass raises is logged, counted and backed off from."""
        failures = 0
        while not self._stopping.is_set():
            try:
                await self._drain_once(f"{self.worker_id}-{index}")
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                self.metrics.worker_loop_errors.inc()
                log.exception("worker loop %d: a pass failed (%d in a row); backing off", index, failures)
                delay = self._pause_after(failures)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=delay)

    async def _drain_once(self, owner: str) -> None:
        """Claim one delivery as ``owner`` (this loop's own claim id) and process it, or wait for work."""
        self.last_tick = time.monotonic()
        await self._stand_aside()
        try:
            claimed = await self.store.claim_next(owner)
        except Exception:
            log.exception("claiming a delivery failed; retrying")
            self.metrics.worker_loop_errors.inc()
            claimed = None
        if claimed is None:
            self.wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wakeup.wait(), timeout=self.config.poll_interval_s)
            return
        task = asyncio.create_task(self._process(claimed, owner))
        self._inflight[claimed.pk] = task
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            # Shutdown past its grace: abandon the delivery so the next start runs it again.
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            with contextlib.suppress(Exception):
                await self.store.abandon(claimed.pk, owner)
            raise
        finally:
            self._inflight.pop(claimed.pk, None)

    async def _stand_aside(self) -> None:
        """Wait while the webhook door answers a burst of signed deliveries, never longer than the policy's bound
        (bot/core/intake_burst.py): what arrives is stored already, and is claimed the moment the burst ends."""
        if self.intake is None:
            return
        since = time.monotonic()
        while not self._stopping.is_set():
            pause = stand_aside_for(self.intake, now=time.monotonic(), since=since)
            if pause <= 0:
                break
            await asyncio.sleep(pause)
        waited = time.monotonic() - since
        if waited > 0.0005:
            self.metrics.worker_stood_aside.inc(waited)

    async def _reaper(self) -> None:
        """Take back claims of dead processes (their heartbeat stopped) so their deliveries resume."""
        while not self._stopping.is_set():
            try:
                reclaimed = await self.store.reclaim_stale(ttl_s=self.config.claim_ttl_s)
                if reclaimed:
                    log.warning("resumed %d deliveries abandoned by a dead worker", reclaimed)
                    self.wakeup.set()
                counts = await self.store.counts()
                for status, count in counts.items():
                    self.metrics.inbox_depth.labels(status).set(count)
            except Exception:
                log.exception("reaper pass failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self._beat_s())

    async def _heartbeat(self, pk: int, owner: str) -> None:
        while True:
            await asyncio.sleep(self._beat_s())
            try:
                await self.store.heartbeat(pk, owner)
            except Exception:  # the next beat tries again; a lapsed claim is only run again, never lost
                log.warning("heartbeat of delivery %d failed", pk, exc_info=True)

    # --- one delivery -------------------------------------------------------------------------------------------------
    async def _process(self, delivery: StoredDelivery, owner: str) -> None:
        token = delivery_var.set(delivery.delivery_id)
        started = time.perf_counter()
        heartbeat = asyncio.create_task(self._heartbeat(delivery.pk, owner))
        try:
            payload, refusal = self._dispatchable(delivery)
            if refusal is not None:
                await self._durably(delivery, owner, lambda: self._settle_refusal(delivery, owner, refusal))
            else:
                _, deps = self.route(payload)
                results, unrecorded = await self.run_handlers(delivery, payload, deps=deps)

                async def settle() -> None:
                    await self._settle(delivery, owner, results, unrecorded)

                async def keep_results() -> None:
                    # The settle commit carries the last handler's result; before retrying it, record that result
                    # on its own, so a shutdown during the retries never runs a finished handler again.
                    for name, error in list(unrecorded.items()):
                        await self.store.record_handler(delivery.pk, name, error=error)
                        del unrecorded[name]

                await self._durably(delivery, owner, settle, on_failure=keep_results)
        finally:
            await cancel_and_wait(heartbeat)
            self.metrics.processing_seconds.labels(metric_event(delivery.event)).observe(time.perf_counter() - started)
            delivery_var.reset(token)

    def _dispatchable(self, delivery: StoredDelivery) -> tuple[Any, Refusal | None]:
        """The payload (parsed once) and why it reaches no handler (another repository, an unroutable shape)."""
        try:
            payload = jsontext.loads(delivery.body)
        except (ValueError, RecursionError) as exc:
            return None, Refusal("failed", f"undispatchable: the stored body is not JSON ({type(exc).__name__})")
        return payload, refuse_dispatch(payload, self.served)

    async def _settle_refusal(self, delivery: StoredDelivery, owner: str, refusal: Refusal) -> None:
        label = metric_event(delivery.event)
        if refusal.outcome == "ignored":
            await self.store.ignore(delivery.pk, owner, reason=refusal.reason)
            self.metrics.deliveries.labels(label, "ignored").inc()
            log.info("delivery ignored: %s", refusal.reason)
            return
        await self.store.park_failed(delivery.pk, owner, error=refusal.reason)
        self.metrics.deliveries.labels(label, "failed").inc()
        log.error("delivery parked as failed: %s", refusal.reason)

    async def _durably(
        self,
        delivery: StoredDelivery,
        owner: str,
        settle: Callable[[], Awaitable[None]],
        *,
        on_failure: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """Run a settling commit until it lands (a full disk, a locked database), backing off between tries.

        While it retries, ``foreman_worker_settles_retrying`` counts it and /readyz names it. At shutdown it
        gives up: the claim then lapses and the delivery runs again, its finished handlers skipped (``on_failure``
        records what the settle commit would have), so nothing is lost and nothing finished repeats.
        """
        attempt = 0
        try:
            while True:
                try:
                    await settle()
                    return
                except Exception:
                    attempt += 1
                    if attempt == 1:
                        self.settles_retrying[delivery.pk] = time.time()
                        self.metrics.worker_settles_retrying.set(len(self.settles_retrying))
                    self.metrics.worker_loop_errors.inc()
                    log.exception("settling delivery %d failed (attempt %d); retrying", delivery.pk, attempt)
                    if on_failure is not None:
                        with contextlib.suppress(Exception):
                            await on_failure()
                    if self._stopping.is_set():
                        return
                    delay = self._pause_after(attempt)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        finally:
            if self.settles_retrying.pop(delivery.pk, None) is not None:
                self.metrics.worker_settles_retrying.set(len(self.settles_retrying))

    async def run_handlers(
        self, delivery: StoredDelivery, payload: Any = None, *, deps: HandlerDeps | None = None
    ) -> tuple[dict[str, str | None], dict[str, str | None]]:
        """Run every matching handler not yet done for this delivery, in the router's declared order; one failure
        never stops the others.

        Returns (every result of this run, the results not yet recorded): handler → error (None: done). Each
        result is recorded as soon as a later sibling is about to run (so a crash never repeats a finished
        sibling); the last one is recorded in the commit that settles the delivery (one commit fewer). ``deps``:
        the delivery's repository's (default: the first served repository's).
        """
        data = jsontext.loads(delivery.body) if payload is None else payload
        if deps is None:
            deps = next(iter(self.routes.values()))
        event = sansio.Event(data, event=delivery.event, delivery_id=delivery.delivery_id)
        already = await self.store.done_handlers(delivery.pk)
        adapter = logging.LoggerAdapter(log, {"delivery": delivery.delivery_id, "event": delivery.event})
        context = HandlerContext(delivery=delivery, log=adapter, deps=deps)
        results: dict[str, str | None] = {}
        pending: dict[str, str | None] = {}
        try:
            callbacks = self.router.handlers_for(event)
        except Exception as exc:  # refuse_dispatch checks the routed fields first; this is the net behind it
            name = "router.fetch"
            message = f"undispatchable: {type(exc).__name__}: {exc}"[:2000]
            self.metrics.handler_errors.labels(name).inc()
            return {name: message}, {}
        for callback in callbacks:
            name = handler_name(callback)
            if name in already:
                continue
            for recorded, error in pending.items():
                await self.store.record_handler(delivery.pk, recorded, error=error)
            pending.clear()
            try:
                await callback(event, context)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"[:2000]
                pending[name] = message
                self.metrics.handler_errors.labels(name).inc()
                adapter.exception("handler %s failed", name)
            else:
                pending[name] = None
            results[name] = pending[name]
        return results, pending

    async def _settle(
        self, delivery: StoredDelivery, owner: str, results: dict[str, str | None], unrecorded: dict[str, str | None]
    ) -> None:
        errors = {name: error for name, error in results.items() if error is not None}
        if not errors:
            await self.store.finish(delivery.pk, owner, handler_results=unrecorded)
            self.metrics.deliveries.labels(metric_event(delivery.event), "done").inc()
            return
        summary = "; ".join(f"{name}: {message}" for name, message in sorted(errors.items()))
        if delivery.attempts >= self.config.max_attempts or "router.fetch" in errors:  # retrying cannot route it
            await self.store.park_failed(delivery.pk, owner, error=summary, handler_results=unrecorded)
            self.metrics.deliveries.labels(metric_event(delivery.event), "failed").inc()
            log.error("delivery parked as failed after %d attempts: %s", delivery.attempts, summary)
            return
        delay = backoff.delay(
            delivery.attempts, base=self.config.backoff_base_s, cap=self.config.backoff_max_s, jitter="full"
        )
        await self.store.retry_later(
            delivery.pk,
            owner,
            error=summary,
            next_attempt_at=utcnow() + timedelta(seconds=delay),
            handler_results=unrecorded,
        )
        self.metrics.deliveries.labels(metric_event(delivery.event), "retry").inc()
        log.warning("delivery will retry in %.1fs (attempt %d): %s", delay, delivery.attempts, summary)
