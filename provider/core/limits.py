"""An optional rate limit per backend (`--rate-limit aws=40,azure=400`), so a rollout of many
pods stays under a store's quota instead of being throttled by it. Calls beyond the rate wait
their turn (a token bucket with a one-second burst); nothing is dropped."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from provider.core.errors import InvalidParameters


class RateLimiter:
    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError("rate must be positive")
        self._rate = rate
        self._capacity = max(1.0, rate)  # one second's worth of burst
        self._tokens = self._capacity
        self._clock = clock
        self._last = clock()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:  # FIFO: waiters are served in arrival order
            while True:
                now = self._clock()
                self._tokens = min(self._capacity, self._tokens + (now - self._last) * self._rate)
                self._last = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return
                await asyncio.sleep((1 - self._tokens) / self._rate)


def parse_rate_limits(text: str, known: list[str]) -> dict[str, float]:
    """`backend=calls_per_second,...` -> {backend: rate}; problems name the flag."""
    limits: dict[str, float] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            rate = float(value)
        except ValueError:
            rate = 0.0
        if not sep or name not in known or rate <= 0:
            raise InvalidParameters(
                f"--rate-limit: {item!r} is not <backend>=<calls per second> with a backend "
                f"among {', '.join(known)} and a positive rate (e.g. aws=40)"
            )
        limits[name] = rate
    return limits
