"""One loop timer for every mount's backstop deadline (provider/edge/watchdog.py)."""

from __future__ import annotations

import asyncio
import contextlib

from provider.edge.watchdog import Watchdog


async def guarded(dog: Watchdog, seconds: float, work: float) -> str:
    task = asyncio.current_task()
    assert task is not None
    dog.watch(task, seconds)
    try:
        await asyncio.sleep(work)
        return "done"
    except asyncio.CancelledError:
        if dog.fired(task):
            return "deadline"
        raise
    finally:
        dog.forget(task)


async def test_a_mount_past_its_deadline_is_cancelled_and_told_so() -> None:
    dog = Watchdog()
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await asyncio.create_task(guarded(dog, 0.05, 5)) == "deadline"
    assert 0.05 <= loop.time() - start < 1
    assert len(dog) == 0


async def test_mounts_in_time_leave_nothing_behind() -> None:
    dog = Watchdog()
    results = await asyncio.gather(*(guarded(dog, 5, 0.01) for _ in range(50)))
    assert results == ["done"] * 50 and len(dog) == 0


async def test_each_mount_gets_its_own_deadline_whatever_the_order() -> None:
    # A long deadline first, then a short one: the timer moves to the earlier; after it
    # fires, the later deadline still holds.
    dog = Watchdog()
    long = asyncio.create_task(guarded(dog, 0.3, 5))
    await asyncio.sleep(0)
    short = asyncio.create_task(guarded(dog, 0.05, 5))
    fine = asyncio.create_task(guarded(dog, 5, 0.1))
    assert await short == "deadline"
    assert not long.done()
    assert await fine == "done"
    assert await long == "deadline"
    assert len(dog) == 0


async def test_someone_elses_cancellation_is_not_the_watchdogs() -> None:
    dog = Watchdog()
    task = asyncio.create_task(guarded(dog, 5, 5))
    await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled() and len(dog) == 0


async def test_a_swallowed_cancellation_is_taken_back() -> None:
    dog = Watchdog()

    async def stubborn() -> int:
        task = asyncio.current_task()
        assert task is not None
        dog.watch(task, 0.02)
        try:
            with contextlib.suppress(asyncio.CancelledError):  # a library that swallows it
                await asyncio.sleep(5)
        finally:
            dog.forget(task)
        await asyncio.sleep(0.01)  # the task is not left cancelling
        return asyncio.current_task().cancelling()  # type: ignore[union-attr]

    assert await asyncio.create_task(stubborn()) == 0
