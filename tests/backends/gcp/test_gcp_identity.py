"""The gcp backend's identities on the wire: the STS exchange of the pod's token, impersonation of
the annotated Google service account, node identity, node-publish-secret keys, token caching."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from backends.gcp.dialect import GcpRef
from backends.gcp.exchange import GSA_ANNOTATION
from devkit.google import POOL
from devkit.testing import fetch_ctx, make_pod
from provider.core.errors import InvalidParameters, MissingCredential, PermissionDenied
from tests.backends.gcp.conftest import STS_AUDIENCE, Stack
from tests.backends.gcp.test_gcp_fetch import DB, KSA, read, service_account_key, spc, values


async def test_gcp_sts_exchange_carries_pod_token_and_audience(stack: Stack) -> None:
    name = stack.google.add_version(DB, '{"user":"u"}', KSA)
    plan = stack.plan(spc(name))
    got = await read(stack, plan, stack.pod())
    value = values(got[GcpRef(name)])
    assert value.content == b'{"user":"u"}'
    assert value.version == name
    [sts] = stack.google.sts_requests
    assert sts == {
        "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
        "audience": STS_AUDIENCE,
        "scope": "https://www.googleapis.com/auth/cloud-platform",
        "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "subject_token": "pod-token-default-app",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
    }
    # No annotation: the federated token reads directly, no impersonation.
    assert stack.google.iam_requests == []
    assert stack.google.reads == [("global", name, KSA)]


async def test_gcp_impersonates_annotated_service_account(stack: Stack) -> None:
    gsa = "reader@proj.iam.gserviceaccount.com"
    name = stack.google.add_version(DB, "pw", f"gsa:{gsa}")  # only the GSA may read
    pod = stack.pod()
    stack.google.annotations["default/app"] = {
        GSA_ANNOTATION: gsa,
        "iam.gke.io/gcp-service-account-delegates": json.dumps(
            ["mid@proj.iam.gserviceaccount.com"]
        ),
    }
    stack.google.impersonators[gsa] = {KSA}
    got = await read(stack, stack.plan(spc(name)), pod)
    assert values(got[GcpRef(name)]).content == b"pw"
    [iam] = stack.google.iam_requests
    assert iam["gsa"] == gsa and iam["caller"] == KSA
    assert iam["body"]["scope"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert iam["body"]["delegates"] == [
        "projects/-/serviceAccounts/mid@proj.iam.gserviceaccount.com"
    ]
    assert stack.google.reads[-1][2] == f"gsa:{gsa}"


async def test_gcp_identity_key_parts(stack: Stack) -> None:
    plan = stack.plan(spc(f"{DB}/versions/1"))
    identity = await stack.backend.identify(plan, stack.pod())
    assert identity.key == f"gcp|pod-adc|{STS_AUDIENCE}|default/app"
    assert identity.subject == "default/app"
    per_pod = stack.rebuild(core={"cache_scope": "pod"})
    one = await per_pod.identify(plan, stack.pod(uid="u1"))
    two = await per_pod.identify(plan, stack.pod(uid="u2"))
    assert one.key.endswith("default/app/pod:u1") and one.key != two.key
    await per_pod.close()


async def test_gcp_no_token_no_answer_even_when_cached(stack: Stack) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    plan = stack.plan(spc(name))
    await read(stack, plan, stack.pod())  # the identity now has a cached access token
    tokenless = make_pod(tokens={"vault": "t"})
    with pytest.raises(MissingCredential) as err:
        await stack.backend.identify(plan, tokenless)
    assert repr(POOL) in str(err.value)
    assert "tokenRequests" in str(err.value)


async def test_gcp_token_cached_until_shortly_before_expiry(stack: Stack) -> None:
    stack.google.lifetime = 2  # seconds: cached for ~1.5 s (a quarter as margin)
    name = stack.google.add_version(DB, "x", KSA)
    plan, pod = stack.plan(spc(name)), stack.pod()
    await read(stack, plan, pod)
    await read(stack, plan, pod)
    assert len(stack.google.sts_requests) == 1
    await asyncio.sleep(1.6)
    await read(stack, plan, pod)
    assert len(stack.google.sts_requests) == 2


async def test_gcp_rejected_token_logs_in_again_once(stack: Stack) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    other = stack.google.add_version("projects/proj/secrets/other", "y", KSA)
    plan, pod = stack.plan(spc(name, other)), stack.pod()
    await read(stack, plan, pod)
    stack.google.revoke_all()
    got = await read(stack, plan, pod)
    assert values(got[GcpRef(name)]).content == b"x"
    assert values(got[GcpRef(other)]).content == b"y"
    # Both readers saw the rejection; they shared one new login.
    assert len(stack.google.sts_requests) == 2


async def test_gcp_provider_adc_is_node_identity(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = "node@proj.iam.gserviceaccount.com"
    name = stack.google.add_version(DB, "node-value", f"gsa:{node}")
    plan = stack.plan({"auth": "provider-adc", **spc(name)})
    with pytest.raises(PermissionDenied) as err:
        await stack.backend.identify(plan, stack.pod())
    assert "--allow-node-identity-namespaces" in str(err.value)
    assert stack.google.oauth_requests == []
    # The provider's own Application Default Credentials: here a key file whose token_uri is
    # the fake Google, found through GOOGLE_APPLICATION_CREDENTIALS as on a real node.
    adc = tmp_path / "adc.json"
    adc.write_text(service_account_key(f"{stack.http}/oauth2/token", node))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    allowed = stack.rebuild(core={"allow_node_identity_namespaces": frozenset({"default"})})
    pod = make_pod()  # no pod token is needed for node identity
    identity = await allowed.identify(plan, pod)
    assert identity.key == "gcp|provider-adc|default/app"
    got = await allowed.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    assert values(got[GcpRef(name)]).content == b"node-value"
    assert len(stack.google.oauth_requests) == 1
    assert stack.google.sts_requests == []


async def test_gcp_node_publish_secret_key_json(stack: Stack) -> None:
    email = "keyed@proj.iam.gserviceaccount.com"
    name = stack.google.add_version(DB, "keyed", f"gsa:{email}")
    plan = stack.plan(spc(name))
    key_json = service_account_key(f"{stack.http}/oauth2/token", email)
    pod = make_pod(secrets={"key.json": key_json})  # no pod token needed with a key
    identity = await stack.backend.identify(plan, pod)
    assert identity.key.startswith("gcp|key|cred:")
    assert "PRIVATE" not in identity.key + repr(identity)
    got = await stack.backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    assert values(got[GcpRef(name)]).content == b"keyed"
    assert stack.google.sts_requests == []
    # Upstream refuses a class that also chooses auth explicitly.
    explicit = stack.plan({"auth": "pod-adc", **spc(name)})
    with pytest.raises(InvalidParameters, match="nodePublishSecretRef"):
        await stack.backend.identify(explicit, pod)


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({GSA_ANNOTATION: "x@y/../../v1/other"}, "must be a Google service account email"),
        (
            {
                GSA_ANNOTATION: "r@proj.iam.gserviceaccount.com",
                "iam.gke.io/gcp-service-account-delegates": "not-json",
            },
            "iam.gke.io/gcp-service-account-delegates must be a JSON list",
        ),
    ],
)
async def test_gcp_bad_service_account_annotations(
    stack: Stack, annotations: dict[str, str], message: str
) -> None:
    name = stack.google.add_version(DB, "x", KSA)
    plan, pod = stack.plan(spc(name)), stack.pod()
    stack.google.annotations["default/app"] = annotations
    identity = await stack.backend.identify(plan, pod)
    with pytest.raises(InvalidParameters) as err:
        await stack.backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    assert message in str(err.value) and "default/app" in str(err.value)
    assert stack.google.iam_requests == []
