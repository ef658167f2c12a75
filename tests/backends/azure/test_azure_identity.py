"""Who the pod is to Entra: workload identity, service principal, VM identity; identity keys."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from backends.azure import auth
from backends.azure.dialect import AzureStore
from backends.azure.options import Options
from backends.azure.store import AzureBackend, create
from devkit.testing import fetch_ctx, make_env, make_pod
from provider.core.backend import BackendEnv
from provider.core.errors import BridgeError, InvalidParameters, MissingCredential, PermissionDenied
from tests.backends.azure.conftest import CLIENT, POD_TOKEN, TENANT, Azure
from tests.backends.azure.test_azure_fetch import AUDIENCE, fetch, objects, plan

SP_ID, SP_SECRET = "bbbbbbbb-0000-0000-0000-000000000002", "sp-secret-value"
OBJ = objects("objectName: s\nobjectType: secret")


def env(**core: object) -> BackendEnv:
    return make_env("azure", Options(), **core)


async def test_azure_missing_pod_token_names_the_audience() -> None:
    with pytest.raises(MissingCredential) as info:
        await create(env()).identify(plan(OBJ), make_pod(tokens={"vault": "x"}))
    assert AUDIENCE in str(info.value) and "tokenRequests" in str(info.value)


async def test_azure_identity_key_names_store_and_pod_never_the_token() -> None:
    backend = create(env())
    p = plan(OBJ)
    a = await backend.identify(p, make_pod(tokens={AUDIENCE: POD_TOKEN}))
    b = await backend.identify(p, make_pod(service_account="other", tokens={AUDIENCE: POD_TOKEN}))
    for part in ("azure", "https://kv1.vault.azure.net", TENANT, CLIENT, "default/app"):
        assert part in a.key
    assert POD_TOKEN not in a.key and POD_TOKEN not in repr(a)
    assert a.key != b.key and a.subject == "default/app"
    per_pod = await create(env(cache_scope="pod")).identify(
        p, make_pod(uid="u-1", tokens={AUDIENCE: POD_TOKEN})
    )
    assert "u-1" in per_pod.key


async def test_azure_service_principal_from_node_publish_secret(
    azure: Azure, backend: AzureBackend
) -> None:
    vault = azure.fake.vault("kv1", TENANT)
    vault.access[SP_ID] = "*"
    vault.add("secret", "s", {"value": "via-sp"})
    azure.fake.client_secrets[(TENANT, SP_ID)] = SP_SECRET
    p = parse_sp()
    pod = make_pod(secrets={"clientid": SP_ID, "clientsecret": SP_SECRET})
    identity = await backend.identify(p, pod)
    assert SP_SECRET not in identity.key and "cred:" in identity.key
    [value] = (await backend.fetch(p, identity, [p.objects[0].ref], fetch_ctx()))[p.objects[0].ref]
    assert value.content == b"via-sp"
    assert azure.fake.calls.tokens[0]["client_secret"] == SP_SECRET
    wrong = make_pod(secrets={"clientid": SP_ID, "clientsecret": "wrong"})
    bad = await backend.identify(p, wrong)
    assert bad.key != identity.key
    with pytest.raises(PermissionDenied) as info:
        await backend.fetch(p, bad, [p.objects[0].ref], fetch_ctx())
    assert "nodePublishSecretRef" in str(info.value) and "wrong" not in str(info.value)


def parse_sp():  # type: ignore[no-untyped-def]
    from backends.azure.dialect import parse
    from provider.core.model import ParseContext

    params = {"keyvaultName": "kv1", "tenantID": TENANT, "objects": OBJ}
    return parse(params, ParseContext(options=Options()))


async def test_azure_no_credentials_at_all_is_missing_credential() -> None:
    with pytest.raises(MissingCredential) as info:
        await create(env()).identify(parse_sp(), make_pod())
    assert "clientid" in str(info.value) and "clientID" in str(info.value)


async def test_azure_vm_identity_only_in_allowed_namespaces() -> None:
    from backends.azure.dialect import parse
    from provider.core.model import ParseContext

    params = {
        "keyvaultName": "kv1",
        "tenantId": TENANT,
        "useVMManagedIdentity": "true",
        "userAssignedIdentityID": "mi-client",
        "objects": OBJ,
    }
    p = parse(params, ParseContext(options=Options()))
    with pytest.raises(PermissionDenied) as info:
        await create(env()).identify(p, make_pod(namespace="apps"))
    assert "allow-node-identity-namespaces" in str(info.value) and "'apps'" in str(info.value)
    allowed = env(allow_node_identity_namespaces=frozenset({"infra"}))
    identity = await create(allowed).identify(p, make_pod(namespace="infra"))
    assert "vm" in identity.key and "mi-client" in identity.key


async def test_azure_identities_are_isolated_on_the_wire(
    azure: Azure, backend: AzureBackend
) -> None:
    other_client, other_token = "cccccccc-0000-0000-0000-000000000003", "pod-token-default-other"
    azure.fake.federated[(TENANT, other_client)] = {other_token}
    vault = azure.fake.vault("kv1", TENANT)
    vault.access[CLIENT] = {("secret", "s")}
    vault.add("secret", "s", {"value": "for-app"})
    mine = plan(OBJ)
    theirs = plan(OBJ, clientID=other_client)
    assert not isinstance((await fetch(backend, mine))[mine.objects[0].ref], BridgeError)
    err = (await fetch(backend, theirs, pod_token=other_token))[theirs.objects[0].ref]
    assert isinstance(err, PermissionDenied)
    principals = [c[2] for c in azure.fake.calls.vault]
    assert principals == [CLIENT, other_client]


async def test_azure_clouds_and_overrides(tmp_path: Path) -> None:
    china = AzureStore("kv1", TENANT, "AzureChinaCloud", "", "workload-identity", CLIENT)
    ends = await auth.endpoints(china, None)
    assert ends == auth.Endpoints("https://login.chinacloudapi.cn", "https://kv1.vault.azure.cn")
    over = Options(authority_host="login.example.test/", vault_dns_suffix="vault.example.test")
    ends = await auth.endpoints(china, over)
    assert ends == auth.Endpoints("https://login.example.test", "https://kv1.vault.example.test")
    env_file = tmp_path / "stack.json"
    env_file.write_text(
        json.dumps(
            {
                "name": "AzureStackCloud",
                "activeDirectoryEndpoint": "https://login.stack.test/",
                "keyVaultDNSSuffix": "vault.stack.test",
            }
        )
    )
    stack = AzureStore("kv1", TENANT, "AzureStackCloud", str(env_file), "workload-identity", CLIENT)
    ends = await auth.endpoints(stack, Options())
    assert ends == auth.Endpoints("https://login.stack.test", "https://kv1.vault.stack.test")
    env_file.write_text("{}")
    with pytest.raises(InvalidParameters) as info:
        await auth.endpoints(stack, Options())
    assert str(env_file) in str(info.value) and "keyVaultDNSSuffix" in str(info.value)
    missing = AzureStore("kv1", TENANT, "AzureStackCloud", "/nonexistent", "workload-identity")
    with pytest.raises(InvalidParameters, match="cloudEnvFileName /nonexistent"):
        await auth.endpoints(missing, Options())


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (Options(connect_to="no-port"), "--azure-connect-to"),
        (Options(connect_to="host:http"), "--azure-connect-to"),
        (Options(ca_file="/nonexistent/ca.pem"), "--azure-ca-file /nonexistent/ca.pem"),
    ],
)
def test_azure_bad_options_are_refused_naming_the_flag(options: Options, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        create(make_env("azure", options))


async def test_azure_concurrent_mounts_of_one_identity_log_in_once(
    azure: Azure, backend: AzureBackend
) -> None:
    vault = azure.fake.vault("kv1", TENANT)
    vault.access[CLIENT] = "*"
    vault.add("secret", "s", {"value": "x"})
    p = plan(OBJ)
    results = await asyncio.gather(*(fetch(backend, p) for _ in range(20)))
    assert all(not isinstance(r[p.objects[0].ref], BridgeError) for r in results)
    assert len(azure.fake.calls.tokens) == 1
    assert len(azure.fake.calls.vault) == 20


async def test_azure_relogin_uses_the_newest_pod_token(azure: Azure, backend: AzureBackend) -> None:
    """The cached credential logs in again with the token of the Mount at hand, not the first."""
    vault = azure.fake.vault("kv1", TENANT)
    vault.access[CLIENT] = "*"
    vault.add("secret", "s", {"value": "x"})
    # Access tokens that expire within the test: the next Mount must log in again.
    azure.fake.expires_in = 1
    azure.fake.federated[(TENANT, CLIENT)] = {"first-token", "second-token"}
    p = plan(OBJ)
    await fetch(backend, p, pod_token="first-token")
    # The first token has expired by now (kubelet tokens are short-lived): Entra refuses it.
    azure.fake.federated[(TENANT, CLIENT)] = {"second-token"}
    await asyncio.sleep(1.2)
    result = await fetch(backend, p, pod_token="second-token")
    assert not isinstance(result[p.objects[0].ref], BridgeError)
    assert [t["client_assertion"] for t in azure.fake.calls.tokens] == [
        "first-token",
        "second-token",
    ]
