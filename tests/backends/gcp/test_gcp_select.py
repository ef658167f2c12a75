"""Selectors of the gcp store (`select` with namePrefix, labels, location) through whole Mounts
of the provider against the fake Google, with the calls of each poll counted at the server."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from devkit.google import POOL, FakeGoogle
from devkit.serving import serving
from devkit.testing import driver_request
from provider.core.settings import CoreSettings
from tests.backends.gcp.conftest import Stack

KSA = "ksa:default/app"
PROJECT = "projects/proj"
REGION = "projects/proj/locations/us-central1"

Provider = Callable[..., AbstractAsyncContextManager[Any]]


def select(*entries: dict[str, Any], **params: str) -> dict[str, str]:
    return {"backend": "gcp", "select": yaml.safe_dump(list(entries)), **params}


def calls(google: FakeGoogle) -> dict[str, int]:
    """The store calls since the last `calls`: listings by method, and secret reads."""
    counted = Counter(method for method, _, _ in google.listings)
    counted["AccessSecretVersion"] = len(google.reads)
    google.listings.clear()
    google.reads.clear()
    return {k: v for k, v in counted.items() if v}


async def mount(stub: Any, parameters: dict[str, str]) -> dict[str, bytes]:
    reply = await stub.Mount(
        driver_request(parameters, tokens={POOL: "pod-token-default-app"}), timeout=20
    )
    return {f.path: f.contents for f in reply.files}


def providing(stack: Stack, tmp_path: Path) -> Provider:
    """A provider serving on the stack's fake Google (`max_objects` and other core settings
    given); the pod default/app may list the project's secrets."""
    stack.pod()
    stack.google.viewers[PROJECT] = {KSA}

    def start(**core: Any) -> AbstractAsyncContextManager[Any]:
        settings = CoreSettings(kube_api_url=stack.http, **core)
        return serving(tmp_path, backend_options={"gcp": stack.options}, core=settings)

    return start


@pytest.fixture
def provider(stack: Stack, tmp_path: Path) -> Provider:
    return providing(stack, tmp_path)


@pytest.fixture
async def stub(provider: Provider) -> AsyncIterator[Any]:
    async with provider() as served:
        yield served.stub


async def test_a_selection_follows_prefix_labels_additions_and_deletions(
    stack: Stack, stub: Any
) -> None:
    google = stack.google
    pay = {"team": "pay"}
    google.add_secret(f"{PROJECT}/secrets/app-a", "a1", KSA, labels=pay)
    google.add_secret(f"{PROJECT}/secrets/app-b", "b1", KSA, labels=pay)
    google.add_secret(f"{PROJECT}/secrets/app-c", "c1", KSA, labels={"team": "ops"})
    # `name:app-` matches this one too at Google (a substring): the prefix check drops it.
    google.add_secret(f"{PROJECT}/secrets/myapp-z", "z", KSA, labels=pay)
    params = select({"project": "proj", "namePrefix": "app-", "labels": pay, "directory": "app"})
    assert await mount(stub, params) == {"app/a": b"a1", "app/b": b"b1"}
    assert google.listings[0] == ("ListSecrets", PROJECT, KSA)
    assert calls(google) == {"ListSecrets": 1, "ListSecretVersions": 2, "AccessSecretVersion": 2}
    # Unchanged: the listings again and every secret read (a listing proves permission to
    # list, never to read: every poll's values are read as the pod).
    assert await mount(stub, params) == {"app/a": b"a1", "app/b": b"b1"}
    assert calls(google) == {"ListSecrets": 1, "ListSecretVersions": 2, "AccessSecretVersion": 2}
    # One rotated, one added, one deleted: the two listed now are read.
    google.add_version(f"{PROJECT}/secrets/app-a", "a2")
    google.add_secret(f"{PROJECT}/secrets/app-d", "d1", KSA, labels=pay)
    google.delete_secret(f"{PROJECT}/secrets/app-b")
    assert await mount(stub, params) == {"app/a": b"a2", "app/d": b"d1"}
    assert calls(google) == {"ListSecrets": 1, "ListSecretVersions": 2, "AccessSecretVersion": 2}


