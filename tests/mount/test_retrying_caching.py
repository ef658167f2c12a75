"""The retry policy and the expiring cache, driven directly with real time on small scales."""

from __future__ import annotations

import asyncio
import time

import pytest

from devkit.testing import fetch_ctx
from provider.core.caching import ExpiringCache
from provider.core.errors import NotFound, StoreUnavailable
from provider.core.retrying import MAX_ATTEMPTS, retry_transient


class Flaky:
    """Fails `failures` times with the given error, then answers."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0
        self.times: list[float] = []

    async def __call__(self) -> str:
        self.calls += 1
        self.times.append(time.monotonic())
        if self.calls <= self.failures:
            raise self.error
        return "ok"


async def test_transient_errors_are_retried() -> None:
    call = Flaky(2, StoreUnavailable("down"))
    retried: list[BaseException] = []
    assert await retry_transient(call, fetch_ctx(30), on_retry=retried.append) == "ok"
    assert call.calls == 3 and len(retried) == 2


async def test_permanent_errors_are_not_retried() -> None:
    call = Flaky(5, NotFound("gone"))
    with pytest.raises(NotFound):
        await retry_transient(call, fetch_ctx(30))
    assert call.calls == 1


async def test_retry_after_is_honoured() -> None:
    call = Flaky(1, StoreUnavailable("throttled", retry_after=0.3))
    await retry_transient(call, fetch_ctx(30))
    assert call.times[1] - call.times[0] >= 0.3


async def test_retries_stop_at_the_retry_deadline() -> None:
    call = Flaky(100, StoreUnavailable("throttled", retry_after=0.4))
    start = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await retry_transient(call, fetch_ctx(1.5))  # retry deadline: 0.5 s
    assert call.calls == 2  # a third attempt could not start before the deadline
    assert time.monotonic() - start < 1.0


async def test_attempts_are_bounded() -> None:
    call = Flaky(100, StoreUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        await retry_transient(call, fetch_ctx(600))
    assert call.calls == MAX_ATTEMPTS


async def test_cache_single_flight_and_expiry() -> None:
    cache: ExpiringCache[str] = ExpiringCache()
    loads = 0

    async def load() -> tuple[str, float]:
        nonlocal loads
        loads += 1
        await asyncio.sleep(0.05)
        return f"v{loads}", 0.2

    assert set(await asyncio.gather(*(cache.get_or_load("k", load) for _ in range(20)))) == {"v1"}
    assert loads == 1
    await asyncio.sleep(0.25)
    assert await cache.get_or_load("k", load) == "v2"


async def test_cache_invalidate_only_the_stale_value() -> None:
    cache: ExpiringCache[object] = ExpiringCache()
    old, new = object(), object()
    cache.put("k", old, 60)
    cache.invalidate("k", old)
    cache.put("k", new, 60)
    cache.invalidate("k", old)  # a second caller that also saw `old` rejected
    assert cache.get("k") is new


async def test_load_failure_reaches_every_waiter_and_is_not_kept() -> None:
    cache: ExpiringCache[str] = ExpiringCache()

    async def load() -> tuple[str, float]:
        await asyncio.sleep(0.02)
        raise StoreUnavailable("down")

    results = await asyncio.gather(
        *(cache.get_or_load("k", load) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, StoreUnavailable) for r in results)
    assert cache.get("k") is None


def test_cache_bounds_entries_and_bytes() -> None:
    events: list[str] = []
    cache: ExpiringCache[bytes] = ExpiringCache(
        max_entries=3, max_bytes=10, size_of=len, on_event=events.append
    )
    for i in range(4):
        cache.put(i, b"x", 60)
    assert len(cache) == 3 and cache.get(0) is None
    cache.put("big", b"y" * 9, 60)
    assert len(cache) == 2 and events.count("evicted") == 3  # 1 + 9 bytes fit in 10
    cache.put("huge", b"z" * 11, 60)  # larger than the whole cache: not kept
    assert cache.get("huge") is None


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (StoreUnavailable("x", retry_after=1.0), "throttled"),
        (StoreUnavailable("HTTP 429 Too Many Requests"), "throttled"),
        (StoreUnavailable("ThrottlingException: Rate exceeded"), "throttled"),
        (StoreUnavailable("connection refused"), "unavailable"),
    ],
)
def test_retry_reasons(error: Exception, reason: str) -> None:
    from provider.core.retrying import retry_reason

    assert retry_reason(error) == reason


def test_get_all_answers_every_value_in_order_or_nothing() -> None:
    now = [0.0]
    events: list[str] = []
    cache: ExpiringCache[str] = ExpiringCache(
        max_entries=3, clock=lambda: now[0], on_event=events.append
    )
    cache.put("a", "va", 10)
    cache.put("b", "vb", 10)
    cache.put("short", "vs", 1)
    assert cache.get_all(["b", "a"]) == ["vb", "va"]
    assert cache.get_all(["a", "missing"]) is None
    assert cache.get_all([]) == []
    now[0] = 5.0
    assert cache.get_all(["a", "short"]) is None  # expired: the caller's per-key pass drops it
    assert cache.get_all(["a", "b"]) == ["va", "vb"]
    assert events == []  # the caller counts what it served, once per mount


def test_get_all_touches_each_entry_like_get() -> None:
    cache: ExpiringCache[str] = ExpiringCache(max_entries=3)
    for key in ("old", "mid", "new"):
        cache.put(key, key, 60)
    assert cache.get_all(["old"]) == ["old"]
    cache.put("fourth", "fourth", 60)  # full: the least recently used goes, which is now "mid"
    assert cache.get("mid") is None
    assert cache.get_all(["old", "new", "fourth"]) == ["old", "new", "fourth"]
