"""ReadBytes (provider/core/limits.py): the bytes of store answers in flight, per fetch (its
answer budget) and provider-wide with a fair share per namespace (issue 40, item 1)."""

from __future__ import annotations

import asyncio

import pytest

from provider.core.errors import LimitExceeded
from provider.core.limits import ReadBytes

A = "vault|addr|team-a/app"
B = "vault|addr|team-b/app"


async def test_a_fetch_is_refused_at_the_charge_that_passes_its_budget() -> None:
    pool = ReadBytes(total=1000, per_namespace=1000, per_fetch=100)
    with pytest.raises(LimitExceeded, match="--max-response-bytes"):
        async with pool.fetch(A) as held:
            await held.charge(60)
            with pytest.raises(LimitExceeded):
                await held.charge(60)
            # Once spent, every later charge is refused at once: the fetch's reads stop.
            with pytest.raises(LimitExceeded):
                await held.charge(1)
    assert pool.in_use == 0  # everything given back


async def test_waiting_for_the_share_and_the_first_charge_of_an_idle_namespace() -> None:
    pool = ReadBytes(total=100, per_namespace=50, per_fetch=100)
    entered = asyncio.Event()
    release = asyncio.Event()

    async def hog() -> None:
        async with pool.fetch(A) as held:
            await held.charge(50)
            entered.set()
            await release.wait()

    hogging = asyncio.create_task(hog())
    await entered.wait()

    async def more_of_a() -> None:
        async with pool.fetch(A) as held:
            await held.charge(10)

    waiting = asyncio.create_task(more_of_a())
    await asyncio.sleep(0.01)
    assert not waiting.done()  # namespace a is at its share
    # Namespace b, with nothing in flight, is admitted at once, even past the total.
    async with pool.fetch(B) as other:
        await asyncio.wait_for(other.charge(80), 0.5)
        assert pool.in_use == 130
    release.set()
    await asyncio.wait_for(waiting, 1.0)
    await hogging
    assert pool.in_use == 0


async def test_fetches_that_all_wait_while_holding_are_not_left_jammed() -> None:
    pool = ReadBytes(total=1000, per_namespace=100, per_fetch=1000)
    started = asyncio.Barrier(2)

    async def reader(first: int) -> str:
        try:
            async with pool.fetch(A) as held:
                await held.charge(first)
                await started.wait()
                await held.charge(40)  # both now wait for the other to give back
        except LimitExceeded as exc:
            return str(exc)
        return "ok"

    got = await asyncio.wait_for(asyncio.gather(reader(50), reader(45)), 1.0)
    # The larger holder is refused (its bytes come back), and the other one goes on.
    assert got[1] == "ok"
    assert "team-a's mounts hold its share" in got[0] and "--max-read-bytes" in got[0]
    assert pool.in_use == 0
