"""The change feed's records and documents: which secret changed, never its value
(docs/change-feed.md).

`secrets-bridge watch` turns each store's own event service into `Change` records and publishes
them into two kinds of ConfigMaps in the provider's namespace, which every node provider watches:

- one *records* document per source (`secrets-bridge-feed-<source>`, key `records.json`): the
  last `WINDOW` changes, numbered by `seq` within a `generation`. A node that missed records
  (its `seq` is older than the window's `first`) or sees another generation treats the
  source's scopes as changed once;
- one *health* document (`secrets-bridge-feed-health`, key `health.json`): a heartbeat `beat`
  and each source's state. A node applies the long reuse window (`--feed-window`) to a store's
  values only while the beat keeps advancing and the source is up.

Records name a secret as its store's dialect names it (`subject`), not as the pod wrote it, so
the watcher (from an event) and the node (from a ref) derive the same name. A record only ever
causes a read with the pod's own identity: a forged or replayed one costs a read, never serves
a value, which is why matching may over-match (the scope is used for coverage only).

Both documents are parsed here with bounds (`parse_records`, `parse_health`): they come from
the API server, and a document that does not parse is ignored, never trusted in part.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard, TypeVar

#: The label every feed ConfigMap carries: the nodes watch this selector.
LABEL = "app.kubernetes.io/component"
LABEL_VALUE = "change-feed"
SELECTOR = f"{LABEL}={LABEL_VALUE}"
HEALTH_NAME = "secrets-bridge-feed-health"
HEALTH_KEY = "health.json"
RECORDS_PREFIX = "secrets-bridge-feed-"
RECORDS_KEY = "records.json"
VERSION = 1

#: Records kept per source: the window a node may fall behind by and still apply each change.
WINDOW = 256
#: Bytes of one records document's JSON (ConfigMaps hold 1 MiB; every node receives each update).
MAX_DOCUMENT = 256 * 1024
#: A name longer than this is replaced by its digest, on both sides (`subject_name`).
MAX_NAME = 512
MAX_MARKER = 128
MAX_REASON = 200
#: Sources one feed may carry (the health document's entries).
MAX_SOURCES = 64
#: A source's name: a DNS label, since it becomes part of a ConfigMap's name.
SOURCE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")


def subject_name(name: str) -> str:
    """A record's name for `name`: itself, or its digest when over `MAX_NAME` (a store path
    can be longer than a ConfigMap should carry). Both sides call this."""
    if len(name) <= MAX_NAME:
        return name
    return "sha256:" + hashlib.sha256(name.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Change:
    """One changed secret: its store (the `backends/` package), the store instance (`scope`:
    a Vault address, an AWS region, a Key Vault name, a Google project) and its name as the
    store's dialect names it. `marker` is the store's version or event id, opaque, for the log."""

    store: str
    scope: str
    name: str
    marker: str = ""

    @staticmethod
    def of(store: str, scope: str, name: str, marker: str = "") -> Change:
        """A change with its fields bounded: the name through `subject_name`, the marker cut."""
        return Change(store, scope[:MAX_NAME], subject_name(name), marker[:MAX_MARKER])


@dataclass(frozen=True, slots=True)
class Subject:
    """What a cached value answers to in the feed (a dialect's `Watched.subject`): changes of
    its store named `name` within any scope, or, with `prefix`, every name that starts with it
    (a selection: `""` for one that matches by label or tag). `scope` says which feed covers it."""

    scope: str
    name: str
    prefix: bool = False

    @staticmethod
    def of(scope: str, name: str, *, prefix: bool = False) -> Subject:
        return Subject(scope[:MAX_NAME], name if prefix else subject_name(name), prefix)


StoreC = TypeVar("StoreC", contravariant=True)
RefC = TypeVar("RefC", contravariant=True)


class Watched(Protocol[StoreC, RefC]):
    """What a dialect whose store has a change feed also is: `subject(store, ref)` names a ref
    as that store's `changes.py` names the secret from an event (None: not in any feed, such as
    a dynamic credential)."""

    def subject(self, store: StoreC, ref: RefC) -> Subject | None: ...


class Feed(Protocol):
    """What a source is handed by the watcher (provider/watch/)."""

    async def publish(self, changes: Sequence[Change]) -> None:
        """Returns once the changes are in the records document the nodes watch; raises if
        they are not, and then the source must not acknowledge the events they came from."""
        ...

    def up(self) -> None:
        """The event service answered (a poll returned, a canary came back)."""
        ...

    def down(self, reason: str) -> None:
        """The event service did not answer; `reason` is one secret-free line."""
        ...


class Source(Protocol):
    """One store's event service, read by the watcher (`backends/<store>/changes.py`)."""

    #: The store package (`vault`, `aws`, `azure`, `gcp`).
    store: str
    #: The source's name (`SOURCE_NAME`): its records document is `secrets-bridge-feed-<name>`.
    name: str
    #: The store instances its events cover: nodes apply the long window only to these.
    scopes: frozenset[str]
    #: True for a pull source (a queue, a subscription): only the Lease holder runs it, and it
    #: acknowledges what it published. False for a push source (Vault's audit stream), which the
    #: holder also runs, and whose events in flight at a takeover are covered by a new generation.
    pulled: bool

    async def run(self, feed: Feed) -> None:
        """Read events until cancelled, publishing each batch before acknowledging it."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Records:
    """One source's records document."""

    source: str
    store: str
    generation: str
    #: The number of the last record published (0: none yet).
    seq: int
    #: (seq, name, marker) of the last `WINDOW` records, oldest first.
    records: tuple[tuple[int, str, str], ...] = ()

    @property
    def first(self) -> int:
        """The oldest seq still in the window (seq + 1 when it is empty)."""
        return self.records[0][0] if self.records else self.seq + 1

    def after(self, seq: int) -> tuple[tuple[int, str, str], ...] | None:
        """The records after `seq`, or None if some of them left the window already."""
        if seq >= self.seq:
            return ()
        if seq + 1 < self.first:
            return None
        return tuple(r for r in self.records if r[0] > seq)

    def appended(self, changes: Sequence[Change]) -> Records:
        """This document with `changes` added, numbered on, the window trimmed to `WINDOW`
        records and `MAX_DOCUMENT` bytes."""
        seq = self.seq
        added = []
        for change in changes:
            seq += 1
            added.append((seq, change.name, change.marker))
        kept = (*self.records, *added)[-WINDOW:]
        size = sum(len(name) + len(marker) + 32 for _, name, marker in kept)
        while kept and size > MAX_DOCUMENT - 1024:
            size -= len(kept[0][1]) + len(kept[0][2]) + 32
            kept = kept[1:]
        return Records(self.source, self.store, self.generation, seq, kept)

    def encode(self) -> dict[str, str]:
        body = {
            "v": VERSION,
            "source": self.source,
            "store": self.store,
            "generation": self.generation,
            "seq": self.seq,
            "records": [list(r) for r in self.records],
        }
        return {RECORDS_KEY: json.dumps(body, separators=(",", ":"))}


