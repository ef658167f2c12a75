"""Fetching through the value cache, with single-flight per (identity key, ref).

Two mounts of the same class by the same identity that arrive together share one store read,
whether or not the value cache (`--cache-ttl`) is on. Only successful values are kept; errors are
shared with the callers already waiting, never cached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence

from backends.base import Backend, FetchContext, Fetched, Identity, SecretValue, StorePlan
from provider.caching import ExpiringCache
from provider.errors import BridgeError
from provider.metrics import Metrics

_Key = tuple[str, Hashable]


def _size(values: Sequence[SecretValue]) -> int:
    return sum(len(v.content) for v in values) + 64 * len(values)


class Fetcher:
    def __init__(
        self,
        *,
        cache_ttl: float,
        metrics: Metrics,
        max_entries: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self._ttl = cache_ttl
        self._metrics = metrics
        self._count = metrics.cache_counter("values")
        self._cache: ExpiringCache[Sequence[SecretValue]] = ExpiringCache(
            max_entries=max_entries, max_bytes=max_bytes, size_of=_size, on_event=self._count
        )
        self._inflight: dict[_Key, asyncio.Future[Fetched]] = {}

    async def fetch(
        self,
        backend: Backend,
        plan: StorePlan,
        identity: Identity,
        refs: Sequence[Hashable],
        ctx: FetchContext,
    ) -> dict[Hashable, Fetched]:
        results: dict[Hashable, Fetched] = {}
        waiting: dict[Hashable, asyncio.Future[Fetched]] = {}
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
                waiting[ref] = self._inflight[key]
            else:
                self._count("miss")
                future: asyncio.Future[Fetched] = loop.create_future()
                self._inflight[key] = mine[ref] = future
        if mine:
            await self._load(backend, plan, identity, mine, ctx)
        for ref, future in {**waiting, **mine}.items():
            results[ref] = await asyncio.shield(future)
        return results

    async def _load(
        self,
        backend: Backend,
        plan: StorePlan,
        identity: Identity,
        mine: Mapping[Hashable, asyncio.Future[Fetched]],
        ctx: FetchContext,
    ) -> None:
        try:
            fetched = await backend.fetch(plan, identity, list(mine), ctx)
        except BaseException as exc:
            for future in mine.values():
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved: the waiters re-raise it themselves
            raise
        finally:
            for ref in mine:
                self._inflight.pop((identity.key, ref), None)
        for ref, future in mine.items():
            result = fetched.get(ref)
            if result is None:
                result = BridgeError(f"the {plan.backend} backend returned no value")
            if not isinstance(result, BridgeError) and self._ttl > 0:
                self._cache.put((identity.key, ref), result, self._ttl)
            future.set_result(result)
