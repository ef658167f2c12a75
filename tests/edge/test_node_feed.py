"""The node's change feed over the wire: `serve --change-feed` in the test's loop, list+watching
devkit's API-server fake, whose feed ConfigMaps the watcher's own Publisher writes; mounts
through the driver's gRPC, store reads counted on /metrics. A rotated secret reaches the files at
the first mount after its record (not before), through broken watches and a compacted history;
a document that does not parse is ignored with one line; the API server gone, the heartbeat
goes stale and values fall back to their configured refresh, then are covered again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from devkit.kubeapi import KubeApi, serving
from devkit.serving import Serving
from devkit.serving import serving as provider_serving
from devkit.testing import driver_request
from provider.core.changes import (
    LABEL,
    LABEL_VALUE,
    RECORDS_KEY,
    WINDOW,
    Change,
    parse_records,
    records_name,
)
from provider.core.errors import BridgeError
from provider.core.kube import KubeClient, configmaps
from provider.core.settings import CoreSettings
from provider.watch.publisher import Publisher, SourceFeed

pytestmark = pytest.mark.timeout(30)

NS = "feed"
WANTED = [{"objectName": "wanted", "secretPath": "w"}]
#: --feed-stale-after: longer than a broken watch's backoff (up to 1 s), so a watch broken on
#: purpose does not uncover the store; the test of a stale heartbeat asks for `FAST_STALE`.
STALE_AFTER = 3.0
FAST_STALE = 0.6


@dataclass
class Source:
    """What the publisher needs of the fake store's source."""

    store: str = "fake"
    name: str = "fake"
    scopes: frozenset[str] = frozenset({"fake"})


@dataclass
class Rig:
    api: KubeApi
    client: KubeClient
    publisher: Publisher
    feed: SourceFeed
    provider: Serving
    store_file: Path

    def write(self, secrets: dict[str, str]) -> None:
        self.store_file.write_text(yaml.safe_dump({"secrets": secrets}))

    async def files(self, service_account: str = "app") -> dict[str, bytes]:
        params = {"backend": "fake", "objects": yaml.safe_dump(WANTED)}
        request = driver_request(params, service_account=service_account, pod=service_account)
        reply = await self.provider.stub.Mount(request, timeout=10)
        assert not reply.error.code, reply.error
        return {f.path: f.contents for f in reply.files}

    async def metric(self, name: str) -> float:
        async with (
            aiohttp.ClientSession() as http,
            http.get(self.provider.health + "/metrics") as response,
        ):
            text = await response.text()
        total = 0.0
        found = False
        for match in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE):
            total, found = total + float(match.group(2)), True
        return total if found else float("nan")

    async def reads(self) -> float:
        return await self.metric("secrets_bridge_backend_calls_total")

    async def publish(self, *names: str) -> None:
        await self.feed.publish([Change.of("fake", "fake", name) for name in names])


async def until(condition: Callable[[], Awaitable[bool]], what: str, seconds: float = 8) -> None:
    """Poll `condition` until true; AssertionError after `seconds`."""
    deadline = time.monotonic() + seconds
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s")
        await asyncio.sleep(0.05)


async def beating(publisher: Publisher) -> None:
    """The watcher's heartbeat, faster than --feed-stale-after; a failed write is tried again."""
    while True:
        with contextlib.suppress(BridgeError):
            await publisher.beat()
        await asyncio.sleep(0.1)


@pytest.fixture
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    stale_after = getattr(request, "param", STALE_AFTER)
    async with serving(bookmark_interval=0.2) as (api, client):
        token = tmp_path / "kube-token"
        token.write_text(api.token)
        store_file = tmp_path / "store.yaml"
        store_file.write_text(yaml.safe_dump({"secrets": {"w": "v1"}}))
        core = CoreSettings(
            enable_fake_backend=True,
            change_feed=True,
            feed_window=3600.0,
            feed_stale_after=stale_after,
            feed_namespace=NS,
            kube_api_url=api.url,
            kube_api_token_file=str(token),
        )
        options = {"fake": FakeOptions(store_file=str(store_file))}
        publisher = Publisher(client, NS, heartbeat=0.1, coalesce=0.0)
        feed = publisher.feed(Source())
        feed.up()
        beats = asyncio.create_task(beating(publisher))
        try:
            async with provider_serving(tmp_path, backend_options=options, core=core) as provider:
                rig = Rig(api, client, publisher, feed, provider, store_file)
                yield rig
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats


async def covered(rig: Rig) -> None:
    """Until the node covers the fake store (a beat seen, the source up)."""

    async def seen() -> bool:
        return await rig.metric("secrets_bridge_feed_covered") == 1.0

    await until(seen, "the feed's cover")


async def changes_seen(rig: Rig, count: float) -> None:
    async def seen() -> bool:
        return await rig.metric("secrets_bridge_feed_changes_total") >= count

    await until(seen, f"{count} records seen by the node")


