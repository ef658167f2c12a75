"""TLS verification is on by default for every store: against a server whose certificate the
provider was not told to trust, every backend fails the mount and sends no request (so no token
or credential crosses an unverified connection)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from backends.aws.options import Options as AwsOptions
from backends.azure.options import Options as AzureOptions
from backends.gcp.options import Options as GcpOptions
from devkit import certs
from devkit.ports import free_port
from devkit.testing import Harness, make_pod
from devkit.tokens import SigningKey
from provider.core.errors import BridgeError
from provider.mount.mounting import MountInput

NAMES = ["localhost", "login.microsoftonline.com", "kv.vault.azure.net", "sts.googleapis.com"]


class Untrusted:
    def __init__(self) -> None:
        self.requests = 0
        self.port = free_port()

    async def handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        return web.json_response({})


@pytest.fixture
async def untrusted(tmp_path: Path) -> AsyncIterator[Untrusted]:
    # Self-signed, for every name the stores are reached by: valid but not trusted.
    cert = certs.issue("untrusted", sans=NAMES, ips=["127.0.0.1"])
    (tmp_path / "cert.pem").write_bytes(cert.pem)
    (tmp_path / "key.pem").write_bytes(cert.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server = Untrusted()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.handle)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", server.port, ssl_context=context).start()
    yield server
    await runner.cleanup()


def cases(port: int) -> dict[str, tuple[dict[str, str], dict[str, Any]]]:
    url = f"https://127.0.0.1:{port}"
    return {
        "vault": (
            {
                "backend": "vault",
                "roleName": "app",
                "vaultAddress": url,
                "objects": yaml.safe_dump([{"objectName": "a", "secretPath": "secret/a"}]),
            },
            {},
        ),
        "aws": (
            {
                "backend": "aws",
                "region": "us-east-1",
                "roleArn": "arn:aws:iam::123456789012:role/app",
                "objects": yaml.safe_dump([{"objectName": "a", "objectType": "secretsmanager"}]),
            },
            {"aws": AwsOptions(endpoints=f"us-east-1={url}", sts_endpoint=url)},
        ),
        "gcp": (
            {
                "backend": "gcp",
                "secrets": yaml.safe_dump(
                    [{"resourceName": "projects/p/secrets/a/versions/1", "path": "a"}]
                ),
            },
            {
                "gcp": GcpOptions(
                    project="p",
                    sts_endpoint=f"{url}/v1/token",
                    secretmanager_endpoint=f"127.0.0.1:{port}",
                )
            },
        ),
        "azure": (
            {
                "backend": "azure",
                "keyvaultName": "kv",
                "tenantID": "11111111-2222-3333-4444-555555555555",
                "clientID": "aaaaaaaa-0000-0000-0000-000000000001",
                "objects": "array:\n  - |\n    objectName: a\n    objectType: secret\n",
            },
            {"azure": AzureOptions(connect_to=f"127.0.0.1:{port}")},
        ),
    }


@pytest.mark.parametrize("backend", ["vault", "aws", "gcp", "azure"])
async def test_tls_is_verified_by_default(
    untrusted: Untrusted, tmp_path: Path, backend: str
) -> None:
    params, options = cases(untrusted.port)[backend]
    tokens = SigningKey.generate()
    pod = make_pod(
        tokens={
            aud: tokens.pod_token("default", "app", aud)
            for aud in ("vault", "sts.amazonaws.com", "api://AzureADTokenExchange", "p.svc.id.goog")
        }
    )
    h = Harness(tmp_path, options=options)
    try:
        with pytest.raises(BridgeError) as info:
            await h.mounter.mount(MountInput(params=params, pod=pod, permission=0o644), budget=6)
    finally:
        await h.backends.close()
    assert untrusted.requests == 0, "a request crossed an unverified TLS connection"
    assert "eyJ" not in str(info.value)
