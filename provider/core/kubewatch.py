"""List+watch of Kubernetes objects, resumed by resourceVersion and relisted after 410 Gone.

The informer loop of client-go's reflector, without its cache: list (the collection's
resourceVersion), hand the whole current set to `on_sync`, then watch from that version and
hand each ADDED/MODIFIED/DELETED to `on_event`, keeping the version of every object and
BOOKMARK. A stream the server ends (its timeoutSeconds) is watched again from the kept version;
410 Gone relists (and syncs again); any other failure backs off with jitter (1 s doubling to
30 s, reset once a watch is established) and tries again, never giving up until cancelled.
Nothing is kept but the version: the callers hold what they need of the objects.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence

from provider.core.errors import BridgeError
from provider.core.kube import Gone, KubeClient, Object, resource_version

log = logging.getLogger("secrets_bridge.kubewatch")

#: Seconds the server is asked to keep each watch open (client-go picks 5 to 10 minutes).
WATCH_SECONDS = 300
BACKOFF_FIRST = 1.0
BACKOFF_LAST = 30.0


class ListWatch:
    """`await ListWatch(client, path, selector, on_sync=..., on_event=...).run()` until
    cancelled. `healthy` tells whether a watch is established (the list and the stream are
    current); `on_health(healthy)` is called each time that changes."""

    def __init__(
        self,
        client: KubeClient,
        collection: str,
        selector: str = "",
        *,
        on_sync: Callable[[Sequence[Object]], None],
        on_event: Callable[[str, Object], None],
        on_health: Callable[[bool], None] | None = None,
        watch_seconds: int = WATCH_SECONDS,
        backoff: tuple[float, float] = (BACKOFF_FIRST, BACKOFF_LAST),
    ) -> None:
        self._client = client
        self._collection = collection
        self._selector = selector
        self._on_sync = on_sync
        self._on_event = on_event
        self._on_health = on_health
        self._watch_seconds = watch_seconds
        self._backoff = backoff
        self._healthy = False
        self._version = ""
        self._failures = 0

    @property
    def healthy(self) -> bool:
        return self._healthy

    async def run(self) -> None:
        while True:
            try:
                if not self._version:
                    items, self._version = await self._client.list(self._collection, self._selector)
                    self._on_sync(items)
                await self._watch()  # the server ended it: watch on from the version kept
            except Gone:
                log.info("resync of %s: its resourceVersion is too old", self._collection)
                self._version = ""
                self._health(False)
            except BridgeError as exc:
                self._health(False)
                delay = self._delay()
                self._failures = min(self._failures + 1, 16)
                log.warning(
                    "watch of %s failed (%s); again in %.1f s", self._collection, exc, delay
                )
                await asyncio.sleep(delay)

    async def _watch(self) -> None:
        events = self._client.watch(
            self._collection,
            self._selector,
            self._version,
            self._watch_seconds,
            opened=self._opened,
        )
        async for kind, obj in events:
            self._version = resource_version(obj) or self._version
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._on_event(kind, obj)

    def _opened(self) -> None:
        self._failures = 0
        self._health(True)

    def _delay(self) -> float:
        """Jittered exponential backoff: a fleet of nodes does not return all at once."""
        first, last = self._backoff
        ceiling: float = min(last, first * 2.0**self._failures)
        return ceiling * random.uniform(0.5, 1.0)  # noqa: S311

    def _health(self, healthy: bool) -> None:
        if healthy != self._healthy:
            self._healthy = healthy
            if self._on_health is not None:
                self._on_health(healthy)
