"""Metrics say what happened: the fake store reports a missing secret as NotFound (not ok), the
value cache counts no misses when it is off, and the process and build series are exported."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from devkit.testing import Harness
from provider import __version__
from provider.core.errors import BridgeError


def series(harness: Harness) -> str:
    return harness.metrics.render().decode()


async def test_fake_reads_report_their_outcome(harness: Harness) -> None:
    harness.write({"secrets": {"a": "pw-1"}})
    await harness.files([{"objectName": "a"}])
    with pytest.raises(BridgeError, match="no secret"):
        await harness.files([{"objectName": "missing"}])
    text = series(harness)
    assert 'backend_calls_total{backend="fake",operation="read",outcome="ok"} 1.0' in text
    assert 'backend_calls_total{backend="fake",operation="read",outcome="NotFound"} 1.0' in text
    # Their durations too, one per read, as every store records its calls (issue 33).
    assert 'backend_call_duration_seconds_count{backend="fake",operation="read"} 2.0' in text


async def test_no_value_cache_misses_without_a_value_cache(harness: Harness) -> None:
    harness.write({"secrets": {"a": "pw-1"}})
    await harness.files([{"objectName": "a"}])
    assert 'cache="values",event="miss"' not in series(harness)


async def test_process_and_build_series(harness: Harness) -> None:
    text = series(harness)
    assert "process_resident_memory_bytes " in text and "process_open_fds " in text
    assert 'secrets_bridge_build_info{python="' in text and f'version="{__version__}"' in text


async def test_with_caching_off_no_answer_outlives_its_mount(harness: Harness) -> None:
    """The answer memo holds values weakly: nothing of a mount stays once it is answered."""
    harness.write({"secrets": {"a": "pw-1"}})
    await harness.files([{"objectName": "a"}])
    for _ in range(3):  # let the finished load task's wake-up callbacks run
        await asyncio.sleep(0)
    gc.collect()
    assert len(harness.mounter._answers) == 0


async def test_with_a_value_cache_the_answer_is_reused(tmp_path: Path) -> None:
    cached = Harness(tmp_path, cache_ttl=30)
    cached.write({"secrets": {"a": "pw-1"}})
    first = await cached.mounter.mount(cached.request([{"objectName": "a"}]))
    second = await cached.mounter.mount(cached.request([{"objectName": "a"}]))
    assert second is first and len(cached.mounter._answers) == 1