async def test_a_rotation_reaches_the_files_at_the_first_mount_after_its_record(rig: Rig) -> None:
    await covered(rig)
    assert await rig.files("app") == {"wanted": b"v1"}
    assert await rig.files("app2") == {"wanted": b"v1"}
    rig.write({"w": "v22"})
    await asyncio.sleep(0.1)  # past --cache-ttl 0: only the feed's cover keeps them
    for _ in range(3):
        assert await rig.files("app") == {"wanted": b"v1"}
        assert await rig.files("app2") == {"wanted": b"v1"}
    assert await rig.reads() == 2
    await rig.publish("w")
    await changes_seen(rig, 1)
    assert await rig.files("app") == {"wanted": b"v22"}
    assert await rig.files("app2") == {"wanted": b"v22"}
    assert await rig.files("app") == {"wanted": b"v22"}
    assert await rig.reads() == 4


async def test_broken_watches_and_a_compacted_history_still_deliver(rig: Rig) -> None:
    await rig.publish("unrelated")  # the records document exists before the node reads
    await covered(rig)
    await changes_seen(rig, 1)
    assert await rig.files() == {"wanted": b"v1"}
    rig.write({"w": "v22"})
    rig.api.break_watches()
    await rig.publish("w")  # while the node's watch is broken: resumed from its version
    await changes_seen(rig, 2)
    assert await rig.files() == {"wanted": b"v22"}
    rig.write({"w": "v333"})
    rig.api.compact()
    rig.api.break_watches()
    await rig.publish("w")  # the resume gets 410: the relist brings the document
    await changes_seen(rig, 3)
    assert await rig.files() == {"wanted": b"v333"}
    assert await rig.reads() == 3
    assert await rig.metric("secrets_bridge_feed_resyncs_total") == 0
    # Records the node cannot follow on from (a flood past the window while its watch was
    # broken, then a new generation): a resync each, and values read before it are read
    # again once (--cache-ttl 0), then covered.
    for resyncs, gap in enumerate(("flood", "generation"), 1):
        rig.write({"w": "v" * (4 + resyncs)})
        rig.api.compact()
        rig.api.break_watches()
        if gap == "flood":
            await rig.publish(*(f"other/{i}" for i in range(WINDOW + 10)))
        else:
            await rig.publisher.new_generation(Source())

        async def resynced(count: int = resyncs) -> bool:
            return await rig.metric("secrets_bridge_feed_resyncs_total") == count

        await until(resynced, f"the resync after the {gap}")
        assert await rig.files() == {"wanted": b"v" * (4 + resyncs)}
        assert await rig.files() == {"wanted": b"v" * (4 + resyncs)}
        assert await rig.reads() == 3 + resyncs


@pytest.mark.parametrize("kind", ["not JSON", "another source's name"])
async def test_an_unparseable_or_foreign_document_is_ignored_with_one_line(
    rig: Rig, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    await rig.publish("unrelated")
    await covered(rig)
    await changes_seen(rig, 1)
    assert await rig.files() == {"wanted": b"v1"}
    rig.write({"w": "v22"})
    found = await rig.client.get(configmaps(NS, records_name("fake")))
    assert found is not None
    ours = parse_records(found["data"])
    if kind == "not JSON":  # (the watcher replaces a broken document of its own source)
        name, data = records_name("other"), {RECORDS_KEY: '{"records": [[' + str(ours.seq + 1)}
    else:  # a document of source "fake" naming w, under another source's name
        name, data = records_name("evil"), ours.appended([Change.of("fake", "fake", "w")]).encode()
    labels = {LABEL: LABEL_VALUE}
    with caplog.at_level(logging.WARNING, logger="secrets_bridge.feed"):
        await rig.client.create(
            configmaps(NS), {"metadata": {"name": name, "labels": labels}, "data": data}
        )
        await rig.publish("marker")  # seen after it, the watch delivering in order
        await changes_seen(rig, 2)
    lines = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert len(lines) == 1, lines
    assert name in lines[0]
    assert '"records"' not in lines[0]  # the document's body is not logged
    assert await rig.files() == {"wanted": b"v1"}  # w was not named by any accepted record
    assert await rig.reads() == 1
    assert await rig.metric("secrets_bridge_feed_healthy") == 1


@pytest.mark.parametrize("rig", [FAST_STALE], indirect=True)
async def test_the_api_server_gone_falls_back_then_covers_again(rig: Rig) -> None:
    await covered(rig)
    assert await rig.files() == {"wanted": b"v1"}
    assert await rig.files() == {"wanted": b"v1"}
    assert await rig.reads() == 1
    rig.api.pause()

    async def stale() -> bool:
        return await rig.metric("secrets_bridge_feed_healthy") == 0

    await until(stale, "the stale heartbeat", FAST_STALE + 3)
    assert await rig.metric("secrets_bridge_feed_covered") == 0
    rig.write({"w": "v22"})
    assert await rig.files() == {"wanted": b"v22"}  # --cache-ttl 0: read at every mount
    assert await rig.files() == {"wanted": b"v22"}
    assert await rig.reads() == 3
    rig.api.resume()
    await covered(rig)
    assert await rig.metric("secrets_bridge_feed_healthy") == 1
    assert await rig.files() == {"wanted": b"v22"}  # read before the cover came back
    assert await rig.files() == {"wanted": b"v22"}  # covered
    assert await rig.reads() == 4
