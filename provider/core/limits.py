"""Limits on the load the provider puts on the stores, and on what one tenant may take of it.

- An optional rate limit per backend (`--rate-limit aws=40,azure=400`), so a rollout of many
  pods stays under a store's quota instead of being throttled by it. Calls beyond the rate wait
  their turn (a token bucket with a one-second burst); nothing is dropped.
- Fetch slots per backend (`--max-concurrent-fetches`) and, within them, per namespace
  (`--max-concurrent-fetches-per-namespace`): a slot is held for as long as a store takes to
  answer, so without a share per namespace one tenant's hanging store would hold every slot and
  stall every other namespace's mounts (issue 20); and a namespace with nothing in flight is
  never kept waiting by the others, however many of them hang (issue 32).
- `namespace_of`: the tenant of a cache key. Every identity key ends with the pod scope
  (`provider/core/identity.py::pod_scope`, built from the kubelet's own keys), whose first
  element is the pod's namespace; nothing a pod author writes can change that last element,
  since the parts before it are joined with "|" and a namespace or service account name
  contains neither "|" nor "/".
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from typing import TypeVar

from provider.core.errors import InvalidParameters, LimitExceeded

T = TypeVar("T")


def namespace_of(key: Hashable) -> str:
    """The namespace of an identity key, or of a cache key `(identity key, ref)`."""
    if isinstance(key, tuple) and key:
        key = key[0]
    return str(key).rsplit("|", 1)[-1].split("/", 1)[0]


class FetchSlots:
    """At most `total` loads reading per backend, and `per_namespace` of them per namespace —
    except that a namespace with nothing in flight always gets its first slot.

    Shares alone do not hold when several namespaces are busy: four namespaces whose stores
    accept and never answer fill 4 x 16 = 64 slots, all of a backend's (issue 32). So a
    namespace with no load in flight is never made to wait for the total: its healthy store
    is read at once while any number of other namespaces' stores hang. The total is then
    exceeded by at most the number of namespaces with exactly one load in flight, which the
    node's pods bound; a namespace's second and later loads (a rollout of one namespace) keep
    the total, so the store's quota is still protected. Waiters are admitted in arrival order
    among those admissible; one held back by its namespace's share does not block the others.

    A load gives up its slot while its store calls wait to retry (`wait_off_slot`), so a
    failing store's backoff holds nothing, and takes it again, by the same rules, after.
    """

    def __init__(self, total: int, per_namespace: int) -> None:
        self._total = max(1, total)
        self._per_namespace = max(1, min(per_namespace, self._total))
        #: Per backend: slots in use, and per namespace.
        self._in_use: dict[str, int] = {}
        self._namespaces: dict[tuple[str, str], int] = {}
        self._waiters: deque[tuple[str, str, asyncio.Future[None]]] = deque()

    def slot(self, backend: str, namespace: str) -> Slot:
        return Slot(self, backend, namespace)

    @asynccontextmanager
    async def hold(self, backend: str, namespace: str) -> AsyncIterator[Slot]:
        slot = self.slot(backend, namespace)
        await slot.take()
        token = _current.set(slot)
        try:
            yield slot
        finally:
            _current.reset(token)
            slot.give()

    def _admits(self, backend: str, namespace: str) -> bool:
        mine = self._namespaces.get((backend, namespace), 0)
        if mine >= self._per_namespace:
            return False
        return mine == 0 or self._in_use.get(backend, 0) < self._total

    def _grant(self, backend: str, namespace: str) -> None:
        self._in_use[backend] = self._in_use.get(backend, 0) + 1
        key = (backend, namespace)
        self._namespaces[key] = self._namespaces.get(key, 0) + 1

    async def _acquire(self, backend: str, namespace: str) -> None:
        if self._admits(backend, namespace):
            self._grant(backend, namespace)
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (backend, namespace, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(backend, namespace)  # granted as we were cancelled: give it back
            elif entry in self._waiters:
                self._waiters.remove(entry)
            raise

    def _release(self, backend: str, namespace: str) -> None:
        self._in_use[backend] -= 1
        key = (backend, namespace)
        self._namespaces[key] -= 1
        if not self._namespaces[key]:
            # Forget it, so namespaces that come and go (and their names) do not accumulate.
            del self._namespaces[key]
        for entry in list(self._waiters):
            waiting_backend, waiting_namespace, waiter = entry
            if waiter.done():  # cancelled while waiting; its owner is on its way out
                self._waiters.remove(entry)
            elif self._admits(waiting_backend, waiting_namespace):
                self._waiters.remove(entry)
                self._grant(waiting_backend, waiting_namespace)
                waiter.set_result(None)


class Slot:
    """One load's hold on its backend's slots, given up while the load's calls wait to retry."""

    def __init__(self, slots: FetchSlots, backend: str, namespace: str) -> None:
        self._slots = slots
        self._backend = backend
        self._namespace = namespace
        self.held = False
        #: The taking in flight: the load's concurrent calls that wake from their waits share it.
        self._taking: asyncio.Future[None] | None = None

    async def take(self) -> None:
        if self.held:
            return
        if self._taking is None:
            self._taking = asyncio.ensure_future(
                self._slots._acquire(self._backend, self._namespace)
            )
        taking = self._taking
        try:
            await asyncio.shield(taking)
        except asyncio.CancelledError:
            if not taking.done():
                taking.cancel()
            raise
        finally:
            if self._taking is taking and taking.done():
                self._taking = None
                self.held = not taking.cancelled() and taking.exception() is None

    def give(self) -> None:
        if self._taking is not None and not self._taking.done():
            self._taking.cancel()
        if self.held:
            self.held = False
            self._slots._release(self._backend, self._namespace)


