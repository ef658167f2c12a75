"""Identity against real servers: moto's STS, a Kubernetes API stub, a Pod Identity agent stub."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator

import pytest

from backends.aws.dialect import parse
from backends.aws.options import Options
from backends.aws.store import create
from devkit.eks import PodIdentityAgent
from devkit.kube import ServiceAccounts
from devkit.moto import CountingProxy, MotoServer
from devkit.testing import fetch_ctx, make_env, make_pod
from provider.core.errors import MissingCredential, PermissionDenied
from provider.core.identity import ANNOTATION_TTL
from provider.core.model import ParseContext
from tests.backends.aws.conftest import POD_TOKEN, REGION, ROLE, MakeHarness, irsa_pod

OBJECTS = "- {objectName: s, objectType: secretsmanager}"
ANNOTATED = "arn:aws:iam::123456789012:role/annotated"


@pytest.fixture
async def kube() -> AsyncIterator[ServiceAccounts]:
    stub = ServiceAccounts(
        {
            ("default", "app"): {"eks.amazonaws.com/role-arn": ANNOTATED},
            ("default", "plain"): {},
            ("ops", "plain"): {},
        }
    )
    await stub.start()
    yield stub
    await stub.stop()


@pytest.fixture
def seeded(moto: MotoServer) -> MotoServer:
    moto.client("secretsmanager").create_secret(Name="s", SecretString="value")
    return moto


async def test_aws_irsa_logs_in_once_per_identity(
    make_harness: MakeHarness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    h = make_harness(f"{REGION}={proxy.url}")
    parameters = {"roleArn": ROLE, "objects": OBJECTS}
    first = await h.mount(parameters)
    await h.mount(parameters)
    assert first.content("s") == b"value"
    assert proxy.counts["AssumeRoleWithWebIdentity"] == 1
    body = proxy.access_keys
    # The STS call is unsigned (the pod token is the credential); reads use STS's key.
    assert body[0] == ""
    assert all(key.startswith("ASIA") for key in body[1:])
    await h.mount(parameters, irsa_pod(sa="other"))
    assert proxy.counts["AssumeRoleWithWebIdentity"] == 2


async def test_aws_identity_key_is_secret_free(make_harness: MakeHarness) -> None:
    h = make_harness()
    plan = h.parse({"roleArn": ROLE, "failoverRegion": "us-west-2", "objects": OBJECTS})
    identity = await h.backend.identify(plan, irsa_pod())
    assert identity.key == f"aws|{REGION}|us-west-2|irsa:{ROLE}|default/app"
    assert POD_TOKEN not in identity.key and POD_TOKEN not in repr(identity)
    scoped = make_harness(cache_scope="pod")
    identity = await scoped.backend.identify(plan, irsa_pod(uid="u-1"))
    assert identity.key.endswith("default/app/pod:u-1")


async def test_aws_missing_token_names_the_audience(
    make_harness: MakeHarness, proxy: CountingProxy
) -> None:
    h = make_harness(f"{REGION}={proxy.url}")
    with pytest.raises(MissingCredential, match=r"'sts\.amazonaws\.com'"):
        await h.backend.identify(h.parse({"roleArn": ROLE, "objects": OBJECTS}), make_pod())
    pod_identity = h.parse({"usePodIdentity": "true", "objects": OBJECTS})
    with pytest.raises(MissingCredential, match=r"'pods\.eks\.amazonaws\.com'"):
        await h.backend.identify(pod_identity, irsa_pod())
    assert sum(proxy.counts.values()) == 0


async def test_aws_role_from_service_account_annotation(
    make_harness: MakeHarness, seeded: MotoServer, proxy: CountingProxy, kube: ServiceAccounts
) -> None:
    h = make_harness(f"{REGION}={proxy.url}", kube_api_url=kube.url)
    mounted = await h.mount({"objects": OBJECTS})
    assert mounted.content("s") == b"value"
    assert f"irsa:{ANNOTATED}" in mounted.identity.key
    await h.mount({"objects": OBJECTS})
    assert kube.calls["default/app"] == 1  # a rollout reads the annotation once


async def test_aws_node_identity_only_for_allowed_namespaces(
    make_harness: MakeHarness,
    seeded: MotoServer,
    proxy: CountingProxy,
    kube: ServiceAccounts,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIANODEIDENTITY0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "node-secret")
    h = make_harness(
        f"{REGION}={proxy.url}",
        kube_api_url=kube.url,
        allow_node_identity_namespaces=frozenset({"ops"}),
    )
    plan = h.parse({"objects": OBJECTS})
    with pytest.raises(PermissionDenied) as caught:
        await h.backend.identify(plan, make_pod(service_account="plain"))
    text = str(caught.value)
    assert "--allow-node-identity-namespaces" in text and "roleArn" in text
    mounted = await h.mount(
        {"objects": OBJECTS}, make_pod(namespace="ops", service_account="plain")
    )
    assert mounted.content("s") == b"value"
    assert mounted.identity.key.endswith("|node|ops/plain")
    assert proxy.access_keys == ["AKIANODEIDENTITY0001"]


async def test_aws_pod_identity_agent(
    make_harness: MakeHarness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    agent = PodIdentityAgent(token="pod-identity-token")
    await agent.start()
    try:
        h = make_harness(
            f"{REGION}={proxy.url}", pod_identity_endpoint=f"{agent.url}/v1/credentials"
        )
        parameters = {"usePodIdentity": "true", "objects": OBJECTS}
        pod = make_pod(tokens={"pods.eks.amazonaws.com": "pod-identity-token"})
        mounted = await h.mount(parameters, pod)
        await h.mount(parameters, pod)
        assert mounted.content("s") == b"value"
        assert agent.calls["credentials"] == 1
        assert proxy.access_keys == ["ASIAPODIDENTITYTEST1"] * 2
        assert "pod-identity:auto" in mounted.identity.key

        refused = make_pod(service_account="other", tokens={"pods.eks.amazonaws.com": "wrong"})
        with pytest.raises(PermissionDenied, match="Pod Identity association"):
            await h.mount(parameters, refused)
    finally:
        await agent.stop()


async def test_aws_refused_assume_role_fails_the_fetch(
    make_harness: MakeHarness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    h = make_harness(f"{REGION}={proxy.url}")
    proxy.deny_operations.add("AssumeRoleWithWebIdentity")
    with pytest.raises(PermissionDenied) as caught:
        await h.mount({"roleArn": ROLE, "objects": OBJECTS})
    text = str(caught.value)
    assert ROLE in text and "trust policy" in text and "default/app" in text
    assert POD_TOKEN not in text


async def test_aws_expired_credentials_log_in_again_once(
    make_harness: MakeHarness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    h = make_harness(f"{REGION}={proxy.url}")
    proxy.inject["GetSecretValue"].append((400, "ExpiredTokenException"))
    mounted = await h.mount({"roleArn": ROLE, "objects": OBJECTS})
    assert mounted.content("s") == b"value"
    assert proxy.counts["AssumeRoleWithWebIdentity"] == 2
    assert proxy.counts["GetSecretValue"] == 2


async def test_aws_backend_without_options_uses_defaults() -> None:
    # No aws flags given: the composition root passes Options(), the defaults.
    backend = create(make_env("aws"))
    try:
        plan = parse(
            {"region": REGION, "roleArn": ROLE, "objects": OBJECTS},
            ParseContext(options=Options()),
        )
        with pytest.raises(MissingCredential):
            await backend.identify(plan, make_pod())
        identity = await backend.identify(plan, irsa_pod())
        assert await backend.fetch(plan, identity, [], fetch_ctx()) == {}
    finally:
        await backend.close()


async def test_aws_credentials_are_renewed_before_they_expire(
    make_harness: MakeHarness, seeded: MotoServer, proxy: CountingProxy
) -> None:
    agent = PodIdentityAgent(token="t", lifetime=1.0)  # kept until a fifth before expiry
    await agent.start()
    try:
        h = make_harness(
            f"{REGION}={proxy.url}", pod_identity_endpoint=f"{agent.url}/v1/credentials"
        )
        parameters = {"usePodIdentity": "true", "objects": OBJECTS}
        pod = make_pod(tokens={"pods.eks.amazonaws.com": "t"})
        await h.mount(parameters, pod)
        await h.mount(parameters, pod)
        assert agent.calls["credentials"] == 1
        await asyncio.sleep(0.9)
        await h.mount(parameters, pod)
        assert agent.calls["credentials"] == 2
    finally:
        await agent.stop()


async def test_an_identity_named_by_an_annotation_holds_until_it_is_read_again(
    make_harness: MakeHarness, kube: ServiceAccounts
) -> None:
    """A request answered again skips identify only until then (Identity.expires), so a
    changed annotation takes effect as soon as it did when every mount identified the pod."""
    h = make_harness(kube_api_url=kube.url)
    before = time.monotonic()
    annotated = await h.backend.identify(h.parse({"objects": OBJECTS}), irsa_pod())
    assert before + ANNOTATION_TTL <= annotated.expires <= time.monotonic() + ANNOTATION_TTL
    given = await h.backend.identify(h.parse({"roleArn": ROLE, "objects": OBJECTS}), irsa_pod())
    assert given.expires == math.inf
