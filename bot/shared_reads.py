"""A read of the outside world shared by every caller for a stated bound: the first caller reads, the callers that
come while it reads wait for that read, and for ``max_age_s`` after it the answer is handed out again.

For facts every caller of a repository asks alike and that are shown, not acted on (the runtime context's default
branch on Gitea): a thousand agents polling their context make one read of Gitea per bound, not one each. A failed
read is not kept (the next caller reads again), and no value is kept longer than its bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class SharedReads:
    """Answers by key, each kept ``max_age_s`` from when its read began (monotonic clock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._kept: dict[Hashable, tuple[float, Any]] = {}
        self._reading: dict[Hashable, asyncio.Future[Any]] = {}

    async def get(self, key: Hashable, max_age_s: float, read: Callable[[], Awaitable[T]]) -> T:
        kept = self._kept.get(key)
        if kept is not None and self._clock() - kept[0] <= max_age_s:
            value: T = kept[1]
            return value
        pending = self._reading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        began = self._clock()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._reading[key] = future
        try:
            value = await read()
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved here: a read nobody else waited for is not "never retrieved"
            raise
        else:
            self._kept[key] = (began, value)
            future.set_result(value)
            return value
        finally:
            del self._reading[key]
