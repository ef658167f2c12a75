"""The node's view of the change feed (docs/change-feed.md): which store instances it covers
and since when, and what its records drop from the caches.

A value read from a store the feed covers may be reused for `--feed-window` (1 h by default)
by a class that sets no `refreshInterval` of its own, instead of `--cache-ttl`: a change to it
drops it first, so the next poll reads it, for every identity on the node. The feed covers a
store instance (`Scope`) while its heartbeat keeps advancing, within `--feed-stale-after`, and
its source reports itself up. When either fails, the scope's `since` becomes +inf and every
value falls back to its configured window at once; when the feed covers it again, only values
read from then on get the long window (`since` is then), since a change may have been missed
in between. A source whose records a node missed (its generation changed, or the window moved
past the node's last seq) is covered anew the same way: "treated as changed once", spread over
the configured window rather than read by every pod of the node in one poll.

A record is a name, never a value, and only ever drops what this node holds: the next poll
reads it again with the pod's own identity. A forged or replayed record costs reads.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from provider.core import changes
from provider.core.caching import Entry
from provider.core.changes import Health, Records, SourceState, Subject
from provider.core.metrics import Metrics

log = logging.getLogger("secrets_bridge.feed")

#: Store instances a node tracks, whatever the health document lists (it is parsed with its
#: own bounds; this keeps a node's memory fixed even so).
MAX_SCOPES = 4096
#: Sources a node tracks (records documents come one per source, whatever their number).
MAX_SOURCES = 4 * changes.MAX_SOURCES


@dataclass(eq=False, slots=True)
class Scope:
    """One store instance's cover (the `Cover` of provider/core/caching.py)."""

    store: str
    name: str
    window: float
    #: Entries stored at or after this may be reused for `window`; +inf: not covered.
    since: float = math.inf


def matches(subject: Subject, names: Collection[str]) -> bool:
    """Whether a record of `names` (one store's) names the entry `subject` names. A prefix
    subject (a selection) matches any name it starts, and a digest (a name too long for a
    record: provider/core/changes.py `subject_name`), which cannot be matched by prefix."""
    if not subject.prefix:
        return subject.name in names
    return any(n.startswith(subject.name) or n.startswith("sha256:") for n in names)


@dataclass
class _Source:
    generation: str = ""
    seq: int = -1
    state: SourceState | None = None


