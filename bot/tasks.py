"""Background tasks: stopping them (cancel every one, then wait for each), and reads run a few at a time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None, also_suppress: tuple[type[Exception], ...] = ()) -> None:
    """Cancel the given tasks (None is skipped), then await each; its cancellation (and ``also_suppress``) is quiet.

    All are cancelled before the first is awaited, so one slow to end never keeps the others running meanwhile.
    """
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(asyncio.CancelledError, *also_suppress):
            await task


async def bounded_in_order(read: Callable[[T], Awaitable[R]], items: Sequence[T], *, at_once: int) -> list[R]:
    """``[await read(item) for item in items]``, with at most ``at_once`` reads in flight. As the loop would, it
    raises the exception of the first item (in order) whose read failed, after every started read has ended."""
    gate = asyncio.Semaphore(at_once)

    async def one(item: T) -> R:
        async with gate:
            return await read(item)

    outcomes = await asyncio.gather(*(one(item) for item in items), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return cast(list[R], outcomes)
