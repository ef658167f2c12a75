"""Vault's gcp auth method (iam type), logged in to as the pod: its Kubernetes token exchanged at
Google STS, a JWT signed by IAM signJwt for its Google service account with a real RSA key, which
the stand-in of Vault's method checks against the key Google publishes; the token a real
OpenBao's (devkit/vault_gcp.py says why Vault's method is a stand-in)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator

import jwt
import pytest
from aiohttp import ClientSession

from backends.vault.gcplogin import IAM_OVERRIDE, STS_OVERRIDE
from backends.vault.options import Options
from backends.vault.store import VaultBackend, create
from devkit.google import POOL, FakeGoogle, start_http
from devkit.openbao import OpenBao
from devkit.testing import fetch_ctx, make_env, make_pod
from devkit.vault_gcp import VaultGcpAuth
from provider.core.errors import InvalidParameters, MissingCredential, PermissionDenied
from provider.core.model import Pod
from tests.backends.vault.conftest import plan_for

POD_TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJnY3AifQ.c2lnbmF0dXJlLWdjcA"
GKE = "https://container.googleapis.com/v1/projects/proj/locations/eu/clusters/c1"
STS_AUDIENCE = f"identitynamespace:{POOL}:{GKE}"
APP_GSA = "vault-app@proj.iam.gserviceaccount.com"
OTHER_GSA = "vault-other@proj.iam.gserviceaccount.com"
OBJECTS = "- {objectName: password, secretPath: secret/data/app/gcp-db, secretKey: password}"


@pytest.fixture(scope="module")
def secret(openbao: OpenBao) -> str:
    openbao.kv2_put("secret", "app/gcp-db", {"password": "s3cr3t-gcp"})
    return "s3cr3t-gcp"


@pytest.fixture
async def google(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[FakeGoogle, str]]:
    fake = FakeGoogle(sts_audience=STS_AUDIENCE)
    fake.pod_tokens[POD_TOKEN] = "default/app"
    for gsa in (APP_GSA, OTHER_GSA):
        fake.add_service_account(gsa)
        fake.signers[gsa] = {"ksa:default/app"}
    fake.annotations["default/app"] = {"iam.gke.io/gcp-service-account": APP_GSA}
    runner, url = await start_http(fake)
    # Where the provider exchanges and signs: gcloud's endpoint overrides (gcplogin.py).
    monkeypatch.setenv(STS_OVERRIDE, url)
    monkeypatch.setenv(IAM_OVERRIDE, url)
    yield fake, url
    await runner.cleanup()


@pytest.fixture
async def vault_gcp(
    openbao: OpenBao, google: tuple[FakeGoogle, str], secret: str
) -> AsyncIterator[VaultGcpAuth]:
    auth = VaultGcpAuth(openbao.addr, google=google[1])
    auth.add_role("app", bound_service_accounts=[APP_GSA], policies=["app"])
    await auth.start()
    yield auth
    await auth.stop()


@pytest.fixture
async def backend(
    vault_gcp: VaultGcpAuth, google: tuple[FakeGoogle, str]
) -> AsyncIterator[VaultBackend]:
    vault = create(make_env("vault", Options(addr=vault_gcp.url), kube_api_url=google[1]))
    yield vault
    await vault.close()


def gke_pod(**tokens: str) -> Pod:
    return make_pod(tokens=tokens or {POOL: POD_TOKEN})


async def mount(backend: VaultBackend, vault: VaultGcpAuth, pod: Pod, **params: str) -> bytes:
    plan = plan_for(
        OBJECTS,
        vaultAddress=vault.url,
        roleName="app",
        vaultAuthType="gcp",
        vaultGCPWorkloadIdentityAudience=STS_AUDIENCE,
        **params,
    )
    identity = await backend.identify(plan, pod)
    (fetched,) = (await backend.fetch(plan, identity, [plan.objects[0].ref], fetch_ctx())).values()
    if isinstance(fetched, BaseException):
        raise fetched
    return fetched[0].content


async def test_the_pod_signs_as_its_annotated_service_account_and_reads(
    backend: VaultBackend, vault_gcp: VaultGcpAuth, google: tuple[FakeGoogle, str], secret: str
) -> None:
    fake, _ = google
    content = await mount(backend, vault_gcp, gke_pod())
    assert json.loads(content)["data"]["data"]["password"] == secret
    # STS saw the pod's own token; IAM signed as the pod's principal, never the node's.
    assert [r["subject_token"] for r in fake.sts_requests] == [POD_TOKEN]
    assert [(r["gsa"], r["caller"]) for r in fake.iam_requests] == [(APP_GSA, "ksa:default/app")]
    (claims,) = fake.signed_payloads
    assert claims["aud"] == "vault/app" and claims["sub"] == APP_GSA
    assert 0 < claims["exp"] - time.time() <= 15 * 60
    assert vault_gcp.logins == [APP_GSA]
    await mount(backend, vault_gcp, gke_pod())
    assert len(vault_gcp.logins) == 1, "the Vault token is cached per identity"


async def test_the_class_names_the_service_account(
    backend: VaultBackend, vault_gcp: VaultGcpAuth, google: tuple[FakeGoogle, str], secret: str
) -> None:
    google[0].annotations["default/app"] = {}
    content = await mount(backend, vault_gcp, gke_pod(), vaultGCPServiceAccount=APP_GSA)
    assert json.loads(content)["data"]["data"]["password"] == secret
    with pytest.raises(InvalidParameters, match=r"vaultGCPServiceAccount.*iam\.gke\.io"):
        await mount(backend, vault_gcp, gke_pod())


async def test_the_identity_key_names_method_role_mount_and_service_account(
    backend: VaultBackend,
) -> None:
    def plan(role: str = "app", **params: str) -> object:
        given = {
            "vaultAddress": "http://vault",
            "roleName": role,
            "vaultAuthType": "gcp",
            "vaultGCPWorkloadIdentityAudience": STS_AUDIENCE,
            "vaultGCPServiceAccount": APP_GSA,
            **params,
        }
        return plan_for(OBJECTS, **given)

    identity = await backend.identify(plan(), gke_pod())  # type: ignore[arg-type]
    assert identity.key.split("|")[3:] == [
        "gcp",
        "app",
        POOL,
        "gcp",
        f"gsa:{APP_GSA}",
        STS_AUDIENCE,
        "default/app",
    ]
    others = [
        plan(vaultGCPServiceAccount=OTHER_GSA),
        plan(role="other"),
        plan(vaultAuthMountPath="gke"),
    ]
    keys = {identity.key}
    for other in others:
        keys.add((await backend.identify(other, gke_pod())).key)  # type: ignore[arg-type]
    assert len(keys) == 4
    plain = plan_for(OBJECTS, vaultAddress="http://vault", roleName="app", vaultAuthType="jwt")
    assert (await backend.identify(plain, gke_pod(vault="t"))).key not in keys
    assert POD_TOKEN not in identity.key


async def test_a_role_bound_to_another_service_account_refuses_and_names_it(
    backend: VaultBackend, vault_gcp: VaultGcpAuth, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(PermissionDenied) as refused:
        await mount(backend, vault_gcp, gke_pod(), vaultGCPServiceAccount=OTHER_GSA)
    message = str(refused.value)
    assert "default/app" in message and "role 'app'" in message and "auth/gcp" in message
    assert f"not bound to {OTHER_GSA}" in message and "bound_service_accounts" in message
    assert vault_gcp.logins == [OTHER_GSA]
    for text in (message, caplog.text):
        assert POD_TOKEN not in text and "eyJ" not in text


async def test_a_pod_without_the_pool_token_is_told_which_audience(
    backend: VaultBackend, vault_gcp: VaultGcpAuth, google: tuple[FakeGoogle, str]
) -> None:
    with pytest.raises(MissingCredential, match=rf"'{POOL}'"):
        await mount(backend, vault_gcp, gke_pod(vault="x"))
    assert google[0].sts_requests == []


async def test_iam_refusing_to_sign_names_the_role_to_grant(
    backend: VaultBackend, vault_gcp: VaultGcpAuth, google: tuple[FakeGoogle, str]
) -> None:
    google[0].signers[APP_GSA] = set()
    with pytest.raises(PermissionDenied) as refused:
        await mount(backend, vault_gcp, gke_pod())
    message = str(refused.value)
    assert f"signJwt for {APP_GSA} as default/app" in message
    assert "PERMISSION_DENIED" in message and "serviceAccountTokenCreator" in message
    assert vault_gcp.logins == []


async def login(vault: VaultGcpAuth, token: str, role: str = "app") -> tuple[int, str]:
    async with (
        ClientSession() as http,
        http.post(f"{vault.url}/v1/auth/gcp/login", json={"role": role, "jwt": token}) as r,
    ):
        return r.status, await r.text()


@pytest.mark.parametrize(
    ("claims", "refusal"),
    [
        ({"exp": -120}, "JWT is expired"),
        ({"exp": 3 * 3600}, "JWT must expire in 60 minutes"),
        ({"exp": 30 * 60}, "role requires that service account JWTs expire within 900 seconds"),
        ({"aud": "vault/other"}, "must end in 'vault/app'"),
    ],
)
async def test_expired_long_lived_or_wrong_audience_jwts_are_refused(
    vault_gcp: VaultGcpAuth,
    google: tuple[FakeGoogle, str],
    claims: dict[str, object],
    refusal: str,
) -> None:
    payload: dict[str, object] = {"aud": "vault/app", "sub": APP_GSA, "exp": 300, **claims}
    payload["exp"] = int(time.time()) + int(str(payload["exp"]))
    _, signed = google[0].sign_jwt(APP_GSA, json.dumps(payload))
    status, text = await login(vault_gcp, signed)
    assert status == 400 and refusal in text, text


async def test_a_jwt_signed_by_another_key_is_refused(
    vault_gcp: VaultGcpAuth, google: tuple[FakeGoogle, str]
) -> None:
    payload = {"aud": "vault/app", "sub": APP_GSA, "exp": int(time.time()) + 300}
    good_kid, good = google[0].sign_jwt(APP_GSA, json.dumps(payload))
    _, other_key = google[0].signing_key(OTHER_GSA)
    forged = jwt.encode(payload, other_key, algorithm="RS256", headers={"kid": good_kid})
    status, text = await login(vault_gcp, forged)
    assert status == 400 and "cryptographic" in text
    assert (await login(vault_gcp, good))[0] == 200


def test_the_google_fake_publishes_what_it_signs_with() -> None:
    fake = FakeGoogle()
    kid, signed = fake.sign_jwt(APP_GSA, json.dumps({"sub": APP_GSA, "aud": "vault/app"}))
    assert jwt.get_unverified_header(signed)["kid"] == kid
    assert set(fake.x509_keys(APP_GSA)) == {kid}
    (jwk,) = fake.jwks(APP_GSA)["keys"]
    public = jwt.PyJWK(jwk).key
    assert jwt.decode(signed, public, algorithms=["RS256"], audience="vault/app")["sub"] == APP_GSA


async def test_a_missing_role_is_named(backend: VaultBackend, vault_gcp: VaultGcpAuth) -> None:
    plan = plan_for(
        OBJECTS,
        vaultAddress=vault_gcp.url,
        roleName="nope",
        vaultAuthType="gcp",
        vaultGCPWorkloadIdentityAudience=STS_AUDIENCE,
    )
    identity = await backend.identify(plan, gke_pod())
    with pytest.raises(PermissionDenied, match="there is no role 'nope' at auth/gcp"):
        await backend.fetch(plan, identity, [plan.objects[0].ref], fetch_ctx())
