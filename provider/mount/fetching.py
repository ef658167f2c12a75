"""Fetching through the value cache, with single-flight per (identity key, ref).

Two mounts of the same class by the same identity that arrive together share one store read,
whether or not the value cache (`--cache-ttl`) is on. Only successful values are kept; errors are
shared with the callers already waiting, never cached.

Serve-stale (`--serve-stale-max-age`, off by default): when the store fails transiently (down,
throttled past our retries), the last good value of the same identity and object is served if it
is younger than the limit — logged and counted, so an outage of the store does not stop pods of
a known identity from starting. It never applies to denials or missing objects, and never
bypasses the identity check (`identify` runs before any fetch).

Each backend has at most `--max-concurrent-fetches` fetch calls in flight, and optionally at
most `--rate-limit` fetch calls per second, so a rollout of thousands of pods queues here instead
of hammering (or being throttled by) the store.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Mapping, Sequence

from provider.core.caching import ExpiringCache
from provider.core.errors import BridgeError, DeadlineExceeded
from provider.core.limits import RateLimiter
from provider.core.metrics import Metrics
from provider.core.model import Backend, FetchContext, Fetched, Identity, SecretValue, StorePlan

_Key = tuple[str, Hashable]
log = logging.getLogger("secrets_bridge.fetching")


def _size(values: Sequence[SecretValue]) -> int:
    return sum(len(v.content) for v in values) + 64 * len(values)


class Fetcher:
    def __init__(
        self,
        *,
        cache_ttl: float,
        metrics: Metrics,
        serve_stale_max_age: float = 0.0,
        max_concurrent_fetches: int = 64,
        rate_limits: Mapping[str, float] | None = None,
        max_entries: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self._ttl = cache_ttl
        self._stale_age = serve_stale_max_age
        self._metrics = metrics
        self._count = metrics.cache_counter("values")
        self._cache: ExpiringCache[Sequence[SecretValue]] = ExpiringCache(
            max_entries=max_entries, max_bytes=max_bytes, size_of=_size, on_event=self._count
        )
        self._last_good: ExpiringCache[Sequence[SecretValue]] = ExpiringCache(
            max_entries=max_entries,
            max_bytes=max_bytes,
            size_of=_size,
            on_event=metrics.cache_counter("stale"),
        )
        self._inflight: dict[_Key, tuple[asyncio.Future[Fetched], asyncio.Task[None]]] = {}
        #: Callers still waiting on each load; the last one to give up cancels it.
        self._waiters: dict[asyncio.Task[None], int] = {}
        self._max_concurrent = max_concurrent_fetches
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._rates = {name: RateLimiter(rate) for name, rate in (rate_limits or {}).items()}

    async def fetch(
        self,
        backend: Backend,
        plan: StorePlan,
        identity: Identity,
        refs: Sequence[Hashable],
        ctx: FetchContext,
    ) -> dict[Hashable, Fetched]:
        results: dict[Hashable, Fetched] = {}
        pending: dict[Hashable, asyncio.Future[Fetched]] = {}
        loads: set[asyncio.Task[None]] = set()
        mine: dict[Hashable, asyncio.Future[Fetched]] = {}
        loop = asyncio.get_running_loop()
        for ref in dict.fromkeys(refs):
            key = (identity.key, ref)
            cached = self._cache.get(key) if self._ttl > 0 else None
            if cached is not None:
                self._count("hit")
                results[ref] = cached
            elif key in self._inflight:
                self._count("coalesced")
                pending[ref], task = self._inflight[key]
                loads.add(task)
            else:
                self._count("miss")
                mine[ref] = pending[ref] = loop.create_future()
        if mine:
            # The load runs as its own task: if this caller's deadline passes, callers that
            # joined it keep waiting; only when every caller gave up is the store call cancelled.
            task = asyncio.create_task(self._load(backend, plan, identity, mine, ctx))
            for ref, future in mine.items():
                self._inflight[(identity.key, ref)] = (future, task)
            loads.add(task)
        for task in loads:
            self._waiters[task] = self._waiters.get(task, 0) + 1
        try:
            for ref, future in pending.items():
                results[ref] = await asyncio.shield(future)
        finally:
            for task in loads:
                self._waiters[task] -= 1
                if self._waiters[task] == 0:
                    del self._waiters[task]
                    if not task.done():
                        task.cancel()
                        # Forget it now, so a caller arriving before the cancellation lands
                        # starts a fresh read instead of joining a dying one.
                        for key in [k for k, (_f, t) in self._inflight.items() if t is task]:
                            del self._inflight[key]
        return results

    async def _load(
        self,
        backend: Backend,
        plan: StorePlan,
        identity: Identity,
        mine: Mapping[Hashable, asyncio.Future[Fetched]],
        ctx: FetchContext,
    ) -> None:
        """Fetch and settle every future of `mine`; never raises (callers get the outcome)."""
        limit = self._limits.setdefault(plan.backend, asyncio.Semaphore(self._max_concurrent))
        rate = self._rates.get(plan.backend)
        try:
            async with limit:
                if rate is not None:
                    await rate.acquire()
                fetched = await backend.fetch(plan, identity, list(mine), ctx)
        except BridgeError as exc:
            if not exc.transient or not self._all_stale(identity, mine):
                self._fail(mine, exc)
                return
            fetched = {ref: exc for ref in mine}
        except asyncio.CancelledError:
            self._fail(mine, DeadlineExceeded("every caller gave up before the store answered"))
            raise
        except Exception as exc:  # settled into the futures; the server logs it as INTERNAL
            self._fail(mine, exc)
            return
        finally:
            for ref, future in mine.items():
                held = self._inflight.get((identity.key, ref))
                if held is not None and held[0] is future:  # not a newer load's entry
                    del self._inflight[(identity.key, ref)]
        for ref, future in mine.items():
            result = fetched.get(ref)
            if result is None:
                result = BridgeError(f"the {plan.backend} backend returned no value")
            future.set_result(self._keep_or_stale(plan, identity, ref, result))

    def _keep_or_stale(
        self, plan: StorePlan, identity: Identity, ref: Hashable, result: Fetched
    ) -> Fetched:
        key = (identity.key, ref)
        if not isinstance(result, BridgeError):
            if self._ttl > 0:
                self._cache.put(key, result, self._ttl)
            if self._stale_age > 0:
                self._last_good.put(key, result, self._stale_age)
            return result
        if result.transient and self._stale_age > 0:
            stale = self._last_good.get(key)
            if stale is not None:
                self._metrics.cache_events.labels("stale", "served").inc()
                log.warning(
                    "store unavailable; serving the last good value",
                    extra={
                        "fields": {
                            "backend": plan.backend,
                            "identity": identity.subject,
                            "max_age_s": self._stale_age,
                            "error": str(result),
                        }
                    },
                )
                return stale
        return result

    def _all_stale(self, identity: Identity, mine: Mapping[Hashable, object]) -> bool:
        return self._stale_age > 0 and all(
            self._last_good.get((identity.key, ref)) is not None for ref in mine
        )

    @staticmethod
    def _fail(mine: Mapping[Hashable, asyncio.Future[Fetched]], exc: BaseException) -> None:
        for future in mine.values():
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: the waiters re-raise it themselves
