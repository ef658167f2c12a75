"""Google calls honour the proxy environment: the STS exchange and IAM impersonation (aiohttp)
and Secret Manager (gRPC, which on its own reads only the lower-case variables), against the
Google wire fake behind a counting proxy (devkit/connect_proxy.py). The environment is read when
the backend is built, so each test sets it (monkeypatch) and then builds its backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from yarl import URL

from backends.clouds.names import GSA_ANNOTATION
from backends.gcp.dialect import GcpRef
from backends.gcp.options import DEFAULT_IAM, DEFAULT_SECRETMANAGER, DEFAULT_STS
from backends.gcp.store import GcpBackend
from devkit.certs import server_tls
from devkit.connect_proxy import VARIABLES, ConnectProxy
from devkit.google import start_http, start_secret_manager
from devkit.testing import fetch_ctx, make_pod
from provider.core.model import Pod
from tests.backends.gcp.conftest import Stack
from tests.backends.gcp.test_gcp_fetch import service_account_key

KSA = "ksa:default/app"
GSA = "reader@proj.iam.gserviceaccount.com"
SECRETMANAGER, STS, IAM = (
    URL(f"https://{DEFAULT_SECRETMANAGER}").host,
    URL(DEFAULT_STS).host,
    URL(DEFAULT_IAM).host,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield


@dataclass
class GoogleTls:
    ca_file: str
    grpc_port: int
    https_port: int


@pytest.fixture
async def google_tls(stack: Stack, tmp_path: Path) -> AsyncIterator[GoogleTls]:
    """Secret Manager over TLS and STS/IAM over HTTPS, with a certificate for Google's names."""
    names = [str(SECRETMANAGER), str(STS), str(IAM)]
    cert = server_tls(tmp_path, names[0], sans=names, ips=["127.0.0.1"])
    server, grpc_port = await start_secret_manager(
        stack.google, "tls", regional=False, tls=(cert.key_pem, cert.cert_pem)
    )
    runner, https = await start_http(stack.google, cert.context())
    try:
        yield GoogleTls(str(cert.ca_file), grpc_port, URL(https).port or 0)
    finally:
        await server.stop(None)
        await runner.cleanup()


async def read(
    stack: Stack, backend: GcpBackend, name: str, pod: Pod | None = None, **params: str
) -> bytes:
    plan = stack.plan({"secrets": f"- {{resourceName: {name}, path: a}}", **params})
    identity = await backend.identify(plan, pod or stack.pod())
    got = (await backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx(10)))[GcpRef(name)]
    assert not isinstance(got, BaseException), got
    return got[0].content


async def test_gcp_default_endpoints_through_https_proxy(
    stack: Stack, google_tls: GoogleTls, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = stack.google.add_version("projects/proj/secrets/db", "over-proxy", f"gsa:{GSA}")
    stack.pod()
    stack.google.annotations["default/app"] = {GSA_ANNOTATION: GSA}
    stack.google.impersonators[GSA] = {KSA}
    hosts = {
        str(SECRETMANAGER): f"127.0.0.1:{google_tls.grpc_port}",
        str(STS): f"127.0.0.1:{google_tls.https_port}",
        str(IAM): f"127.0.0.1:{google_tls.https_port}",
    }
    async with ConnectProxy(hosts=hosts) as proxy:
        # Upper case, as Kubernetes manifests spell it: gRPC alone would not read it.
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        backend = stack.rebuild(
            sts_endpoint=DEFAULT_STS,
            iam_endpoint=DEFAULT_IAM,
            secretmanager_endpoint=DEFAULT_SECRETMANAGER,
            local_channel=False,
            ca_file=google_tls.ca_file,
        )
        assert await read(stack, backend, name) == b"over-proxy"
    # Google's own names, each in a CONNECT tunnel (only the proxy resolves them here).
    assert set(proxy.tunnels) == {f"{STS}:443", f"{IAM}:443", f"{SECRETMANAGER}:443"}
    assert proxy.forwarded == []
    assert len(stack.google.sts_requests) == len(stack.google.iam_requests) == 1
    assert stack.google.reads == [("tls", name, f"gsa:{GSA}")]


@pytest.mark.parametrize(("no_proxy", "proxied"), [("", True), ("127.0.0.1", False)])
async def test_gcp_no_proxy_sends_the_listed_hosts_direct(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, no_proxy: str, proxied: bool
) -> None:
    name = stack.google.add_version("projects/proj/secrets/db", "pw", KSA)
    async with ConnectProxy() as proxy:
        # The stack's Secret Manager is a gRPC target on 127.0.0.1 (a CONNECT tunnel through
        # HTTPS_PROXY), its STS plain HTTP on 127.0.0.1 (through HTTP_PROXY).
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", no_proxy)
        backend = stack.rebuild()
        assert await read(stack, backend, name) == b"pw"
    if proxied:
        assert proxy.tunnels == [stack.options.secretmanager_endpoint]
        assert proxy.forwarded == [f"POST {stack.options.sts_endpoint}"]
    else:
        assert proxy.calls == 0
    assert stack.google.reads == [("global", name, KSA)]


async def test_gcp_upper_case_no_proxy_applies_to_grpc(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gRPC on its own would tunnel this channel: it reads https_proxy but not NO_PROXY.
    name = stack.google.add_version("projects/proj/secrets/db", "pw", KSA)
    async with ConnectProxy() as proxy:
        monkeypatch.setenv("https_proxy", proxy.url)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        backend = stack.rebuild()
        assert await read(stack, backend, name) == b"pw"
    assert proxy.calls == 0


async def test_gcp_key_file_and_provider_adc_logins_through_http_proxy(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_uri = f"{stack.http}/oauth2/token"  # the fake's OAuth endpoint, in plain HTTP
    keyed, node = "keyed@proj.iam.gserviceaccount.com", "node@proj.iam.gserviceaccount.com"
    by_key = stack.google.add_version("projects/proj/secrets/k", "keyed", f"gsa:{keyed}")
    by_node = stack.google.add_version("projects/proj/secrets/n", "node", f"gsa:{node}")
    adc = tmp_path / "adc.json"
    adc.write_text(service_account_key(token_uri, node))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    async with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        backend = stack.rebuild(core={"allow_node_identity_namespaces": frozenset({"default"})})
        # A nodePublishSecretRef key.json: its grant is posted by our token client (aiohttp).
        pod = make_pod(secrets={"key.json": service_account_key(token_uri, keyed)})
        assert await read(stack, backend, by_key, pod) == b"keyed"
        # The provider's own credentials: google-auth's requests transport reads the
        # environment itself.
        assert await read(stack, backend, by_node, make_pod(), auth="provider-adc") == b"node"
    assert proxy.forwarded == [f"POST {token_uri}"] * 2
    # HTTP_PROXY is not for https origins, which a gRPC target is: the channel went direct.
    assert proxy.tunnels == []
    assert [principal for _, _, principal in stack.google.reads] == [f"gsa:{keyed}", f"gsa:{node}"]
