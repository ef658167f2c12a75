"""Values with a lifetime — Vault leases (dynamic database credentials) and certificates — held
for each pod across its polls.

The driver re-sends a volume's Mount at every rotation poll (about once a minute). A read there
would issue a new credential each time: new files (apps restart), a new lease piling up in the
store. So a value that comes back with a `Lifetime` is the pod's own, held by (pod uid, identity
key, ref) and answered again at the pod's polls until its renewal point; then it is renewed
(`Renewing.renew`: the lease, and the login token that created it) when that leaves it at least
the life it had left at its renewal point and outlives the pod's next poll, else issued anew — a
certificate and its key come from one read, so they are replaced together. A renewal or re-issue
that fails while the held credential still works answers the held one (the store may be back at
the next poll), unless the store denied it.

The renewal point (`_point`) of a credential of life L, from its start (its issue or last
renewal) to its end, is `max(renewAt × L, min(min_renew_interval, renew_at × L))` after its
start: a class's `renewAt` may ask for sooner than the provider's `renew_at` (2/3), but for at
most one renewal or re-issue per `min_renew_interval` — unless the credential's own life is
shorter, when the floor gives way to the provider's renewal point, so that no floor lets a
credential die under its pod. A credential whose end is final (not renewable: a certificate, a
lease or a login token at its max TTL) is measured from its issue: it is replaced at `renew_at`
of its whole life, not of what was left at its last renewal. Whatever the point, a poll that finds
the credential would end before the pod's next poll (its longest gap seen, a quarter late)
renews or replaces it then. So a pod polling at least three times per credential life (from
issue to its final end), and more than once per login token TTL, never holds a dead credential.

A credential replaced by a re-issue is revoked (`Renewing.release`) `replaced_grace` seconds
later, so that the pod's application can move to the new one and the store's lease table does
not fill with leases nobody uses; one that ends sooner by itself is left to end.

Never shared: such a value does not enter the value cache or serve-stale (provider/mount/loads.py),
and once a ref is known to carry a lifetime, each pod reads it alone. The first read of a ref is
shared like any other read; a pod that got a credential another pod already holds from it reads
its own.

A pod that stops polling (the driver tells providers nothing when a pod goes) is let go after
`idle_after`, or after three of its own poll intervals if that is sooner (never under
IDLE_FLOOR): its leases are revoked (`Renewing.release`), so the store's lease table does not
grow with pod churn. The table is bounded in entries and in the bytes each entry keeps alive:
its contents, the parsed data kept beside them for transforms, and the entry itself
(`kept_size`; devkit/probes/held_memory.py measures it). When full, the namespace holding the
most (entries, or bytes when the byte bound is the one hit) — the incoming entry counted with its
namespace, a tie going against the inserter — gives up its least recently polled credential,
released like an idle one: a namespace within its fair share is never evicted by another's
insert. An entry larger than what every other namespace holds is answered but not held. A
provider restart loses the table: pods get new credentials at their next poll, and the old
leases end at their TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass

from provider.core.backend import AnyBackend, Renewing
from provider.core.errors import BridgeError
from provider.core.memo import Memo
from provider.core.metrics import Metrics
from provider.core.model import (
    FetchContext,
    Fetched,
    Lifetime,
    SecretValue,
    Source,
    lifetime_of,
    parsed_size,
)
from provider.mount.reads import StoreRead

log = logging.getLogger("secrets_bridge.lifetimes")

#: A pod seen polling faster is still given this long before its credentials are let go.
IDLE_FLOOR = 30.0
#: Seconds a revocation of an idle pod's lease may take.
RELEASE_TIMEOUT = 10.0
#: Refs remembered as carrying a lifetime (read per pod from then on).
KNOWN_REFS = 10_000
#: Classes already warned about for a clamped `renewAt` (once each).
WARNED_CLASSES = 10_000
#: How late a pod's next poll may come, as a multiple of its longest gap seen.
POLL_SLACK = 1.25
#: What one entry keeps alive beyond its values: the _Held, its key, the Lifetime and a store's
#: handle (Vault's: the store, the token's clock), its claim (devkit/probes/held_memory.py).
ENTRY_OVERHEAD = 2304
#: Values with more content than this are measured in a thread (walking a parsed answer of a few
#: megabytes takes tens of milliseconds).
MEASURE_INLINE = 256 * 1024

#: (pod uid, identity key, ref)
Key = tuple[str, str, Hashable]
#: The plain read (Fetcher.plain): the store read, refs, ctx, sources, owner.
Plain = Callable[
    [
        StoreRead,
        Sequence[Hashable],
        FetchContext,
        "dict[Hashable, Source] | None",
        "Owner | None",
    ],
    Awaitable[dict[Hashable, Fetched]],
]


@dataclass(frozen=True)
class Owner:
    """The pod a mount is for, as the table keys and shares it."""

    uid: str
    namespace: str
    #: The class's `renewAt`, if it asks for less than the provider's.
    renew_at: float | None = None
    #: Refs read for this pod alone (not joined to other pods' reads).
    private: frozenset[Hashable] = frozenset()
    #: The class's name, for the one warning when its `renewAt` is clamped by the floor.
    label: str = ""


@dataclass
class _Held:
    values: Sequence[SecretValue]
    lifetime: Lifetime
    backend: AnyBackend
    namespace: str
    polled: float
    #: The longest gap seen between two of its pod's polls (0 until the second poll).
    interval: float = 0.0
    size: int = 0
    #: When this credential was issued (its renewals keep it).
    issued: float = 0.0

    def poll(self, now: float) -> None:
        self.interval = max(self.interval, now - self.polled)
        self.polled = now

    def idle_after(self, limit: float) -> float:
        return min(limit, max(3 * self.interval, IDLE_FLOOR)) if self.interval else limit

    def outlives_next_poll(self, now: float, end: float) -> bool:
        """Whether a credential ending at `end` still works at the pod's next poll."""
        return not self.interval or now + POLL_SLACK * self.interval < end


