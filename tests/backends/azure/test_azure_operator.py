"""Issue 15: messages that name the fix. A vault of another tenant than `tenantID` is a tenantID
problem (the SDK refuses locally; nothing reaches Entra), and a missing tenant names both
spellings of the key."""

from __future__ import annotations

import pytest

from backends.azure.dialect import parse
from backends.azure.store import AzureBackend
from provider.core.errors import BridgeError, InvalidParameters, PermissionDenied
from provider.core.model import ParseContext
from tests.backends.azure.conftest import CLIENT, TENANT, Azure
from tests.backends.azure.test_azure_fetch import fetch, objects, plan

OTHER_TENANT = "99999999-8888-7777-6666-555555555555"


async def test_azure_vault_of_another_tenant_names_tenant_id(
    azure: Azure, backend: AzureBackend
) -> None:
    # The vault lives in another tenant; its 401 challenge names that tenant.
    vault = azure.fake.vault("kv1", OTHER_TENANT)
    vault.access[CLIENT] = "*"
    vault.add("secret", "s", {"value": "x"})
    p = plan(objects("objectName: s\nobjectType: secret", "objectName: t\nobjectType: secret"))
    with pytest.raises(PermissionDenied) as info:
        await fetch(backend, p)
    text = str(info.value)
    assert f"Key Vault kv1 belongs to tenant {OTHER_TENANT}" in text, text
    assert f"the class sets tenantID {TENANT}" in text, text
    assert "set tenantID to the vault's tenant" in text, text
    # Not the advice for a refused federated login: the login was never attempted.
    assert "Entra refused" not in text and "federated credential" not in text, text
    # No token was asked of the vault's tenant. (The SDK caches challenges per vault URL
    # process-wide: after another test's kv1, it first logs in to the cached tenant, which is
    # tenantID, and the vault then challenges with its own.)
    assert OTHER_TENANT not in azure.fake.calls.token_tenants
    assert set(azure.fake.calls.token_tenants) <= {TENANT}
    # Fixing tenantID serves the pod (the refused session is not kept).
    azure.fake.federated[(OTHER_TENANT, CLIENT)] = {"pod-token-default-app"}
    fixed = plan(objects("objectName: s\nobjectType: secret"), tenantID=OTHER_TENANT)
    result = await fetch(backend, fixed)
    assert not isinstance(result[fixed.objects[0].ref], BridgeError)


def _error(**params: str) -> str:
    base = {"keyvaultName": "kv1", "clientID": CLIENT, "objects": objects("objectName: s")}
    with pytest.raises(InvalidParameters) as info:
        parse({**base, **params}, ParseContext(options=object()))
    return str(info.value)


def test_azure_missing_tenant_names_both_spellings() -> None:
    text = _error()
    assert "tenantID" in text and "tenantId" in text, text


def test_azure_bad_tenant_is_named_as_written() -> None:
    assert "tenantId 'a/b'" in _error(tenantId="a/b")
    assert "tenantID 'a/b'" in _error(tenantID="a/b")
