"""The change feed end to end (devkit/feedrig.py): a KV write in a real OpenBao reaches the pod's
files at the first mount after it, while unchanged values are reused for the feed's window
without a read; the Lease holder stopped, the standby takes over and changes still arrive; the
feed gone, the provider falls back to its configured refresh."""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from devkit.feedrig import FeedRig, feed_rig

pytestmark = pytest.mark.timeout(90)


async def contents(rig: FeedRig, pod: str = "p0", service_account: str = "app") -> dict[str, str]:
    response = await rig.provider.stub.Mount(rig.request(pod, service_account))
    assert not response.error.code, response.error
    return {f.path: f.contents.decode() for f in response.files}


def reads(rig: FeedRig) -> int:
    counts: Counter[tuple[str, str]] = rig.bao.audit_counts()
    return sum(n for (op, path), n in counts.items() if op == "read" and "feed/" in path)


async def metric(rig: FeedRig, name: str) -> float:
    async with (
        aiohttp.ClientSession() as http,
        http.get(rig.provider.health + "/metrics") as response,
    ):
        text = await response.text()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else float("nan")


async def until(condition: object, seconds: float, what: str) -> float:
    """Poll `condition()` (sync or async) every 0.1 s; seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        result = condition()  # type: ignore[operator]
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return time.monotonic() - start
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {seconds} s")


async def healthy(rig: FeedRig) -> None:
    """Until the feed covers OpenBao: the vault source is up once Vault has dialled the holder
    (at its first audited request), and the next heartbeat says so."""

    async def covered() -> bool:
        await contents(rig)
        return await metric(rig, "secrets_bridge_feed_covered") == 1.0

    await until(covered, 15, "the feed's cover")


async def test_a_write_reaches_the_next_mount_and_unchanged_values_are_not_read(
    tmp_path: Path,
) -> None:
    async with feed_rig(tmp_path) as rig:
        await healthy(rig)
        await contents(rig, "p0", "app")
        await contents(rig, "p1", "app2")  # a second identity holds its own copy
        await asyncio.sleep(1.5)  # past --cache-ttl 0: only the feed's cover keeps them
        rig.bao.audit_mark()
        for _ in range(5):
            first = await contents(rig, "p0", "app")
            await contents(rig, "p1", "app2")
        assert first["o0"] == "s0-v0"
        assert reads(rig) == 0, "covered values were read again"

        rig.bao.kv2_put("secret", "feed/s0", {"pw": "s0-v1"})

        async def rotated() -> bool:
            return (await contents(rig, "p0", "app"))["o0"] == "s0-v1"

        took = await until(rotated, 10, "the change")
        assert took < 5
        assert (await contents(rig, "p1", "app2"))["o0"] == "s0-v1", "for every identity"
        # Only the changed secret was read again, once per identity.
        assert reads(rig) == 2, rig.bao.audit_counts()


async def test_the_standby_takes_over_and_changes_still_arrive(tmp_path: Path) -> None:
    async with feed_rig(tmp_path) as rig:
        await healthy(rig)
        leader = rig.leader()
        assert leader is not None
        await leader.halt()  # SIGTERM: the Lease released, the standby leads at once

        async def moved() -> bool:
            new = rig.leader()
            return new is not None and new is not leader and rig.service.target() is not None

        await until(moved, 10, "the takeover")
        rig.bao.kv2_put("secret", "feed/s1", {"pw": "s1-v1"})

        async def rotated() -> bool:
            return (await contents(rig))["o1"] == "s1-v1"

        await until(rotated, 15, "a change after the takeover")


async def test_without_a_heartbeat_values_fall_back_to_their_configured_refresh(
    tmp_path: Path,
) -> None:
    async with feed_rig(tmp_path, stale_after=2.0) as rig:
        await healthy(rig)
        await contents(rig)
        for replica in rig.replicas:
            await replica.halt()

        async def stale() -> bool:
            return await metric(rig, "secrets_bridge_feed_healthy") == 0.0

        await until(stale, 10, "the fallback")
        rig.bao.audit_mark()
        await contents(rig)
        # --cache-ttl 0: without the feed every mount reads the store again.
        assert reads(rig) == 3
