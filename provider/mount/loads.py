"""Shared store reads ("loads"): at most one per (identity key, ref) at a time.

Two mounts of the same class by the same identity that arrive together share one store read,
whether or not the value cache (`--cache-ttl`) is on. A load runs as its own task on the
provider's own budget (`load_budget`, the kubelet's two minutes; retries within a third of it),
not on the budget of the mount that started it: every caller waits for it at most until its
*own* deadline (provider/mount/fetching.py), so a mount that joined late is never failed because
the first one ran out of time, and the driver's re-sends of a failed mount join the read in
flight instead of starting a retry series each (docs/architecture.md). When neither cache is on,
the last caller to give up cancels the load (nobody could use its result); otherwise it finishes
in the background and refreshes the caches. Only successful values are kept; errors are shared
with the callers already waiting, never cached.

Serve-stale (provider/mount/stale.py): a load that fails transiently answers with the last good
copies; one whose store *refuses* an attempt (down, not slow) answers each ref it holds a copy of
at that attempt — the mounts waiting and those joining later — and keeps retrying to refresh it.
A denial or a not-found drops the copies (and cached values) of the refs it answers.

Each backend has at most `--max-concurrent-fetches` loads reading, one namespace at most
`--max-concurrent-fetches-per-namespace` of them, and optionally at most `--rate-limit` calls per
second: a rollout of thousands of pods queues here instead of hammering the store, and one
namespace's hanging store cannot hold the slots every other namespace needs (issue 20).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable, Mapping, Sequence

from provider.core.caching import ExpiringCache
from provider.core.calls import Failure, FailureWatch, watch_failures
from provider.core.errors import BridgeError, DeadlineExceeded, NotFound, PermissionDenied
from provider.core.limits import FetchSlots, RateLimiter, namespace_of
from provider.core.model import (
    FetchContext,
    Fetched,
    SecretValue,
    Source,
    lifetime_of,
)
from provider.mount.changes import Named, Scope, kept_for
from provider.mount.lifetimes import Owner
from provider.mount.reads import StoreRead
from provider.mount.stale import Key, LastGood

#: For each ref a caller waits on: the ref's outcome to be, and the load that settles it.
Joined = dict[Hashable, tuple["asyncio.Future[Fetched]", "asyncio.Task[None]"]]


class Loads:
    def __init__(
        self,
        *,
        cache: ExpiringCache[Sequence[SecretValue]],
        cache_ttl: float,
        stale: LastGood,
        count: Callable[[str], None],
        slots: FetchSlots,
        rates: Mapping[str, RateLimiter],
        load_budget: float,
        named: Callable[[StoreRead, Hashable], tuple[Scope | None, Named | None]] | None = None,
    ) -> None:
        self._cache = cache
        self._ttl = cache_ttl
        self._stale = stale
        #: The value cache's event counter ("coalesced", "miss").
        self._count = count
        self._slots = slots
        self._rates = rates
        self._load_budget = load_budget
        #: Whether a load's result is worth finishing after every caller left.
        self._keep = cache_ttl > 0 or stale.enabled or named is not None
        #: With the change feed: a value's cover and name there (Fetcher._named).
        self._named = named
        self._inflight: dict[Key, tuple[asyncio.Future[Fetched], asyncio.Task[None]]] = {}
        #: Callers still waiting on each load.
        self._waiters: dict[asyncio.Task[None], int] = {}
        #: The failed store calls of each load still running.
        self._failures: dict[asyncio.Task[None], FailureWatch] = {}

    def join(
        self,
        read: StoreRead,
        refs: Sequence[Hashable],
        ctx: FetchContext,
        sources: dict[Hashable, Source] | None = None,
        owner: Owner | None = None,
    ) -> Joined:
        """The load each of `refs` joins, one started for all those that have none. The refs
        private to `owner` (values with a lifetime: provider/mount/lifetimes.py) join only
        that pod's loads."""
        joined: Joined = {}
        mine: dict[Hashable, asyncio.Future[Fetched]] = {}
        for ref in refs:
            key = _load_key(read, ref, owner)
            if key in self._inflight:
                self._count("coalesced")
                joined[ref] = self._inflight[key]
                if sources is not None:
                    sources[ref] = "coalesced"
            else:
                if sources is not None:
                    sources.pop(ref, None)  # a fresh load after a shared one ran out
                # without --cache-ttl (or a class's refreshInterval) no value cache to miss
                if self._ttl > 0 or read.refresh or self._named is not None:
                    self._count("miss")
                mine[ref] = asyncio.get_running_loop().create_future()
        if mine:
            now = time.monotonic()
            own = FetchContext.within(max(ctx.deadline - now, self._load_budget), now)
            task = asyncio.create_task(self._load(read, mine, own, owner))
            for ref, future in mine.items():
                joined[ref] = self._inflight[_load_key(read, ref, owner)] = (future, task)
        return joined

    def enter(self, joined: Joined) -> set[asyncio.Task[None]]:
        """Count a caller as waiting on each load it joined, until it `leave`s each."""
        loads = {task for _future, task in joined.values()}
        for task in loads:
            self._waiters[task] = self._waiters.get(task, 0) + 1
        return loads

    def leave(self, task: asyncio.Task[None]) -> None:
        self._waiters[task] -= 1
        if self._waiters[task]:
            return
        del self._waiters[task]
        if not task.done() and not self._keep:
            task.cancel()
            # Forget it now, so a caller arriving before the cancellation lands starts a
            # fresh read instead of joining a dying one.
            for key in [k for k, (_f, t) in self._inflight.items() if t is task]:
                del self._inflight[key]

    def latest_failure(self, task: asyncio.Task[None]) -> Failure | None:
        """The latest failed store call of a load still running."""
        watch = self._failures.get(task)
        return watch.latest if watch is not None else None

    def refusal(self, task: asyncio.Task[None]) -> BridgeError | None:
        """The error of a load's latest failed attempt if it was a refusal (not silence)."""
        latest = self.latest_failure(task)
        return latest.error if latest is not None and latest.refused else None

    async def _load(
        self,
        read: StoreRead,
        mine: Mapping[Hashable, asyncio.Future[Fetched]],
        ctx: FetchContext,
        owner: Owner | None = None,
    ) -> None:
        """Fetch and settle every future of `mine`; never raises (callers get the outcome)."""
        rate = self._rates.get(read.store)
        task = asyncio.current_task()
        if task is not None:
            load = task
            self._failures[task] = watch_failures(
                lambda error: self._serve_refused(read, mine, load, error)
            )
        try:
            # The store calls are cut by BackendEnv.retry; this also bounds the wait for a
            # fetch slot, so nothing outlives the load's budget.
            async with asyncio.timeout(ctx.deadline - time.monotonic()):
                async with self._slots.hold(read.store, namespace_of(read.identity.key)):
                    if rate is not None:
                        await rate.acquire()
                    fetched = await read.backend.fetch(read.plan, read.identity, list(mine), ctx)
        except TimeoutError:
            error = DeadlineExceeded(
                f"the {read.store} store did not answer within {self._load_budget:.0f}s"
            )
            fetched = {ref: error for ref in mine}
        except BridgeError as exc:
            if _revokes(exc):  # a refused login: nothing held for this identity may answer
                for ref in mine:
                    self._forget(read.key(ref))
            if not exc.transient or not self._stale.holds_all(read.key(r) for r in mine):
                _fail(mine, exc)
                return
            fetched = {ref: exc for ref in mine}
        except asyncio.CancelledError:
            _fail(mine, DeadlineExceeded("every caller gave up before the store answered"))
            raise
        except Exception as exc:  # settled into the futures; the server logs it as INTERNAL
            _fail(mine, exc)
            return
        finally:
            if task is not None:
                self._failures.pop(task).close()
            for ref, future in mine.items():
                key = read.key(ref)
                load_key = _load_key(read, ref, owner)
                held = self._inflight.get(load_key)
                if held is not None and held[0] is future:  # not a newer load's entry
                    del self._inflight[load_key]
                if task is not None:
                    self._stale.load_ended(key, task)
        for ref, future in mine.items():
            result = fetched.get(ref)
            if result is None:
                result = BridgeError(f"the {read.store} backend returned no value")
            key = read.key(ref)
            if isinstance(result, BridgeError) and _revokes(result):
                self._forget(key)
            # A credential with a lifetime is its pod's alone: never cached, never stale.
            if not isinstance(result, BridgeError) and lifetime_of(result) is None:
                cover, subject = self._named(read, ref) if self._named else (None, None)
                ttl = kept_for(max(self._ttl, read.refresh or 0.0), cover, read.refresh)
                if ttl > 0:
                    # Each caller reads it within its own window (Fetcher.window); kept as
                    # long as the longest a class asked of the value it replaces.
                    self._cache.put(
                        key, result, ttl, keep_longer=True, cover=cover, subject=subject
                    )
                self._stale.keep(key, result)
            if not future.done():  # else answered with its stale copy when the store refused
                future.set_result(self._or_stale(read, ref, result))

    def _forget(self, key: Key) -> None:
        """What is held of `key` goes: the store denied it or no longer has it (issue 32)."""
        self._cache.invalidate(key)
        self._stale.forget(key)

    def _or_stale(self, read: StoreRead, ref: Hashable, result: Fetched) -> Fetched:
        """A load's outcome for `ref`, or its stale copy if the store failed transiently."""
        if isinstance(result, BridgeError) and (
            result.transient or isinstance(result, DeadlineExceeded)
        ):
            stale = self._stale.get(read.key(ref))
            if stale is not None:
                self._stale.announce(read, ref, None, str(result))
                return stale
        return result

    def _serve_refused(
        self,
        read: StoreRead,
        mine: Mapping[Hashable, asyncio.Future[Fetched]],
        load: asyncio.Task[None],
        error: BridgeError,
    ) -> None:
        """The store refused one of `load`'s attempts (it is down, not slow): each ref with a
        stale copy is answered with it now — the mounts waiting on it and those joining the
        load later — while the load goes on retrying, to refresh the copy and the cache. A
        mount that joined before the refusal would otherwise wait out --serve-stale-wait."""
        for ref, future in mine.items():
            held = None if future.done() else self._stale.get(read.key(ref))
            if held is not None:
                self._stale.announce(read, ref, load, str(error))
                future.set_result(held)

    async def close(self) -> None:
        """Cancel the loads still running (shutdown): nobody is left to use their results."""
        loads = {task for _future, task in self._inflight.values()}
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)


def _revokes(error: BridgeError) -> bool:
    """A denial or a not-found: the store's answer now, which a held copy must not outlive."""
    return isinstance(error, PermissionDenied | NotFound)


def _load_key(read: StoreRead, ref: Hashable, owner: Owner | None) -> Key:
    """Loads are shared by identity and ref, except the refs private to one pod."""
    if owner is not None and ref in owner.private:
        return read.key(("pod", owner.uid, ref))
    return read.key(ref)


def _fail(mine: Mapping[Hashable, asyncio.Future[Fetched]], exc: BaseException) -> None:
    for future in mine.values():
        if not future.done():
            future.set_exception(exc)
            future.exception()  # retrieved: the waiters re-raise it themselves
