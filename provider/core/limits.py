"""Limits on the load the provider puts on the stores, and on what one tenant may take of it.

- An optional rate limit per backend (`--rate-limit aws=40,azure=400`), so a rollout of many
  pods stays under a store's quota instead of being throttled by it. Calls beyond the rate wait
  their turn (a token bucket with a one-second burst); nothing is dropped.
- Fetch slots per backend (`--max-concurrent-fetches`) and, within them, per namespace
  (`--max-concurrent-fetches-per-namespace`): a slot is held for as long as a store takes to
  answer, so without a share per namespace one tenant's hanging store would hold every slot and
  stall every other namespace's mounts (issue 20); and a namespace with nothing in flight is
  never kept waiting by the others, however many of them hang (issue 32).
- Bytes of store answers in memory while a fetch reads them (`ReadBytes`, issue 40): one
  fetch (one mount's reads) at most its answer budget (`--max-response-bytes`), and all fetches
  together at most `--max-read-bytes`, `--max-read-bytes-per-namespace` of it per namespace.
- `namespace_of`: the tenant of a cache key. Every identity key ends with the pod scope
  (`provider/core/identity.py::pod_scope`, built from the kubelet's own keys), whose first
  element is the pod's namespace; nothing a pod author writes can change that last element,
  since the parts before it are joined with "|" and a namespace or service account name
  contains neither "|" nor "/".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from provider.core.budgets import TokenBucket
from provider.core.errors import InvalidParameters, LimitExceeded
from provider.core.files import DRIVER_RECV_BYTES

T = TypeVar("T")

#: What a store answer may hold beyond the mount's answer budget: its JSON envelope (Vault's
#: response around the data), so that an answer the driver could take is read whole.
ANSWER_SLACK = 64 * 1024


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
        # One second's worth of burst.
        self._bucket = TokenBucket(max(1.0, rate), rate, clock())
        self._clock = clock
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        async with self._lock:  # FIFO: waiters are served in arrival order
            while True:
                if self._bucket.take(1, self._clock()):
                    return
                await asyncio.sleep(self._bucket.wait(1))


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


#: The GIL switch interval while a worker runs: the loop gets the GIL back within this when it
#: wakes (every wake of the loop waits for the worker to let go of it: at the default 5 ms, a
#: cached mount's dozen wakes added ~100 ms behind a worker; measured in BENCHMARKS.md).
WORKER_SWITCH_INTERVAL = 0.0005


@contextlib.contextmanager
def _short_switches() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, WORKER_SWITCH_INTERVAL))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


#: Each namespace's share of work off the loop (parsing classes not parsed before, large store
#: answers, builds): seconds of work per window (measured: BENCHMARKS.md, "Parsing a class
#: nobody parsed yet").
PARSE_SHARE = 1.0
PARSE_WINDOW = 10.0


class WorkShares:
    """CPU-bound work for tenants (parsing a class nobody parsed yet, a large store answer:
    `BackendEnv.parsed`), off the event loop and within each tenant's share of it (issue 32,
    attack 2; issue 40, item 3).

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
                            "not parsed before and large store answers; cached mounts are not "
                            "affected, and this one is retried"
                        )
                    await asyncio.sleep(wait)
                async with self._worker:
                    spent = [0.0]
                    try:
                        with _short_switches():
                            return await asyncio.to_thread(_timed, work, spent)
                    finally:
                        now = self._clock()
                        self._used[tenant] = (self._owed(tenant, now) + spent[0], now)
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


def _timed(work: Callable[[], T], spent: list[float]) -> T:
    """`work()`, its thread's CPU seconds in `spent[0]`: a tenant's share counts the work it
    did, not the time the worker waited for the GIL while the loop served everyone else (with
    the loop busy, the wall time of a parse was twice its CPU, and a tenant whose one mount needs
    most of its share could never be served)."""
    started = time.thread_time()
    try:
        return work()
    finally:
        spent[0] = time.thread_time() - started


