"""A real `foreman serve` process with two test handlers, for crash-and-resume tests (run as a script)."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from gidgethub import sansio

from bot import logs
from bot.cli.serve import serve
from bot.config import load_settings
from bot.core.dispatch import OrderedRouter
from bot.worker import HandlerContext
from handlers import build_router

LOG = Path(os.environ["CRASH_LOG"])
GATE = Path(os.environ["CRASH_GATE"])
router = OrderedRouter()  # fast, then slow: the declared order


def _append(line: str) -> None:
    with LOG.open("a", encoding="utf-8") as handle:
        handle.write(line + "\n")
        handle.flush()
        os.fsync(handle.fileno())


@router.register("issues")
async def fast(event: sansio.Event, ctx: HandlerContext) -> None:
    """Appends "fast <delivery>" to $CRASH_LOG."""
    _append(f"fast {event.delivery_id}")


@router.register("issues")
async def slow(event: sansio.Event, ctx: HandlerContext) -> None:
    """Appends "slow-start <delivery>", waits until $CRASH_GATE exists, then appends "slow-end <delivery>"."""
    _append(f"slow-start {event.delivery_id}")
    while not GATE.exists():
        await asyncio.sleep(0.02)
    _append(f"slow-end {event.delivery_id}")


if __name__ == "__main__":
    settings = load_settings(Path(sys.argv[1]))
    logs.configure(json_lines=True, level="INFO")
    raise SystemExit(asyncio.run(serve(settings, build_router(router))))
