"""Store failures become provider errors naming vault, object and identity; no SDK error escapes."""

from __future__ import annotations

import pytest

from backends.azure.options import Options
from backends.azure.store import AzureBackend, create
from devkit.testing import make_env
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
)
from tests.backends.azure.conftest import CLIENT, TENANT, Azure
from tests.backends.azure.test_azure_fetch import fetch, objects, plan


@pytest.fixture
def vault(azure: Azure):  # type: ignore[no-untyped-def]
    return azure.fake.vault("kv1", TENANT)


async def test_azure_denied_names_vault_object_identity_and_fix(
    backend: AzureBackend, vault
) -> None:
    vault.access[CLIENT] = {("secret", "allowed")}
    vault.add("secret", "allowed", {"value": "ok"})
    vault.add("secret", "private", {"value": "no"})
    p = plan(
        objects(
            "objectName: private\nobjectType: secret", "objectName: allowed\nobjectType: secret"
        )
    )
    result = await fetch(backend, p)
    err = result[p.objects[0].ref]
    assert isinstance(err, PermissionDenied)
    text = str(err)
    assert "kv1" in text and "'private'" in text and "default/app" in text
    assert "Key Vault Secrets User" in text
    assert not isinstance(result[p.objects[1].ref], BridgeError)


async def test_azure_not_found_names_vault_and_object(backend: AzureBackend, vault) -> None:
    vault.access[CLIENT] = "*"
    p = plan(objects("objectName: missing\nobjectType: key"))
    err = (await fetch(backend, p))[p.objects[0].ref]
    assert isinstance(err, NotFound)
    assert "Key Vault kv1: key 'missing'" in str(err)


async def test_azure_unknown_version_in_history_is_not_found(backend: AzureBackend, vault) -> None:
    vault.access[CLIENT] = "*"
    vault.add("secret", "s", {"value": "x"})
    p = plan(
        objects("objectName: s\nobjectType: secret\nobjectVersionHistory: 2\nobjectVersion: abc")
    )
    err = (await fetch(backend, p))[p.objects[0].ref]
    assert isinstance(err, NotFound) and "'abc'" in str(err)


async def test_azure_refused_login_fails_the_whole_call(
    azure: Azure, backend: AzureBackend, vault
) -> None:
    vault.access[CLIENT] = "*"
    vault.add("secret", "s", {"value": "x"})
    p = plan(objects("objectName: s\nobjectType: secret"))
    with pytest.raises(PermissionDenied) as info:
        await fetch(backend, p, pod_token="not-federated-token")
    text = str(info.value)
    assert CLIENT in text and TENANT in text and "system:serviceaccount:default:app" in text
    assert "AADSTS700213" in text
    assert "not-federated-token" not in text
    # The refused session is dropped: a pod with a good token is served next.
    assert not isinstance((await fetch(backend, p))[p.objects[0].ref], BridgeError)


async def test_azure_5xx_is_unavailable(azure: Azure, backend: AzureBackend, vault) -> None:
    vault.access[CLIENT] = "*"
    vault.add("secret", "s", {"value": "x"})
    azure.fake.throttle[("kv1", "secret", "s")] = 100
    azure.fake.throttle_status = 503
    p = plan(objects("objectName: s\nobjectType: secret"))
    err = (await fetch(backend, p, seconds=1.5))[p.objects[0].ref]
    assert isinstance(err, StoreUnavailable) and err.retry_after is None
    assert "Key Vault kv1: secret 's'" in str(err) and "503" in str(err)


async def test_azure_unknown_vault_is_not_found(backend: AzureBackend) -> None:
    p = plan(objects("objectName: s\nobjectType: secret"), keyvaultName="nosuchvault")
    err = (await fetch(backend, p))[p.objects[0].ref]
    assert isinstance(err, NotFound) and "nosuchvault" in str(err)


async def test_azure_unreachable_vault_is_unavailable_within_the_retry_deadline(
    azure: Azure,
) -> None:
    # A port nothing listens on: connection refused on every attempt.
    options = Options(ca_file=azure.options.ca_file, connect_to="127.0.0.1:9")
    backend = create(make_env("azure", options))
    try:
        p = plan(objects("objectName: s\nobjectType: secret"))
        err = (await fetch(backend, p, seconds=1.5))[p.objects[0].ref]
    finally:
        await backend.close()
    assert isinstance(err, StoreUnavailable)
    assert "kv1" in str(err) and "unreachable" in str(err)


async def test_azure_unparseable_certificate_is_reported_not_raised(
    backend: AzureBackend, vault
) -> None:
    vault.access[CLIENT] = "*"
    body = {
        "value": "bm90IGEgcGZ4",
        "contentType": "application/x-pkcs12",
        "certificate_backed": True,
    }
    vault.add("secret", "broken", body)
    p = plan(objects("objectName: broken\nobjectType: secret"))
    err = (await fetch(backend, p))[p.objects[0].ref]
    assert isinstance(err, InvalidParameters) and "PFX" in str(err) and "broken" in str(err)


async def test_azure_no_sdk_exception_escapes(azure: Azure, backend: AzureBackend) -> None:
    """Every odd answer becomes a BridgeError for its object, never an azure.core exception."""
    fake = azure.fake
    # Vault names not used elsewhere: the SDK caches each vault's challenge process-wide.
    garbage = fake.vault("kvgarbage", TENANT)
    garbage.access[CLIENT] = "*"
    garbage.add("secret", "s", {"value": "x"})
    fake.garbage.add(("kvgarbage", "secret", "s"))
    p = plan(objects("objectName: s\nobjectType: secret"), keyvaultName="kvgarbage")
    err = (await fetch(backend, p, seconds=1.5))[p.objects[0].ref]
    assert isinstance(err, StoreUnavailable) and "kvgarbage" in str(err) and "JSON" in str(err)

    fake.vault("kvchallenge", TENANT).access[CLIENT] = "*"
    fake.resource = "https://evil.example.com"
    p = plan(objects("objectName: s\nobjectType: secret"), keyvaultName="kvchallenge")
    err = (await fetch(backend, p, seconds=1.5))[p.objects[0].ref]
    assert isinstance(err, PermissionDenied) and "kvchallenge" in str(err)
    assert "evil.example.com" in str(err) and "verify_challenge_resource" not in str(err)
    fake.resource = "https://vault.azure.net"

    fake.vault("kventra", TENANT).access[CLIENT] = "*"
    fake.entra_status = 503
    p = plan(objects("objectName: s\nobjectType: secret"), keyvaultName="kventra")
    err = (await fetch(backend, p, seconds=1.5))[p.objects[0].ref]
    assert isinstance(err, StoreUnavailable)
    assert "Key Vault kventra: secret 's'" in str(err) and "Entra" in str(err)
