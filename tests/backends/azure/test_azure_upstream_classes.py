"""A SecretProviderClass from the Azure provider's documentation moves over unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from backends.azure.dialect import parse
from backends.azure.store import AzureBackend
from devkit import certs
from devkit.testing import fetch_ctx, make_pod
from provider.core.model import ParseContext
from tests.backends.azure.conftest import CLIENT, POD_TOKEN, TENANT, Azure

SPC = Path(__file__).with_name("spc_upstream_docs.yaml")
AUDIENCE = "api://AzureADTokenExchange"


async def test_azure_documented_spc_parses_and_fetches(azure: Azure, backend: AzureBackend) -> None:
    root, mid, leaf = certs.chain()
    vault = azure.fake.vault("kvname", TENANT)
    vault.access[CLIENT] = "*"
    vault.add("secret", "secret1", {"value": "hello"})
    key1 = certs.issue("k").key
    vault.add("key", "key1", {"key": certs.jwk(key1)})
    # A Key Vault certificate is three objects of one name: cert, key and (PFX) secret.
    vault.add("cert", "cert1", certs.cert_body(leaf))
    vault.add("key", "cert1", {"key": certs.jwk(leaf.key)})
    body = {"value": certs.pfx(leaf, [root, mid]), "contentType": "application/x-pkcs12"}
    vault.add("secret", "cert1", {**body, "certificate_backed": True})

    spc = yaml.safe_load(SPC.read_text())
    # What the driver sends: the SPC parameters overlaid by the kubelet's pod keys.
    attributes = {
        **spc["spec"]["parameters"],
        "secretProviderClass": "azure-kvname-wi",
        "csi.storage.k8s.io/pod.name": "app-0",
        "csi.storage.k8s.io/pod.namespace": "default",
        "csi.storage.k8s.io/pod.uid": "uid-0",
        "csi.storage.k8s.io/serviceAccount.name": "app",
        "csi.storage.k8s.io/serviceAccount.tokens": json.dumps(
            {AUDIENCE: {"token": POD_TOKEN, "expirationTimestamp": "2030-01-01T00:00:00Z"}}
        ),
    }
    plan = parse(attributes, ParseContext(options=azure.options))
    assert plan.warnings == ()
    assert [s.name for s in plan.objects] == [
        "secret1",
        "key1",
        "cert1",
        "cert1-pub-key",
        "cert1-secret",
    ]

    identity = await backend.identify(plan, make_pod(tokens={AUDIENCE: POD_TOKEN}))
    refs = list(dict.fromkeys(s.ref for s in plan.objects))
    result = await backend.fetch(plan, identity, refs, fetch_ctx())
    files = {}
    for spec in plan.objects:
        [value] = result[spec.ref]  # type: ignore[misc]
        files[spec.name] = value.content
    assert files == {
        "secret1": b"hello",
        "key1": certs.public_pem(key1),
        "cert1": leaf.pem,
        "cert1-pub-key": certs.public_pem(leaf.key),
        "cert1-secret": leaf.key_pem + leaf.pem + mid.pem + root.pem,
    }