class ReadBytes:
    """The bytes store answers hold while fetches read them, provider-wide (issue 40, item 1).

    Without it, one mount of 100 selected secrets of 4 MB each held them all at once (the reads
    run in parallel; the answer's size was checked after they all landed), and a few such
    mounts took the node's provider past its memory limit. Each fetch (`fetch`: one
    `Backend.fetch`, one mount's reads) is charged every answer before its body is in memory
    where the wire tells its size (an HTTP Content-Length), else as its chunks arrive, and
    each answer an SDK returns whole (bounded by its service: stated where it is charged):
    - a fetch whose charges pass `per_fetch` (its answer budget, --max-response-bytes plus
      ANSWER_SLACK) is refused at once, and every later charge of it too, so its reads stop;
    - all fetches together hold at most `total`, one namespace at most `per_namespace` — except
      that, as with FetchSlots, a namespace with nothing charged always gets its first charge
      (at most one answer), so one tenant's fetches never starve another's.
    Charges are given back when the fetch ends (what its values keep alive after that is the
    value cache's and the mount's to bound). A fetch waits for a charge while holding earlier
    ones, so when every fetch holding bytes waits, none would ever give any back: the one of
    the namespace holding most is refused instead (`_unjam`).
    """

    def __init__(self, total: int, per_namespace: int, per_fetch: int) -> None:
        self._total = max(1, total)
        self._per_namespace = max(1, min(per_namespace, self._total))
        self.per_fetch = max(1, per_fetch)
        self.in_use = 0
        self._namespaces: dict[str, int] = {}
        #: Fetches holding bytes, and the waiting charges (arrival order).
        self._holders: set[FetchBytes] = set()
        self._waiters: deque[tuple[FetchBytes, int, asyncio.Future[None]]] = deque()

    @classmethod
    def unbounded(cls) -> ReadBytes:
        """For a backend built without a composition root (tools, tests of one store)."""
        return cls(1 << 62, 1 << 62, 1 << 62)

    @asynccontextmanager
    async def fetch(self, key: Hashable) -> AsyncIterator[FetchBytes]:
        """One fetch's budget for the tenant of identity key `key`; on leaving, everything it
        was charged is given back, and a fetch that went over its budget raises its refusal."""
        budget = FetchBytes(self, namespace_of(key))
        token = _fetching.set(budget)
        try:
            yield budget
        finally:
            _fetching.reset(token)
            budget.close()
        if budget.refusal is not None:
            raise budget.refusal.with_traceback(None)

    def _admits(self, namespace: str, size: int) -> bool:
        mine = self._namespaces.get(namespace, 0)
        if not mine:
            return True
        return mine + size <= self._per_namespace and self.in_use + size <= self._total

    def _grant(self, fetch: FetchBytes, size: int) -> None:
        self.in_use += size
        self._namespaces[fetch.namespace] = self._namespaces.get(fetch.namespace, 0) + size
        fetch.used += size
        self._holders.add(fetch)

    async def _acquire(self, fetch: FetchBytes, size: int) -> None:
        if self._admits(fetch.namespace, size):
            self._grant(fetch, size)
            return
        waiter = asyncio.get_running_loop().create_future()
        entry = (fetch, size, waiter)
        self._waiters.append(entry)
        self._unjam()
        try:
            await waiter
        except asyncio.CancelledError:
            if entry in self._waiters:
                self._waiters.remove(entry)
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def _release(self, fetch: FetchBytes) -> None:
        self._holders.discard(fetch)
        if fetch.used > 0:
            self.in_use -= fetch.used
            left = self._namespaces[fetch.namespace] - fetch.used
            if left:
                self._namespaces[fetch.namespace] = left
            else:
                del self._namespaces[fetch.namespace]  # names come and go: forget it
            fetch.used = 0
        self._fail_waiters(fetch)
        self._wake()

    def _wake(self) -> None:
        """Admit waiters in arrival order among the admissible (one held back by its
        namespace's share does not block the others)."""
        for entry in list(self._waiters):
            fetch, size, waiter = entry
            if waiter.done():
                self._waiters.remove(entry)
            elif self._admits(fetch.namespace, size):
                self._waiters.remove(entry)
                self._grant(fetch, size)
                waiter.set_result(None)
        self._unjam()

    def _unjam(self) -> None:
        """When the fetches holding a namespace's bytes (or every namespace's) all wait for
        more, none would give any back: the largest of them (of the namespace holding most) is
        refused, its bytes come back, and the others go on."""
        waiting = {fetch for fetch, _size, waiter in self._waiters if not waiter.done()}
        if not waiting:
            return
        jammed: set[FetchBytes] = set()
        if self._holders and self._holders <= waiting:
            jammed = self._holders
        else:
            for namespace in {f.namespace for f in waiting}:
                mine = {f for f in self._holders if f.namespace == namespace}
                if mine and mine <= waiting:
                    jammed = mine
                    break
        if not jammed:
            return
        worst = max(jammed, key=lambda f: (self._namespaces.get(f.namespace, 0), f.used))
        worst.refuse(
            LimitExceeded(
                f"namespace {worst.namespace}'s mounts hold its share of the bytes of store "
                f"answers in flight ({self._per_namespace} bytes, --max-read-bytes-per-namespace"
                f"; {self._total} for every namespace, --max-read-bytes); this mount is retried"
            )
        )
        self._fail_waiters(worst)

    def _fail_waiters(self, fetch: FetchBytes) -> None:
        for entry in [e for e in self._waiters if e[0] is fetch]:
            self._waiters.remove(entry)
            if not entry[2].done():
                entry[2].set_exception(fetch.refusal or LimitExceeded("the fetch has ended"))
                entry[2].exception()  # retrieved: the charge raises the fetch's refusal


