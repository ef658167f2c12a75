"""The node's side of the change feed in process: the mounter over the fake store, with the feed's
documents handed to its `Coverage` directly (provider/mount/changes.py), reads counted at the
store. A covered value outlives --cache-ttl until a record names it; a stale heartbeat, a source
down or a gap falls back to each value's configured window."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.testing import Harness, make_pod
from provider.core.changes import WINDOW, Change, Health, Records, SourceState, Subject
from provider.mount.changes import Coverage

WANTED = {"objectName": "wanted", "secretPath": "w"}
SPARE = {"objectName": "spare", "secretPath": "gone", "optional": "true"}


class Feed:
    """The watcher's documents for source "fake" (store "fake", scope "fake"), as a node's
    watch would hand them over."""

    def __init__(self, coverage: Coverage, *, listed: bool = True) -> None:
        self.coverage = coverage
        self.beats = 0
        self.doc = Records("fake", "fake", "g1", 0)
        if listed:  # the node starts with the document as its list found it
            self.coverage.records(self.doc)

    def beat(self, *, up: bool = True, reason: str = "", **more: SourceState) -> None:
        self.beats += 1
        state = SourceState("fake", frozenset({"fake"}), up, reason)
        self.coverage.health(Health(self.beats, 5.0, {"fake": state, **more}))

    def publish(self, *names: str) -> None:
        self.doc = self.doc.appended([Change.of("fake", "fake", name) for name in names])
        self.coverage.records(self.doc)


def feeding(tmp_path: Path, *, listed: bool = True, **core: Any) -> tuple[Harness, Feed]:
    """The mounter with --change-feed --feed-window 3600 (and `core`'s other settings), and
    the feed its coverage is handed."""
    h = Harness(tmp_path, change_feed=True, feed_window=3600.0, **core)
    assert h.mounter.coverage is not None
    return h, Feed(h.mounter.coverage, listed=listed)


def value(h: Harness, name: str) -> float:
    metric: Any = getattr(h.metrics, name)
    return float(metric._value.get())


async def mount(h: Harness, objects: list[dict[str, str]], sa: str = "a", **params: str) -> Any:
    result = await h.mounter.mount(h.request(objects, pod=make_pod(service_account=sa), **params))
    return {f.path: f.contents for f in result.files}


@pytest.mark.parametrize("ttl", [0.0, 0.3])
async def test_a_covered_value_outlives_cache_ttl_until_a_record_names_it(
    tmp_path: Path, ttl: float
) -> None:
    h, feed = feeding(tmp_path, cache_ttl=ttl)
    feed.beat()
    h.write({"secrets": {"w": "v1"}})
    for sa in ("a", "b"):  # two identities of the node: a value each
        assert await mount(h, [WANTED], sa) == {"wanted": b"v1"}
    h.write({"secrets": {"w": "v22"}})
    await asyncio.sleep(ttl + 0.05)
    for sa in ("a", "b"):  # past --cache-ttl, and no record yet: reused
        assert await mount(h, [WANTED], sa) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 2}
    feed.beat()
    feed.publish("w")
    for sa in ("a", "b"):  # the first mount after the record reads the new value
        assert await mount(h, [WANTED], sa) == {"wanted": b"v22"}
        assert await mount(h, [WANTED], sa) == {"wanted": b"v22"}
    assert h.fake.reads == {"w": 4}
    assert (value(h, "feed_changes"), value(h, "feed_dropped")) == (1, 2)
    assert value(h, "feed_healthy") == 1


async def test_a_record_drops_a_selection_and_an_optional_not_found(tmp_path: Path) -> None:
    h, feed = feeding(tmp_path)
    feed.beat()
    h.write({"secrets": {"w": "v", "app/a": "1", "app/b": "2"}})
    chosen = yaml.safe_dump([{"prefix": "app/", "directory": "app"}])
    both = {"wanted": b"v", "app/a": b"1", "app/b": b"2"}
    for _ in range(3):
        assert await mount(h, [WANTED, SPARE], select=chosen) == both
    assert h.fake.reads == {"w": 1, "gone": 1, "list:app/": 1, "app/a": 1, "app/b": 1}
    h.write({"secrets": {"w": "v", "app/a": "1", "app/b": "2", "app/c": "3", "gone": "here"}})
    assert await mount(h, [WANTED, SPARE], select=chosen) == both
    feed.publish("app/c")  # a secret created under the prefix
    assert await mount(h, [WANTED, SPARE], select=chosen) == {**both, "app/c": b"3"}
    assert h.fake.reads == {"w": 1, "gone": 1, "list:app/": 2, "app/a": 2, "app/b": 2, "app/c": 1}
    feed.publish("gone")  # the optional object, created
    got = await mount(h, [WANTED, SPARE], select=chosen)
    assert got == {**both, "app/c": b"3", "spare": b"here"}
    assert h.fake.reads["gone"] == 2
    assert h.fake.reads["w"] == 1


async def test_a_class_with_its_own_refresh_interval_keeps_its_window(tmp_path: Path) -> None:
    h, feed = feeding(tmp_path, min_refresh_interval=0.0)
    feed.beat()
    h.write({"secrets": {"w": "v1"}})
    own = {"refreshInterval": "0.3s"}
    assert await mount(h, [WANTED], **own) == {"wanted": b"v1"}
    h.write({"secrets": {"w": "v22"}})
    assert await mount(h, [WANTED], **own) == {"wanted": b"v1"}  # within its window
    await asyncio.sleep(0.35)
    assert await mount(h, [WANTED], **own) == {"wanted": b"v22"}  # its window, not the feed's
    assert h.fake.reads == {"w": 2}
    # A record drops its value too: the next poll reads it, within its window or not.
    h.write({"secrets": {"w": "v333"}})
    feed.publish("w")
    assert await mount(h, [WANTED], refreshInterval="60s") == {"wanted": b"v333"}
    assert h.fake.reads == {"w": 3}


async def test_a_stale_heartbeat_falls_back_to_the_configured_window(tmp_path: Path) -> None:
    h, feed = feeding(tmp_path, cache_ttl=0.3, feed_stale_after=0.2)
    coverage = feed.coverage
    feed.beat()
    h.write({"secrets": {"w": "v1"}})
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    h.write({"secrets": {"w": "v22"}})
    await asyncio.sleep(0.35)  # past --cache-ttl and --feed-stale-after, the beat unchanged
    coverage.check()  # as the node's periodic check does
    assert value(h, "feed_healthy") == 0
    assert not coverage.healthy
    assert await mount(h, [WANTED]) == {"wanted": b"v22"}  # older than --cache-ttl: read
    assert await mount(h, [WANTED]) == {"wanted": b"v22"}  # within it: reused
    assert h.fake.reads == {"w": 2}
    # A beat that repeats its number is no heartbeat.
    coverage.health(Health(feed.beats, 5.0, {}))
    assert not coverage.healthy
    # Back: only values read from then on are covered.
    feed.beat()
    assert value(h, "feed_healthy") == 1
    await asyncio.sleep(0.35)
    assert await mount(h, [WANTED]) == {"wanted": b"v22"}
    assert h.fake.reads == {"w": 3}  # read before the feed came back
    await asyncio.sleep(0.35)
    feed.beat()
    assert await mount(h, [WANTED]) == {"wanted": b"v22"}
    assert h.fake.reads == {"w": 3}  # covered again


async def test_a_source_down_uncovers_its_scopes_only(tmp_path: Path) -> None:
    h, feed = feeding(tmp_path)
    coverage = feed.coverage
    other = SourceState("vault", frozenset({"https://vault:8200"}), True)
    feed.beat(other=other)
    h.write({"secrets": {"w": "v1"}})
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 1}
    vault = coverage.cover("vault", Subject.of("https://vault:8200", "secret/x"))
    assert vault is not None
    since = vault.since
    assert since < math.inf
    feed.beat(up=False, reason="the queue does not answer", other=other)
    assert value(h, "feed_healthy") == 1  # the heartbeat still advances
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 3}  # --cache-ttl 0: read at every mount
    assert vault.since == since  # the other source's scope is still covered


@pytest.mark.parametrize("down", ["a-first", "b-second"])
async def test_a_scope_two_sources_list_is_covered_only_while_both_are_up(
    tmp_path: Path, down: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Two sources may watch one store instance (two accounts' queues in one region): a change
    # the one down misses is missed whatever the other says, and the cover does not flap.
    h, feed = feeding(tmp_path)
    coverage = feed.coverage

    def beat(*, both_up: bool) -> None:
        feed.beats += 1
        states = {
            name: SourceState("fake", frozenset({"fake"}), both_up or name != down, "gone")
            for name in ("a-first", "b-second")
        }
        coverage.health(Health(feed.beats, 5.0, states))

    beat(both_up=True)
    h.write({"secrets": {"w": "v1"}})
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 1}
    assert value(h, "feed_covered") == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="secrets_bridge.feed"):
        for _ in range(5):
            beat(both_up=False)
            coverage.check()
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 2}  # no longer covered: --cache-ttl 0
    assert value(h, "feed_covered") == 0
    lines = [r.getMessage() for r in caplog.records if "covered" in r.getMessage()]
    assert len(lines) == 1, lines  # said once, not at every check


async def test_a_source_no_longer_in_the_health_document_is_not_covered(tmp_path: Path) -> None:
    # A source taken out of the watcher's configuration publishes no records any more: its
    # scope must not stay covered on the strength of the last state the node saw of it.
    h, feed = feeding(tmp_path)
    coverage = feed.coverage
    feed.beat()
    h.write({"secrets": {"w": "v1"}})
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    coverage.health(Health(feed.beats + 1, 5.0, {}))
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 2}


async def test_the_first_records_document_of_a_covered_source_is_applied(tmp_path: Path) -> None:
    # A pulled source's records document is created at its first publish, after the nodes
    # started and covered its scopes from the health document: its records are changes too.
    h, feed = feeding(tmp_path, listed=False)
    feed.beat()
    h.write({"secrets": {"w": "v1"}})
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    h.write({"secrets": {"w": "v22"}})
    feed.publish("w")  # the document's first version
    assert await mount(h, [WANTED]) == {"wanted": b"v22"}


@pytest.mark.parametrize("gap", ["beyond the window", "a new generation"])
async def test_a_gap_resyncs_what_was_read_before_it(tmp_path: Path, gap: str) -> None:
    h, feed = feeding(tmp_path)
    coverage = feed.coverage
    feed.beat()
    h.write({"secrets": {"w": "v1", "x": "x1"}})
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    h.write({"secrets": {"w": "v22", "x": "x1"}})
    if gap == "beyond the window":  # the watcher numbered on past this node's seq
        doc = Records("fake", "fake", "g1", 40).appended(
            [Change.of("fake", "fake", f"n{i}") for i in range(WINDOW)]
        )
    else:
        doc = Records("fake", "fake", "g2", 0)
    coverage.records(doc)
    assert value(h, "feed_resyncs") == 1
    # Read before the gap: its configured window (--cache-ttl 0), once.
    assert await mount(h, [WANTED]) == {"wanted": b"v22"}
    assert await mount(h, [WANTED]) == {"wanted": b"v22"}
    assert h.fake.reads == {"w": 2}
    # Read after it: covered, and followed by the records from there on.
    h.write({"secrets": {"w": "v333", "x": "x1"}})
    assert await mount(h, [WANTED]) == {"wanted": b"v22"}
    coverage.records(doc.appended([Change.of("fake", "fake", "w")]))
    assert await mount(h, [WANTED]) == {"wanted": b"v333"}
    assert h.fake.reads == {"w": 3}
    assert value(h, "feed_resyncs") == 1


async def test_forged_replayed_or_foreign_records_cost_at_most_a_read(tmp_path: Path) -> None:
    h, feed = feeding(tmp_path)
    coverage = feed.coverage
    vault = Records("vault", "vault", "v1", 0)
    coverage.records(vault)
    feed.beat()
    h.write({"secrets": {"w": "v1"}})
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    # A secret this node does not hold: nothing dropped, nothing read.
    feed.publish("not-held", "w/suffix", "")
    assert value(h, "feed_dropped") == 0
    # Another store's records naming the same path: this store's value stays.
    coverage.records(vault.appended([Change.of("vault", "fake", "w")]))
    assert value(h, "feed_dropped") == 0
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 1}
    # A forged record of a held one: one read, of the store's own value.
    feed.publish("w")
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 2}
    # The same document again, and an older one of the same generation: nothing.
    newest = feed.doc
    older = Records("fake", "fake", "g1", 1, ((1, "w", ""),))
    for doc in (newest, older, newest):
        coverage.records(doc)
    assert await mount(h, [WANTED]) == {"wanted": b"v1"}
    assert h.fake.reads == {"w": 2}
    assert value(h, "feed_resyncs") == 0
    assert value(h, "feed_dropped") == 1


async def test_a_flood_of_records_takes_bounded_time_and_counts_right(tmp_path: Path) -> None:
    h, feed = feeding(tmp_path)
    coverage = feed.coverage
    feed.beat()
    held = [f"s/{i}" for i in range(400)]
    h.write({"secrets": {path: "v" for path in held}})
    for start in range(0, len(held), 100):
        objects = [
            {"objectName": f"o{i}", "secretPath": p} for i, p in enumerate(held[start:][:100])
        ]
        for sa in ("a", "b"):
            await mount(h, objects, sa)
    assert sum(h.fake.reads.values()) == 800
    started = time.perf_counter()
    for batch in range(10):  # ten full documents: half of each names held secrets
        names = [*held[batch * 20 :][:128], *(f"absent/{batch}/{i}" for i in range(128))]
        feed.publish(*names)
        assert len(feed.doc.records) == WINDOW
    elapsed = time.perf_counter() - started
    assert elapsed < 2.0
    # Each held secret named was dropped for both identities, once: 20 new ones per document
    # after the first's 128 (the others were dropped already).
    assert value(h, "feed_changes") == 10 * 256
    assert value(h, "feed_dropped") == 2 * (128 + 9 * 20)
    assert value(h, "feed_resyncs") == 0
    # A flood past the window: one resync, not one drop per record.
    coverage.records(
        feed.doc.appended([Change.of("fake", "fake", f"f/{i}") for i in range(10 * WINDOW)])
    )
    assert value(h, "feed_resyncs") == 1
    assert value(h, "feed_changes") == 10 * 256


async def test_a_name_too_long_for_a_record_is_matched_by_its_digest(tmp_path: Path) -> None:
    h, feed = feeding(tmp_path)
    feed.beat()
    long = "l/" + "/".join(["x" * 200] * 3)  # over MAX_NAME: records carry its digest
    h.write({"secrets": {long: "v1", "w": "w"}})
    objects = [{"objectName": "long", "secretPath": long}, WANTED]
    chosen = yaml.safe_dump([{"prefix": "l/", "directory": "l"}])
    assert (await mount(h, objects, select=chosen))["long"] == b"v1"
    h.write({"secrets": {long: "v22", "w": "w"}})
    feed.publish(long)
    assert feed.doc.records[-1][1].startswith("sha256:")
    got = await mount(h, objects, select=chosen)
    assert (got["long"], got[long]) == (b"v22", b"v22")
    assert (h.fake.reads["list:l/"], h.fake.reads["w"]) == (2, 1)


def test_what_the_feed_names_an_entry_by_is_counted_as_it_keeps_alive() -> None:
    """A value kept with the feed on also keeps its name there: the cache counts those bytes
    in the entry's size, and they are what tracemalloc sees them hold."""
    import tracemalloc

    from provider.core.caching import ExpiringCache
    from provider.core.changes import Subject
    from provider.mount.changes import Named, named

    def name(i: int) -> str:
        return f"secret/team-{i:05d}/" + "app/" * (i % 40)

    kept: list[Named | None] = [None] * 5000  # the list itself before the count starts
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(len(kept)):
            kept[i] = named("vault", Subject.of("https://vault:8200", name(i)))
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    real = sum(d.size_diff for d in after.compare_to(before, "filename"))
    counted = sum(n.size for n in kept if n is not None)
    assert abs(real - counted) <= 0.05 * real, (real, counted)

    cache: ExpiringCache[str] = ExpiringCache(size_of=len)
    first = kept[0]
    assert first is not None
    cache.put("k", "value", 60, subject=first)
    assert cache.usage("")[1] == len("value") + first.size
