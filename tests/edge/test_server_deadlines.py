"""Deadlines end cleanly (issue 21): our answer beats the driver's deadline, and a call the driver
cancelled is dropped quietly — a debug line and a metric, never an ERROR traceback."""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import grpc
import pytest

from devkit.serving import Provider
from devkit.testing import attributes, mount_request

OBJECTS = [{"objectName": "api-key"}]


def errors_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()
    ]


async def metrics_lines(provider: Provider) -> list[str]:
    async with aiohttp.ClientSession() as http:
        async with http.get(provider.health + "/metrics") as resp:
            return (await resp.text()).splitlines()


async def cancelled_count(provider: Provider) -> float:
    text = await metrics_lines(provider)
    lines = [ln for ln in text if 'code="CANCELLED"' in ln and "_total" in ln]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


@pytest.mark.parametrize("provider", [{"fake_latency": 30.0}], indirect=True)
async def test_deadline_is_answered_before_the_drivers(
    provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await provider.stub.Mount(mount_request(attributes(OBJECTS)), timeout=2)
    elapsed = time.monotonic() - start
    # Our own message, a margin before the driver's 2 s: not grpc's bare "Deadline Exceeded".
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "fake store did not answer" in (info.value.details() or "")
    assert 1.3 <= elapsed < 1.9
    assert not errors_logged(caplog)


@pytest.mark.parametrize("provider", [{"fake_latency": 30.0}], indirect=True)
async def test_a_call_the_driver_cancelled_logs_no_traceback(
    provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    calls = [provider.stub.Mount(mount_request(attributes(OBJECTS)), timeout=20) for _ in range(5)]
    await asyncio.sleep(0.3)
    for call in calls:
        call.cancel()
    # And calls whose driver deadline passes exactly while the provider answers.
    racing = [
        provider.stub.Mount(mount_request(attributes(OBJECTS)), timeout=0.05) for _ in range(20)
    ]
    results = await asyncio.gather(*calls, *racing, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError | grpc.aio.AioRpcError) for r in results)
    await asyncio.sleep(0.3)
    assert await cancelled_count(provider) >= 5
    assert not errors_logged(caplog)
    assert any("driver cancelled" in r.getMessage() for r in caplog.records)


async def in_flight(provider: Provider) -> float:
    text = await metrics_lines(provider)
    (line,) = [ln for ln in text if ln.startswith("secrets_bridge_mounts_in_flight ")]
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.parametrize("provider", [{"fake_latency": 30.0}], indirect=True)
async def test_mounts_waiting_on_a_slow_store_show_as_in_flight(provider: Provider) -> None:
    """The pile-up an outage causes is visible on /metrics, and gone once the mounts end."""
    assert await in_flight(provider) == 0
    calls = [provider.stub.Mount(mount_request(attributes(OBJECTS)), timeout=20) for _ in range(3)]
    await asyncio.sleep(0.3)
    assert await in_flight(provider) == 3
    for call in calls:
        call.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    await asyncio.sleep(0.3)
    assert await in_flight(provider) == 0
