"""`waiting.all_done`: the wait every mount of an outage sits in, on loads other mounts share."""

from __future__ import annotations

import asyncio
import time

import pytest

from provider.core.waiting import all_done


async def _sleeper(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"


def _callbacks(task: asyncio.Future[object]) -> int:
    # The C Future exposes its pending callbacks read-only; a waiter that left must leave none.
    return len(task._callbacks or [])  # type: ignore[attr-defined]


async def test_returns_when_every_task_is_done() -> None:
    tasks = {asyncio.create_task(_sleeper(0.02)), asyncio.create_task(_sleeper(0.05))}
    start = time.monotonic()
    await all_done(tasks, 5.0)
    assert all(task.done() for task in tasks)
    assert time.monotonic() - start < 2.0


async def test_returns_at_the_timeout_and_leaves_the_shared_tasks_running() -> None:
    slow = asyncio.create_task(_sleeper(0.5))
    await all_done({slow}, 0.05)
    assert not slow.done()  # another caller may still be waiting on it
    assert _callbacks(slow) == 0
    assert await slow == "done"


async def test_nothing_pending_or_no_time_left_returns_at_once() -> None:
    done = asyncio.create_task(_sleeper(0))
    await done
    pending = asyncio.create_task(_sleeper(0.5))
    await all_done({done}, 5.0)
    await all_done({pending}, 0.0)
    await all_done({pending}, -1.0)
    await all_done(set(), 5.0)
    assert not pending.done() and _callbacks(pending) == 0
    pending.cancel()


async def test_a_cancelled_waiter_cancels_only_its_own_wait() -> None:
    shared = asyncio.create_task(_sleeper(0.2))
    waiter = asyncio.create_task(all_done({shared}, 5.0))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not shared.done() and _callbacks(shared) == 0
    assert await shared == "done"


async def test_many_waiters_on_one_task_all_wake_and_detach() -> None:
    shared = asyncio.create_task(_sleeper(0.05))
    waiters = [asyncio.create_task(all_done({shared}, 5.0)) for _ in range(200)]
    await asyncio.sleep(0.01)
    assert _callbacks(shared) >= 200
    await asyncio.gather(*waiters)
    assert shared.done()


async def test_a_failed_or_cancelled_task_counts_as_done() -> None:
    async def boom() -> None:
        raise RuntimeError("load failed")

    failing = asyncio.create_task(boom())
    cancelled = asyncio.create_task(_sleeper(5))
    asyncio.get_running_loop().call_later(0.02, cancelled.cancel)
    await all_done({failing, cancelled}, 5.0)
    assert failing.done() and cancelled.cancelled()
    assert isinstance(failing.exception(), RuntimeError)
