"""Fetching secrets, keys and certificates through the real Azure SDK against the fake vault."""

from __future__ import annotations

import base64
import time
from collections.abc import Hashable, Mapping

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs12

from backends.azure.dialect import parse
from backends.azure.store import AzureBackend
from devkit import certs
from devkit.azure import RESOURCE
from devkit.testing import fetch_ctx, make_pod
from provider.core.model import Fetched, ParseContext, SecretValue, StorePlan
from tests.backends.azure.conftest import CLIENT, POD_TOKEN, TENANT, Azure

AUDIENCE = "api://AzureADTokenExchange"


def plan(objects: str, **extra: str) -> StorePlan:
    params = {"keyvaultName": "kv1", "tenantID": TENANT, "clientID": CLIENT, "objects": objects}
    return parse({**params, **extra}, ParseContext(options=object()))


def objects(*entries: str) -> str:
    body = "".join(f"  - |\n    {e.strip().replace(chr(10), chr(10) + '    ')}\n" for e in entries)
    return "array:\n" + body


async def fetch(
    backend: AzureBackend, p: StorePlan, pod_token: str = POD_TOKEN, seconds: float = 30.0
) -> Mapping[Hashable, Fetched]:
    pod = make_pod(tokens={AUDIENCE: pod_token})
    identity = await backend.identify(p, pod)
    refs = list(dict.fromkeys(s.ref for s in p.objects))
    return await backend.fetch(p, identity, refs, fetch_ctx(seconds))


def values(result: Mapping[Hashable, Fetched], p: StorePlan, i: int = 0) -> list[SecretValue]:
    got = result[p.objects[i].ref]
    assert not isinstance(got, Exception), got
    return list(got)


def one(result: Mapping[Hashable, Fetched], p: StorePlan, i: int = 0) -> SecretValue:
    [value] = values(result, p, i)
    return value


@pytest.fixture
def vault(azure: Azure):  # type: ignore[no-untyped-def]
    v = azure.fake.vault("kv1", TENANT)
    v.access[CLIENT] = "*"
    return v


async def test_azure_secret_through_challenge_and_workload_identity(
    azure: Azure, backend: AzureBackend, vault
) -> None:
    version = vault.add("secret", "db-password", {"value": "s3cr3t"})
    p = plan(objects("objectName: db-password\nobjectType: secret"))
    value = one(await fetch(backend, p), p)
    assert value.content == b"s3cr3t"
    assert value.version == version
    # The pod token was the client assertion, for the scope the 401 challenge named.
    [login] = azure.fake.calls.tokens
    assert login["client_assertion"] == POD_TOKEN
    assert login["client_assertion_type"].endswith("jwt-bearer")
    assert login["client_id"] == CLIENT
    assert login["scope"] == RESOURCE + "/.default"
    # A second Mount of the same identity reuses the credential: no second login.
    await fetch(backend, p)
    assert len(azure.fake.calls.tokens) == 1
    assert [c[2] for c in azure.fake.calls.vault] == [CLIENT, CLIENT]


@pytest.mark.parametrize("kind", ["rsa", "ec"])
async def test_azure_key_is_public_pem(backend: AzureBackend, vault, kind: str) -> None:
    key = certs.issue("k", key=rsa.generate_private_key(65537, 2048)).key if kind == "rsa" else None
    key = key or certs.issue("k").key
    version = vault.add("key", "signing", {"key": certs.jwk(key)})
    p = plan(objects("objectName: signing\nobjectType: key\nobjectAlias: signing.pem"))
    value = one(await fetch(backend, p), p)
    assert value.content == certs.public_pem(key)
    assert value.version == version
    assert p.objects[0].name == "signing.pem"


async def test_azure_cert_is_leaf_pem(backend: AzureBackend, vault) -> None:
    _root, _mid, leaf = certs.chain()
    vault.add("cert", "tls", certs.cert_body(leaf))
    p = plan(objects("objectName: tls\nobjectType: cert"))
    assert one(await fetch(backend, p), p).content == leaf.pem


async def test_azure_pfx_certificate_secret_is_key_then_chain_leaf_to_root(
    backend: AzureBackend, vault
) -> None:
    root, mid, leaf = certs.chain()
    # Stored root-first: the backend must reorder leaf -> intermediate -> root.
    secret = {"value": certs.pfx(leaf, [root, mid]), "contentType": "application/x-pkcs12"}
    vault.add("secret", "tls", {**secret, "certificate_backed": True})
    p = plan(objects("objectName: tls\nobjectType: secret"))
    content = one(await fetch(backend, p), p).content
    assert content == leaf.key_pem + leaf.pem + mid.pem + root.pem
    assert content.startswith(b"-----BEGIN PRIVATE KEY-----")


