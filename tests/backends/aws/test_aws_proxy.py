"""AWS calls honour the proxy environment: aiobotocore's clients (STS, Secrets Manager) and the
EKS Pod Identity agent call, against the real moto_server behind a counting proxy
(devkit/connect_proxy.py) — over TLS through HTTPS_PROXY (moto behind a TLS front) and in plain
HTTP through HTTP_PROXY. The environment is read when the backend and its clients are built, so
each test sets it (monkeypatch) first."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devkit import certs
from devkit.connect_proxy import VARIABLES, ConnectProxy
from devkit.eks import PodIdentityAgent
from devkit.forward import Forwarder
from devkit.moto import MotoServer
from devkit.testing import make_pod
from tests.backends.aws.conftest import REGION, ROLE, MakeHarness

#: AWS's own names of the endpoints a read uses (botocore's defaults for the region).
SECRETS = f"secretsmanager.{REGION}.amazonaws.com"
STS_NAMES = (f"sts.{REGION}.amazonaws.com", "sts.amazonaws.com")
OBJECTS = "- {objectName: proxied, objectType: secretsmanager}"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
def seeded(moto: MotoServer) -> MotoServer:
    moto.client("secretsmanager").create_secret(Name="proxied", SecretString="through")
    return moto


@pytest.fixture
async def tls_moto(
    seeded: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Forwarder]:
    """moto behind a TLS front whose certificate names AWS's endpoints (and 127.0.0.1),
    trusted through AWS_CA_BUNDLE as botocore reads it."""
    cert = certs.server_tls(tmp_path, SECRETS, sans=[SECRETS, *STS_NAMES], ips=["127.0.0.1"])
    monkeypatch.setenv("AWS_CA_BUNDLE", str(cert.ca_file))
    front = Forwarder("127.0.0.1", seeded.port)
    await front.start(cert.context())
    yield front
    await front.stop()


@pytest.fixture
async def proxy(tls_moto: Forwarder) -> AsyncIterator[ConnectProxy]:
    hosts = {name: f"127.0.0.1:{tls_moto.port}" for name in (SECRETS, *STS_NAMES)}
    async with ConnectProxy(hosts=hosts) as server:
        yield server


def params() -> dict[str, str]:
    return {"region": REGION, "roleArn": ROLE, "objects": OBJECTS}


async def test_aws_default_endpoints_through_https_proxy(
    make_harness: MakeHarness, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No endpoint override: botocore's own AWS names, which only the proxy resolves here.
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    mounted = await make_harness().mount(params())
    assert mounted.content("proxied") == b"through"
    # AssumeRoleWithWebIdentity, then GetSecretValue: each in a CONNECT tunnel to its name.
    hosts = {target.rpartition(":")[0] for target in proxy.tunnels}
    assert SECRETS in hosts and hosts & set(STS_NAMES) and hosts <= {SECRETS, *STS_NAMES}
    assert all(target.endswith(":443") for target in proxy.tunnels)
    assert proxy.forwarded == []


@pytest.mark.parametrize(("no_proxy", "tunnelled"), [("", True), ("127.0.0.1", False)])
async def test_aws_no_proxy_sends_the_listed_hosts_direct(
    make_harness: MakeHarness,
    tls_moto: Forwarder,
    proxy: ConnectProxy,
    monkeypatch: pytest.MonkeyPatch,
    no_proxy: str,
    tunnelled: bool,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    mounted = await make_harness(f"{REGION}={tls_moto.url}").mount(params())
    assert mounted.content("proxied") == b"through"
    target = f"127.0.0.1:{tls_moto.port}"
    assert set(proxy.tunnels) == ({target} if tunnelled else set())


async def test_aws_http_proxy_carries_the_pod_identity_agent_and_plain_endpoints(
    make_harness: MakeHarness, seeded: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = PodIdentityAgent(token="pod-identity-token")
    await agent.start()
    pod = make_pod(tokens={"pods.eks.amazonaws.com": "pod-identity-token"})
    parameters = {"region": REGION, "usePodIdentity": "true", "objects": OBJECTS}
    try:
        async with ConnectProxy() as proxy:
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            endpoint = f"{agent.url}/v1/credentials"
            h = make_harness(f"{REGION}={seeded.url}", pod_identity_endpoint=endpoint)
            assert (await h.mount(parameters, pod)).content("proxied") == b"through"
            assert proxy.tunnels == []
            assert proxy.forwarded == [f"GET {endpoint}", f"POST {seeded.url}/"]
            # The agent's token went on to the agent (the proxy saw the call, not a refusal).
            assert agent.calls["credentials"] == 1

            proxy.reset()
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            h = make_harness(f"{REGION}={seeded.url}", pod_identity_endpoint=endpoint)
            assert (await h.mount(parameters, pod)).content("proxied") == b"through"
            assert proxy.calls == 0
            assert agent.calls["credentials"] == 2
    finally:
        await agent.stop()
