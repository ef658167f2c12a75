"""Serve-stale (`--serve-stale-max-age`, off by default): the last good value of each
(identity, object), for when its store fails.

When the store fails transiently (down, hanging, throttled past our retries) — or has not
answered within `--serve-stale-wait`, or refused one of the read's attempts (a store that is
down is not waited for) — the fetcher serves the last good value of the same identity and
object if it is younger than the limit, logged and counted, while the one load per key keeps
refreshing it. It never applies to denials or missing objects, and never bypasses the identity
check (`identify` runs before any fetch). A denial or a not-found drops the copy at once (and
the value cache's entry): access revoked stays revoked through a later outage. Copies are held
marked "stale", so whoever is served one is told so (the audit trail's source), and evicted by
namespace share like the value cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Hashable, Iterable, Sequence

from provider.core.caching import ExpiringCache
from provider.core.limits import namespace_of
from provider.core.metrics import Metrics
from provider.core.model import SecretValue, values_size
from provider.mount.reads import StoreRead

#: (identity key, ref): one object as one identity reads it.
Key = tuple[str, Hashable]

# The fetcher's logger: operators grep its lines as the fetcher's since serve-stale began.
log = logging.getLogger("secrets_bridge.fetching")


def is_stale(result: object) -> bool:
    """Whether a fetch outcome is a stale copy (copies are held marked)."""
    return isinstance(result, list) and bool(result) and result[0].source == "stale"


class LastGood:
    def __init__(
        self,
        *,
        max_age: float,
        wait: float,
        metrics: Metrics,
        max_entries: int,
        max_bytes: int,
    ) -> None:
        #: `--serve-stale-max-age`; 0 turns serve-stale off.
        self.max_age = max_age
        #: `--serve-stale-wait`: how long a mount waits for a silent store before its copy.
        self.wait = wait
        self._metrics = metrics
        self._copies: ExpiringCache[Sequence[SecretValue]] = ExpiringCache(
            max_entries=max_entries,
            max_bytes=max_bytes,
            size_of=values_size,
            on_event=metrics.cache_counter("stale"),
            tenant_of=namespace_of,
        )
        #: (key, load) pairs whose stale answer was logged: one line per load, not per mount.
        self._announced: set[tuple[Key, asyncio.Task[None]]] = set()

    @property
    def enabled(self) -> bool:
        return self.max_age > 0

    def get(self, key: Key) -> Sequence[SecretValue] | None:
        """The copy to serve for `key`, if serve-stale is on and one is young enough."""
        return self._copies.get(key) if self.max_age > 0 else None

    def keep(self, key: Key, values: Sequence[SecretValue]) -> None:
        """Remember a good read (a no-op with serve-stale off)."""
        if self.max_age > 0:
            # Held marked: whoever is served this copy later is served a stale value.
            copy = [dataclasses.replace(v, source="stale") for v in values]
            self._copies.put(key, copy, self.max_age)

    def forget(self, key: Key) -> None:
        """Drop the copy of `key`: the store denied it or no longer has it (issue 32), so no
        later outage may serve what was readable before."""
        self._copies.invalidate(key)

    def holds_all(self, keys: Iterable[Key]) -> bool:
        """Whether every one of `keys` has a copy to serve."""
        return self.max_age > 0 and all(self._copies.get(key) is not None for key in keys)

    def count_served(self) -> None:
        """Count a mount answered with a stale copy (once per object it was served)."""
        self._metrics.cache_events.labels("stale", "served").inc()

    def announce(
        self, read: StoreRead, ref: Hashable, load: asyncio.Task[None] | None, why: str
    ) -> None:
        """Log that `ref` is being answered stale: once per load (each time without one)."""
        key = read.key(ref)
        if load is not None:
            if (key, load) in self._announced:
                return
            self._announced.add((key, load))
        log.warning(
            "store unavailable; serving the last good value",
            extra={
                "fields": {
                    "backend": read.store,
                    "identity": read.identity.subject,
                    "max_age_s": self.max_age,
                    "error": why,
                }
            },
        )

    def load_ended(self, key: Key, load: asyncio.Task[None]) -> None:
        """`load` settled `key`: the next load's stale answer is announced again."""
        self._announced.discard((key, load))
