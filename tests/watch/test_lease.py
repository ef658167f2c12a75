"""Leader election against devkit's API-server fake: one of two leads; a cancelled leader hands
over at once, a vanished one after the lease's duration; a leader cut off stops by its deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from devkit.kubeapi import KubeApi, eventually, serving
from provider.core.kube import KubeClient, leases
from provider.watch.lease import Elector


class Replica:
    def __init__(self, api: KubeApi, identity: str) -> None:
        api.tokens.add(identity)
        self.client = KubeClient(api.url, token=identity)
        # Short terms so each test takes about a second.
        self.elector = Elector(
            self.client,
            "ns",
            "watch",
            identity,
            lease_duration=1.0,
            renew_deadline=0.5,
            retry_period=0.1,
        )
        self.leads = 0
        self.leading_now = False
        self.task = asyncio.create_task(self.elector.run(self.lead))

    async def lead(self) -> None:
        self.leads += 1
        self.leading_now = True
        try:
            await asyncio.Event().wait()
        finally:
            self.leading_now = False

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.client.close()


@pytest.fixture
async def api() -> AsyncIterator[KubeApi]:
    async with serving() as (api, _):
        yield api


@pytest.fixture
async def pair(api: KubeApi) -> AsyncIterator[tuple[Replica, Replica]]:
    one, two = Replica(api, "one"), Replica(api, "two")
    await eventually(lambda: one.elector.leading or two.elector.leading)
    leader, standby = (one, two) if one.elector.leading else (two, one)
    yield leader, standby
    for replica in (one, two):
        await replica.stop()


def holder(api: KubeApi) -> str:
    lease = api.object(leases("ns"), "watch")
    return str((lease or {}).get("spec", {}).get("holderIdentity"))


async def test_one_of_two_leads(api: KubeApi, pair: tuple[Replica, Replica]) -> None:
    leader, standby = pair
    await asyncio.sleep(1.5)  # past the lease's duration: the standby sees it renewed
    assert leader.elector.leading and leader.leading_now and leader.leads == 1
    assert not standby.elector.leading and standby.leads == 0
    assert holder(api) == leader.elector.identity


async def test_a_cancelled_leader_hands_over_at_once(
    api: KubeApi, pair: tuple[Replica, Replica]
) -> None:
    leader, standby = pair
    await leader.stop()
    assert not leader.leading_now
    loop = asyncio.get_running_loop()
    released = loop.time()
    await eventually(lambda: standby.leading_now)
    assert loop.time() - released < 0.5  # within a retry or two, not the lease's duration
    spec = api.object(leases("ns"), "watch")["spec"]  # type: ignore[index]
    assert spec["holderIdentity"] == standby.elector.identity
    assert spec["leaseTransitions"] == 1


async def test_a_vanished_leader_is_replaced_after_the_lease_duration(
    api: KubeApi, pair: tuple[Replica, Replica]
) -> None:
    leader, standby = pair
    loop = asyncio.get_running_loop()
    cut = loop.time()
    api.tokens.discard(leader.elector.identity)  # partitioned: it can neither renew nor release
    await eventually(lambda: not leader.leading_now)
    assert loop.time() - cut <= 0.5 + 0.3  # by its renew deadline (0.3 s: a loaded machine)
    await eventually(lambda: standby.leading_now)
    # Not before the lease's duration since the last renewal (at most a retry before the cut).
    assert loop.time() - cut >= 1.0 - 0.1
    assert not leader.elector.leading


async def test_a_leader_that_cannot_reach_the_api_stops_by_the_renew_deadline(
    api: KubeApi, pair: tuple[Replica, Replica]
) -> None:
    leader, standby = pair
    loop = asyncio.get_running_loop()
    api.pause(hang=True)  # calls are held unanswered
    paused = loop.time()
    await eventually(lambda: not leader.leading_now)
    assert loop.time() - paused <= 0.5 + 0.3
    assert not standby.leading_now
    api.resume()
    await eventually(lambda: leader.leading_now or standby.leading_now)