@dataclass(frozen=True)
class SourceState:
    """One source as the health document reports it."""

    store: str
    scopes: frozenset[str]
    up: bool
    reason: str = ""
    generation: str = ""
    seq: int = 0

    def encode(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "scopes": sorted(self.scopes),
            "up": self.up,
            "reason": self.reason[:MAX_REASON],
            "generation": self.generation,
            "seq": self.seq,
        }


@dataclass(frozen=True)
class Health:
    """The health document: `beat` advances at every heartbeat (`interval` seconds apart)."""

    beat: int
    interval: float
    sources: Mapping[str, SourceState] = field(default_factory=dict)

    def encode(self) -> dict[str, str]:
        body = {
            "v": VERSION,
            "beat": self.beat,
            "interval": self.interval,
            "sources": {name: s.encode() for name, s in sorted(self.sources.items())},
        }
        return {HEALTH_KEY: json.dumps(body, separators=(",", ":"))}


class BadDocument(ValueError):
    """A feed document that does not parse: ignored whole."""


def records_name(source: str) -> str:
    return RECORDS_PREFIX + source


def parse_records(data: Mapping[str, str] | None) -> Records:
    body = _body(data, RECORDS_KEY)
    source = _text(body, "source", 40)
    if not SOURCE_NAME.match(source):
        raise BadDocument(f"source name {source[:40]!r} is not a DNS label")
    raw = body.get("records")
    if not isinstance(raw, list) or len(raw) > WINDOW:
        raise BadDocument(f"records: expected a list of at most {WINDOW}")
    records = []
    last = 0
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not _count(item[0])
            or not isinstance(item[1], str)
            or not isinstance(item[2], str)
            or len(item[1]) > MAX_NAME + 7
            or len(item[2]) > MAX_MARKER
            or item[0] <= last
        ):
            raise BadDocument("records: each record is [seq, name, marker], seq ascending")
        last = item[0]
        records.append((item[0], item[1], item[2]))
    seq = body.get("seq")
    if not _count(seq) or seq < last:
        raise BadDocument("seq: expected a count at least the last record's")
    return Records(
        source, _text(body, "store", 40), _text(body, "generation", 64), seq, tuple(records)
    )