_current: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("fetch_slot", default=None)


async def wait_off_slot(seconds: float) -> None:
    """A retry's wait: the current load's fetch slot is given up meanwhile, and taken again
    (waiting its turn like any other load) before the next attempt."""
    slot = _current.get()
    if slot is None or not slot.held:
        await asyncio.sleep(seconds)
        if slot is not None:
            await slot.take()  # a sibling call gave it up: run the next attempt under it
        return
    slot.give()
    try:
        await asyncio.sleep(seconds)
    finally:
        await slot.take()


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


class WorkShares:
    """CPU-bound work for tenants (parsing a class nobody parsed yet), off the event loop and
    within each tenant's share of it (issue 32, attack 2).

    Parsing a class near the size limits is a long stretch of pure Python; on the event loop, a
    few volumes cycling through distinct classes held up every other tenant's cached mounts
    (measured: BENCHMARKS.md, "Parsing a class nobody parsed yet"). Here the work runs in a
    worker thread, one job at a time (it holds the GIL; the loop gets it back every switch
    interval, ~5 ms, instead of after the whole parse), each tenant at most one job at a time
    (so a tenant's next job waits behind at most one of every other tenant's), and each tenant
    within `share` seconds of work per `window` seconds (a leaky bucket): a tenant over it waits
    until its share frees, or is refused at once when that is later than its deadline.
    """

    def __init__(
        self, share: float, window: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = share / window  # seconds of work each tenant regains per second
        self._share = share
        self._clock = clock
        self._used: dict[str, tuple[float, float]] = {}  # tenant -> (seconds used, as of)
        #: Each tenant's turn, and how many of its jobs hold or await it.
        self._tenants: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._worker = asyncio.Lock()

    def _owed(self, tenant: str, now: float) -> float:
        used, since = self._used.get(tenant, (0.0, now))
        return max(0.0, used - (now - since) * self._rate)

    async def run(self, tenant: str, work: Callable[[], T], deadline: float, what: str) -> T:
        """`work()` in a worker thread, in `tenant`'s turn and share; `what` names the work in
        the refusal (LimitExceeded) of a tenant whose share does not free before `deadline`."""
        lock, users = self._tenants.setdefault(tenant, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                wait = (self._owed(tenant, self._clock()) - self._share) / self._rate
                if wait > 0:
                    if self._clock() + wait > deadline:
                        raise LimitExceeded(
                            f"{what}: namespace {tenant} has used its share of parsing "
                            f"({self._share:g}s per {self._share / self._rate:g}s) on classes "
                            "not parsed before; mounts of classes already parsed are not "
                            "affected, and this one is retried"
                        )
                    await asyncio.sleep(wait)
                async with self._worker:
                    started = self._clock()
                    try:
                        return await asyncio.to_thread(work)
                    finally:
                        now = self._clock()
                        self._used[tenant] = (self._owed(tenant, now) + now - started, now)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._tenants[tenant]
            self._forget_settled()

    def _forget_settled(self) -> None:
        """Tenants whose share is whole again need no entry (names come and go)."""
        now = self._clock()
        if len(self._used) > 64:
            for tenant in [t for t in self._used if self._owed(t, now) == 0]:
                del self._used[tenant]