def kept_size(values: Sequence[SecretValue]) -> int:
    """The bytes a held entry of `values` keeps alive: contents, parsed data, the entry."""
    seen: set[int] = set()
    total = ENTRY_OVERHEAD
    for value in values:
        total += sys.getsizeof(value) + sys.getsizeof(value.content)
        total += parsed_size(value.data, seen)
    return total


async def measured(values: Sequence[SecretValue]) -> int:
    """`kept_size`, off the loop for a big answer."""
    if sum(len(v.content) for v in values) <= MEASURE_INLINE:
        return kept_size(values)
    return await asyncio.to_thread(kept_size, values)


class Lifetimes:
    def __init__(
        self,
        plain: Plain,
        *,
        metrics: Metrics,
        renew_at: float = 2 / 3,
        idle_after: float = 600.0,
        max_entries: int = 10_000,
        max_bytes: int = 32 * 1024 * 1024,
        min_renew_interval: float = 300.0,
        replaced_grace: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        #: The read of what is not held (the fetcher's value cache and shared loads).
        self._plain = plain
        self._metrics = metrics
        self._renew_at = renew_at
        self._min_renew_interval = min_renew_interval
        self._replaced_grace = replaced_grace
        self._idle_after = idle_after
        self._max_entries = max_entries
        #: Bytes the entries keep alive in all (a dynamic secret's answer is the tenant's to size).
        self._max_bytes = max_bytes
        self._bytes = 0
        self._clock = clock
        self._held: dict[Key, _Held] = {}
        #: Which table entry holds each value object (a shared first read hands one to many).
        self._claims: dict[int, Key] = {}
        #: (backend, ref) known to carry a lifetime (each counts 1 against the memo's size).
        self._known: Memo[tuple[str, Hashable], bool] = Memo(KNOWN_REFS, KNOWN_REFS)
        #: (namespace, class, renewAt) warned about once for being clamped by the floor.
        self._warned: Memo[tuple[str, str, float], bool] = Memo(WARNED_CLASSES, WARNED_CLASSES)
        self._sweeper: asyncio.Task[None] | None = None
        #: Revocations running or waiting out their grace (held here so that the loop does not
        #: collect them).
        self._releases: set[asyncio.Task[None]] = set()
        #: Replaced credentials waiting out their grace: (when, serial, backend, lifetime), a
        #: heap bounded by max_entries, with one task waiting for the earliest.
        self._retiring: list[tuple[float, int, Renewing, Lifetime]] = []
        self._serial = itertools.count()
        self._retirer: asyncio.Task[None] | None = None
        metrics.credentials_held.set_function(lambda: len(self._held))

    def private(self, backend: str, refs: Sequence[Hashable]) -> frozenset[Hashable]:
        """The refs known to carry a lifetime: each pod reads those alone."""
        return frozenset(r for r in refs if self._known.get((backend, r)))

    async def fetch(
        self,
        read: StoreRead,
        owner: Owner,
        refs: Sequence[Hashable],
        ctx: FetchContext,
        sources: dict[Hashable, Source] | None,
    ) -> dict[Hashable, Fetched]:
        """Each ref's values or error, held credentials answered again while they last."""
        now = self._clock()
        renew_at = min(owner.renew_at or self._renew_at, self._renew_at)
        results: dict[Hashable, Fetched] = {}
        due: dict[Hashable, _Held] = {}
        unheld: list[Hashable] = []
        for ref in refs:
            key = (owner.uid, read.identity.key, ref)
            held = self._held.get(key)
            if held is None:
                unheld.append(ref)
                continue
            held.poll(now)
            if now >= held.lifetime.end:
                self._drop(key, "expired")
                unheld.append(ref)
            elif self._due(held, now, renew_at, owner):
                due[ref] = held
            else:
                self._answer(results, sources, ref, held, "reused")
        if due:
            renewed = await asyncio.gather(
                *(self._renew(held, ctx, renew_at) for held in due.values())
            )
            for (ref, held), ok in zip(due.items(), renewed, strict=True):
                if ok:
                    self._answer(results, sources, ref, held, "renewed")
                else:
                    unheld.append(ref)
        if unheld:
            try:
                fetched = await self._read(read, owner, unheld, ctx, sources)
            except BridgeError as exc:  # a refused login: held credentials may still answer
                if not due:
                    raise
                fetched = {ref: exc for ref in unheld}
            sizes = {ref: await _size_of(fetched[ref]) for ref in unheld}
            for ref in unheld:
                self._settle(read, owner, ref, fetched[ref], sizes[ref], due, results)
                if sources is not None:
                    self._mark(sources, ref, fetched[ref], results[ref])
        return results

    # -- when a credential is due ------------------------------------------------------------

    def _point(self, held: _Held, renew_at: float) -> tuple[float, bool]:
        """When `held` is due at the earliest (see the module's docstring), and whether the
        floor moved that later than the class asked."""
        life = held.lifetime
        start = life.start if life.renewable else min(held.issued, life.start)
        span = max(0.0, life.end - start)
        asked = renew_at * span
        floored = max(asked, min(self._min_renew_interval, self._renew_at * span))
        return start + floored, floored > asked

    def _due(self, held: _Held, now: float, renew_at: float, owner: Owner) -> bool:
        point, clamped = self._point(held, renew_at)
        if clamped and owner.renew_at is not None:
            self._warn_clamped(owner, held)
        return now >= point or not held.outlives_next_poll(now, held.lifetime.end)

    def _warn_clamped(self, owner: Owner, held: _Held) -> None:
        """Once per class: its `renewAt` asks for renewals more often than the floor allows."""
        assert owner.renew_at is not None
        key = (owner.namespace, owner.label, owner.renew_at)
        if self._warned.get(key):
            return
        self._warned.put(key, True, 1)
        life = held.lifetime.end - held.lifetime.start
        log.warning(
            "renewAt is under this provider's floor; credentials are renewed less often",
            extra={
                "fields": {
                    "class": owner.label,
                    "namespace": owner.namespace,
                    "renewAt": owner.renew_at,
                    "backend": held.backend.name,
                    "why": (
                        f"renewAt {owner.renew_at:g} of a {life:.0f}s {held.lifetime.kind} asks "
                        f"for a renewal every {owner.renew_at * life:.3g}s; the floor of "
                        f"{self._min_renew_interval:g}s (--min-renew-interval) is used, or "
                        f"{self._renew_at:.3g} of its life when that is sooner"
                    ),
                }
            },
        )

    # -- reading, renewing -------------------------------------------------------------------

    async def _read(
        self,
        read: StoreRead,
        owner: Owner,
        refs: list[Hashable],
        ctx: FetchContext,
        sources: dict[Hashable, Source] | None,
    ) -> dict[Hashable, Fetched]:
        """The plain read of `refs`, the known ones for this pod alone; a credential that came
        from a read shared with another pod that holds it already is read again, alone."""
        mine = dataclasses.replace(owner, private=self.private(read.store, refs))
        fetched = await self._plain(read, refs, ctx, sources, mine)
        taken = [
            ref
            for ref, result in fetched.items()
            if not isinstance(result, BridgeError)
            and lifetime_of(result) is not None
            and self._claims.get(id(result[0]), (owner.uid,))[0] != owner.uid
        ]
        if taken:
            alone = dataclasses.replace(owner, private=frozenset(taken))
            fetched.update(await self._plain(read, taken, ctx, sources, alone))
        return fetched

    def _settle(
        self,
        read: StoreRead,
        owner: Owner,
        ref: Hashable,
        result: Fetched,
        size: int,
        due: dict[Hashable, _Held],
        results: dict[Hashable, Fetched],
    ) -> None:
        key = (owner.uid, read.identity.key, ref)
        lifetime = None if isinstance(result, BridgeError) else lifetime_of(result)
        if lifetime is None:
            held = due.get(ref)
            if isinstance(result, BridgeError) and held is not None and self._usable(result, held):
                # The store failed to issue a new one: the held one still works.
                results[ref] = held.values
                self._count(read.store, "reused")
                return
            if held is not None:
                self._drop(key, "replaced")
            results[ref] = result
            return
        assert not isinstance(result, BridgeError)
        self._remember(read.store, ref)
        now = self._clock()
        old = self._drop(key, "replaced")
        if old is not None:
            self._retire(old, now)
        entry = _Held(result, lifetime, read.backend, owner.namespace, now, size=size, issued=now)
        if old is not None:
            entry.interval = old.interval  # the pod's poll period, learned on the one replaced
        self._put(key, entry)
        self._count(read.store, "reissued" if old is not None else "issued")
        results[ref] = result

    def _usable(self, error: BridgeError, held: _Held) -> bool:
        """A held credential answers for a failed re-issue when the store is only unavailable
        (not when it denies: the identity may have lost its access) and it still works."""
        return error.transient and self._clock() < held.lifetime.end

    async def _renew(self, held: _Held, ctx: FetchContext, renew_at: float) -> bool:
        """Renew `held` in place when that gives it at least the life it had left when due and
        it then outlives the pod's next poll; a credential whose end became final is kept only
        until its renewal point, measured from its issue."""
        old = held.lifetime
        backend = held.backend
        if not old.renewable or not isinstance(backend, Renewing):
            return False
        left_at_point = old.end - self._point(held, renew_at)[0]
        try:
            new = await backend.renew(old, ctx)
        except BridgeError as exc:
            log.info(
                "a lease could not be renewed; issuing a new credential",
                extra={"fields": {"backend": backend.name, "cause": str(exc)[:300]}},
            )
            self._count(backend.name, "renew_failed")
            return False
        if new is None:
            return False
        now = self._clock()
        held.lifetime = new  # what it is now, should a re-issue fail and it answer again
        if (
            new.end - now < left_at_point
            or not held.outlives_next_poll(now, new.end)
            or (not new.renewable and now >= self._point(held, renew_at)[0])
        ):
            return False
        self._count(backend.name, "renewed")
        return True

    def _answer(
        self,
        results: dict[Hashable, Fetched],
        sources: dict[Hashable, Source] | None,
        ref: Hashable,
        held: _Held,
        how: Source,
    ) -> None:
        results[ref] = held.values
        if sources is not None:
            sources[ref] = how
        if how == "reused":
            self._count(held.backend.name, how)

    def _mark(
        self, sources: dict[Hashable, Source], ref: Hashable, fetched: Fetched, answered: Fetched
    ) -> None:
        if answered is not fetched:
            sources[ref] = "reused"
        elif not isinstance(fetched, BridgeError) and lifetime_of(fetched) is not None:
            sources[ref] = "issued"

    # -- the table ---------------------------------------------------------------------------

    def _put(self, key: Key, held: _Held) -> None:
        while len(self._held) >= self._max_entries:
            if not self._evict(held.namespace, 1, by_bytes=False):
                return self._not_held(held)
        while self._bytes + held.size > self._max_bytes:
            if not self._evict(held.namespace, held.size, by_bytes=True):
                return self._not_held(held)
        self._held[key] = held
        self._bytes += held.size
        self._claims[id(held.values[0])] = key
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())
        return None

    def _not_held(self, held: _Held) -> None:
        """An entry the table cannot take without evicting a namespace holding less: answered
        this once, and revoked after the grace as a replaced one is."""
        self._count(held.backend.name, "unheld")
        self._retire(held, self._clock())

    def _evict(self, namespace: str, incoming: int, *, by_bytes: bool) -> bool:
        """The least recently polled credential of the namespace holding the most, counting
        the incoming entry with its own namespace (`namespace`) and a tie against it; False
        when that namespace is the inserter's and it holds nothing yet."""
        counts: dict[str, int] = {namespace: incoming}
        for held in self._held.values():
            counts[held.namespace] = counts.get(held.namespace, 0) + (held.size if by_bytes else 1)
        busiest = max(counts, key=lambda n: (counts[n], n == namespace))
        mine = [k for k, h in self._held.items() if h.namespace == busiest]
        if not mine:
            return False
        self._let_go(min(mine, key=lambda k: self._held[k].polled), "evicted")
        return True

    def _drop(self, key: Key, why: str) -> _Held | None:
        held = self._held.pop(key, None)
        if held is not None:
            self._bytes -= held.size
            self._claims.pop(id(held.values[0]), None)
            if why == "expired":
                self._count(held.backend.name, why)
        return held

    def _let_go(self, key: Key, why: str) -> None:
        """Drop a credential nobody polls any more, and revoke its lease in the background."""
        held = self._drop(key, why)
        if held is None:
            return
        self._count(held.backend.name, why)
        self._revoke_now(held)

    def _retire(self, held: _Held, now: float) -> None:
        """A replaced credential: revoked after the grace, unless it ends sooner by itself."""
        backend = held.backend
        if not _revocable(held) or held.lifetime.end - now <= self._replaced_grace:
            return
        assert isinstance(backend, Renewing)
        if len(self._retiring) >= self._max_entries:  # bounded: the oldest grace is cut short
            _when, _n, oldest, lifetime = heapq.heappop(self._retiring)
            self._revoke(oldest, lifetime)
        when = now + self._replaced_grace
        heapq.heappush(self._retiring, (when, next(self._serial), backend, held.lifetime))
        if self._retirer is None or self._retirer.done():
            self._retirer = asyncio.create_task(self._retire_due())

    async def _retire_due(self) -> None:
        """Revoke each replaced credential when its grace is over (one task for all)."""
        while self._retiring:
            await asyncio.sleep(max(0.0, self._retiring[0][0] - self._clock()))
            now = self._clock()
            while self._retiring and self._retiring[0][0] <= now:
                _when, _n, backend, lifetime = heapq.heappop(self._retiring)
                if now < lifetime.end:  # else it ended by itself meanwhile
                    self._revoke(backend, lifetime)

    def _revoke_now(self, held: _Held) -> None:
        if _revocable(held):
            assert isinstance(held.backend, Renewing)
            self._revoke(held.backend, held.lifetime)

    def _revoke(self, backend: Renewing, lifetime: Lifetime) -> None:
        task = asyncio.create_task(self._release(backend, lifetime))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, backend: Renewing, lifetime: Lifetime) -> None:
        now = self._clock()
        ctx = FetchContext.within(RELEASE_TIMEOUT, now, retries=False)
        name = getattr(backend, "name", "store")
        try:
            revoked = await backend.release(lifetime, ctx)
        except BridgeError as exc:
            log.info(
                "a lease could not be revoked; it ends at its TTL",
                extra={"fields": {"backend": name, "cause": str(exc)[:300]}},
            )
            revoked = False
        self._count(name, "revoked" if revoked else "revoke_refused")

    async def _sweep(self) -> None:
        """Let go of the credentials of pods that stopped polling, and of ended ones."""
        while self._held:
            await asyncio.sleep(max(1.0, min(self._idle_after / 4, 15.0)))
            now = self._clock()
            for key, held in list(self._held.items()):
                if now >= held.lifetime.end:
                    self._drop(key, "expired")
                elif now - held.polled >= held.idle_after(self._idle_after):
                    self._let_go(key, "idle")

    def _remember(self, backend: str, ref: Hashable) -> None:
        self._known.put((backend, ref), True, 1)

    def _count(self, backend: str, event: str) -> None:
        self._metrics.credential_events.labels(backend, event).inc()

    async def close(self) -> None:
        """Stop sweeping (shutdown). Held leases are not revoked: the pods keep using them, and
        the replaced ones waiting out their grace end at their TTL."""
        for task in (self._sweeper, self._retirer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for task in list(self._releases):
            task.cancel()
        await asyncio.gather(*self._releases, return_exceptions=True)


def _revocable(held: _Held) -> bool:
    """A lease of a store that revokes (a certificate ends at its notAfter: nothing to revoke)."""
    return held.lifetime.kind == "lease" and isinstance(held.backend, Renewing)


async def _size_of(fetched: Fetched) -> int:
    """What holding `fetched` would keep alive (0 for an error or a plain value: not held)."""
    if isinstance(fetched, BridgeError) or lifetime_of(fetched) is None:
        return 0
    return await measured(fetched)
