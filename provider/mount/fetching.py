"""Fetching through the value cache, with single-flight per (identity key, ref).

Two mounts of the same class by the same identity that arrive together share one store read,
whether or not the value cache (`--cache-ttl`) is on. Only successful values are kept; errors are
shared with the callers already waiting, never cached.

A shared read (a "load") runs as its own task on the provider's own budget (`load_budget`, the
kubelet's two minutes; retries within a third of it), not on the budget of the mount that
started it: every caller waits for it at most until its *own* deadline, so a mount that joined
late is never failed because the first one ran out of time, and the driver's re-sends of a
failed mount join the read in flight instead of starting a retry series each
(docs/architecture.md). When neither cache is on, the last caller to give up cancels the load
(nobody could use its result); otherwise it finishes in the background and refreshes the
caches.

Serve-stale (`--serve-stale-max-age`, provider/mount/stale.py): when the store fails
transiently or has not answered within `--serve-stale-wait`, a mount is served the last good
value of the same identity and object, while the one load per key keeps refreshing it. When the
store refuses (it is down, not slow), the load settles every ref with a copy at that attempt:
the mounts waiting on it, and those joining it later, are answered then, not after the wait.

Each backend has at most `--max-concurrent-fetches` fetch calls in flight, one namespace at most
`--max-concurrent-fetches-per-namespace` of them, and optionally at most `--rate-limit` calls per
second: a rollout of thousands of pods queues here instead of hammering the store, and one
namespace's hanging store cannot hold the slots every other namespace needs (issue 20). The
value and stale caches evict by namespace share (provider/core/caching.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from provider.core import waiting
from provider.core.backend import AnyBackend, FailureWatch, watch_failures
from provider.core.caching import ExpiringCache
from provider.core.errors import BridgeError, DeadlineExceeded
from provider.core.limits import FetchSlots, RateLimiter, namespace_of
from provider.core.metrics import Metrics
from provider.core.model import AnyPlan, FetchContext, Fetched, Identity, SecretValue, Source
from provider.mount.stale import Key, LastGood, is_stale, values_size

log = logging.getLogger("secrets_bridge.fetching")

#: The provider's own budget for a shared load: the kubelet's NodePublish deadline.
LOAD_BUDGET = 120.0
#: A caller with less time left than this does not start a fresh load after a failed one.
RESTART_MIN = 0.5
#: Fresh loads one caller may start after shared ones ran out of time.
MAX_ROUNDS = 3


@dataclass(frozen=True)
class _Raised:
    """A load that raised instead of returning per-ref outcomes (a refused login, a bug).

    Every caller joined to the load gets the very same exception object. Raised as it is, each
    raise would add that caller's frames to the one traceback it carries, and keep every
    caller's frames (their requests among them) alive as long as any of them holds the error:
    measured, 50 joined mounts left a chain of 102 entries. So each caller keeps the traceback
    the load gave it (`Future.result()` re-raises with it, as asyncio does) and raises with that.
    """

    error: BaseException
    traceback: TracebackType | None

    def rethrown(self) -> BaseException:
        return self.error.with_traceback(self.traceback)


_Outcome = Fetched | _Raised
_Joined = dict[Hashable, tuple["asyncio.Future[Fetched]", "asyncio.Task[None]"]]


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
        max_bytes: int = 64 * 1024 * 1024,
        load_budget: float = LOAD_BUDGET,
    ) -> None:
        self._ttl = cache_ttl
        self._load_budget = load_budget
        #: Whether a load's result is worth finishing after every caller left.
        self._keep = cache_ttl > 0 or serve_stale_max_age > 0
        self._metrics = metrics
        self._count = metrics.cache_counter("values")
        self._cache: ExpiringCache[Sequence[SecretValue]] = ExpiringCache(
            max_entries=max_entries,
            max_bytes=max_bytes,
            size_of=values_size,
            on_event=self._count,
            tenant_of=namespace_of,
        )
        self._stale = LastGood(
            max_age=serve_stale_max_age,
            wait=serve_stale_wait,
            metrics=metrics,
            max_entries=max_entries,
            max_bytes=max_bytes,
        )
        self._inflight: dict[Key, tuple[asyncio.Future[Fetched], asyncio.Task[None]]] = {}
        #: Callers still waiting on each load.
        self._waiters: dict[asyncio.Task[None], int] = {}
        #: The failed store calls of each load still running.
        self._failures: dict[asyncio.Task[None], FailureWatch] = {}
        self._slots = FetchSlots(max_concurrent_fetches, max_concurrent_fetches_per_namespace)
        self._rates = {name: RateLimiter(rate) for name, rate in (rate_limits or {}).items()}

    @property
    def metrics(self) -> Metrics:
        """The provider's metrics (the mounter counts fallback reads on them)."""
        return self._metrics

    def cached(
        self, identity: Identity, refs: Sequence[Hashable]
    ) -> list[Sequence[SecretValue]] | None:
        """Each of `refs`' values (refs given once each) when every one is in the value cache,
        counted as hits; else None, and nothing counted: the caller then `fetch`es, which
        counts each ref as what it turns out to be. A cached mount's whole fetch."""
        if self._ttl <= 0:
            return None
        key = identity.key
        found = self._cache.get_all([(key, ref) for ref in refs])
        if found is not None:
            self._count("hit", len(found))
        return found

    async def fetch(
        self,
        backend: AnyBackend,
        plan: AnyPlan,
        identity: Identity,
        refs: Sequence[Hashable],
        ctx: FetchContext,
        sources: dict[Hashable, Source] | None = None,
    ) -> dict[Hashable, Fetched]:
        """Each ref's values or error. With `sources` (the audit trail is on), also where each
        value came from: the cache, another mount's read, or what the values are marked with."""
        results: dict[Hashable, Fetched] = {}
        raised: list[_Raised] = []
        todo = list(dict.fromkeys(refs))
        for round_ in range(MAX_ROUNDS):
            joined = self._join(backend, plan, identity, todo, ctx, results, sources)
            if not joined:  # every value came from the cache: nothing to wait for
                break
            # Entered and left here rather than in a coroutine of its own: every mount of an
            # outage waits in this frame (see `_outcomes`).
            loads = self._enter(joined)
            try:
                outcomes = await self._outcomes(plan, identity, joined, ctx)
            finally:
                for task in loads:
                    self._leave(task)
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
            if not todo:
                break
        if raised:
            raise raised[0].rethrown()
        if sources is not None:
            _settle(sources, results)
        return results

    def _join(
        self,
        backend: AnyBackend,
        plan: AnyPlan,
        identity: Identity,
        refs: Sequence[Hashable],
        ctx: FetchContext,
        results: dict[Hashable, Fetched],
        sources: dict[Hashable, Source] | None = None,
    ) -> _Joined:
        """Cache hits into `results`; for the rest, the load each joins (or starts)."""
        joined: _Joined = {}
        mine: dict[Hashable, asyncio.Future[Fetched]] = {}
        hits = 0
        for ref in refs:
            key = (identity.key, ref)
            cached = self._cache.get(key) if self._ttl > 0 else None
            if cached is not None:
                hits += 1
                results[ref] = cached
                if sources is not None:
                    sources[ref] = "cache"
            elif key in self._inflight:
                self._count("coalesced")
                joined[ref] = self._inflight[key]
                if sources is not None:
                    sources[ref] = "coalesced"
            else:
                if sources is not None:
                    sources.pop(ref, None)  # a fresh load after a shared one ran out
                if self._ttl > 0:  # without --cache-ttl there is no value cache to miss
                    self._count("miss")
                mine[ref] = asyncio.get_running_loop().create_future()
        if hits:  # counted once per mount, not once per object: this is every cached mount
            self._count("hit", hits)
        if mine:
            now = time.monotonic()
            budget = max(ctx.deadline - now, self._load_budget)
            own = FetchContext(deadline=now + budget, retry_deadline=now + budget / 3)
            task = asyncio.create_task(self._load(backend, plan, identity, mine, own))
            for ref, future in mine.items():
                joined[ref] = self._inflight[(identity.key, ref)] = (future, task)
        return joined

    def _enter(self, joined: _Joined) -> set[asyncio.Task[None]]:
        """Count this caller as waiting on each load it joined (see `_leave`)."""
        loads = {task for _future, task in joined.values()}
        for task in loads:
            self._waiters[task] = self._waiters.get(task, 0) + 1
        return loads

    async def _outcomes(
        self, plan: AnyPlan, identity: Identity, joined: _Joined, ctx: FetchContext
    ) -> dict[Hashable, _Outcome]:
        """Each ref's load outcome, or what this caller answers for it when it cannot wait
        longer: the stale copy after --serve-stale-wait, else a deadline error at its own
        deadline.

        One wait for all of the mount's refs rather than a task per ref: an outage holds
        every mount of its first seconds waiting here at once (~100 at 33 mounts/s with the
        default --serve-stale-wait), and the allocators keep the high-water mark of that for
        good. Measured: 19 KiB of Python heap per waiting 5-object mount with a task per ref,
        8 KiB with one `asyncio.wait`, 5.7 KiB with `waiting.all_done` on the loads.
        """
        start = time.monotonic()
        # Per ref, in `joined`'s order (lists: this frame is held by every waiting mount).
        stale: list[Sequence[SecretValue] | None] = []
        stops: list[tuple[float, ...]] = []
        for ref in joined:
            held = self._stale.get((identity.key, ref))
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
                    outcome = self._gave_up(plan, identity, ref, stale[i], task, start)
                outcomes[i] = outcome
            if all(outcome is not None for outcome in outcomes):
                break
        settled = [outcome for outcome in outcomes if outcome is not None]
        assert len(settled) == len(joined)  # each ref's last stop settles it
        return dict(zip(joined, settled, strict=True))

    def _refusal(self, task: asyncio.Task[None]) -> BridgeError | None:
        """The error of this load's latest failed attempt if it was a refusal (not silence)."""
        watch = self._failures.get(task)
        latest = watch.latest if watch is not None else None
        return latest.error if latest is not None and latest.refused else None

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
        return self._refusal(task) if stale is None else None

    def _gave_up(
        self,
        plan: AnyPlan,
        identity: Identity,
        ref: Hashable,
        stale: Sequence[SecretValue] | None,
        task: asyncio.Task[None],
        start: float,
    ) -> _Outcome:
        """What a caller answers for `ref` at its last stop: the stale copy, or a deadline
        error naming the load's last failed attempt."""
        watch = self._failures.get(task)
        latest = watch.latest if watch is not None else None
        last = f"; last attempt: {latest.error}" if latest is not None else ""
        if stale is not None:
            key = (identity.key, ref)
            self._stale.count_served()
            self._stale.announce(plan.backend, identity.subject, key, task, f"no answer yet{last}")
            return stale
        return DeadlineExceeded(
            f"the {plan.backend} store did not answer within this mount's deadline "
            f"({time.monotonic() - start:.1f}s of waiting; still trying){last}"
        )

    def _leave(self, task: asyncio.Task[None]) -> None:
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

    async def _load(
        self,
        backend: AnyBackend,
        plan: AnyPlan,
        identity: Identity,
        mine: Mapping[Hashable, asyncio.Future[Fetched]],
        ctx: FetchContext,
    ) -> None:
        """Fetch and settle every future of `mine`; never raises (callers get the outcome)."""
        rate = self._rates.get(plan.backend)
        task = asyncio.current_task()
        if task is not None:
            load = task
            self._failures[task] = watch_failures(
                lambda error: self._serve_refused(plan, identity, mine, load, error)
            )
        try:
            # The store calls are cut by BackendEnv.retry; this also bounds the wait for a
            # fetch slot, so nothing outlives the load's budget.
            async with asyncio.timeout(ctx.deadline - time.monotonic()):
                async with self._slots.hold(plan.backend, namespace_of(identity.key)):
                    if rate is not None:
                        await rate.acquire()
                    fetched = await backend.fetch(plan, identity, list(mine), ctx)
        except TimeoutError:
            error = DeadlineExceeded(
                f"the {plan.backend} store did not answer within {self._load_budget:.0f}s"
            )
            fetched = {ref: error for ref in mine}
        except BridgeError as exc:
            if not exc.transient or not self._stale.holds_all((identity.key, r) for r in mine):
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
            if task is not None:
                self._failures.pop(task).close()
            for ref, future in mine.items():
                key = (identity.key, ref)
                held = self._inflight.get(key)
                if held is not None and held[0] is future:  # not a newer load's entry
                    del self._inflight[key]
                if task is not None:
                    self._stale.load_ended(key, task)
        for ref, future in mine.items():
            result = fetched.get(ref)
            if result is None:
                result = BridgeError(f"the {plan.backend} backend returned no value")
            key = (identity.key, ref)
            if not isinstance(result, BridgeError):
                if self._ttl > 0:
                    self._cache.put(key, result, self._ttl)
                self._stale.keep(key, result)
            if not future.done():  # else answered with its stale copy when the store refused
                future.set_result(self._or_stale(plan, identity, key, result))

    def _or_stale(self, plan: AnyPlan, identity: Identity, key: Key, result: Fetched) -> Fetched:
        """A load's outcome for `key`, or its stale copy if the store failed transiently."""
        if isinstance(result, BridgeError) and (
            result.transient or isinstance(result, DeadlineExceeded)
        ):
            stale = self._stale.get(key)
            if stale is not None:
                self._stale.announce(plan.backend, identity.subject, key, None, str(result))
                return stale
        return result

    def _serve_refused(
        self,
        plan: AnyPlan,
        identity: Identity,
        mine: Mapping[Hashable, asyncio.Future[Fetched]],
        load: asyncio.Task[None],
        error: BridgeError,
    ) -> None:
        """The store refused one of `load`'s attempts (it is down, not slow): each ref with a
        stale copy is answered with it now — the mounts waiting on it and those joining the
        load later — while the load goes on retrying, to refresh the copy and the cache. A
        mount that joined before the refusal would otherwise wait out --serve-stale-wait."""
        for ref, future in mine.items():
            key = (identity.key, ref)
            held = None if future.done() else self._stale.get(key)
            if held is not None:
                self._stale.announce(plan.backend, identity.subject, key, load, str(error))
                future.set_result(held)

    @staticmethod
    def _fail(mine: Mapping[Hashable, asyncio.Future[Fetched]], exc: BaseException) -> None:
        for future in mine.values():
            if not future.done():
                future.set_exception(exc)
                future.exception()  # retrieved: the waiters re-raise it themselves

    async def close(self) -> None:
        """Cancel the loads still running (shutdown): nobody is left to use their results."""
        loads = {task for _future, task in self._inflight.values()}
        for task in loads:
            task.cancel()
        await asyncio.gather(*loads, return_exceptions=True)


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
