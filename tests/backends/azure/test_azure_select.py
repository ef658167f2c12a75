"""`select` on Key Vault: whole Mounts through the real provider (gRPC on a Unix socket) and the
real SDK against the fake vault, its calls counted at the vault (each listing page is one
`GET /secrets`, each secret read one `GET /secrets/<name>/`)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from devkit.azure import FakeAzure, Vault
from devkit.serving import serving
from provider.core.settings import CoreSettings
from tests.backends.azure.conftest import CLIENT, TENANT, Azure
from tests.backends.azure.test_azure_fetch import objects
from tests.backends.azure.test_azure_mount import request

OTHER = "aaaaaaaa-0000-0000-0000-000000000002"


def params(*selectors: dict[str, Any], listed: str = "") -> dict[str, str]:
    out = {"backend": "azure", "keyvaultName": "kvname", "tenantID": TENANT, "clientID": CLIENT}
    if selectors:
        out["select"] = yaml.safe_dump(list(selectors))
    if listed:
        out["objects"] = listed
    return out


class Counter:
    """The vault's calls since the last `take`: listing pages and secret reads."""

    def __init__(self, fake: FakeAzure) -> None:
        self.fake, self.seen = fake, 0

    def take(self) -> tuple[int, int]:
        calls = [path for _vault, path, _who in self.fake.calls.vault[self.seen :]]
        self.seen = len(self.fake.calls.vault)
        lists = sum(1 for p in calls if p.rstrip("/") == "/secrets")
        return lists, len(calls) - lists


async def mount(stub: Any, parameters: dict[str, str]) -> dict[str, bytes]:
    reply = await stub.Mount(request(parameters), timeout=20)
    assert not reply.error.code
    return {f.path: f.contents for f in reply.files}


