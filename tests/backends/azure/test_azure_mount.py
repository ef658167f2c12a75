"""Whole Mounts through the real provider (gRPC on a Unix socket) against the fake Azure."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from devkit import certs
from devkit.serving import serving
from devkit.testing import driver_request
from tests.backends.azure.conftest import CLIENT, POD_TOKEN, TENANT, Azure
from tests.backends.azure.test_azure_fetch import objects

HERE = Path(__file__).parent
AUDIENCE = "api://AzureADTokenExchange"


def request(parameters: dict[str, str], token: str = POD_TOKEN) -> Any:
    return driver_request(parameters, tokens={AUDIENCE: token}, spc="azure-kvname-wi")


@pytest.fixture
async def provider(azure: Azure, tmp_path: Path) -> AsyncIterator[Any]:
    async with serving(tmp_path, backend_options={"azure": azure.options}) as provider:
        yield provider.stub


async def test_azure_upstream_documented_class_mounts(azure: Azure, provider: Any) -> None:
    root, mid, leaf = certs.chain()
    vault = azure.fake.vault("kvname", TENANT)
    vault.access[CLIENT] = "*"
    v_secret = vault.add("secret", "secret1", {"value": "hello"})
    key1 = certs.issue("k").key
    vault.add("key", "key1", {"key": certs.jwk(key1)})
    vault.add("cert", "cert1", certs.cert_body(leaf))
    vault.add("key", "cert1", {"key": certs.jwk(leaf.key)})
    body = {"value": certs.pfx(leaf, [root, mid]), "contentType": "application/x-pkcs12"}
    vault.add("secret", "cert1", {**body, "certificate_backed": True})
    spc = yaml.safe_load((HERE / "spc_upstream_docs.yaml").read_text())

    reply = await provider.Mount(request(spc["spec"]["parameters"]), timeout=10)
    assert not reply.error.code
    assert {f.path: (f.mode, f.contents) for f in reply.files} == {
        "secret1": (0o644, b"hello"),
        "key1": (0o644, certs.public_pem(key1)),
        "cert1": (0o644, leaf.pem),
        "cert1-pub-key": (0o644, certs.public_pem(leaf.key)),
        "cert1-secret": (0o644, leaf.key_pem + leaf.pem + mid.pem + root.pem),
    }
    versions = {v.id: v.version for v in reply.object_version}
    # Upstream's ids (`<objectType>/<objectName>`); the version is Key Vault's, not a hash.
    assert versions["secret/secret1"] == v_secret
    assert set(versions) == {
        "secret/secret1",
        "key/key1",
        "cert/cert1",
        "key/cert1",
        "secret/cert1",
    }


async def test_azure_mount_history_encoding_and_modes(azure: Azure, provider: Any) -> None:
    vault = azure.fake.vault("kvname", TENANT)
    vault.access[CLIENT] = "*"
    v1 = vault.add("secret", "api-key", {"value": "first"})
    v2 = vault.add("secret", "api-key", {"value": "second"})
    vault.add("secret", "blob", {"value": base64.b64encode(b"\x00\x01binary").decode()})
    parameters = {
        "backend": "azure",
        "keyvaultName": "kvname",
        "tenantID": TENANT,
        "clientID": CLIENT,
        "objects": objects(
            "objectName: api-key\nobjectType: secret\nobjectAlias: keys\nobjectVersionHistory: 2",
            "objectName: blob\nobjectType: secret\nobjectEncoding: base64\nfilePermission: '0400'",
        ),
    }
    reply = await provider.Mount(request(parameters), timeout=10)
    assert not reply.error.code
    assert {f.path: (f.mode, f.contents) for f in reply.files} == {
        "keys/0": (0o644, b"second"),
        "keys/1": (0o644, b"first"),
        "blob": (0o400, b"\x00\x01binary"),
    }
    versions = {v.id: v.version for v in reply.object_version}
    assert versions["secret/api-key/0"] == v2 and versions["secret/api-key/1"] == v1


async def test_azure_mount_denied_names_vault_object_and_identity(
    azure: Azure, provider: Any
) -> None:
    vault = azure.fake.vault("kvname", TENANT)
    vault.add("secret", "theirs", {"value": "x"})
    parameters = {
        "backend": "azure",
        "keyvaultName": "kvname",
        "tenantId": TENANT,
        "clientID": CLIENT,
        "objects": objects("objectName: theirs\nobjectType: secret"),
    }
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await provider.Mount(request(parameters), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    details = err.value.details() or ""
    assert "kvname" in details and "'theirs'" in details and "default/app" in details
    assert POD_TOKEN not in details and "at-" not in details


async def test_azure_object_versions_are_key_vault_version_ids(azure: Azure, provider: Any) -> None:
    """Issue 33: each secret's ObjectVersion is the version id the vault assigned (the last
    segment of the secret's id, as upstream reports it) — latest, aliased, pinned, decoded with
    objectEncoding, in a history — and keys' and certificates' too; only a file our own
    extensions derive (`extract`) gets an HMAC."""
    _root, _mid, leaf = certs.chain()
    vault = azure.fake.vault("kvname", TENANT)
    vault.access[CLIENT] = "*"
    old = vault.add("secret", "db", {"value": "old"})
    latest = vault.add("secret", "db", {"value": "new"})
    b64 = vault.add("secret", "blob", {"value": base64.b64encode(b"\x00bin").decode()})
    hexed = vault.add("secret", "hexed", {"value": b"\x01\x02".hex()})
    as_json = vault.add("secret", "conf", {"value": '{"password": "pw"}'})
    key = vault.add("key", "signing", {"key": certs.jwk(certs.issue("k").key)})
    cert = vault.add("cert", "tls", certs.cert_body(leaf))
    parameters = {
        "backend": "azure",
        "keyvaultName": "kvname",
        "tenantID": TENANT,
        "clientID": CLIENT,
        "objects": objects(
            "objectName: db\nobjectType: secret",
            f"objectName: db\nobjectType: secret\nobjectAlias: db-old\nobjectVersion: {old}",
            "objectName: db\nobjectType: secret\nobjectAlias: db-history\nobjectVersionHistory: 2",
            "objectName: blob\nobjectType: secret\nobjectEncoding: base64",
            "objectName: hexed\nobjectType: secret\nobjectEncoding: hex",
            "objectName: conf\nobjectType: secret\nobjectEncoding: utf-8",
            "objectName: conf\nobjectType: secret\nobjectAlias: password\nextract: password",
            "objectName: signing\nobjectType: key",
            "objectName: tls\nobjectType: cert",
        ),
    }
    reply = await provider.Mount(request(parameters), timeout=10)
    assert not reply.error.code
    files = {f.path: f.contents for f in reply.files}
    assert files["db"] == b"new" and files["db-old"] == b"old"
    assert files["blob"] == b"\x00bin" and files["hexed"] == b"\x01\x02"
    assert files["password"] == b"pw"
    versions = [(v.id, v.version) for v in reply.object_version]
    assert versions == [
        ("secret/db", latest),
        ("secret/db", old),
        ("secret/db/0", latest),
        ("secret/db/1", old),
        ("secret/blob", b64),
        ("secret/hexed", hexed),
        ("secret/conf", as_json),
        ("secret/conf", versions[7][1]),
        ("key/signing", key),
        ("cert/tls", cert),
    ]
    # Our extension's file: an HMAC (32 hex), not the vault's id of the secret it came from.
    assert re.fullmatch(r"[0-9a-f]{32}", versions[7][1]) and versions[7][1] != as_json
    # The ids above are the vault's own: the last segment of each object's id on the wire.
    assert all(re.fullmatch(r"[0-9a-f]{32}", v) for v in (latest, old, b64, hexed, key, cert))


async def test_azure_object_encoding_refuses_a_value_not_so_encoded(
    azure: Azure, provider: Any
) -> None:
    vault = azure.fake.vault("kvname", TENANT)
    vault.access[CLIENT] = "*"
    vault.add("secret", "blob", {"value": "not base64! s3cr3t"})
    parameters = {
        "backend": "azure",
        "keyvaultName": "kvname",
        "tenantID": TENANT,
        "clientID": CLIENT,
        "objects": objects("objectName: blob\nobjectType: secret\nobjectEncoding: base64"),
    }
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await provider.Mount(request(parameters), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert "'blob'" in details and "not valid base64" in details and "objectEncoding" in details
    assert "s3cr3t" not in details
