"""Fetching secrets, keys and certificates through the real Azure SDK against the fake vault."""

from __future__ import annotations

from collections.abc import Mapping

from backends.azure.params import parse
from backends.azure.store import AzureBackend
from backends.base import ParseContext, StorePlan
from tests.backends.azure.conftest import CLIENT, POD_TOKEN, TENANT, Azure
from tests.helpers import fetch_ctx, make_pod

AUDIENCE = "api://AzureADTokenExchange"


def plan(objects: str, **extra: str) -> StorePlan:
    params = {"keyvaultName": "kv1", "tenantID": TENANT, "clientID": CLIENT, "objects": objects}
    return parse({**params, **extra}, ParseContext(options=object()))


def objects(*entries: str) -> str:
    return "array:\n" + "".join(
        f"  - |\n    {e.strip().replace(chr(10), chr(10) + '    ')}\n" for e in entries
    )


async def fetch(backend: AzureBackend, p: StorePlan, pod_token: str = POD_TOKEN) -> Mapping:
    pod = make_pod(tokens={AUDIENCE: pod_token})
    identity = await backend.identify(p, pod)
    refs = list(dict.fromkeys(s.ref for s in p.objects))
    return await backend.fetch(p, identity, refs, fetch_ctx())


async def test_azure_secret_roundtrip(azure: Azure, backend: AzureBackend) -> None:
    vault = azure.fake.vault("kv1", TENANT)
    vault.access[CLIENT] = "*"
    version = vault.add("secret", "db-password", {"value": "s3cr3t"})
    p = plan(objects("objectName: db-password\nobjectType: secret"))
    result = await fetch(backend, p)
    [value] = result[p.objects[0].ref]
    assert value.content == b"s3cr3t"
    assert value.version == version
