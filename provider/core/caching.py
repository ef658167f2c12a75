"""Expiring, bounded caches with single-flight loading.

One structure serves credentials (Vault tokens, STS credentials, access tokens: kept until
shortly before they expire) and secret values (`--cache-ttl`). Concurrent callers asking for the
same key while a load is in flight share that one load, whether or not the result is then kept:
this is what turns 500 simultaneous pod starts into one login and one read.

Fair shares (issue 20): the provider serves every namespace of the node from one cache, so
plain LRU would let one namespace evict everyone else's entries by filling the cache with its
own (large values, thousands of throwaway roles). Given `tenant_of` (the namespace of a key),
a full cache evicts from the namespace holding the most — entries when the entry bound is hit,
bytes when the byte bound is — and within it the least recently used entry. A namespace is
never evicted by another while it holds no more than the other does, so each of N namespaces
keeps at least 1/N of the bounds, and one alone may use all of them.
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class Cover(Protocol):
    """A change feed's cover of some entries (provider/mount/changes.py): an entry stored at or
    after `since` may be reused up to `window` seconds by a caller that accepts it (a class
    with no window of its own), since a change to it would have dropped it. `since` is +inf
    while the feed does not cover them."""

    since: float
    window: float


class Named(Protocol):
    """What the change feed names an entry by (provider/mount/changes.py), and the bytes that
    keeps alive: counted in the entry's size, as its value is."""

    @property
    def size(self) -> int: ...


@dataclass(eq=False)
class Entry(Generic[T]):
    """One kept value. Compared and hashed by identity: the LRU order is kept by entry, so
    touching one (`fresh`) hashes no key. What was built from a value may hold its entry (weakly)
    and ask `fresh` whether it is still the one kept."""

    key: Hashable
    value: T
    expires: float
    size: int
    tenant: str
    #: When it was put: a caller may accept only entries younger than its own `max_age`.
    stored: float = 0.0
    #: False once dropped (replaced, invalidated, expired, evicted).
    live: bool = True
    #: The change feed's cover of it, and what the feed names it by (`drop_where` matches it).
    cover: Cover | None = None
    subject: Named | None = None

    def covered(self, now: float) -> bool:
        """Whether the feed covers it and its cover's window has not passed."""
        cover = self.cover
        return (
            cover is not None and cover.since <= self.stored and now - self.stored <= cover.window
        )


