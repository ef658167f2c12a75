"""Limits on the load the provider puts on the stores, and on what one tenant may take of it.

- An optional rate limit per backend (`--rate-limit aws=40,azure=400`), so a rollout of many
  pods stays under a store's quota instead of being throttled by it. Calls beyond the rate wait
  their turn (a token bucket with a one-second burst); nothing is dropped.
- Fetch slots per backend (`--max-concurrent-fetches`) and, within them, per namespace
  (`--max-concurrent-fetches-per-namespace`): a slot is held for as long as a store takes to
  answer, so without a share per namespace one tenant's hanging store would hold every slot and
  stall every other namespace's mounts (issue 20).
- `namespace_of`: the tenant of a cache key. Every identity key ends with the pod scope
  (`provider/core/identity.py::pod_scope`, built from the kubelet's own keys), whose first
  element is the pod's namespace; nothing a pod author writes can change that last element,
  since the parts before it are joined with "|" and a namespace or service account name
  contains neither "|" nor "/".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager

from provider.core.errors import InvalidParameters


def namespace_of(key: Hashable) -> str:
    """The namespace of an identity key, or of a cache key `(identity key, ref)`."""
    if isinstance(key, tuple) and key:
        key = key[0]
    return str(key).rsplit("|", 1)[-1].split("/", 1)[0]


class FetchSlots:
    """At most `total` fetch calls in flight per backend, and `per_namespace` of them per
    namespace. A call waits for its namespace's slot first, so calls over a namespace's share
    queue there without holding any of the backend's slots."""

    def __init__(self, total: int, per_namespace: int) -> None:
        self._total = max(1, total)
        self._per_namespace = max(1, min(per_namespace, self._total))
        self._backends: dict[str, asyncio.Semaphore] = {}
        self._namespaces: dict[tuple[str, str], asyncio.Semaphore] = {}
        self._users: dict[tuple[str, str], int] = {}

    @asynccontextmanager
    async def hold(self, backend: str, namespace: str) -> AsyncIterator[None]:
        key = (backend, namespace)
        own = self._namespaces.get(key)
        if own is None:
            own = self._namespaces[key] = asyncio.Semaphore(self._per_namespace)
        shared = self._backends.setdefault(backend, asyncio.Semaphore(self._total))
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with own, shared:
                yield
        finally:
            self._users[key] -= 1
            if not self._users[key]:
                # Nobody holds or awaits it: forget it, so namespaces that come and go (and
                # their names) do not accumulate.
                del self._users[key], self._namespaces[key]


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
