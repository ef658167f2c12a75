"""Identity bindings (`useAzureTokenProxy: "true"`): the pod's login through the AKS token proxy.

The real SDK (azure-identity's token proxy transport under a ClientAssertionCredential) against
the token proxy fake of devkit/azure_binding.py, which checks the server name, its own CA, and
the assertion (signature, expiry, audience, subject) before Entra's fake issues the token.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from backends.azure import binding
from backends.azure.dialect import AzureStore, audiences, parse
from backends.azure.options import Options
from backends.azure.store import AzureBackend, create
from devkit.azure_binding import FakeTokenProxy, proxy_name, start
from devkit.serving import serving
from devkit.testing import driver_request, fetch_ctx, make_env, make_pod
from devkit.tokens import SigningKey
from provider.core.errors import (
    InvalidParameters,
    MissingCredential,
    PermissionDenied,
    StoreUnavailable,
)
from provider.core.model import Identity, ParseContext, StorePlan
from tests.backends.azure.conftest import CLIENT, TENANT, Azure
from tests.backends.azure.test_azure_fetch import objects

AUDIENCE = "api://AKSIdentityBinding"
WORKLOAD = "api://AzureADTokenExchange"
OBJ = objects("objectName: s\nobjectType: secret")
#: A vault of these tests only: the SDK caches each vault's challenge (its tenant) process-wide.
VAULT = "kvbinding"


@dataclass
class Cluster:
    proxy: FakeTokenProxy
    signer: SigningKey
    port: int
    ca_file: Path
    #: The Azure fake's options plus the token proxy's URL and CA (its server name computed).
    options: Options

    def token(self, namespace: str = "default", sa: str = "app", **kw: Any) -> str:
        return self.signer.pod_token(namespace, sa, kw.pop("audience", AUDIENCE), **kw)


@pytest.fixture(scope="module")
def signer() -> SigningKey:
    return SigningKey.generate()


@pytest.fixture
async def cluster(azure: Azure, signer: SigningKey, tmp_path: Path) -> AsyncIterator[Cluster]:
    proxy = FakeTokenProxy(azure.fake, signer)
    proxy.allow(TENANT, CLIENT, "default", "app")
    vault = azure.fake.vault(VAULT, TENANT)
    vault.access[CLIENT] = "*"
    vault.add("secret", "s", {"value": "bound"})
    runner, port, ca_file = await start(proxy, tmp_path / "cluster")
    # localhost, not 127.0.0.1: --azure-connect-to sends every other name to the Entra fake.
    options = replace(
        azure.options,
        token_proxy_url=f"https://localhost:{port}",
        token_proxy_ca_file=str(ca_file),
    )
    try:
        yield Cluster(proxy, signer, port, ca_file, options)
    finally:
        await runner.cleanup()


def plan(**extra: str) -> StorePlan:
    params = {
        "keyvaultName": VAULT,
        "tenantId": TENANT,
        "clientID": CLIENT,
        "useAzureTokenProxy": "true",
        "objects": OBJ,
        **extra,
    }
    return parse({k: v for k, v in params.items() if v}, ParseContext(options=Options()))


async def built(options: Options) -> AzureBackend:
    return create(make_env("azure", options))  # type: ignore[return-value]


async def read(backend: Any, token: str, p: StorePlan | None = None, **pod: Any) -> Identity:
    p = p or plan()
    identity: Identity = await backend.identify(p, make_pod(tokens={AUDIENCE: token}, **pod))
    result = await backend.fetch(p, identity, [p.objects[0].ref], fetch_ctx())
    [value] = result[p.objects[0].ref]
    assert value.content == b"bound"
    return identity


async def test_azure_identity_binding_mount_through_the_token_proxy(
    azure: Azure, cluster: Cluster, tmp_path: Path
) -> None:
    token = cluster.token()
    params = {
        "backend": "azure",
        "keyvaultName": VAULT,
        "tenantId": TENANT,
        "clientID": CLIENT,
        "useAzureTokenProxy": "true",
        "objects": OBJ,
    }
    async with serving(tmp_path, backend_options={"azure": cluster.options}) as provider:
        request = driver_request(params, tokens={AUDIENCE: token, WORKLOAD: "not-this-one"})
        reply = await provider.stub.Mount(request, timeout=10)
    assert not reply.error.code
    assert {f.path: f.contents for f in reply.files} == {"s": b"bound"}
    # Computed from the API server's certificate, the server name reached the proxy's face;
    # the login kept Entra's path under the proxy's origin, and Entra saw no request itself.
    [call] = cluster.proxy.calls
    assert (call.server_name, call.path) == ("proxy", f"/{TENANT}/oauth2/v2.0/token")
    assert call.subject == "system:serviceaccount:default:app" and call.client_id == CLIENT
    assert azure.fake.calls.tokens == []
    assert azure.fake.calls.vault[-1] == (VAULT, "/secrets/s/", CLIENT)


async def test_azure_identity_binding_server_name_is_upstreams() -> None:
    for cluster_id in ("c0ffee0123", "my-cluster-123", "x"):
        name = binding.server_name(cluster_id)
        assert name == proxy_name(cluster_id) and name == name.lower()
        label = name.removesuffix(".ests.aks")
        assert name.startswith("a") and len(label) <= 63 and label.isalnum()
    assert binding.server_name("a") != binding.server_name("b")


async def test_azure_identity_binding_caches_the_login_per_identity(cluster: Cluster) -> None:
    backend = await built(cluster.options)
    try:
        first = await read(backend, cluster.token())
        again = await read(backend, cluster.token())
        assert first.key == again.key
        assert len(cluster.proxy.calls) == 1  # one login, its access token reused
    finally:
        await backend.close()


async def test_azure_identity_binding_key_names_the_proxy_never_the_token(
    cluster: Cluster,
) -> None:
    backend = await built(cluster.options)
    token = cluster.token()
    bound = await backend.identify(plan(), make_pod(tokens={AUDIENCE: token}))
    workload = await backend.identify(
        plan(useAzureTokenProxy=""), make_pod(tokens={WORKLOAD: token})
    )
    assert bound.key != workload.key
    server_name = proxy_name(cluster.proxy.cluster_id)
    for part in (CLIENT, f"https://localhost:{cluster.port}", server_name, str(cluster.ca_file)):
        assert part in bound.key
    assert token not in bound.key and token not in repr(bound)
    named = await built(replace(cluster.options, sni_name="other.ests.aks"))
    other = await named.identify(plan(), make_pod(tokens={AUDIENCE: token}))
    assert other.key != bound.key and "other.ests.aks" in other.key
    for b in (backend, named):
        await b.close()


async def test_azure_identity_binding_missing_token_names_the_audience(
    cluster: Cluster,
) -> None:
    backend = await built(cluster.options)
    with pytest.raises(MissingCredential) as info:
        await backend.identify(plan(), make_pod(tokens={WORKLOAD: cluster.token()}))
    assert AUDIENCE in str(info.value) and "tokenRequests" in str(info.value)
    assert cluster.proxy.calls == []
    await backend.close()


async def test_azure_identity_binding_wrong_ca_is_refused_naming_the_flag(
    azure: Azure, cluster: Cluster
) -> None:
    # The CA of Entra's fake, not the cluster's: the token proxy cannot be trusted.
    untrusting = replace(cluster.options, token_proxy_ca_file=azure.options.ca_file)
    for options in (untrusting, replace(untrusting, sni_name=cluster.proxy.server_name)):
        backend = await built(options)
        with pytest.raises(MissingCredential) as info:
            await read(backend, cluster.token())
        text = str(info.value)
        assert "failed TLS verification" in text and "--azure-token-proxy-ca-file" in text
        assert str(azure.options.ca_file) in text
        await backend.close()
    # The first failed computing the server name (identify); the second at the login, which
    # names the identity and the client id.
    assert "default/app" in text and CLIENT in text
    assert cluster.proxy.calls == []


async def test_azure_identity_binding_wrong_server_name_is_refused(cluster: Cluster) -> None:
    backend = await built(replace(cluster.options, sni_name="a0000.ests.aks"))
    token = cluster.token()
    with pytest.raises(binding.ProxyUntrusted) as info:
        await read(backend, token)
    text = str(info.value)
    assert "a0000.ests.aks" in text and "--azure-sni-name" in text
    assert "Hostname mismatch" in text and CLIENT in text and token not in text
    assert cluster.proxy.calls == []
    await backend.close()


@pytest.mark.parametrize(
    ("token_args", "why"),
    [
        ({"lifetime": -60}, "expired"),
        ({"audience": WORKLOAD}, "audience"),
        ({"sa": "other"}, "service account"),
    ],
)
async def test_azure_identity_binding_proxy_refusals_name_the_identity(
    cluster: Cluster, token_args: dict[str, Any], why: str
) -> None:
    backend = await built(cluster.options)
    sa = token_args.pop("sa", "app")
    token = cluster.token(sa=sa, **token_args)
    with pytest.raises(PermissionDenied) as info:
        await read(backend, token, service_account=sa)
    text = str(info.value)
    assert f"default/{sa}" in text and CLIENT in text and AUDIENCE in text, why
    assert "use-managed-identity" in text and "cid.wi.aks.azure.com" in text
    assert token not in text and "AKS token proxy" in text
    [call] = cluster.proxy.calls
    assert call.server_name == "proxy"
    await backend.close()


async def test_azure_identity_binding_without_binding_is_refused(cluster: Cluster) -> None:
    cluster.proxy.bindings.clear()
    backend = await built(cluster.options)
    with pytest.raises(PermissionDenied) as info:
        await read(backend, cluster.token())
    assert "AADSTS700213" in str(info.value) and "identity binding" in str(info.value)
    await backend.close()


async def test_azure_identity_binding_api_server_unreachable_names_the_flag(
    cluster: Cluster,
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    backend = await built(replace(cluster.options, token_proxy_url=f"https://localhost:{closed}"))
    with pytest.raises(StoreUnavailable) as info:
        await backend.identify(plan(), make_pod(tokens={AUDIENCE: cluster.token()}))
    assert "--azure-sni-name" in str(info.value) and f"localhost:{closed}" in str(info.value)
    await backend.close()


async def test_azure_identity_binding_mount_error_reaches_the_driver(
    azure: Azure, cluster: Cluster, tmp_path: Path
) -> None:
    options = replace(cluster.options, sni_name="a0000.ests.aks")
    params = {"backend": "azure", **plan_params()}
    async with serving(tmp_path, backend_options={"azure": options}) as provider:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await provider.stub.Mount(
                driver_request(params, tokens={AUDIENCE: cluster.token()}), timeout=10
            )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.value.details() or ""
    assert "--azure-sni-name" in details and CLIENT in details and "default/app" in details


def plan_params() -> dict[str, str]:
    return {
        "keyvaultName": VAULT,
        "tenantId": TENANT,
        "clientID": CLIENT,
        "useAzureTokenProxy": "true",
        "objects": OBJ,
    }


def test_azure_identity_binding_bad_proxy_url_is_refused_at_start() -> None:
    for url in ("http://kubernetes", "https://u:p@k8s", "https://k8s/?a=b", "https://k8s:0"):
        with pytest.raises(ValueError, match="--azure-token-proxy-url"):
            create(make_env("azure", Options(token_proxy_url=url)))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"clientID": ""}, "clientID is required for identity binding"),
        ({"useVMManagedIdentity": "true"}, "only one identity mode"),
        ({"usePodIdentity": "true"}, "only one identity mode"),
        ({"useAzureTokenProxy": "yes"}, "useAzureTokenProxy"),
    ],
)
def test_azure_identity_binding_parameters_refused(extra: dict[str, str], message: str) -> None:
    params = {**plan_params(), **extra}
    with pytest.raises(InvalidParameters) as info:
        parse({k: v for k, v in params.items() if v}, ParseContext(options=Options()))
    assert message in str(info.value)


def test_azure_identity_binding_audience_is_reported() -> None:
    p = plan()
    assert isinstance(p.store, AzureStore) and p.store.auth == "identity-binding"
    assert audiences(p.store) == (AUDIENCE,)
    assert audiences(plan(useAzureTokenProxy="false").store) == (WORKLOAD,)


# Upstream's own tests of identity binding beyond the parameters (tests/upstream/cases/azure.yaml
# holds those): pkg/auth/auth_test.go `TestParseIdentityBindingToken`,
# `TestParseIdentityBindingTokenError` and `TestGetCredential_IdentityBinding_MissingFields`
# (the token is the one for api://AKSIdentityBinding, never workload identity's; none is an
# error), and test/e2e/identity_binding_with_wi_test.go (one service account mounts a workload
# identity class and an identity binding class, both read secret1).


async def test_azure_upstream_parse_identity_binding_token(cluster: Cluster) -> None:
    backend = await built(cluster.options)
    tokens = {AUDIENCE: "identity-binding-token", WORKLOAD: "wi-token"}
    identity = await backend.identify(plan(), make_pod(tokens=tokens))
    assert identity.credential.assertion == "identity-binding-token"
    await backend.close()


@pytest.mark.parametrize(
    "tokens",
    [{}, {WORKLOAD: "some-token"}, {AUDIENCE: ""}],
    ids=["empty serviceaccount tokens", "identity binding audience not found", "empty token"],
)
async def test_azure_upstream_parse_identity_binding_token_error(
    cluster: Cluster, tokens: dict[str, str]
) -> None:
    backend = await built(cluster.options)
    with pytest.raises(MissingCredential, match=AUDIENCE):
        await backend.identify(plan(), make_pod(tokens=tokens))
    await backend.close()


async def test_azure_upstream_identity_binding_with_workload_identity(
    azure: Azure, cluster: Cluster
) -> None:
    wi_token = "pod-token-dual-identity"
    azure.fake.federated[(TENANT, CLIENT)] = {wi_token}
    backend = await built(cluster.options)
    try:
        bound = await read(backend, cluster.token())
        workload_plan = plan(useAzureTokenProxy="")
        pod = make_pod(tokens={WORKLOAD: wi_token, AUDIENCE: cluster.token()})
        workload = await backend.identify(workload_plan, pod)
        ref = workload_plan.objects[0].ref
        [value] = (await backend.fetch(workload_plan, workload, [ref], fetch_ctx()))[ref]
        assert value.content == b"bound" and workload.key != bound.key
        assert [t["client_assertion"] for t in azure.fake.calls.tokens] == [wi_token]
        assert len(cluster.proxy.calls) == 1
    finally:
        await backend.close()
