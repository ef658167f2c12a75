"""Fetching a mount's values: through the value cache, else from the shared store reads
(provider/mount/loads.py), waiting for them no longer than the mount's own deadline.

A cached mount takes its values in one pass (`cached`). The others join (or start) the one load
per (identity key, ref) and wait here — in one frame per mount, since an outage holds every
mount of its first seconds waiting at once — until the load answers, or until what this mount
answers instead: its stale copy after `--serve-stale-wait` for a silent store (at once when the
store refuses: the load settles it), the store's refusal at a third of its deadline, else a
deadline error at its own deadline. A load that ran out of time is not this mount's verdict
while it has time left: it starts (or joins) a fresh one. The value and stale caches evict by
namespace share (provider/core/caching.py).

A store's "not found" of an `optional: true` object is an answer like a value: it is reused
within the same window (it would otherwise be read at every mount while its class's values come
from the cache), and forgotten when the window ends or a read finds the secret. A required
object's "not found" is never reused: the pod that started before its secret was created gets it
at the driver's next try.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from backends import registry
from provider.core import waiting
from provider.core.caching import Entry, ExpiringCache
from provider.core.errors import BridgeError, DeadlineExceeded, NotFound
from provider.core.limits import FetchSlots, RateLimiter, namespace_of
from provider.core.metrics import Metrics
from provider.core.model import FetchContext, Fetched, SecretValue, Source, values_size
from provider.mount.changes import Coverage, Named, Scope, kept_for, named
from provider.mount.lifetimes import Lifetimes, Owner
from provider.mount.loads import Joined, Loads
from provider.mount.reads import StoreRead
from provider.mount.stale import Key, LastGood, is_stale

#: The provider's own budget for a shared load: the kubelet's NodePublish deadline.
LOAD_BUDGET = 120.0
#: A caller with less time left than this does not start a fresh load after a failed one.
RESTART_MIN = 0.5
#: Fresh loads one caller may start after shared ones ran out of time.
MAX_ROUNDS = 3
#: Bytes the value cache, the stale copies and the held credentials may each keep alive: with
#: the AWS revalidation cache (16 MiB) and the answers built from them (16 MiB), what one
#: namespace can make the provider hold at rest stays well under the DaemonSet's 256 MiB
#: (SECURITY.md, "What stays in memory").
VALUE_BYTES = 32 * 1024 * 1024
#: Bytes a held "not found" keeps alive besides its message (the error object, its key and
#: the cache entry).
ABSENT_OVERHEAD = 600


@dataclass(frozen=True)
class _Raised:
    """A load that raised instead of returning per-ref outcomes (a refused login, a bug).

    Every caller joined to the load gets the very same exception object. Raised as it is, each
    raise would add that caller's frames to the one traceback it carries, and keep every
    caller's frames (their requests among them) alive as long as any of them holds the error
    (measured: BENCHMARKS.md, "A raised load's traceback"). So each caller keeps the traceback
    the load gave it (`Future.result()` re-raises with it, as asyncio does) and raises with that.
    """

    error: BaseException
    traceback: TracebackType | None

    def rethrown(self) -> BaseException:
        return self.error.with_traceback(self.traceback)


_Outcome = Fetched | _Raised


def _ran_out(outcome: _Outcome) -> bool:
    error = outcome.error if isinstance(outcome, _Raised) else outcome
    return isinstance(error, DeadlineExceeded)


class Fetcher:
    def __init__(
        self,
        *,
        cache_ttl: float,
        metrics: Metrics,
        serve_stale_max_age: float = 0.0,
        serve_stale_wait: float = 3.0,
        max_concurrent_fetches: int = 64,
        max_concurrent_fetches_per_namespace: int = 16,
        rate_limits: Mapping[str, float] | None = None,
        max_entries: int = 10_000,
        max_bytes: int = VALUE_BYTES,
        load_budget: float = LOAD_BUDGET,
        renew_at: float = 2 / 3,
        lease_idle_after: float = 600.0,
        max_held_credentials: int = 10_000,
        min_renew_interval: float = 300.0,
        replaced_credential_grace: float = 300.0,
        feed_window: float = 0.0,
        feed_stale_after: float = 90.0,
    ) -> None:
        self._ttl = cache_ttl
        #: The change feed's view (--change-feed): values of the stores it covers are reused
        #: for `feed_window` by classes with no refreshInterval (provider/mount/changes.py).
        self.coverage = (
            Coverage(feed_window, feed_stale_after, metrics, drop=self._drop_changed)
            if feed_window > 0
            else None
        )
        self._metrics = metrics
        # A value with a lease or a certificate is held per pod; what it does not hold, it
        # reads through this fetcher's plain read.
        self._lifetimes = Lifetimes(
            self.plain,
            metrics=metrics,
            renew_at=renew_at,
            idle_after=lease_idle_after,
            max_entries=max_held_credentials,
            max_bytes=max_bytes,
            min_renew_interval=min_renew_interval,
            replaced_grace=replaced_credential_grace,
        )
        self._count = metrics.cache_counter("values")
        #: Bound once: counted at every mount answered again.
        self._hits = metrics.cache_events.labels("values", "hit")
        self._cache: ExpiringCache[Sequence[SecretValue]] = ExpiringCache(
            max_entries=max_entries,
            max_bytes=max_bytes,
            size_of=values_size,
            on_event=self._count,
            tenant_of=namespace_of,
        )
        #: "Not found" answers, reused within the reader's window as values are (a few bytes
        #: each: the store's one-line message).
        self._absent: ExpiringCache[NotFound] = ExpiringCache(
            max_entries=max_entries,
            max_bytes=max_bytes,
            size_of=lambda error: len(str(error)) + ABSENT_OVERHEAD,
            tenant_of=namespace_of,
        )
        self._stale = LastGood(
            max_age=serve_stale_max_age,
            wait=serve_stale_wait,
            metrics=metrics,
            max_entries=max_entries,
            max_bytes=max_bytes,
        )
        self._loads = Loads(
            cache=self._cache,
            cache_ttl=cache_ttl,
            stale=self._stale,
            count=self._count,
            slots=FetchSlots(max_concurrent_fetches, max_concurrent_fetches_per_namespace),
            rates={name: RateLimiter(rate) for name, rate in (rate_limits or {}).items()},
            load_budget=load_budget,
            named=self._named if self.coverage is not None else None,
        )

    @property
    def metrics(self) -> Metrics:
        """The provider's metrics (the mounter counts fallback reads on them)."""
        return self._metrics

    def window(self, refresh: float | None) -> float:
        """Seconds a value may be reused: a class's `refreshInterval`, else --cache-ttl (or,
        for a value the change feed covers, --feed-window: `Entry.covered`)."""
        return self._ttl if refresh is None else refresh

    def _named(self, read: StoreRead, ref: Hashable) -> tuple[Scope | None, Named | None]:
        """The feed's cover of a value `read` keeps, and what the feed names it by."""
        assert self.coverage is not None
        watched = registry.watched(read.store)
        subject = watched.subject(read.plan.store, ref) if watched is not None else None
        return self.coverage.cover(read.store, subject), named(read.store, subject)

    def _drop_changed(self, changed: Callable[[Entry[Any]], bool]) -> int:
        return self._cache.drop_where(changed) + self._absent.drop_where(changed)

    def cached(
        self, keys: Sequence[Key], refresh: float | None = None
    ) -> list[Sequence[SecretValue]] | None:
        """Each key's values (keys given once each, `StoreRead.key(ref)`) when every one is in
        the value cache and younger than the class's reuse window (`refresh`), counted as
        hits; else None, and nothing counted: the caller then `fetch`es, which counts each ref
        as what it turns out to be. A cached mount's whole fetch."""
        window = self._ttl if refresh is None else refresh
        covering = refresh is None and self.coverage is not None  # takes the feed's window
        if window <= 0 and not covering:
            return None
        found = self._cache.get_all(keys, window, covered=covering)
        if found is not None:
            self._count_hits(len(found), refresh)
        return found

    def entries(
        self, keys: Sequence[Key], values: Iterable[Sequence[SecretValue]]
    ) -> list[Entry[Sequence[SecretValue]]] | None:
        """The value cache's entries holding these very values (what an answer built from them
        may be kept by), or None when one is not kept."""
        return self._cache.entries(keys, values)

    def fresh(
        self, held: Sequence[weakref.ref[Entry[Sequence[SecretValue]]]], refresh: float | None
    ) -> bool:
        """Whether every one of these entries is still kept and within the class's reuse
        window, counted as hits if so: the whole fetch of a mount answered again."""
        window = self._ttl if refresh is None else refresh
        covering = refresh is None and self.coverage is not None  # takes the feed's window
        if (window <= 0 and not covering) or not self._cache.fresh(held, window, covered=covering):
            return False
        self._count_hits(len(held), refresh)
        return True

    def _count_hits(self, hits: int, refresh: float | None) -> None:
        self._hits.inc(hits)
        if refresh is not None:  # reused under the class's own policy
            self._metrics.class_refresh_reuses.inc(hits)

    async def fetch(
        self,
        read: StoreRead,
        refs: Sequence[Hashable],
        ctx: FetchContext,
        sources: dict[Hashable, Source] | None = None,
        owner: Owner | None = None,
    ) -> dict[Hashable, Fetched]:
        """Each ref's values or error. With `sources` (the audit trail is on), also where each
        value came from: the cache, another mount's read, or what the values are marked with.
        With `owner` (the pod), values with a lifetime are held for it across its polls
        (provider/mount/lifetimes.py)."""
        if owner is not None:
            return await self._lifetimes.fetch(read, owner, refs, ctx, sources)
        return await self.plain(read, refs, ctx, sources)

    async def plain(
        self,
        read: StoreRead,
        refs: Sequence[Hashable],
        ctx: FetchContext,
        sources: dict[Hashable, Source] | None = None,
        owner: Owner | None = None,
    ) -> dict[Hashable, Fetched]:
        """The plain read: the value cache, else the shared loads (the refs private to
        `owner` only joined to its own)."""
        results: dict[Hashable, Fetched] = {}
        raised: list[_Raised] = []
        todo = list(dict.fromkeys(refs))
        for round_ in range(MAX_ROUNDS):
            joined = self._join(read, todo, ctx, results, sources, owner)
            if not joined:  # every value came from the cache: nothing to wait for
                break
            # Entered and left here rather than in a coroutine of its own: every mount of an
            # outage waits in this frame (see `_outcomes`).
            loads = self._loads.enter(joined)
            try:
                outcomes = await self._outcomes(read, joined, ctx)
            finally:
                for task in loads:
                    self._loads.leave(task)
            todo = []
            for ref, outcome in outcomes.items():
                # A shared load that ran out of time is not this caller's verdict while it
                # still has time of its own: it starts (or joins) a fresh one.
                left = ctx.deadline - time.monotonic()
                if _ran_out(outcome) and left > RESTART_MIN and round_ < MAX_ROUNDS - 1:
                    todo.append(ref)
                elif isinstance(outcome, _Raised):
                    raised.append(outcome)
                else:
                    results[ref] = outcome
                    self._note_absent(read, ref, outcome)
            if not todo:
                break
        if raised:
            raise raised[0].rethrown()
        if sources is not None:
            _settle(sources, results)
        return results

    def _join(
        self,
        read: StoreRead,
        refs: Sequence[Hashable],
        ctx: FetchContext,
        results: dict[Hashable, Fetched],
        sources: dict[Hashable, Source] | None = None,
        owner: Owner | None = None,
    ) -> Joined:
        """Cache hits into `results`; for the rest, the load each joins (or starts)."""
        left: list[Hashable] = []
        hits = 0
        window = self.window(read.refresh)
        covering = read.refresh is None and self.coverage is not None
        for ref in refs:
            cached: Fetched | None = None
            if window > 0 or covering:
                key = read.key(ref)
                cached = self._cache.get(key, window, covered=covering)
                if cached is None:
                    # Which objects are optional is asked only of a held "not found" (rare).
                    absent = self._absent.get(key, window, covered=covering)
                    cached = absent if absent is not None and ref in _optional(read) else None
            if cached is None:
                left.append(ref)
                continue
            hits += 1
            results[ref] = cached
            if sources is not None:
                sources[ref] = "cache"
        if hits:  # counted once per mount, not once per object: this is every cached mount
            self._count_hits(hits, read.refresh)
        return self._loads.join(read, left, ctx, sources, owner) if left else {}

    def _note_absent(self, read: StoreRead, ref: Hashable, outcome: Fetched) -> None:
        """Keep a "not found" for the longest window a class asks of it; a value read since
        replaces it."""
        key = read.key(ref)
        if isinstance(outcome, NotFound):
            if ref not in _optional(read):
                return
            cover, subject = self._named(read, ref) if self.coverage is not None else (None, None)
            ttl = kept_for(max(self._ttl, read.refresh or 0.0), cover, read.refresh)
            if ttl > 0:
                self._absent.put(key, outcome, ttl, keep_longer=True, cover=cover, subject=subject)
        else:  # a value, or a denial the "not found" must not outlive
            self._absent.invalidate(key)

    async def _outcomes(
        self, read: StoreRead, joined: Joined, ctx: FetchContext
    ) -> dict[Hashable, _Outcome]:
        """Each ref's load outcome, or what this caller answers for it when it cannot wait
        longer: the stale copy after --serve-stale-wait, else a deadline error at its own
        deadline.

        One wait for all of the mount's refs rather than a task per ref: an outage holds
        every mount of its first seconds waiting here at once (~100 at 33 mounts/s with the
        default --serve-stale-wait), and the allocators keep the high-water mark of that for
        good (measured: BENCHMARKS.md, "Waiting mounts: one wait on the shared read").
        """
        start = time.monotonic()
        # Per ref, in `joined`'s order (lists: this frame is held by every waiting mount).
        stale: list[Sequence[SecretValue] | None] = []
        stops: list[tuple[float, ...]] = []
        for ref in joined:
            held = self._stale.get(read.key(ref))
            until = ctx.deadline
            if held is not None and self._stale.wait > 0:
                # A silent store is waited for this long; one that refuses settles the ref
                # with this copy at once (`_serve_refused`).
                until = min(until, start + self._stale.wait)
            # A store that refuses (rather than stays silent) gets the answer it always got:
            # its error once a third of this mount's deadline is spent (the driver re-sends
            # an UNAVAILABLE mount, and the re-send joins this read, which goes on). A silent
            # store is waited for until this mount's own deadline.
            first = min(until, ctx.retry_deadline)
            mine = (first,) if first == until else (first, until)
            stale.append(held)
            stops.append(stops[-1] if stops and stops[-1] == mine else mine)
        outcomes: list[_Outcome | None] = [None] * len(joined)
        for stop in sorted({s for ref_stops in stops for s in ref_stops}):
            # A load settles its refs together, except the ones it holds stale copies of,
            # which a refusal settles at once: so a ref without a copy is waited for on its
            # load (one callback per load, as a rule one per mount), one with a copy on itself.
            awaited = {
                task if held is None else future
                for (future, task), held, outcome in zip(
                    joined.values(), stale, outcomes, strict=True
                )
                if outcome is None and not future.done()
            }
            if awaited:
                await waiting.all_done(awaited, stop - time.monotonic())
            for i, (ref, (future, task)) in enumerate(joined.items()):
                if outcomes[i] is not None or not (future.done() or stop in stops[i]):
                    continue
                outcome = self._outcome_at(stale[i], future, task)
                if outcome is None and stop == stops[i][-1]:
                    outcome = self._gave_up(read, ref, stale[i], task, start)
                outcomes[i] = outcome
            if all(outcome is not None for outcome in outcomes):
                break
        settled = [outcome for outcome in outcomes if outcome is not None]
        assert len(settled) == len(joined)  # each ref's last stop settles it
        return dict(zip(joined, settled, strict=True))

    def _outcome_at(
        self,
        stale: Sequence[SecretValue] | None,
        future: asyncio.Future[Fetched],
        task: asyncio.Task[None],
    ) -> _Outcome | None:
        """The load's outcome for `ref` if it has one, or the refusal it saw when there is no
        stale copy to wait for; None to keep waiting."""
        if future.done():
            try:
                result = future.result()
            except Exception as exc:  # the load's own traceback, not other callers' (_Raised)
                return _Raised(exc, exc.__traceback__)
            if is_stale(result):  # counted per mount served, announced once per load
                self._stale.count_served()
            return result
        return self._loads.refusal(task) if stale is None else None

    def _gave_up(
        self,
        read: StoreRead,
        ref: Hashable,
        stale: Sequence[SecretValue] | None,
        task: asyncio.Task[None],
        start: float,
    ) -> _Outcome:
        """What a caller answers for `ref` at its last stop: the stale copy, or a deadline
        error naming the load's last failed attempt."""
        latest = self._loads.latest_failure(task)
        last = f"; last attempt: {latest.error}" if latest is not None else ""
        if stale is not None:
            self._stale.count_served()
            self._stale.announce(read, ref, task, f"no answer yet{last}")
            return stale
        return DeadlineExceeded(
            f"the {read.store} store did not answer within this mount's deadline "
            f"({time.monotonic() - start:.1f}s of waiting; still trying){last}"
        )

    async def close(self) -> None:
        """Cancel the loads still running (shutdown): nobody is left to use their results."""
        await self._lifetimes.close()
        await self._loads.close()


def _optional(read: StoreRead) -> set[Hashable]:
    """The refs of the read's `optional: true` objects (asked only on the uncached path)."""
    return {spec.ref for spec in read.plan.objects if spec.transforms.optional}


def _settle(sources: dict[Hashable, Source], results: Mapping[Hashable, Fetched]) -> None:
    """Each value's source: a stale copy is always "stale"; else the cache or another mount's
    read when this mount used one, else what the values are marked with (a store read, or a
    held value the store confirmed)."""
    for ref, result in results.items():
        if isinstance(result, BridgeError):
            sources.pop(ref, None)
            continue
        marked: Source = result[0].source if result else "store"
        how = sources.get(ref)
        sources[ref] = marked if how is None or marked == "stale" else how
