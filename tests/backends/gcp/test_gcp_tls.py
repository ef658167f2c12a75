"""The production transport: TLS to Secret Manager and HTTPS to STS, trusting --gcp-ca-file."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from backends.gcp.dialect import GcpRef
from provider.core.errors import StoreUnavailable
from tests.backends.gcp.certs import ServerCert, make_server_cert
from tests.backends.gcp.conftest import Stack
from tests.backends.gcp.fake_google import http_app, start_secret_manager
from tests.helpers import fetch_ctx

KSA = "ksa:default/app"


@pytest.fixture
async def tls(stack: Stack, tmp_path: Path) -> AsyncIterator[tuple[ServerCert, int, str]]:
    """A TLS Secret Manager and an HTTPS STS/IAM on the stack's fake Google."""
    cert = make_server_cert(tmp_path)
    server, port = await start_secret_manager(
        stack.google, "tls", regional=False, tls=(cert.key_pem, cert.cert_pem)
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert.cert_file, cert.key_file)
    runner = web.AppRunner(http_app(stack.google), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    https_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield cert, port, f"https://localhost:{https_port}"
    finally:
        await server.stop(None)
        await runner.cleanup()


async def test_gcp_tls_with_ca_file(stack: Stack, tls: tuple[ServerCert, int, str]) -> None:
    cert, port, https = tls
    name = stack.google.add_version("projects/proj/secrets/db", "over-tls", KSA)
    backend = stack.rebuild(
        secretmanager_endpoint=f"localhost:{port}",
        sts_endpoint=f"{https}/v1/token",
        iam_endpoint=https,
        local_channel=False,
        ca_file=str(cert.ca_file),
    )
    plan, pod = stack.plan({"secrets": f"- {{resourceName: {name}, path: a}}"}), stack.pod()
    got = await backend.fetch(plan, await backend.identify(plan, pod), [GcpRef(name)], fetch_ctx())
    result = got[GcpRef(name)]
    assert not isinstance(result, BaseException), result
    assert result[0].content == b"over-tls"
    assert stack.google.reads == [("tls", name, KSA)]
    await backend.close()


async def test_gcp_tls_refuses_an_untrusted_server(
    stack: Stack, tls: tuple[ServerCert, int, str]
) -> None:
    _cert, port, https = tls
    name = stack.google.add_version("projects/proj/secrets/db", "x", KSA)
    plan, pod = stack.plan({"secrets": f"- {{resourceName: {name}, path: a}}"}), stack.pod()
    # Secret Manager over TLS without our CA: the call fails, nothing is read.
    untrusted = stack.rebuild(secretmanager_endpoint=f"localhost:{port}", local_channel=False)
    got = await untrusted.fetch(
        plan, await untrusted.identify(plan, pod), [GcpRef(name)], fetch_ctx(0.9)
    )
    assert isinstance(got[GcpRef(name)], StoreUnavailable)
    await untrusted.close()
    # STS over HTTPS without our CA: the pod's token is never sent.
    no_ca = stack.rebuild(sts_endpoint=f"{https}/v1/token")
    with pytest.raises(StoreUnavailable):
        await no_ca.fetch(plan, await no_ca.identify(plan, pod), [GcpRef(name)], fetch_ctx(0.9))
    await no_ca.close()
    assert stack.google.reads == []
    assert len(stack.google.sts_requests) == 1  # the first backend's, over plain HTTP