async def test_the_newest_enabled_version_is_mounted(stack: Stack, stub: Any) -> None:
    secret = f"{PROJECT}/secrets/cfg-main"
    stack.google.add_secret(secret, "good", KSA)
    stack.google.add_version(secret, "bad")
    stack.google.add_secret(f"{PROJECT}/secrets/cfg-other", "o", KSA)
    params = select({"project": "proj", "namePrefix": "cfg-", "directory": "c"})
    assert await mount(stub, params) == {"c/main": b"bad", "c/other": b"o"}
    # Disabling the bad version rolls the file back at the next poll.
    stack.google.disabled.add(f"{secret}/versions/2")
    assert await mount(stub, params) == {"c/main": b"good", "c/other": b"o"}
    # A secret with no enabled version has nothing to mount.
    stack.google.disabled.add(f"{secret}/versions/1")
    assert await mount(stub, params) == {"c/other": b"o"}


async def test_a_regional_selection_uses_the_regional_endpoint(stack: Stack, stub: Any) -> None:
    stack.google.add_secret(f"{REGION}/secrets/eu-db", "r", KSA, labels={"tier": "db"})
    stack.google.add_secret(f"{PROJECT}/secrets/eu-db", "global", KSA, labels={"tier": "db"})
    chosen = {"project": "proj", "location": "us-central1", "labels": {"tier": "db"}}
    assert await mount(stub, select({**chosen, "directory": "r"})) == {"r/eu-db": b"r"}
    assert stack.google.reads == [("regional", f"{REGION}/secrets/eu-db/versions/1", KSA)]
    assert {parent for _, parent, _ in stack.google.listings} == {REGION, f"{REGION}/secrets/eu-db"}


async def test_selected_next_to_listed_and_an_optional_listed_one_missing(
    stack: Stack, stub: Any
) -> None:
    stack.google.readers[PROJECT] = {KSA}  # project-wide access: a missing secret is NOT_FOUND
    stack.google.add_secret(f"{PROJECT}/secrets/db-main", '{"password":"p"}', KSA)
    params = select(
        {"project": "proj", "namePrefix": "db-", "directory": "db", "extract": "password"},
        secrets=yaml.safe_dump(
            [
                {
                    "resourceName": f"{PROJECT}/secrets/gone/versions/latest",
                    "path": "gone",
                    "optional": True,
                },
            ]
        ),
        templates="- path: url\n  template: 'db://${db/main}'\n",
    )
    assert await mount(stub, params) == {"db/main": b"p", "url": b"db://p"}


async def test_a_denied_secret_fails_the_selection(stack: Stack, stub: Any) -> None:
    stack.google.add_secret(f"{PROJECT}/secrets/s-mine", "m", KSA)
    stack.google.add_secret(f"{PROJECT}/secrets/s-theirs", "t", "ksa:other/app")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await mount(stub, select({"project": "proj", "namePrefix": "s-", "directory": "s"}))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"{PROJECT}/secrets/s-theirs/versions/1" in (err.value.details() or "")


async def test_listing_needs_the_viewer_role(stack: Stack, stub: Any) -> None:
    stack.google.viewers.clear()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await mount(stub, select({"project": "proj", "namePrefix": "s-", "directory": "s"}))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "roles/secretmanager.viewer" in (err.value.details() or "")


async def test_a_secret_deleted_between_listing_and_reading_is_left_out(
    stack: Stack, stub: Any
) -> None:
    for name in ("k-a", "k-b", "k-c"):
        stack.google.add_secret(f"{PROJECT}/secrets/{name}", name, KSA)
    # k-b is gone when its versions are listed, k-c when its version is read.
    stack.google.failures[f"{PROJECT}/secrets/k-b"] = [grpc.StatusCode.NOT_FOUND]
    stack.google.failures[f"{PROJECT}/secrets/k-c/versions/1"] = [grpc.StatusCode.NOT_FOUND]
    chosen = select({"project": "proj", "namePrefix": "k-", "directory": "k"})
    assert await mount(stub, chosen) == {"k/a": b"k-a"}