def parse_health(data: Mapping[str, str] | None) -> Health:
    body = _body(data, HEALTH_KEY)
    beat, interval = body.get("beat"), body.get("interval")
    if not _count(beat):
        raise BadDocument("beat: expected a count")
    if not isinstance(interval, int | float) or not 0 < interval <= 3600:
        raise BadDocument("interval: expected seconds in (0, 3600]")
    raw = body.get("sources")
    if not isinstance(raw, dict) or len(raw) > MAX_SOURCES:
        raise BadDocument(f"sources: expected a map of at most {MAX_SOURCES}")
    sources = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not SOURCE_NAME.match(name) or not isinstance(entry, dict):
            raise BadDocument("sources: each entry is a DNS-label name and a map")
        scopes = entry.get("scopes")
        if (
            not isinstance(scopes, list)
            or len(scopes) > 256
            or not all(isinstance(s, str) and len(s) <= MAX_NAME for s in scopes)
        ):
            raise BadDocument(f"sources.{name}.scopes: expected a list of names")
        seq = entry.get("seq", 0)
        if not _count(seq) or not isinstance(entry.get("up"), bool):
            raise BadDocument(f"sources.{name}: expected up (a boolean) and seq (a count)")
        sources[name] = SourceState(
            _text(entry, "store", 40),
            frozenset(scopes),
            entry["up"],
            _text(entry, "reason", MAX_REASON, required=False),
            _text(entry, "generation", 64, required=False),
            seq,
        )
    return Health(beat, float(interval), sources)


def _body(data: Mapping[str, str] | None, key: str) -> dict[str, Any]:
    text = (data or {}).get(key)
    if not isinstance(text, str) or len(text) > MAX_DOCUMENT:
        raise BadDocument(f"{key}: missing or over {MAX_DOCUMENT} bytes")
    try:
        body = json.loads(text)
    except ValueError:
        raise BadDocument(f"{key}: not JSON") from None
    if not isinstance(body, dict) or body.get("v") != VERSION:
        raise BadDocument(f"{key}: expected an object of version {VERSION}")
    return body


def _text(body: Mapping[str, Any], key: str, limit: int, *, required: bool = True) -> str:
    value = body.get(key, None if required else "")
    if not isinstance(value, str) or len(value) > limit:
        raise BadDocument(f"{key}: expected a string of at most {limit} characters")
    return value


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


#: Seconds between two of a source's log lines about what it dropped unread.
SKIPS_EVERY = 60.0


class Skips:
    """What a source drops unread (messages, lines that are no event): counted in `count`, and
    said at most once every `every` seconds, in one warning that names the source (`who`), what
    it did with them (`verb`: deleted, acknowledged, skipped) and what they are (`what`), with
    the reason of the last one. Their text is never shown: events are untrusted input."""

    def __init__(
        self, log: logging.Logger, who: str, verb: str, what: str, every: float = SKIPS_EVERY
    ) -> None:
        self.count = 0
        self._log = log
        self._said = f"{who}: {verb} %d {what} (%d in all; the last: %s)"
        self._every = every
        self._said_at = -every
        self._said_count = 0

    def add(self, why: str, count: int = 1) -> None:
        """Count `count` dropped for `why` (a secret-free reason); warn if a minute passed."""
        self.count += count
        now = time.monotonic()
        if now - self._said_at >= self._every:
            self._log.warning(self._said, self.count - self._said_count, self.count, why)
            self._said_at, self._said_count = now, self.count


#: A pull source's waits after a failed poll, in seconds: the first and the longest (`Backoff`).
POLL_BACKOFF = (1.0, 60.0)


class Backoff:
    """The wait after a failed poll or publish: `low` seconds, doubled with each failure in a
    row up to `high`; a success (`reset`) starts again from `low`."""

    def __init__(self, low: float, high: float) -> None:
        self._low, self._high = low, high
        self._failures = 0

    async def wait(self) -> None:
        """Sleep after one more failure."""
        self._failures += 1
        await asyncio.sleep(min(self._high, self._low * 2 ** min(self._failures - 1, 16)))

    def reset(self) -> None:
        self._failures = 0


@dataclass
class PullCounts:
    """What a pull source (a queue, a subscription) has done, for its tests and the log."""

    receives: int = 0
    messages: int = 0
    changes: int = 0
    #: Messages deleted from the queue or acknowledged to the subscription.
    acknowledged: int = 0
    publish_failures: int = 0

    async def published(
        self, feed: Feed, changes: Collection[Change], log: logging.Logger, who: str
    ) -> bool:
        """Publish a batch's changes (none: nothing to do); False, counted and logged with the
        feed's reason, when the feed refused them: then only the messages that announced no
        change may be acknowledged, and the rest are delivered again."""
        if not changes:
            return True
        try:
            await feed.publish(list(changes))
        except Exception as exc:  # the feed says why; the store delivers the messages again
            self.publish_failures += 1
            log.warning("%s: publishing %d changes: %s", who, len(changes), exc)
            return False
        self.changes += len(changes)
        return True
