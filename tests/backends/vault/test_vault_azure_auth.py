"""Vault's azure auth method, logged in to as the pod: its api://AzureADTokenExchange token the
client assertion of its workload identity (azure-identity), the Entra access token a real RS256
JWT that the stand-in of Vault's method checks against the tenant's published keys; the token a
real OpenBao's (devkit/vault_azure.py says why Vault's method is a stand-in)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import ClientSession

from backends.vault.options import Options
from backends.vault.store import VaultBackend, create
from devkit import certs
from devkit.azure import FakeAzure
from devkit.openbao import OpenBao
from devkit.ports import serve_app
from devkit.testing import fetch_ctx, make_env, make_pod
from devkit.vault_azure import VaultAzureAuth
from provider.core.errors import MissingCredential, PermissionDenied
from provider.core.model import Pod
from tests.backends.vault.conftest import plan_for

POD_TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhenVyZSJ9.c2lnbmF0dXJlLWF6dXJl"
TENANT = "72f988bf-86f1-41af-91ab-2d7cd011db47"
APP = "11111111-2222-3333-4444-555555555555"
OTHER = "66666666-7777-8888-9999-000000000000"
OBJECTS = "- {objectName: password, secretPath: secret/data/app/azure-db, secretKey: password}"


@dataclass
class Entra:
    fake: FakeAzure
    url: str
    tls: certs.ServerTLS


@pytest.fixture(scope="module")
def secret(openbao: OpenBao) -> str:
    openbao.kv2_put("secret", "app/azure-db", {"password": "s3cr3t-azure"})
    return "s3cr3t-azure"


@pytest.fixture(scope="module")
def entra_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[certs.ServerTLS]:
    yield certs.server_tls(Path(tmp_path_factory.mktemp("entra")), "localhost")


@pytest.fixture
async def entra(
    entra_tls: certs.ServerTLS, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Entra]:
    fake = FakeAzure()
    fake.signed_tokens = True
    for client in (APP, OTHER):
        fake.federated[(TENANT, client)] = {POD_TOKEN}
    runner, port = await serve_app(fake.entra_app(), ssl_context=entra_tls.context())
    url = f"https://localhost:{port}"
    # Where azure-identity logs in (its own variable), and the CA the system trusts.
    monkeypatch.setenv("AZURE_AUTHORITY_HOST", url)
    monkeypatch.setenv("SSL_CERT_FILE", str(entra_tls.ca_file))
    yield Entra(fake, url, entra_tls)
    await runner.cleanup()


@pytest.fixture
async def vault_azure(openbao: OpenBao, entra: Entra, secret: str) -> AsyncIterator[VaultAzureAuth]:
    import ssl

    context = ssl.create_default_context(cafile=str(entra.tls.ca_file))
    auth = VaultAzureAuth(openbao.addr, authority=entra.url, tenant=TENANT, ssl=context)
    auth.add_role("app", bound_service_principal_ids=[entra.fake.object_id(APP)], policies=["app"])
    await auth.start()
    yield auth
    await auth.stop()


@pytest.fixture
async def backend(vault_azure: VaultAzureAuth) -> AsyncIterator[VaultBackend]:
    vault = create(make_env("vault", Options(addr=vault_azure.url)))
    yield vault
    await vault.close()


def aks_pod(**tokens: str) -> Pod:
    return make_pod(tokens=tokens or {"api://AzureADTokenExchange": POD_TOKEN})


def params(client: str = APP, **more: str) -> dict[str, str]:
    return {
        "roleName": "app",
        "vaultAuthType": "azure",
        "vaultAzureTenantID": TENANT,
        "vaultAzureClientID": client,
        **more,
    }


async def mount(backend: VaultBackend, vault: VaultAzureAuth, pod: Pod, **given: str) -> bytes:
    plan = plan_for(OBJECTS, vaultAddress=vault.url, **params(**given))
    identity = await backend.identify(plan, pod)
    (fetched,) = (await backend.fetch(plan, identity, [plan.objects[0].ref], fetch_ctx())).values()
    if isinstance(fetched, BaseException):
        raise fetched
    return fetched[0].content


async def test_the_pod_logs_in_with_its_workload_identity_and_reads(
    backend: VaultBackend, vault_azure: VaultAzureAuth, entra: Entra, secret: str
) -> None:
    content = await mount(
        backend,
        vault_azure,
        aks_pod(),
        vaultAzureSubscriptionID=OTHER,
        vaultAzureResourceGroup="rg-aks",
        vaultAzureVMSSName="aks-nodes",
    )
    assert json.loads(content)["data"]["data"]["password"] == secret
    # Entra saw the pod's own token as the client assertion, for the method's resource.
    (request,) = entra.fake.calls.tokens
    assert request["client_assertion"] == POD_TOKEN and request["client_id"] == APP
    assert request["scope"] == "https://management.azure.com//.default"
    assert entra.fake.token_claims[0]["aud"] == "https://management.azure.com/"
    assert vault_azure.logins == [
        {
            "subscription_id": OTHER,
            "resource_group_name": "rg-aks",
            "vmss_name": "aks-nodes",
            "oid": entra.fake.object_id(APP),
        }
    ]
    await mount(
        backend,
        vault_azure,
        aks_pod(),
        vaultAzureSubscriptionID=OTHER,
        vaultAzureResourceGroup="rg-aks",
        vaultAzureVMSSName="aks-nodes",
    )
    assert len(vault_azure.logins) == 1, "the Vault token is cached per identity"


async def test_the_identity_key_names_method_role_mount_and_workload_identity(
    backend: VaultBackend,
) -> None:
    def plan(**given: str) -> object:
        return plan_for(OBJECTS, vaultAddress="http://vault", **{**params(), **given})

    identity = await backend.identify(plan(), aks_pod())  # type: ignore[arg-type]
    assert identity.key.split("|")[3:] == [
        "azure",
        "app",
        "api://AzureADTokenExchange",
        "azure",
        f"wi:{TENANT}:{APP}",
        "https://management.azure.com/",
        "default/app",
    ]
    keys = {identity.key}
    for other in (
        plan(vaultAzureClientID=OTHER),
        plan(roleName="other"),
        plan(vaultAuthMountPath="aks"),
        plan(vaultAzureResource="https://vault.example.com"),
        plan(vaultAzureSubscriptionID=OTHER, vaultAzureResourceGroup="rg"),
    ):
        keys.add((await backend.identify(other, aks_pod())).key)  # type: ignore[arg-type]
    assert len(keys) == 6
    assert POD_TOKEN not in identity.key


async def test_a_role_bound_to_another_principal_refuses_and_names_it(
    backend: VaultBackend, vault_azure: VaultAzureAuth, entra: Entra
) -> None:
    with pytest.raises(PermissionDenied) as refused:
        await mount(backend, vault_azure, aks_pod(), client=OTHER)
    message = str(refused.value)
    assert "default/app" in message and "role 'app'" in message and "auth/azure" in message
    assert f"not bound to the workload identity {OTHER}" in message
    assert "bound_service_principal_ids" in message
    assert [login["oid"] for login in vault_azure.logins] == [entra.fake.object_id(OTHER)]
    assert "eyJ" not in message


async def test_a_token_for_another_resource_is_refused_and_the_fix_named(
    backend: VaultBackend, vault_azure: VaultAzureAuth
) -> None:
    with pytest.raises(PermissionDenied) as refused:
        await mount(backend, vault_azure, aks_pod(), vaultAzureResource="https://vault.azure.net")
    message = str(refused.value)
    assert "invalid audience" in message and "vaultAzureResource" in message
    assert vault_azure.logins == []


async def test_entra_refusing_the_assertion_names_the_federated_credential(
    backend: VaultBackend, vault_azure: VaultAzureAuth, entra: Entra
) -> None:
    entra.fake.federated[(TENANT, APP)] = set()
    with pytest.raises(PermissionDenied) as refused:
        await mount(backend, vault_azure, aks_pod())
    message = str(refused.value)
    assert f"workload identity {APP} in tenant {TENANT}" in message
    assert "invalid_client" in message and "AADSTS700213" in message
    assert "system:serviceaccount:default:app" in message


async def test_a_pod_without_the_token_exchange_token_is_told_which_audience(
    backend: VaultBackend, vault_azure: VaultAzureAuth, entra: Entra
) -> None:
    with pytest.raises(MissingCredential, match="'api://AzureADTokenExchange'"):
        await mount(backend, vault_azure, aks_pod(vault="x"))
    assert entra.fake.calls.tokens == []


async def login(vault: VaultAzureAuth, token: str) -> tuple[int, str]:
    async with (
        ClientSession() as http,
        http.post(f"{vault.url}/v1/auth/azure/login", json={"role": "app", "jwt": token}) as r,
    ):
        return r.status, await r.text()


@pytest.mark.parametrize(
    ("claims", "refusal"),
    [
        ({"exp": int(time.time()) - 60}, "token is expired"),
        ({"aud": "https://vault.azure.net"}, "expected audience"),
        ({"iss": "https://sts.windows.net/other/"}, "issued by a different provider"),
    ],
)
async def test_expired_wrong_audience_or_issuer_tokens_are_refused(
    vault_azure: VaultAzureAuth, entra: Entra, claims: dict[str, object], refusal: str
) -> None:
    token = entra.fake.signed_token(TENANT, APP, "https://management.azure.com//.default", **claims)
    status, text = await login(vault_azure, token)
    assert status == 400 and refusal in text, text


async def test_a_token_signed_by_another_key_is_refused(
    vault_azure: VaultAzureAuth, entra: Entra
) -> None:
    good = entra.fake.signed_token(TENANT, APP, "https://management.azure.com//.default")
    assert (await login(vault_azure, good))[0] == 200
    entra.fake.token_key = None  # Entra's key rolls; the published one is the new key
    entra.fake.signing_key()
    status, text = await login(vault_azure, good)
    assert status == 400 and "failed to verify signature" in text


async def test_a_missing_role_is_named(backend: VaultBackend, vault_azure: VaultAzureAuth) -> None:
    plan = plan_for(OBJECTS, vaultAddress=vault_azure.url, **params(roleName="nope"))
    identity = await backend.identify(plan, aks_pod())
    with pytest.raises(PermissionDenied, match="there is no role 'nope' at auth/azure"):
        await backend.fetch(plan, identity, [plan.objects[0].ref], fetch_ctx())
