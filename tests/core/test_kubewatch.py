"""ListWatch against devkit's API-server fake: a sync then each event, a broken stream resumed
from the version kept (no relist), 410 relisted, an outage waited out with backoff."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from devkit.kubeapi import KubeApi, eventually, serving
from provider.core.kube import KubeClient, configmaps
from provider.core.kubewatch import ListWatch

PATH = configmaps("ns")


class Seen:
    def __init__(self) -> None:
        self.syncs: list[list[str]] = []
        self.events: list[tuple[str, str]] = []
        self.health: list[bool] = []

    def sync(self, items: Sequence[dict[str, Any]]) -> None:
        self.syncs.append(sorted(i["metadata"]["name"] for i in items))

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, obj["metadata"]["name"]))


Watched = tuple[KubeApi, KubeClient, Seen, ListWatch]


@pytest.fixture
async def watched() -> AsyncIterator[Watched]:
    async with serving(bookmark_interval=0.1) as (api, client):
        await client.create(PATH, body("a", {"feed": "1"}))
        await client.create(PATH, body("other"))
        seen = Seen()
        watch = ListWatch(
            client,
            PATH,
            "feed=1",
            on_sync=seen.sync,
            on_event=seen.event,
            on_health=seen.health.append,
            watch_seconds=1,
            backoff=(0.2, 0.4),
        )
        task = asyncio.create_task(watch.run())
        await eventually(lambda: watch.healthy)
        yield api, client, seen, watch
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def body(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": {}}


async def test_a_sync_then_each_change(
    watched: Watched,
) -> None:
    _, client, seen, _ = watched
    assert seen.syncs == [["a"]]
    b = await client.create(PATH, body("b", {"feed": "1"}))
    await client.replace(configmaps("ns", "b"), {**b, "data": {"k": "v"}})
    await client.delete(configmaps("ns", "b"))
    expected = [("ADDED", "b"), ("MODIFIED", "b"), ("DELETED", "b")]
    await eventually(lambda: seen.events == expected)


async def test_a_broken_stream_resumes_from_the_version_kept(
    watched: Watched,
) -> None:
    api, client, seen, watch = watched
    for _ in range(3):
        api.break_watches()
        await client.create(PATH, body(f"b{len(seen.events)}", {"feed": "1"}))
        await eventually(lambda: watch.healthy and len(seen.events) == api.requests["create"] - 2)
    await asyncio.sleep(1.2)  # past one server-side timeout too: watched again, not relisted
    assert api.requests["list"] == 1
    assert seen.syncs == [["a"]]
    assert [kind for kind, _ in seen.events] == ["ADDED"] * 3


async def test_too_old_a_version_relists(
    watched: Watched,
) -> None:
    api, client, seen, watch = watched
    api.pause()  # the watch breaks and waits out its backoff (at least 0.1 s)
    await eventually(lambda: not watch.healthy)
    api.resume()
    await client.create(PATH, body("b", {"feed": "1"}))
    api.compact()  # b left the history before the watch is back
    await eventually(lambda: len(seen.syncs) == 2)
    assert seen.syncs[1] == ["a", "b"]


async def test_an_outage_is_unhealthy_until_the_watch_is_back(
    watched: Watched,
) -> None:
    api, client, seen, watch = watched
    api.pause()
    await eventually(lambda: not watch.healthy)
    await asyncio.sleep(0.3)
    api.resume()
    await eventually(lambda: watch.healthy)
    assert seen.health == [True, False, True]
    await client.create(PATH, body("b", {"feed": "1"}))
    await eventually(lambda: seen.events == [("ADDED", "b")])
