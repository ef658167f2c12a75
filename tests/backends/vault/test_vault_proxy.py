"""Vault calls honour the proxy environment: https through HTTPS_PROXY (a CONNECT tunnel, TLS
with Vault inside it), http through HTTP_PROXY, NO_PROXY hosts direct; the real OpenBao behind
a counting proxy (devkit/connect_proxy.py). The environment is read when the backend is built,
so each test sets it (monkeypatch) and then builds its backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from yarl import URL

from backends.vault.options import Options
from backends.vault.store import VaultBackend, create
from devkit.connect_proxy import VARIABLES, ConnectProxy
from devkit.openbao import TLS_SERVER_NAME, OpenBao
from devkit.testing import fetch_ctx, make_env, make_pod
from devkit.tokens import SigningKey
from provider.core.errors import StoreUnavailable
from provider.core.model import StorePlan
from tests.backends.vault.conftest import plan_for

OBJECT = "- {objectName: s, secretPath: secret/data/app/proxied, secretKey: k}"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, openbao: OpenBao) -> Iterator[None]:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    openbao.kv2_put("secret", "app/proxied", {"k": "through"})
    yield


@pytest.fixture
async def proxy() -> AsyncIterator[ConnectProxy]:
    # The proxy knows the name in OpenBao's certificate; this process cannot resolve it.
    async with ConnectProxy(hosts={TLS_SERVER_NAME: "127.0.0.1"}) as server:
        yield server


@asynccontextmanager
async def built() -> AsyncIterator[VaultBackend]:
    backend = create(make_env("vault", Options()))
    try:
        yield backend
    finally:
        await backend.close()


def tls_plan(openbao: OpenBao, address: str, **params: str) -> StorePlan:
    assert openbao.ca_file is not None
    return plan_for(
        OBJECT,
        vaultAddress=address,
        roleName="app",
        vaultAuthMountPath="jwt",
        vaultCACertPath=str(openbao.ca_file),
        **params,
    )


async def read(backend: VaultBackend, plan: StorePlan, key: SigningKey) -> object:
    pod = make_pod(tokens={"vault": key.pod_token("default", "app")})
    identity = await backend.identify(plan, pod)
    ref = plan.objects[0].ref
    return (await backend.fetch(plan, identity, [ref], fetch_ctx(10)))[ref]


def content(fetched: object) -> object:
    assert isinstance(fetched, list), fetched
    return fetched[0].view()


async def test_https_through_the_proxy_by_a_name_only_the_proxy_resolves(
    openbao: OpenBao,
    signing_key: SigningKey,
    proxy: ConnectProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = URL(openbao.tls_addr).port
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    async with built() as backend:
        plan = tls_plan(openbao, f"https://{TLS_SERVER_NAME}:{port}")
        assert content(await read(backend, plan, signing_key)) == {"k": "through"}
    # Login and read, in one tunnel to the name the class gave; nothing in plain HTTP.
    assert proxy.tunnels and set(proxy.tunnels) == {f"{TLS_SERVER_NAME}:{port}"}
    assert proxy.forwarded == []


@pytest.mark.parametrize(
    ("no_proxy", "tunnelled"), [("", True), ("127.0.0.1", False), ("localhost", True)]
)
async def test_no_proxy_sends_the_listed_hosts_direct(
    openbao: OpenBao,
    signing_key: SigningKey,
    proxy: ConnectProxy,
    monkeypatch: pytest.MonkeyPatch,
    no_proxy: str,
    tunnelled: bool,
) -> None:
    # The address is 127.0.0.1 (the certificate's name given as vaultTLSServerName, which also
    # holds inside a tunnel). Loopback is not special: only a NO_PROXY entry sends it direct,
    # and `localhost` is not 127.0.0.1 (names are never resolved to match).
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    async with built() as backend:
        plan = tls_plan(openbao, openbao.tls_addr, vaultTLSServerName=TLS_SERVER_NAME)
        assert content(await read(backend, plan, signing_key)) == {"k": "through"}
    port = URL(openbao.tls_addr).port
    assert proxy.tunnels == ([f"127.0.0.1:{port}"] if tunnelled else [])


async def test_http_through_http_proxy_only(
    openbao: OpenBao,
    signing_key: SigningKey,
    proxy: ConnectProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = plan_for(OBJECT, vaultAddress=openbao.addr, roleName="app", vaultAuthMountPath="jwt")
    # HTTPS_PROXY is for https URLs only: the plain-HTTP dev listener is reached directly.
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    async with built() as backend:
        assert content(await read(backend, plain, signing_key)) == {"k": "through"}
    assert proxy.calls == 0
    # HTTP_PROXY: each request is handed to the proxy whole (login, then the read).
    monkeypatch.setenv("http_proxy", proxy.url)
    async with built() as backend:
        assert content(await read(backend, plain, signing_key)) == {"k": "through"}
    assert proxy.tunnels == []
    assert [line.split(" ")[0] for line in proxy.forwarded] == ["POST", "GET"]
    assert all(line.split(" ")[1].startswith(f"{openbao.addr}/v1/") for line in proxy.forwarded)


async def test_proxy_credentials_are_sent_to_the_proxy(
    openbao: OpenBao,
    signing_key: SigningKey,
    proxy: ConnectProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://bridge:pr0xy-pw@127.0.0.1:{proxy.port}")
    async with built() as backend:
        plan = tls_plan(openbao, openbao.tls_addr, vaultTLSServerName=TLS_SERVER_NAME)
        assert content(await read(backend, plan, signing_key)) == {"k": "through"}
    assert proxy.authorizations and set(proxy.authorizations) == {"Basic YnJpZGdlOnByMHh5LXB3"}


async def test_a_refusing_proxy_is_named_and_not_retried(
    openbao: OpenBao,
    signing_key: SigningKey,
    proxy: ConnectProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy.refuse.add(TLS_SERVER_NAME)
    monkeypatch.setenv("HTTPS_PROXY", f"http://bridge:pr0xy-pw@127.0.0.1:{proxy.port}")
    port = URL(openbao.tls_addr).port
    async with built() as backend:
        plan = tls_plan(openbao, f"https://{TLS_SERVER_NAME}:{port}")
        with pytest.raises(StoreUnavailable) as info:
            await read(backend, plan, signing_key)
    message = str(info.value)
    assert f"the proxy http://127.0.0.1:{proxy.port} (from HTTPS_PROXY)" in message
    assert "HTTP 403" in message and "NO_PROXY" in message
    assert "pr0xy-pw" not in message and not info.value.transient
    assert len(proxy.tunnels) == 1  # refused once, not retried


async def test_an_unusable_proxy_variable_fails_the_call_naming_it(
    openbao: OpenBao, signing_key: SigningKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://127.0.0.1:1080")
    async with built() as backend:
        plan = tls_plan(openbao, openbao.tls_addr, vaultTLSServerName=TLS_SERVER_NAME)
        with pytest.raises(StoreUnavailable, match=r"HTTPS_PROXY .*socks5") as info:
            await read(backend, plan, signing_key)
    assert not info.value.transient
