"""Stopping background tasks: cancel every one, then wait for each to end."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


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
