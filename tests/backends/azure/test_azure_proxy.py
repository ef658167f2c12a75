"""Azure calls honour the proxy environment: the Entra login and the Key Vault reads (the SDK's
transport over our shared aiohttp session), against the Entra and Key Vault wire fake behind a
counting proxy (devkit/connect_proxy.py). The environment is read when the backend is built, so
each test sets it (monkeypatch) and then builds its backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest

from backends.azure.store import AzureBackend, create
from devkit.azure import AUTHORITY, SUFFIX
from devkit.connect_proxy import VARIABLES, ConnectProxy
from devkit.testing import make_env
from tests.backends.azure.conftest import CLIENT, TENANT, Azure
from tests.backends.azure.test_azure_fetch import fetch, objects, one, plan

#: A vault of these tests only: the SDK caches each vault's challenge (its tenant) process-wide.
NAME = "kvproxy"
VAULT = f"{NAME}.{SUFFIX}"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
def vault(azure: Azure):  # type: ignore[no-untyped-def]
    v = azure.fake.vault(NAME, TENANT)
    v.access[CLIENT] = "*"
    v.add("secret", "db-password", {"value": "s3cr3t"})
    return v


@pytest.fixture
async def proxy(azure: Azure) -> AsyncIterator[ConnectProxy]:
    # The proxy resolves Entra's and the vault's names to the fake, as DNS would for it.
    hosts = {AUTHORITY: f"127.0.0.1:{azure.port}", VAULT: f"127.0.0.1:{azure.port}"}
    async with ConnectProxy(hosts=hosts) as server:
        yield server


@asynccontextmanager
async def built(azure: Azure) -> AsyncIterator[AzureBackend]:
    backend = create(make_env("azure", azure.options))
    try:
        yield backend
    finally:
        await backend.close()


SECRET = objects("objectName: db-password\nobjectType: secret")


async def test_azure_login_and_reads_through_https_proxy(
    azure: Azure, vault, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The proxy by name: --azure-connect-to (set, for direct connections) must not send the
    # connection meant for the proxy to the vault's address instead.
    monkeypatch.setenv("HTTPS_PROXY", f"http://localhost:{proxy.port}")
    async with built(azure) as backend:
        p = plan(SECRET, keyvaultName=NAME)
        assert one(await fetch(backend, p), p).content == b"s3cr3t"
    assert set(proxy.tunnels) == {f"{AUTHORITY}:443", f"{VAULT}:443"}
    assert proxy.forwarded == []
    assert len(azure.fake.calls.tokens) == len(azure.fake.calls.vault) == 1


@pytest.mark.parametrize(
    "no_proxy", [f"{AUTHORITY},{VAULT}", f"{AUTHORITY} .{SUFFIX}", "*", f"{AUTHORITY},{SUFFIX}"]
)
async def test_azure_no_proxy_sends_the_listed_hosts_direct(
    azure: Azure, vault, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch, no_proxy: str
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    async with built(azure) as backend:  # direct: through --azure-connect-to
        p = plan(SECRET, keyvaultName=NAME)
        assert one(await fetch(backend, p), p).content == b"s3cr3t"
    assert proxy.calls == 0


async def test_azure_no_proxy_for_the_vault_only(
    azure: Azure, vault, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", VAULT)
    async with built(azure) as backend:
        p = plan(SECRET, keyvaultName=NAME)
        assert one(await fetch(backend, p), p).content == b"s3cr3t"
    assert proxy.tunnels == [f"{AUTHORITY}:443"]