class ExpiringCache(Generic[T]):
    """LRU cache whose entries carry their own lifetime, bounded in entries and bytes."""

    def __init__(
        self,
        *,
        max_entries: int = 10_000,
        max_bytes: int | None = None,
        size_of: Callable[[T], int] = lambda _v: 0,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[str], None] | None = None,
        tenant_of: Callable[[Hashable], str] | None = None,
    ) -> None:
        self._entries: dict[Hashable, Entry[T]] = {}
        #: Per tenant: its entries in LRU order (oldest first) and the bytes they hold.
        self._lru: dict[str, OrderedDict[Entry[T], None]] = {}
        self._tenant_bytes: dict[str, int] = {}
        self._tenant_of = tenant_of or (lambda _k: "")
        self._inflight: dict[Hashable, asyncio.Future[T]] = {}
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._size_of = size_of
        self._bytes = 0
        self._clock = clock
        # "hit", "miss", "coalesced", "evicted": counted by the owner into metrics.
        self._on_event = on_event or (lambda _e: None)

    def __len__(self) -> int:
        return len(self._entries)

    def get(
        self, key: Hashable, max_age: float | None = None, *, covered: bool = False
    ) -> T | None:
        """The value, unless expired, or (with `max_age`) put longer ago than that — unless
        `covered` and the change feed covers it (`Entry.covered`)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        now = self._clock()
        if entry.expires <= now:
            self._drop(key)
            return None
        stale = max_age is not None and now - entry.stored > max_age
        if stale and not (covered and entry.covered(now)):
            return None
        self._lru[entry.tenant].move_to_end(entry)
        return entry.value

    def get_all(
        self, keys: Iterable[Hashable], max_age: float = math.inf, *, covered: bool = False
    ) -> list[T] | None:
        """Every key's value, in order, each touched as `get` touches it — or None as soon as
        one is missing, expired or older than `max_age` (`covered`: as `get`; `get` drops an
        expired one on the caller's next, per-key pass). One clock read for all: this is the
        path of every cached mount."""
        now = self._clock()
        oldest = now - max_age
        entries, lru = self._entries, self._lru
        values: list[T] = []
        for key in keys:
            entry = entries.get(key)
            if entry is None or entry.expires <= now:
                return None
            if entry.stored < oldest and not (covered and entry.covered(now)):
                return None
            lru[entry.tenant].move_to_end(entry)
            values.append(entry.value)
        return values

    def entries(self, keys: Iterable[Hashable], values: Iterable[T]) -> list[Entry[T]] | None:
        """The entries that hold these very values under these keys, or None if one does not
        (it was not kept, or was replaced since)."""
        found: list[Entry[T]] = []
        for key, value in zip(keys, values, strict=True):
            entry = self._entries.get(key)
            if entry is None or entry.value is not value:
                return None
            found.append(entry)
        return found

    def fresh(
        self,
        held: Iterable[weakref.ref[Entry[T]]],
        max_age: float = math.inf,
        *,
        covered: bool = False,
    ) -> bool:
        """Whether every entry is still kept, unexpired and younger than `max_age` (`covered`:
        as `get`); each is touched as `get` touches it. No key is looked up: this is the path
        of every mount answered again."""
        now = self._clock()
        oldest = now - max_age
        lru = self._lru
        for ref in held:
            entry = ref()
            if entry is None or not entry.live or entry.expires <= now:
                return False
            if entry.stored < oldest and not (covered and entry.covered(now)):
                return False
            lru[entry.tenant].move_to_end(entry)
        return True

    def expiry(self, key: Hashable) -> float:
        """When the entry kept for `key` expires (`clock()` time); -inf when none is kept."""
        entry = self._entries.get(key)
        return entry.expires if entry is not None else -math.inf

    def usage(self, tenant: str) -> tuple[int, int]:
        """(entries, bytes) held for `tenant`."""
        return len(self._lru.get(tenant, ())), self._tenant_bytes.get(tenant, 0)

    def put(
        self,
        key: Hashable,
        value: T,
        ttl: float,
        *,
        keep_longer: bool = False,
        cover: Cover | None = None,
        subject: Named | None = None,
    ) -> None:
        """Keep `value` for `ttl` seconds; with `keep_longer`, at least as long as the entry
        it replaces would have lived (a fresher value for callers that ask a longer reuse of
        it than the one putting it: each reads it within its own `max_age`). `cover` and
        `subject`: the change feed's (`Entry`)."""
        if ttl <= 0:
            return
        now = self._clock()
        expires = now + ttl
        old = self._entries.get(key)
        if keep_longer and old is not None:
            expires = max(expires, old.expires)
        self._drop(key)
        size = self._size_of(value) + (subject.size if subject is not None else 0)
        if self._max_bytes is not None and size > self._max_bytes:
            return
        tenant = self._tenant_of(key)
        entry = self._entries[key] = Entry(
            key, value, expires, size, tenant, now, cover=cover, subject=subject
        )
        self._lru.setdefault(tenant, OrderedDict())[entry] = None
        self._tenant_bytes[tenant] = self._tenant_bytes.get(tenant, 0) + size
        self._bytes += size
        while True:
            if len(self._entries) > self._max_entries:
                victim = max(self._lru, key=lambda t: len(self._lru[t]))
            elif self._max_bytes is not None and self._bytes > self._max_bytes:
                victim = max(self._tenant_bytes, key=self._tenant_bytes.__getitem__)
            else:
                break
            self._drop(next(iter(self._lru[victim])).key)
            self._on_event("evicted")

    def drop_where(self, changed: Callable[[Entry[T]], bool]) -> int:
        """Forget every entry `changed` says changed (the change feed's records); how many.
        One pass over the entries: a feed update carries many records at once."""
        gone = [key for key, entry in self._entries.items() if changed(entry)]
        for key in gone:
            self._drop(key)
        return len(gone)

    def invalidate(self, key: Hashable, stale: T | None = None) -> None:
        """Forget `key` — only if it still holds `stale`, when given.

        Several callers that saw the same credential rejected all invalidate it; the check keeps
        the first caller's fresh replacement from being thrown away by the others.
        """
        entry = self._entries.get(key)
        if entry is not None and (stale is None or entry.value is stale):
            self._drop(key)

    async def get_or_load(self, key: Hashable, load: Callable[[], Awaitable[tuple[T, float]]]) -> T:
        """The cached value, or the result of one shared `load()` returning (value, ttl)."""
        while True:
            cached = self.get(key)
            if cached is not None:
                self._on_event("hit")
                return cached
            pending = self._inflight.get(key)
            if pending is None:
                break
            self._on_event("coalesced")
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not pending.cancelled() or (task is not None and task.cancelling()):
                    raise
                # The caller running the load gave up (its mount was cancelled), not this
                # one: load again rather than inherit someone else's cancellation.
        self._on_event("miss")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            value, ttl = await load()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as exc:
            future.set_exception(exc)
            # Nobody else may be waiting; retrieve it so asyncio does not log "never retrieved".
            future.exception()
            raise
        else:
            self.put(key, value, ttl)
            future.set_result(value)
            return value
        finally:
            del self._inflight[key]

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.live = False
            self._bytes -= entry.size
            lru = self._lru[entry.tenant]
            del lru[entry]
            self._tenant_bytes[entry.tenant] -= entry.size
            if not lru:
                del self._lru[entry.tenant], self._tenant_bytes[entry.tenant]
