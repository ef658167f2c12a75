"""Faults against a real OpenBao behind a fault-injecting proxy (issue 10)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import grpc
import pytest

from protos import provider_pb2
from tests.e2e.conftest import Stack


async def mount(stack: Stack, timeout: float = 10, **kw: str) -> object:
    return await stack.stub.Mount(stack.request(**kw), timeout=timeout)


async def test_store_down_is_unavailable_within_a_third_of_the_deadline(stack: Stack) -> None:
    stack.proxy.error_rate, stack.proxy.status = 1.0, 503
    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await mount(stack, timeout=6)
    elapsed = time.monotonic() - start
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert stack.proxy.url in info.value.details() and "e2e/app" in info.value.details()
    assert elapsed < 6 / 3 + 1.0
    # Bounded: a handful of attempts, not one per object per retry forever.
    assert stack.proxy.calls <= 6


async def test_429_storm_every_mount_succeeds_with_bounded_calls(stack: Stack) -> None:
    stack.proxy.error_rate, stack.proxy.status = 0.3, 429
    results = await asyncio.gather(
        *(
            mount(stack, timeout=30, pod=f"p{i}", service_account=("app", "app2")[i % 2])
            for i in range(500)
        ),
        return_exceptions=True,
    )
    failures = Counter(r.code().name for r in results if isinstance(r, grpc.aio.AioRpcError))
    assert not failures, failures
    # 500 mounts, 2 identities, 3 objects: coalescing and retries keep calls far below one
    # call per object per mount (1,500).
    assert stack.proxy.calls < 500, (stack.proxy.calls, stack.proxy.injected)


async def test_store_killed_mid_burst_no_hang_then_healthy(stack: Stack) -> None:
    baseline = len(asyncio.all_tasks())
    stack.proxy.delay = 0.05
    burst = [
        asyncio.ensure_future(
            mount(stack, timeout=8, pod=f"p{i}", service_account=("app", "app2")[i % 2])
        )
        for i in range(200)
    ]
    await asyncio.sleep(0.1)
    stack.bao.stop()  # the store dies while mounts are in flight
    start = time.monotonic()
    results = await asyncio.gather(*burst, return_exceptions=True)
    assert time.monotonic() - start < 8
    codes = Counter(r.code().name if isinstance(r, grpc.aio.AioRpcError) else "OK" for r in results)
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
    await asyncio.sleep(0.2)
    assert len(asyncio.all_tasks()) <= baseline + 2  # nothing left running in the provider
    reply = await stack.stub.Version(provider_pb2.VersionRequest(), timeout=5)
    assert reply.runtime_name == "secrets-bridge"
