"""The group-commit writer: the webhook door's deliveries stored many to a transaction, each answered once stored."""

from __future__ import annotations

import asyncio
import logging

from bot.core.intake import Delivery
from bot.tasks import cancel_and_wait
from state.deliveries import DeliveryStore, InsertResult

log = logging.getLogger("foreman.app")

_MAX_BATCH = 256


class GroupCommitWriter:
    """One task stores whatever deliveries are waiting in a single transaction, then answers them all.

    A request is acknowledged only after its row is committed, so a 202 always means "stored".
    """

    def __init__(self, store: DeliveryStore) -> None:
        self._store = store
        self._queue: asyncio.Queue[tuple[Delivery, bool, asyncio.Future[InsertResult]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit-writer")

    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        while not self._queue.empty():
            _, _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(RuntimeError("service is shutting down"))

    async def submit(self, delivery: Delivery, is_self: bool) -> InsertResult:
        future: asyncio.Future[InsertResult] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((delivery, is_self, future))  # unbounded: never waits
        return await future

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < _MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                results = await self._store.insert_batch([(d, s) for d, s, _ in batch])
            except Exception as exc:
                if len(batch) == 1:
                    log.exception("storing a delivery failed")
                    _answer(batch[0][2], exc)
                    continue
                # One bad row must not fail its neighbours: store each on its own, so only the rows that
                # really cannot be stored are refused (all of them only when the database itself is down).
                log.warning("storing %d deliveries together failed (%s); storing each alone", len(batch), exc)
                for delivery, is_self, future in batch:
                    try:
                        (result,) = await self._store.insert_batch([(delivery, is_self)])
                    except Exception as row_exc:
                        log.exception("storing delivery %s failed", delivery.delivery_id)
                        _answer(future, row_exc)
                    else:
                        _answer(future, result)
                continue
            for (_, _, future), result in zip(batch, results, strict=True):
                _answer(future, result)


def _answer(future: asyncio.Future[InsertResult], outcome: InsertResult | BaseException) -> None:
    """Answer one waiting request (it may have gone away: a client that disconnected cancels its future)."""
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