@dataclass
class Coverage:
    """The feed as this node sees it: fed the documents by provider/edge/feed.py, consulted
    by the fetcher when it keeps a value (`cover`) and asked to drop changed ones (`drop`)."""

    #: Seconds a covered value may be reused (--feed-window).
    window: float
    #: Seconds without an advancing heartbeat after which nothing is covered (--feed-stale-after).
    stale_after: float
    metrics: Metrics
    #: Drops the entries a predicate picks from the value and not-found caches; how many.
    drop: Callable[[Callable[[Entry[Any]], bool]], int] = lambda _changed: 0
    clock: Callable[[], float] = time.monotonic
    _scopes: dict[tuple[str, str], Scope] = field(default_factory=dict)
    _sources: dict[str, _Source] = field(default_factory=dict)
    _beat: int = -1
    _beat_seen: float = -math.inf
    _healthy: bool = False

    def cover(self, store: str, subject: Subject | None) -> Scope | None:
        """The cover of a value of `store` named `subject`: the one the feed lists, or None."""
        if subject is None:
            return None
        return self._scopes.get((store, subject.scope))

    @property
    def healthy(self) -> bool:
        return self._healthy

    def records(self, doc: Records) -> None:
        """A source's records document arrived (a watch event or a relist)."""
        source = self._source(doc.source)
        if source is None:
            return
        renewed = doc.generation != source.generation and source.seq >= 0
        if doc.generation != source.generation:
            if renewed:  # a new generation: what came before it is unknown
                self._recover(doc.source, "its generation changed")
            # Every record of a generation first seen is applied: those older than what this
            # node holds drop nothing, and a covered value may be older than the newest.
            source.generation, source.seq = doc.generation, 0
        missed = doc.after(source.seq)
        source.seq = max(source.seq, doc.seq)
        if missed is None:
            if not renewed:
                self._recover(doc.source, "this node missed records beyond the window")
            return
        if missed:
            self._changed(doc.store, {name for _seq, name, _marker in missed})

    def health(self, doc: Health) -> None:
        """The health document arrived: a new beat, each source's state."""
        if doc.beat != self._beat:
            self._beat, self._beat_seen = doc.beat, self.clock()
        for name, state in doc.sources.items():
            if (listed := self._source(name)) is not None:
                listed.state = state
        for name, source in self._sources.items():
            if name not in doc.sources and source.state is not None and source.state.up:
                # A source the feed no longer lists covers nothing.
                source.state = dataclasses.replace(
                    source.state, up=False, reason="no longer in the feed"
                )
        self.check()

    def check(self) -> None:
        """Cover or uncover each listed scope by the heartbeat's age and its source's state;
        run at every health document and periodically (a heartbeat that stops comes with no
        event)."""
        now = self.clock()
        healthy = now - self._beat_seen <= self.stale_after
        if healthy != self._healthy:
            self._healthy = healthy
            self.metrics.feed_healthy.set(1 if healthy else 0)
            if healthy:
                log.info("change feed: heartbeat seen; covered values use --feed-window")
            else:
                log.warning(
                    "change feed: no heartbeat for %.0f s (--feed-stale-after %.0f s): every "
                    "value falls back to its configured refresh",
                    min(now - self._beat_seen, 1e9),
                    self.stale_after,
                )
        # A scope is covered while every source that lists it is up: a change the one down
        # misses is missed whatever the others say.
        listed: dict[Scope, str] = {}
        down: dict[Scope, str] = {}
        for name, source in self._sources.items():
            state = source.state
            if state is None:
                continue
            for scope in self._scopes_of(state):
                listed[scope] = state.store
                if not (healthy and state.up):
                    why = "is down: " + state.reason if healthy else "has no heartbeat"
                    down.setdefault(scope, f"source {name} {why}")
        for scope, store in listed.items():
            if scope not in down and scope.since == math.inf:
                scope.since = now
                log.info("change feed: %s %s covered", store, scope.name)
            elif scope in down and scope.since != math.inf:
                scope.since = math.inf
                log.warning(
                    "change feed: %s %s no longer covered (%s): its values use their "
                    "configured refresh",
                    store,
                    scope.name,
                    down[scope],
                )
        for scope in self._scopes.values():
            if scope not in listed and scope.since != math.inf:
                scope.since = math.inf  # no source lists it any more
                log.warning(
                    "change feed: %s %s no longer listed by any source", scope.store, scope.name
                )
        covered = len(listed) - len(down)
        self.metrics.feed_covered.set(covered)

    def _source(self, name: str) -> _Source | None:
        """The source of that name, tracked from now on, or None past `MAX_SOURCES`."""
        source = self._sources.get(name)
        if source is None and len(self._sources) < MAX_SOURCES:
            source = self._sources[name] = _Source()
        return source

    def _scopes_of(self, state: SourceState) -> Iterable[Scope]:
        for name in state.scopes:
            key = (state.store, name)
            scope = self._scopes.get(key)
            if scope is None:
                if len(self._scopes) >= MAX_SCOPES:
                    continue
                scope = self._scopes[key] = Scope(state.store, name, self.window)
            yield scope

    def _recover(self, source: str, why: str) -> None:
        """Cover the source's scopes anew: values read before now use their configured window.
        Said and counted only when it covered any (a node that just started covers nothing)."""
        state = self._sources[source].state
        now = self.clock()
        covered = [s for s in self._scopes_of(state) if s.since != math.inf] if state else []
        for scope in covered:
            scope.since = now
        if covered:
            self.metrics.feed_resyncs.inc()
            log.info("change feed: source %s resynced (%s)", source, why)

    def _changed(self, store: str, names: set[str]) -> None:
        def changed(entry: Entry[Any]) -> bool:
            subject = entry.subject
            return (
                isinstance(subject, Named)
                and subject.store == store
                and matches(subject.subject, names)
            )

        self.metrics.feed_changes.inc(len(names))
        dropped = self.drop(changed)
        self.metrics.feed_dropped.inc(dropped)


def kept_for(ttl: float, cover: Scope | None, refresh: float | None) -> float:
    """How long to keep a value kept for `ttl`: as long as its cover's window too, when the
    class takes the feed's (it sets no `refreshInterval`)."""
    return max(ttl, cover.window) if cover is not None and refresh is None else ttl


@dataclass(frozen=True, slots=True)
class Named:
    """What a kept value is named by in the feed (`Entry.subject`), and the bytes that keeps
    alive (the cache counts them in the entry's size)."""

    store: str
    subject: Subject
    size: int = 0


#: Bytes of a `Named` and its `Subject` themselves, their strings apart.
_OBJECTS = sys.getsizeof(Named("", Subject("", ""))) + sys.getsizeof(Subject("", ""))


def named(store: str, subject: Subject | None) -> Named | None:
    """The `Entry.subject` of a value of `store` named `subject` (None: the feed names it not).
    Its size counts the name, which the subject made; the store's name and the scope are the
    plan's own strings."""
    if subject is None:
        return None
    size = _OBJECTS + sys.getsizeof(subject.name)
    return Named(store, subject, size + sys.getsizeof(size))  # the count is an object too
