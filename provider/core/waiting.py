"""Waiting on shared work until a deadline, holding as little as possible per waiter.

In an outage every mount that arrives waits on the one shared read of its objects until the
store answers or the mount's own time is up: a few hundred at once on a busy node, and the
allocators keep the high-water mark of what they held (issue 16's soak). `asyncio.wait` is
built for the general case — it copies the awaitables into a set and runs two coroutines
around one waiter future — so here is the narrow one: a waiter future, one callback per
awaited task, one timer; it holds less per waiting mount than `asyncio.wait` on each object's
future (measured: BENCHMARKS.md, "Waiting mounts: one wait on the shared read").
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any


async def all_done(tasks: Collection[asyncio.Future[Any]], seconds: float) -> None:
    """Return once every one of `tasks` (tasks, or any futures) is done, or after `seconds`,
    whichever comes first. The tasks are never cancelled (other callers share them); a
    cancellation of the caller ends only its own wait."""
    left = sum(1 for task in tasks if not task.done())
    if not left or seconds <= 0:
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def one_done(_task: asyncio.Future[Any]) -> None:
        nonlocal left
        left -= 1
        if not left and not waiter.done():
            waiter.set_result(None)

    for task in tasks:
        if not task.done():
            task.add_done_callback(one_done)
    timer = loop.call_later(seconds, _release, waiter)
    try:
        await waiter
    finally:
        timer.cancel()
        for task in tasks:
            task.remove_done_callback(one_done)


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