async def refused(stub: Any, parameters: dict[str, str]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Mount(request(parameters), timeout=20)
    return err.value


@pytest.fixture
def vault(azure: Azure) -> Vault:
    v = azure.fake.vault("kvname", TENANT)
    v.access[CLIENT] = "*"
    return v


@pytest.fixture
async def stub(azure: Azure, tmp_path: Path) -> AsyncIterator[Any]:
    async with serving(tmp_path, backend_options={"azure": azure.options}) as provider:
        yield provider.stub


async def test_a_selection_follows_the_vault_reading_every_selected_secret(
    azure: Azure, vault: Vault, stub: Any
) -> None:
    pay = {"team": "pay"}
    db = vault.add("secret", "app-db", {"value": "db1", "tags": pay})
    vault.add("secret", "app-api", {"value": "api1", "tags": {**pay, "tier": "1"}})
    vault.add("secret", "app-web", {"value": "web", "tags": {"team": "web"}})
    vault.add("secret", "app-off", {"value": "off", "tags": pay}, enabled=False)
    vault.add("secret", "app-tls", {"value": "pfx", "tags": pay, "certificate_backed": True})
    vault.add("secret", "billing-db", {"value": "other", "tags": pay})
    vault.add("secret", "app-", {"value": "the prefix itself", "tags": pay})
    count = Counter(azure.fake)
    chosen = params({"namePrefix": "app-", "tags": pay, "directory": "app"})

    reply = await stub.Mount(request(chosen), timeout=20)
    assert {f.path: f.contents for f in reply.files} == {"app/db": b"db1", "app/api": b"api1"}
    # Each file's object version is the secret's Key Vault version id.
    assert {v.id: v.version for v in reply.object_version}["app/db"] == db
    assert count.take() == (1, 2)
    # Unchanged: one listing page and both read again (a listing proves permission to list,
    # never to read).
    assert await mount(stub, chosen) == {"app/db": b"db1", "app/api": b"api1"}
    assert count.take() == (1, 2)
    # A new version, a new secret, a deleted one: the listing and the two listed now.
    vault.add("secret", "app-db", {"value": "db2", "tags": pay})
    vault.add("secret", "app-new", {"value": "new", "tags": pay})
    del vault.objects[("secret", "app-api")]
    assert await mount(stub, chosen) == {"app/db": b"db2", "app/new": b"new"}
    assert count.take() == (1, 2)


async def test_a_selection_beside_listed_objects_one_of_them_optional(
    azure: Azure, vault: Vault, stub: Any
) -> None:
    vault.add("secret", "cfg-a", {"value": "a"})
    vault.add("secret", "cfg-b", {"value": "b"})
    vault.add("secret", "plain", {"value": "p"})
    listed = objects(
        "objectName: plain\nobjectType: secret",
        "objectName: gone\nobjectType: secret\noptional: true",
        "objectName: gone\nobjectType: secret\nobjectAlias: gone-history\n"
        "objectVersionHistory: 2\noptional: true",
    )
    chosen = params({"namePrefix": "CFG-"}, listed=listed)
    # The prefix matches as Key Vault names do, ignoring case; the files are at the root.
    assert await mount(stub, chosen) == {"plain": b"p", "a": b"a", "b": b"b"}
    # Not optional, a missing object still fails the mount.
    strict = params(listed=objects("objectName: gone\nobjectType: secret"))
    assert (await refused(stub, strict)).code() == grpc.StatusCode.NOT_FOUND


async def test_a_selection_that_matches_nothing(vault: Vault, stub: Any) -> None:
    vault.add("secret", "plain", {"value": "p"})
    listed = objects("objectName: plain\nobjectType: secret")
    assert await mount(stub, params({"namePrefix": "none-"}, listed=listed)) == {"plain": b"p"}
    err = await refused(stub, params({"namePrefix": "none-", "optional": "false"}, listed=listed))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    assert "no secret matches it" in (err.details() or "")


async def test_a_secret_deleted_between_listing_and_read_is_left_out(
    azure: Azure, vault: Vault, stub: Any
) -> None:
    vault.add("secret", "app-a", {"value": "a"})
    vault.add("secret", "app-b", {"value": "b"})
    azure.fake.gone.add(("kvname", "secret", "app-b"))
    assert await mount(stub, params({"namePrefix": "app-", "directory": "d"})) == {"d/a": b"a"}


async def test_a_denied_secret_or_listing_fails_the_selection(
    azure: Azure, vault: Vault, stub: Any
) -> None:
    vault.add("secret", "app-a", {"value": "a"})
    vault.add("secret", "app-b", {"value": "b"})
    vault.access[CLIENT] = {("secret", "app-a")}
    err = await refused(stub, params({"namePrefix": "app-", "directory": "d"}))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not list the vault's secrets" in (err.details() or "")
    vault.listers.add(CLIENT)
    err = await refused(stub, params({"namePrefix": "app-", "directory": "d"}))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'app-b'" in (err.details() or "") and "default/app" in (err.details() or "")


async def test_names_that_would_traverse_or_collide_are_refused(
    azure: Azure, vault: Vault, stub: Any
) -> None:
    vault.add("secret", "plain", {"value": "p"})
    vault.add("secret", "app-plain", {"value": "x"})
    listed = objects("objectName: plain\nobjectType: secret")
    err = await refused(stub, params({"namePrefix": "app-"}, listed=listed))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'plain'" in (err.details() or "")
    # A vault whose names collide once the prefix is cut (Key Vault's names ignore case: only
    # a hostile server lists both), or that lists a name no Key Vault name can be.
    del vault.objects[("secret", "plain")]
    vault.add("secret", "APP-plain", {"value": "y"})
    err = await refused(stub, params({"namePrefix": "app-", "directory": "d"}))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "d/plain" in (err.details() or "")
    vault.objects.clear()
    vault.add("secret", "app-..", {"value": "z"})
    err = await refused(stub, params({"namePrefix": "app-", "directory": "d"}))
    assert "'app-..', which is not a Key Vault name" in (err.details() or "")


async def test_a_selection_over_max_objects_stops_listing_early(
    azure: Azure, tmp_path: Path
) -> None:
    vault = azure.fake.vault("kvname", TENANT)
    vault.access[CLIENT] = "*"
    for i in range(5):
        vault.add("secret", f"many-{i}", {"value": str(i)})
    count = Counter(azure.fake)
    core = CoreSettings(max_objects=3)
    async with serving(tmp_path, backend_options={"azure": azure.options}, core=core) as p:
        err = await refused(p.stub, params({"namePrefix": "many-", "directory": "d"}))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "matches more than 3 secrets" in (err.details() or "")
    assert count.take() == (1, 0)


async def test_100000_matches_are_refused_after_a_few_pages(
    azure: Azure, vault: Vault, stub: Any
) -> None:
    for i in range(100_000):
        vault.add("secret", f"bulk-{i:06d}", {"value": "v"})
    count = Counter(azure.fake)
    started = time.monotonic()
    err = await refused(stub, params({"namePrefix": "bulk-", "directory": "d"}))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "matches more than 100 secrets" in (err.details() or "")
    # --max-objects (100) + 1 matches: 5 pages of 25, not 4,000.
    assert count.take() == (5, 0)
    assert time.monotonic() - started < 15


async def test_a_listing_that_never_ends_is_refused(azure: Azure, vault: Vault, stub: Any) -> None:
    azure.fake.list_forever = True
    started = time.monotonic()
    count = Counter(azure.fake)
    err = await refused(stub, params({"namePrefix": "app-", "directory": "d"}))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the listing did not end after 200 pages" in (err.details() or "")
    assert count.take() == (200, 0)
    assert time.monotonic() - started < 30


async def test_a_next_page_on_another_host_is_not_followed(
    azure: Azure, vault: Vault, stub: Any
) -> None:
    for i in range(26):
        vault.add("secret", f"app-{i}", {"value": str(i)})
    azure.fake.next_link_host = "elsewhere.example"
    count = Counter(azure.fake)
    err = await refused(stub, params({"namePrefix": "app-", "directory": "d"}))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "next page is on 'elsewhere.example'" in (err.details() or "")
    assert count.take() == (1, 0)
