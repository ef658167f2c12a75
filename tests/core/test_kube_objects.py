"""KubeClient's object calls against devkit's API-server fake: create, get, replace with
optimistic concurrency, list by label, watch with bookmarks and 410, and what the server refuses."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from devkit.kubeapi import KubeApi, serving
from provider.core.errors import PermissionDenied, StoreUnavailable
from provider.core.kube import (
    Conflict,
    Gone,
    KubeClient,
    configmaps,
    endpointslices,
    leases,
    resource_version,
)

Served = tuple[KubeApi, KubeClient]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serving(bookmark_interval=0.1) as pair:
        yield pair


def configmap(name: str, labels: dict[str, str] | None = None, **data: str) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels or {}}, "data": data}


def test_paths_of_core_and_group_resources() -> None:
    assert configmaps("ns") == "/api/v1/namespaces/ns/configmaps"
    assert configmaps("ns", "a") == "/api/v1/namespaces/ns/configmaps/a"
    assert leases("ns", "l") == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l"
    assert endpointslices("ns") == "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"


async def test_create_get_replace_with_the_resource_version(served: Served) -> None:
    _, client = served
    created = await client.create(configmaps("ns"), configmap("a", k="1"))
    assert created["metadata"]["uid"] and created["metadata"]["creationTimestamp"]
    assert await client.get(configmaps("ns", "a")) == created
    assert await client.get(configmaps("ns", "missing")) is None
    with pytest.raises(Conflict):
        await client.create(configmaps("ns"), configmap("a"))
    body = {**created, "data": {"k": "2"}}
    replaced = await client.replace(configmaps("ns", "a"), body)
    assert int(resource_version(replaced)) > int(resource_version(created))
    with pytest.raises(Conflict, match="409"):
        await client.replace(configmaps("ns", "a"), body)  # the version it carries is stale


async def test_list_by_label_with_the_lists_version(served: Served) -> None:
    _, client = served
    await client.create(configmaps("ns"), configmap("a", {"x": "1"}))
    last = await client.create(configmaps("ns"), configmap("b", {"x": "1", "y": "2"}))
    await client.create(configmaps("ns"), configmap("c", {"x": "2"}))
    items, version = await client.list(configmaps("ns"), "x=1,y=2")
    assert [i["metadata"]["name"] for i in items] == ["b"]
    assert int(version) >= int(resource_version(last))


async def test_watch_resumes_after_a_version_with_bookmarks(served: Served) -> None:
    _, client = served
    first = await client.create(configmaps("ns"), configmap("a", {"x": "1"}))
    await client.create(configmaps("ns"), configmap("b", {"x": "1"}))
    await client.create(configmaps("ns"), configmap("c", {"x": "2"}))
    seen = []
    async for kind, obj in client.watch(configmaps("ns"), "x=1", resource_version(first), 1):
        seen.append((kind, obj["metadata"].get("name")))
    assert seen[0] == ("ADDED", "b")
    assert ("ADDED", "c") not in seen
    assert ("BOOKMARK", None) in seen


async def test_a_compacted_history_is_gone(served: Served) -> None:
    api, client = served
    first = await client.create(configmaps("ns"), configmap("a"))
    await client.create(configmaps("ns"), configmap("b"))
    api.compact()
    with pytest.raises(Gone):
        async for _ in client.watch(configmaps("ns"), "", resource_version(first), 5):
            pass


async def test_a_broken_watch_is_unavailable(served: Served) -> None:
    api, client = served
    _, version = await client.list(configmaps("ns"))
    with pytest.raises(StoreUnavailable, match="broke"):
        async for _ in client.watch(configmaps("ns"), "", version, 5, opened=api.break_watches):
            pass


async def test_an_event_over_the_bound_ends_the_stream(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = served
    await client.create(configmaps("ns"), configmap("a", k="v" * 5000))
    monkeypatch.setattr("provider.core.kube.MAX_EVENT", 4096)
    with pytest.raises(StoreUnavailable, match="over 4096 bytes"):
        async for _ in client.watch(configmaps("ns"), "", "0", 5):
            pass


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (configmap("A_b"), "metadata.name"),
        (configmap("a", {"x": "not valid!"}), "metadata.labels"),
        (configmap("a", k="v" * (1024 * 1024 + 1)), "Too long: must have at most 1048576"),
    ],
)
async def test_the_server_refuses_what_the_real_one_does(
    served: Served, body: dict[str, object], says: str
) -> None:
    api, client = served
    with pytest.raises(StoreUnavailable, match="422"):
        await client.create(configmaps("ns"), body)
    headers = {"Authorization": f"Bearer {api.token}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(api.url + configmaps("ns"), json=body, headers=headers) as response,
    ):
        status = await response.json()
    assert (status["code"], status["reason"]) == (422, "Invalid")
    assert says in status["message"]
    assert api.requests["create"] == 2


async def test_a_wrong_token_is_refused(served: Served) -> None:
    api, _ = served
    client = KubeClient(api.url, token="wrong")
    try:
        with pytest.raises(PermissionDenied):
            await client.get(configmaps("ns", "a"))
    finally:
        await client.close()


async def test_a_paused_server_is_unavailable(served: Served) -> None:
    api, client = served
    api.pause()
    with pytest.raises(StoreUnavailable, match="503"):
        await client.get(configmaps("ns", "a"))
    api.resume()
    assert await client.get(configmaps("ns", "a")) is None