async def test_azure_pem_certificate_secret_is_written_as_stored(
    backend: AzureBackend, vault
) -> None:
    _root, mid, leaf = certs.chain()
    stored = (leaf.key_pem + leaf.pem + mid.pem).decode()
    body = {"value": stored, "contentType": "application/x-pem-file", "certificate_backed": True}
    vault.add("secret", "tls", body)
    p = plan(objects("objectName: tls\nobjectType: secret"))
    assert one(await fetch(backend, p), p).content == stored.encode()


async def test_azure_pfx_format_is_base64_pfx_and_base64_encoding_decodes(
    backend: AzureBackend, vault
) -> None:
    root, mid, leaf = certs.chain()
    stored = certs.pfx(leaf, [mid, root])
    body = {"value": stored, "contentType": "application/x-pkcs12", "certificate_backed": True}
    version = vault.add("secret", "tls", body)
    p = plan(
        objects(
            "objectName: tls\nobjectType: secret\nobjectFormat: PFX\nobjectAlias: tls.pfx.b64",
            "objectName: tls\nobjectType: secret\nobjectFormat: pfx\nobjectEncoding: base64\n"
            "objectAlias: tls.pfx",
        )
    )
    # The binary one is decoded by the backend (its own ref), keeping Key Vault's version id.
    assert p.objects[1].ref.encoding == "base64" and p.objects[1].transforms.identity
    got = await fetch(backend, p)
    text, binary = one(got, p, 0), one(got, p, 1)
    assert text.content == stored.encode()
    assert binary.content == base64.b64decode(stored)
    assert binary.version == text.version == version
    key, cert, _extra = pkcs12.load_key_and_certificates(binary.content, None)
    assert cert == leaf.cert and key is not None


async def test_azure_version_history_newest_first_or_from_object_version(
    backend: AzureBackend, vault
) -> None:
    v1 = vault.add("secret", "rotating", {"value": "one"})
    v2 = vault.add("secret", "rotating", {"value": "two"})
    vault.add("secret", "rotating", {"value": "disabled"}, enabled=False)
    v4 = vault.add("secret", "rotating", {"value": "four"})
    p = plan(
        objects(
            "objectName: rotating\nobjectType: secret\nobjectAlias: all\nobjectVersionHistory: 5",
            f"objectName: rotating\nobjectType: secret\nobjectAlias: old\n"
            f"objectVersionHistory: 2\nobjectVersion: {v2}",
        )
    )
    result = await fetch(backend, p)
    latest = values(result, p, 0)
    assert [v.content for v in latest] == [b"four", b"two", b"one"]
    assert [v.suffix for v in latest] == ["0", "1", "2"]
    assert [v.version for v in latest] == [v4, v2, v1]
    assert [v.version_id for v in latest] == [f"secret/rotating/{i}" for i in range(3)]
    assert [v.content for v in values(result, p, 1)] == [b"two", b"one"]


async def test_azure_version_history_of_certificates(backend: AzureBackend, vault) -> None:
    _r, _m, old = certs.chain()
    _r, _m, new = certs.chain()
    vault.add("cert", "tls", certs.cert_body(old))
    vault.add("cert", "tls", certs.cert_body(new))
    p = plan(objects("objectName: tls\nobjectType: cert\nobjectVersionHistory: 2"))
    got = values(await fetch(backend, p), p)
    assert [x509.load_pem_x509_certificate(v.content) for v in got] == [new.cert, old.cert]
    assert [v.version_id for v in got] == ["cert/tls/0", "cert/tls/1"]


async def test_azure_object_version_pins_a_version(backend: AzureBackend, vault) -> None:
    v1 = vault.add("secret", "s", {"value": "one"})
    vault.add("secret", "s", {"value": "two"})
    p = plan(objects(f"objectName: s\nobjectType: secret\nobjectVersion: {v1}"))
    assert one(await fetch(backend, p), p).content == b"one"


async def test_azure_429_honours_retry_after_then_succeeds(
    azure: Azure, backend: AzureBackend, vault
) -> None:
    vault.add("secret", "busy", {"value": "finally"})
    azure.fake.throttle[("kv1", "secret", "busy")] = 1
    azure.fake.retry_after = "1"
    p = plan(objects("objectName: busy\nobjectType: secret"))
    start = time.monotonic()
    assert one(await fetch(backend, p), p).content == b"finally"
    assert time.monotonic() - start >= 1.0
    gets = [c for c in azure.fake.calls.vault if c[1] == "/secrets/busy/"]
    assert len(gets) == 2  # one 429, one success: the SDK did not retry on its own


async def test_azure_throttled_past_the_retry_deadline_is_unavailable(
    azure: Azure, backend: AzureBackend, vault
) -> None:
    vault.add("secret", "busy", {"value": "x"})
    azure.fake.throttle[("kv1", "secret", "busy")] = 100
    azure.fake.retry_after = "5"
    p = plan(objects("objectName: busy\nobjectType: secret"))
    err = (await fetch(backend, p, seconds=6))[p.objects[0].ref]
    assert type(err).__name__ == "StoreUnavailable"
    assert "kv1" in str(err) and "busy" in str(err) and "429" in str(err)
