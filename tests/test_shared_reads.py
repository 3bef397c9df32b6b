"""A read shared by every caller for a stated bound (bot/shared_reads.py), and the runtime context's use of it:
one read of the default branch on Gitea per bound, however many agents poll."""

from __future__ import annotations

import asyncio

import pytest

from bot.shared_reads import SharedReads


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_answer_serves_every_caller_within_its_bound_then_is_read_again() -> None:
    clock, reads = Clock(), []
    shared = SharedReads(clock)

    async def read() -> int:
        reads.append(clock.now)
        return len(reads)

    assert [await shared.get("k", 2.0, read) for _ in range(3)] == [1, 1, 1]
    clock.now += 2.0
    assert await shared.get("k", 2.0, read) == 1  # at the bound: still served
    clock.now += 0.001
    assert await shared.get("k", 2.0, read) == 2 and len(reads) == 2
    assert await shared.get("other", 2.0, read) == 3  # another key reads on its own


async def test_callers_that_come_while_it_reads_wait_for_that_one_read() -> None:
    shared, started, release = SharedReads(), asyncio.Event(), asyncio.Event()
    count = 0

    async def read() -> str:
        nonlocal count
        count += 1
        started.set()
        await release.wait()
        return "main"

    first = asyncio.create_task(shared.get("k", 2.0, read))
    await started.wait()
    others = [asyncio.create_task(shared.get("k", 2.0, read)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(first, *others) == ["main"] * 6 and count == 1


async def test_a_failed_read_is_not_kept_and_its_waiters_see_the_failure() -> None:
    shared, started, release = SharedReads(), asyncio.Event(), asyncio.Event()
    answers: list[object] = [RuntimeError("gitea is down"), "main"]

    async def read() -> str:
        started.set()
        await release.wait()
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    first = asyncio.create_task(shared.get("k", 60.0, read))
    await started.wait()
    waiter = asyncio.create_task(shared.get("k", 60.0, read))
    await asyncio.sleep(0)
    release.set()
    for task in (first, waiter):
        with pytest.raises(RuntimeError, match="gitea is down"):
            await task
    assert await shared.get("k", 60.0, read) == "main"  # read again at once, not the failure kept
