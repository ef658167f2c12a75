"""The gcp backend's identities on the wire: the STS exchange of the pod's token, impersonation of
the annotated Google service account, node identity, node-publish-secret keys (their assertion's
audience at a private token endpoint), token caching."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from backends.clouds.gcp import SCOPE
from backends.clouds.names import GSA_ANNOTATION
from backends.gcp import auth as gcp_auth
from backends.gcp.dialect import GcpRef
from backends.gcp.keyfile import ServiceAccountKey
from devkit.google import (
    BAD_AUDIENCE,
    BAD_SIGNATURE,
    BAD_TIMES,
    GOOGLE_TOKEN_AUDIENCE,
    JWT_BEARER,
    POOL,
    start_http,
)
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


# -- a key's assertion: aud is Google's token endpoint, wherever it is posted (issue 33) --------

KEYED = "psc@proj.iam.gserviceaccount.com"


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def private_pem(key: rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def public_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def key_file(token_uri: str, key: rsa.RSAPrivateKey, key_id: str = "k1") -> str:
    info = {
        "type": "service_account",
        "project_id": "proj",
        "private_key_id": key_id,
        "private_key": private_pem(key),
        "client_email": KEYED,
        "client_id": "2",
        "token_uri": token_uri,
    }
    return json.dumps(info)


def signed(key: rsa.RSAPrivateKey, key_id: str = "k1", **claims: Any) -> str:
    """A JWT-bearer assertion for KEYED, with `claims` over the ones Google expects."""
    now = int(time.time())
    payload = {
        "iss": KEYED,
        "aud": GOOGLE_TOKEN_AUDIENCE,
        "scope": SCOPE,
        "iat": now,
        "exp": now + 3600,
        **claims,
    }
    return jwt.encode(payload, private_pem(key), algorithm="RS256", headers={"kid": key_id})


async def test_gcp_key_json_private_token_endpoint_asserts_googles_audience(stack: Stack) -> None:
    """A key whose token_uri is a private endpoint (Private Service Connect, a proxy to
    Google), allowed through --gcp-token-uris: the grant is posted there, and its assertion's
    aud is still Google's token endpoint, the only one Google accepts."""
    runner, private = await start_http(stack.google)  # another origin than the STS endpoint
    try:
        token_uri = f"{private}/oauth2/token"
        key = rsa_key()
        stack.google.add_key(KEYED, "k1", public_pem(key))  # the fake checks the signature
        name = stack.google.add_version(DB, "via-private-endpoint", f"gsa:{KEYED}")
        plan = stack.plan(spc(name))
        pod = make_pod(secrets={"key.json": key_file(token_uri, key)})
        # Neither Google's nor on a configured origin: refused before anything is signed.
        with pytest.raises(InvalidParameters, match="--gcp-token-uris"):
            await stack.backend.identify(plan, pod)
        assert stack.google.oauth_requests == []

        backend = stack.rebuild(token_uris=token_uri)
        identity = await backend.identify(plan, pod)
        got = await backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
        assert values(got[GcpRef(name)]).content == b"via-private-endpoint"
        assert stack.google.oauth_urls == [token_uri]
        [form] = stack.google.oauth_requests
        assert form["grant_type"] == JWT_BEARER
        [claims] = stack.google.assertions
        assert claims["aud"] == GOOGLE_TOKEN_AUDIENCE != token_uri
        assert (claims["iss"], claims["scope"]) == (KEYED, SCOPE)
        assert claims["exp"] - claims["iat"] == 3600
        assert jwt.get_unverified_header(form["assertion"])["kid"] == "k1"
    finally:
        await runner.cleanup()


async def test_gcp_key_assertion_for_the_token_uri_is_refused_as_google_does(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The regression itself: an assertion whose aud is the key's token_uri. The fake refuses
    it as Google does (400 invalid_grant), and the pod is told its key's login was refused."""
    token_uri = f"{stack.http}/oauth2/token"
    key = rsa_key()
    stack.google.add_key(KEYED, "k1", public_pem(key))
    name = stack.google.add_version(DB, "x", f"gsa:{KEYED}")
    plan = stack.plan(spc(name))

    def aud_is_token_uri(k: ServiceAccountKey) -> str:
        return signed(key, aud=k.token_uri)

    monkeypatch.setattr(gcp_auth, "assertion", aud_is_token_uri)
    pod = make_pod(secrets={"key.json": key_file(token_uri, key)})
    identity = await stack.backend.identify(plan, pod)
    with pytest.raises(PermissionDenied) as err:
        await stack.backend.fetch(plan, identity, [GcpRef(name)], fetch_ctx())
    text = str(err.value)
    assert "invalid_grant" in text and "HTTP 400" in text and KEYED in text, text
    assert len(stack.google.oauth_requests) == 1  # a refusal is not retried
    assert stack.google.assertions == [] and stack.google.reads == []


@pytest.mark.parametrize(
    ("change", "error", "description"),
    [
        ({"aud": "http://127.0.0.1/oauth2/token"}, "invalid_grant", BAD_AUDIENCE),
        ({"aud": "https://www.googleapis.com/oauth2/v4/token"}, "invalid_grant", BAD_AUDIENCE),
        ({"exp_after": 7200}, "invalid_grant", BAD_TIMES),
        ({"iat_after": -7200}, "invalid_grant", BAD_TIMES),
        ({"other_key": True}, "invalid_grant", BAD_SIGNATURE),
        ({"key_id": "k2"}, "invalid_grant", BAD_SIGNATURE),
        ({"scope": ""}, "invalid_scope", None),
        ({"grant_type": "client_credentials"}, "unsupported_grant_type", None),
    ],
)
async def test_fake_google_checks_key_assertions_as_google_does(
    stack: Stack, change: dict[str, Any], error: str, description: str | None
) -> None:
    key = rsa_key()
    stack.google.add_key(KEYED, "k1", public_pem(key))
    now = int(time.time())
    claims: dict[str, Any] = {k: v for k, v in change.items() if k in ("aud", "scope")}
    if "exp_after" in change:
        claims["exp"] = now + change["exp_after"]
    if "iat_after" in change:
        claims["iat"] = now + change["iat_after"]
    signer = rsa_key() if change.get("other_key") else key
    assertion = signed(signer, change.get("key_id", "k1"), **claims)
    grant = {"grant_type": change.get("grant_type", JWT_BEARER), "assertion": assertion}
    url = f"{stack.http}/oauth2/token"
    async with aiohttp.ClientSession() as http, http.post(url, data=grant) as response:
        assert response.status == 400
        body = await response.json()
    assert body["error"] == error
    if description is not None:
        assert body["error_description"] == description
    assert stack.google.assertions == []
    # A correct assertion of the same key is accepted.
    good = {"grant_type": JWT_BEARER, "assertion": signed(key)}
    async with aiohttp.ClientSession() as http, http.post(url, data=good) as response:
        assert response.status == 200, await response.text()
        assert stack.google.tokens[(await response.json())["access_token"]] == f"gsa:{KEYED}"
