"""WorkShares (provider/core/limits.py): work off the loop, one tenant's share at a time."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from provider.core.errors import LimitExceeded
from provider.core.limits import WorkShares


def busy(seconds: float) -> str:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
    return threading.current_thread().name


async def test_work_runs_off_the_event_loop_thread() -> None:
    shares = WorkShares(share=1.0, window=10.0)
    name = await shares.run("a", lambda: busy(0.01), time.monotonic() + 5, "class 'x'")
    assert name != threading.current_thread().name


async def test_a_tenant_over_its_share_waits_or_is_refused_and_others_are_not() -> None:
    shares = WorkShares(share=0.1, window=1.0)  # 0.1 s of work a second
    deadline = time.monotonic() + 5
    await shares.run("a", lambda: busy(0.3), deadline, "class 'x'")  # 0.2 s over its share
    with pytest.raises(LimitExceeded, match="namespace a has used its share of parsing"):
        await shares.run("a", lambda: busy(0.01), time.monotonic() + 0.5, "class 'y'")
    started = time.monotonic()
    await shares.run("b", lambda: busy(0.01), deadline, "class 'z'")  # b is not held back
    assert time.monotonic() - started < 0.2
    started = time.monotonic()
    await shares.run("a", lambda: busy(0.01), deadline, "class 'y'")  # a waits for its share
    assert 1.0 <= time.monotonic() - started < 3.0


async def test_a_tenants_jobs_run_one_at_a_time_and_are_forgotten() -> None:
    shares = WorkShares(share=10.0, window=10.0)
    running = []

    def job() -> None:
        running.append(1)
        assert len(running) == 1
        busy(0.02)
        running.pop()

    deadline = time.monotonic() + 5
    await asyncio.gather(*(shares.run(t, job, deadline, "x") for t in ("a", "a", "b", "c")))
    assert not shares._tenants


async def test_a_share_counts_the_work_done_not_the_time_spent_waiting() -> None:
    """A job's share is its thread's CPU: time it spends waiting (for the GIL while the loop
    serves everyone else, here a sleep) is not the tenant's work."""
    shares = WorkShares(share=0.1, window=1.0)
    await shares.run("a", lambda: time.sleep(0.3), time.monotonic() + 5, "class 'x'")
    started = time.monotonic()
    await shares.run("a", lambda: busy(0.01), time.monotonic() + 0.5, "class 'y'")
    assert time.monotonic() - started < 0.2
