"""Values with a lifetime — Vault leases (dynamic database credentials) and certificates — held
for each pod across its polls.

The driver re-sends a volume's Mount at every rotation poll (about once a minute). A read there
would issue a new credential each time: new files (apps restart), a new lease piling up in the
store. So a value that comes back with a `Lifetime` is the pod's own, held by (pod uid, identity
key, ref) and answered again at the pod's polls until `renew_at` of its life has passed; then it
is renewed (`Renewing.renew`: the lease, and the login token that created it) when that leaves it
at least the life it had left at its renewal point, else issued anew — a certificate and its key
come from one read, so they are replaced together. The credential replaced is not revoked: the
pod may use it until it reloads its files, and it ends at its own TTL. A renewal or re-issue that
fails while the held credential still works answers the held one (the store may be back at the
next poll), unless the store denied it.

Never shared: such a value does not enter the value cache or serve-stale (provider/mount/loads.py),
and once a ref is known to carry a lifetime, each pod reads it alone. The first read of a ref is
shared like any other read; a pod that got a credential another pod already holds from it reads
its own.

A pod that stops polling (the driver tells providers nothing when a pod goes) is let go after
`idle_after`, or after three of its own poll intervals if that is sooner (never under
IDLE_FLOOR): its leases are revoked (`Renewing.release`), so the store's lease table does not
grow with pod churn. The table is bounded in entries and bytes: when full, the namespace holding
the most (entries, or bytes when the byte bound is the one hit) gives up its least recently
polled credential, released like an idle one. A provider restart loses the
table: pods get new credentials at their next poll, and the old leases end at their TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
)
from provider.mount.reads import StoreRead
from provider.mount.stale import values_size

log = logging.getLogger("secrets_bridge.lifetimes")

#: A pod seen polling faster is still given this long before its credentials are let go.
IDLE_FLOOR = 30.0
#: Seconds a revocation of an idle pod's lease may take.
RELEASE_TIMEOUT = 10.0
#: Refs remembered as carrying a lifetime (read per pod from then on).
KNOWN_REFS = 10_000

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


@dataclass
class _Held:
    values: Sequence[SecretValue]
    lifetime: Lifetime
    backend: AnyBackend
    namespace: str
    polled: float
    #: The longest gap seen between two of its polls (0 until the second poll).
    interval: float = 0.0
    size: int = 0

    def poll(self, now: float) -> None:
        self.interval = max(self.interval, now - self.polled)
        self.polled = now

    def idle_after(self, limit: float) -> float:
        return min(limit, max(3 * self.interval, IDLE_FLOOR)) if self.interval else limit


class Lifetimes:
    def __init__(
        self,
        *,
        metrics: Metrics,
        renew_at: float = 2 / 3,
        idle_after: float = 600.0,
        max_entries: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
        min_renew_interval: float = 300.0,
        replaced_grace: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._metrics = metrics
        self._renew_at = renew_at
        self._min_renew_interval = min_renew_interval
        self._replaced_grace = replaced_grace
        self._idle_after = idle_after
        self._max_entries = max_entries
        #: Value bytes in all (a dynamic secret's answer is the tenant's to size).
        self._max_bytes = max_bytes
        self._bytes = 0
        self._clock = clock
        self._held: dict[Key, _Held] = {}
        #: Which table entry holds each value object (a shared first read hands one to many).
        self._claims: dict[int, Key] = {}
        #: (backend, ref) known to carry a lifetime (each counts 1 against the memo's size).
        self._known: Memo[tuple[str, Hashable], bool] = Memo(KNOWN_REFS, KNOWN_REFS)
        self._sweeper: asyncio.Task[None] | None = None
        #: Revocations running (held here so that the loop does not collect them).
        self._releases: set[asyncio.Task[None]] = set()
        metrics.credentials_held.set_function(lambda: len(self._held))

    def private(self, backend: str, refs: Sequence[Hashable]) -> frozenset[Hashable]:
        """The refs known to carry a lifetime: each pod reads those alone."""
        return frozenset(r for r in refs if self._known.get((backend, r)))

    async def fetch(
        self,
        plain: Plain,
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
            elif held.lifetime.due(now, renew_at):
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
                fetched = await self._read(plain, read, owner, unheld, ctx, sources)
            except BridgeError as exc:  # a refused login: held credentials may still answer
                if not due:
                    raise
                fetched = {ref: exc for ref in unheld}
            for ref in unheld:
                self._settle(read, owner, ref, fetched[ref], due, results)
                if sources is not None:
                    self._mark(sources, ref, fetched[ref], results[ref])
        return results

    async def _read(
        self,
        plain: Plain,
        read: StoreRead,
        owner: Owner,
        refs: list[Hashable],
        ctx: FetchContext,
        sources: dict[Hashable, Source] | None,
    ) -> dict[Hashable, Fetched]:
        """The plain read of `refs`, the known ones for this pod alone; a credential that came
        from a read shared with another pod that holds it already is read again, alone."""
        mine = Owner(owner.uid, owner.namespace, owner.renew_at, self.private(read.store, refs))
        fetched = await plain(read, refs, ctx, sources, mine)
        taken = [
            ref
            for ref, result in fetched.items()
            if not isinstance(result, BridgeError)
            and lifetime_of(result) is not None
            and self._claims.get(id(result[0]), (owner.uid,))[0] != owner.uid
        ]
        if taken:
            alone = Owner(owner.uid, owner.namespace, owner.renew_at, frozenset(taken))
            fetched.update(await plain(read, taken, ctx, sources, alone))
        return fetched

    def _settle(
        self,
        read: StoreRead,
        owner: Owner,
        ref: Hashable,
        result: Fetched,
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
        replaced = key in self._held
        if replaced:
            self._drop(key, "replaced")
        self._put(key, _Held(result, lifetime, read.backend, owner.namespace, self._clock()))
        self._count(read.store, "reissued" if replaced else "issued")
        results[ref] = result

    def _usable(self, error: BridgeError, held: _Held) -> bool:
        """A held credential answers for a failed re-issue when the store is only unavailable
        (not when it denies: the identity may have lost its access) and it still works."""
        return error.transient and self._clock() < held.lifetime.end

    async def _renew(self, held: _Held, ctx: FetchContext, renew_at: float) -> bool:
        """Renew `held` in place when that gives it at least the life it had left when due."""
        old = held.lifetime
        backend = held.backend
        if not old.renewable or not isinstance(backend, Renewing):
            return False
        try:
            new = await backend.renew(old, ctx)
        except BridgeError as exc:
            log.info(
                "a lease could not be renewed; issuing a new credential",
                extra={"fields": {"backend": backend.name, "cause": str(exc)[:300]}},
            )
            self._count(backend.name, "renew_failed")
            return False
        if new is None or new.end - self._clock() < (1 - renew_at) * (old.end - old.start):
            return False
        held.lifetime = new
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
        held.size = values_size(held.values)
        while self._held and len(self._held) >= self._max_entries:
            self._evict(by_bytes=False)
        while self._held and self._bytes + held.size > self._max_bytes:
            self._evict(by_bytes=True)
        self._held[key] = held
        self._bytes += held.size
        self._claims[id(held.values[0])] = key
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())

    def _evict(self, *, by_bytes: bool) -> None:
        """The least recently polled credential of the namespace holding the most."""
        counts: dict[str, int] = {}
        for held in self._held.values():
            counts[held.namespace] = counts.get(held.namespace, 0) + (held.size if by_bytes else 1)
        busiest = max(counts, key=lambda n: counts[n])
        key = min(
            (k for k, h in self._held.items() if h.namespace == busiest),
            key=lambda k: self._held[k].polled,
        )
        self._let_go(key, "evicted")

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
        if held.lifetime.renewable and isinstance(held.backend, Renewing):
            task = asyncio.create_task(self._release(held.backend, held.lifetime))
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
                "an idle pod's lease could not be revoked; it ends at its TTL",
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
        """Stop sweeping (shutdown). Held leases are not revoked: the pods keep using them."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for task in list(self._releases):
            task.cancel()
        await asyncio.gather(*self._releases, return_exceptions=True)
