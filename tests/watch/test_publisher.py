"""The publisher against devkit's API-server fake: records read back as nodes parse them, two
replicas writing at once lose nothing, a flood makes few writes and a bounded document, the
health document beats, and publish fails when the API does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from devkit.kubeapi import KubeApi, serving
from provider.core.changes import (
    HEALTH_NAME,
    LABEL,
    LABEL_VALUE,
    MAX_DOCUMENT,
    WINDOW,
    Change,
    parse_health,
    parse_records,
    records_name,
)
from provider.core.errors import StoreUnavailable
from provider.core.kube import KubeClient, configmaps
from provider.watch.publisher import Publisher, SourceFeed

Served = tuple[KubeApi, KubeClient]


@dataclass
class Source:
    store: str = "vault"
    name: str = "vault"
    scopes: frozenset[str] = frozenset({"https://vault:8200"})


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serving() as pair:
        yield pair


def document(api: KubeApi, name: str) -> dict[str, Any]:
    found = api.object(configmaps("ns"), name)
    assert found is not None
    return found


def changes(count: int, prefix: str = "secret") -> list[Change]:
    return [Change.of("vault", "https://vault:8200", f"{prefix}/{i}", str(i)) for i in range(count)]


async def test_published_records_read_back(served: Served) -> None:
    api, client = served
    feed = Publisher(client, "ns", heartbeat=5, coalesce=0.01).feed(Source())
    await feed.publish(changes(2))
    await feed.publish(changes(1, "other"))
    stored = document(api, records_name("vault"))
    assert stored["metadata"]["labels"] == {LABEL: LABEL_VALUE}
    records = parse_records(stored["data"])
    assert (records.source, records.store, records.seq) == ("vault", "vault", 3)
    assert records.after(0) == ((1, "secret/0", "0"), (2, "secret/1", "1"), (3, "other/0", "0"))


async def test_two_replicas_writing_at_once_lose_no_record(served: Served) -> None:
    api, client = served
    one = Publisher(client, "ns", heartbeat=5, coalesce=0.0).feed(Source())
    two = Publisher(client, "ns", heartbeat=5, coalesce=0.0).feed(Source())

    async def replica(feed: SourceFeed, tag: str) -> None:
        for i in range(20):
            await feed.publish(changes(2, f"{tag}{i}"))

    await asyncio.gather(replica(one, "a"), replica(two, "b"))
    records = parse_records(document(api, records_name("vault"))["data"])
    assert records.seq == 80
    names = {f"{tag}{i}/{j}" for tag in "ab" for i in range(20) for j in (0, 1)}
    assert {name for _, name, _ in records.records} == names


async def test_a_flood_makes_few_writes_and_a_bounded_document(served: Served) -> None:
    api, client = served
    feed = Publisher(client, "ns", heartbeat=5, coalesce=0.2).feed(Source())
    await feed.publish(changes(1, "before"))
    flood = changes(10_000, "x" * 400)
    await asyncio.gather(*(feed.publish([change]) for change in flood))
    assert api.requests["create"] + api.requests["update"] <= 3
    stored = document(api, records_name("vault"))["data"]
    assert len(json.dumps(stored)) <= MAX_DOCUMENT
    records = parse_records(stored)
    assert records.seq == 10_001  # numbered as if all were kept
    assert records.after(1) is None  # a node at the first record sees the gap and resyncs
    assert 0 < len(records.records) <= WINDOW


async def test_a_new_generation_starts_an_empty_window(served: Served) -> None:
    api, client = served
    publisher = Publisher(client, "ns", heartbeat=5, coalesce=0.01)
    await publisher.feed(Source()).publish(changes(3))
    before = parse_records(document(api, records_name("vault"))["data"])
    await publisher.new_generation(Source())
    after = parse_records(document(api, records_name("vault"))["data"])
    assert after.generation != before.generation
    assert (after.seq, after.records) == (0, ())


async def test_the_health_document_beats_with_each_sources_state(served: Served) -> None:
    api, client = served
    publisher = Publisher(client, "ns", heartbeat=5, coalesce=0.01)
    feed = publisher.feed(Source())
    await feed.publish(changes(2))
    feed.down("the audit socket is closed")
    await publisher.beat()
    feed.up()
    await publisher.beat()
    stored = document(api, HEALTH_NAME)
    assert stored["metadata"]["labels"] == {LABEL: LABEL_VALUE}
    health = parse_health(stored["data"])
    assert (health.beat, health.interval) == (2, 5.0)
    state = health.sources["vault"]
    assert (state.up, state.reason, state.seq, state.scopes) == (
        True,
        "",
        2,
        frozenset({"https://vault:8200"}),
    )
    records = parse_records(document(api, records_name("vault"))["data"])
    assert state.generation == records.generation
    successor = Publisher(client, "ns", heartbeat=5)  # a new leader, nothing published yet
    successor.feed(Source())
    await successor.beat()
    health = parse_health(document(api, HEALTH_NAME)["data"])
    assert health.beat == 3
    assert (health.sources["vault"].generation, health.sources["vault"].seq) == (
        records.generation,
        2,
    )


async def test_publish_fails_while_the_api_is_down(served: Served) -> None:
    api, client = served
    feed = Publisher(client, "ns", heartbeat=5, coalesce=0.01).feed(Source())
    api.pause()
    with pytest.raises(StoreUnavailable):
        await feed.publish(changes(1))
    api.resume()
    await feed.publish(changes(1))
    assert parse_records(document(api, records_name("vault"))["data"]).seq == 1
