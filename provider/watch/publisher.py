"""The watcher's writes into the change feed: each source's records document and the health one.

Every write is a compare-and-swap (get, change, replace carrying the resourceVersion; create if
absent), retried on Conflict a bounded number of times: both replicas may write at a takeover,
and neither loses the other's records. Publishing coalesces: the changes of one source handed
over within `coalesce` seconds become one write that every caller awaits, so a flood makes a
bounded number of writes (every node receives each one). Only the newest `WINDOW` changes of a
batch are kept, numbered as if all were: a node behind sees the gap and resyncs. A document
that does not parse is replaced by a new generation, which every node treats as "all changed".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from provider.core.changes import (
    HEALTH_NAME,
    LABEL,
    LABEL_VALUE,
    WINDOW,
    BadDocument,
    Change,
    Health,
    Records,
    SourceState,
    parse_health,
    parse_records,
    records_name,
)
from provider.core.errors import StoreUnavailable
from provider.core.kube import Conflict, KubeClient, configmaps

#: Seconds a source's changes wait for others to join their write.
COALESCE = 0.5
#: Compare-and-swap attempts of one write before it fails.
ATTEMPTS = 8

Data = Mapping[str, str] | None


class Document(Protocol):
    def encode(self) -> dict[str, str]: ...


D = TypeVar("D", bound=Document)


class Described(Protocol):
    """What the publisher needs of a source (`provider.core.changes.Source` is one)."""

    store: str
    name: str
    scopes: frozenset[str]


class Publisher:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        *,
        heartbeat: float,
        coalesce: float = COALESCE,
        attempts: int = ATTEMPTS,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._heartbeat = heartbeat
        self._coalesce = coalesce
        self._attempts = attempts
        self._feeds: dict[str, SourceFeed] = {}

    def feed(self, source: Described) -> SourceFeed:
        """The `Feed` handed to `source.run` (one per source name)."""
        if source.name not in self._feeds:
            self._feeds[source.name] = SourceFeed(self, source, self._coalesce)
        return self._feeds[source.name]

    async def new_generation(self, source: Described) -> None:
        """Start the source's records anew (a new generation, an empty window): every node
        treats its scopes as changed once. For a push source at a takeover, whose events
        sent to the old leader may be lost."""
        await self.feed(source).renew()

    async def beat(self) -> None:
        """Advance the health document's beat and report every source's state."""
        for feed in self._feeds.values():
            await feed.load()

        def update(data: Data) -> Health:
            try:
                beat = parse_health(data).beat if data is not None else 0
            except BadDocument:
                beat = 0
            states = {name: feed.state() for name, feed in self._feeds.items()}
            return Health(beat + 1, self._heartbeat, states)

        await self.swap(HEALTH_NAME, update)

    async def read(self, name: str) -> Mapping[str, str] | None:
        """The data of ConfigMap `name`, or None if there is none."""
        found = await self._client.get(configmaps(self._namespace, name))
        return None if found is None else found.get("data") or {}

    async def swap(self, name: str, update: Callable[[Data], D]) -> D:
        """Replace the data of ConfigMap `name` by `update(data)` encoded (data None: it does not
        exist) unless it changed meanwhile, and then try again; the document written, or
        StoreUnavailable if it kept changing."""
        collection = configmaps(self._namespace)
        path = configmaps(self._namespace, name)
        for attempt in range(self._attempts):
            current = await self._client.get(path)
            document = update(None if current is None else current.get("data") or {})
            try:
                if current is None:
                    body = _configmap({"name": name}, document.encode())
                    await self._client.create(collection, body)
                else:
                    body = _configmap(current["metadata"], document.encode())
                    await self._client.replace(path, body)
                return document
            except Conflict:
                # The other replica wrote first; part before trying again, so both progress.
                await asyncio.sleep(random.uniform(0, 0.02 * 2**attempt))  # noqa: S311
        raise StoreUnavailable(f"ConfigMap {name} changed under each of {self._attempts} writes")


class SourceFeed:
    """One source's `Feed`: publish (coalesced), up and down."""

    def __init__(self, publisher: Publisher, source: Described, coalesce: float) -> None:
        self._publisher = publisher
        self._coalesce = coalesce
        self._source = source
        self._name = records_name(source.name)
        self._pending: list[Change] = []
        #: Changes of the pending batch dropped past WINDOW: their numbers are still taken.
        self._skipped = 0
        self._flush: asyncio.Future[None] | None = None
        self._lock = asyncio.Lock()
        self._records: Records | None = None
        self._up = False
        self._reason = "the event service has not answered yet"

    async def publish(self, changes: Sequence[Change]) -> None:
        if not changes:
            return
        self._pending.extend(changes)
        if len(self._pending) > WINDOW:
            self._skipped += len(self._pending) - WINDOW
            del self._pending[:-WINDOW]
        if self._flush is None:
            self._flush = asyncio.ensure_future(self._write_soon())
        # Shielded: a caller cancelled does not cancel the others' write.
        await asyncio.shield(self._flush)

    def up(self) -> None:
        self._up, self._reason = True, ""

    def down(self, reason: str) -> None:
        self._up, self._reason = False, reason

    def state(self) -> SourceState:
        records = self._records
        return SourceState(
            self._source.store,
            self._source.scopes,
            self._up,
            self._reason,
            records.generation if records else "",
            records.seq if records else 0,
        )

    async def load(self) -> None:
        """Read the records document's generation and seq if this replica has not written it
        yet (a new leader), so the health document reports them."""
        if self._records is not None:
            return
        found = await self._publisher.read(self._name)
        if found is not None:
            with contextlib.suppress(BadDocument):
                self._records = parse_records(found)

    async def renew(self) -> None:
        async with self._lock:
            self._records = await self._publisher.swap(self._name, lambda _: self._fresh())

    async def _write_soon(self) -> None:
        await asyncio.sleep(self._coalesce)
        changes, skipped = self._pending, self._skipped
        self._pending, self._skipped, self._flush = [], 0, None
        async with self._lock:

            def update(data: Data) -> Records:
                records = self._parsed(data)
                if skipped:  # a gap: the records before it cannot be followed on from
                    records = dataclasses.replace(records, seq=records.seq + skipped, records=())
                return records.appended(changes)

            self._records = await self._publisher.swap(self._name, update)

    def _parsed(self, data: Data) -> Records:
        if data is None:
            return self._fresh()
        try:
            records = parse_records(data)
        except BadDocument:
            return self._fresh()
        return records if records.source == self._source.name else self._fresh()

    def _fresh(self) -> Records:
        return Records(self._source.name, self._source.store, secrets.token_hex(8), 0)


def _configmap(metadata: Mapping[str, Any], data: dict[str, str]) -> dict[str, Any]:
    labels = {**(metadata.get("labels") or {}), LABEL: LABEL_VALUE}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**metadata, "labels": labels},
        "data": data,
    }