class FetchBytes:
    """One fetch's charges against its answer budget and the provider's pool (ReadBytes)."""

    def __init__(self, pool: ReadBytes, namespace: str) -> None:
        self._pool = pool
        self.namespace = namespace
        self.used = 0
        #: Set once the budget is spent: every later charge raises it, and so does the fetch.
        self.refusal: LimitExceeded | None = None
        self._closed = False
        self._spent = asyncio.Event()

    async def gather(self, *reads: Awaitable[T]) -> list[T | BaseException]:
        """Every read's result or exception, as `asyncio.gather(..., return_exceptions=True)`
        gives them — except that once the budget is spent, the reads still running (waiting
        for a store's answer that has not begun) are cancelled: the fetch is refused then."""
        tasks = [asyncio.ensure_future(read) for read in reads]
        spent: asyncio.Future[Any] = asyncio.ensure_future(self._spent.wait())
        try:
            pending: set[asyncio.Future[Any]] = set(tasks)
            while pending and not self._spent.is_set():
                _done, pending = await asyncio.wait(
                    pending | {spent}, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(spent)
        finally:
            spent.cancel()
            for task in tasks:
                task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        results: list[T | BaseException] = []
        for task in tasks:
            if task.cancelled():
                results.append(self.refusal or asyncio.CancelledError())
            elif (error := task.exception()) is not None:
                results.append(error)
            else:
                results.append(task.result())
        return results

    async def charge(self, size: int) -> None:
        """Hold `size` more bytes (waiting for the pool), or raise the fetch's refusal."""
        if self.refusal is None and self.used + size > self._pool.per_fetch:
            self.refuse(over_budget(self.used + size, self._pool.per_fetch - ANSWER_SLACK))
        if self.refusal is not None:
            raise self.refusal.with_traceback(None)
        if self._closed or size <= 0:
            return  # a read left behind by its fetch, or nothing to hold
        try:
            await self._pool._acquire(self, size)
        except LimitExceeded:
            if self.refusal is not None:
                raise self.refusal.with_traceback(None) from None
            raise
        if self.refusal is not None:  # a sibling read spent the budget meanwhile
            raise self.refusal.with_traceback(None)

    def refuse(self, error: LimitExceeded) -> None:
        if self.refusal is None:
            self.refusal = error
            self._spent.set()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool._release(self)


#: The fetch whose reads run in this context, for SDK clients that `charge` it without being
#: handed it (their calls are many layers below the fetch; tasks inherit it as they start).
_fetching: contextvars.ContextVar[FetchBytes | None] = contextvars.ContextVar(
    "fetch_bytes", default=None
)


async def charge(size: int) -> None:
    """Charge `size` bytes to the fetch this call runs for (`ReadBytes.fetch`), if any."""
    held = _fetching.get()
    if held is not None:
        await held.charge(size)


def answer_size(answer: object) -> int:
    """The bytes of an SDK's parsed answer, for its charge: its strings' and bytes' lengths
    and a few bytes per other value (the answer is the service's, and small: each store says
    which bound it relies on where it charges)."""
    if isinstance(answer, str | bytes | bytearray):
        return len(answer)
    if isinstance(answer, dict):
        return sum(answer_size(k) + answer_size(v) for k, v in answer.items())
    if isinstance(answer, list | tuple):
        return sum(answer_size(v) for v in answer) + 8
    return 16


def over_budget(read: int, limit: int) -> LimitExceeded:
    """A mount refused while reading: its store answers already pass its answer budget (the
    building step's own message for an answer that would be too large, said before it is)."""
    return LimitExceeded(
        f"the answer would be over {limit} bytes as sent to the driver (the store's answers "
        f"read for it reach {read} bytes, so its reads were stopped), over the provider's limit "
        f"of {limit} (--max-response-bytes); split the class, or raise --max-response-bytes "
        f"together with the driver's --max-call-recv-msg-size (default {DRIVER_RECV_BYTES}), "
        "which refuses larger answers (over 1 MiB also breaks sync to a Kubernetes Secret)"
    )
