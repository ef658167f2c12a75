"""The production transport: TLS to Secret Manager and HTTPS to STS, trusting --gcp-ca-file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.gcp.dialect import GcpRef
from devkit.certs import ServerTLS, server_tls
from devkit.google import start_http, start_secret_manager
from devkit.testing import fetch_ctx
from provider.core.errors import StoreUnavailable
from tests.backends.gcp.conftest import Stack

KSA = "ksa:default/app"


@pytest.fixture
async def tls(stack: Stack, tmp_path: Path) -> AsyncIterator[tuple[ServerTLS, int, str]]:
    """A TLS Secret Manager and an HTTPS STS/IAM on the stack's fake Google."""
    cert = server_tls(tmp_path, "localhost", ips=["127.0.0.1"])
    server, port = await start_secret_manager(
        stack.google, "tls", regional=False, tls=(cert.key_pem, cert.cert_pem)
    )
    runner, https = await start_http(stack.google, cert.context())
    try:
        yield cert, port, https
    finally:
        await server.stop(None)
        await runner.cleanup()


async def test_gcp_tls_with_ca_file(stack: Stack, tls: tuple[ServerTLS, int, str]) -> None:
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
    stack: Stack, tls: tuple[ServerTLS, int, str]
) -> None:
    _cert, port, https = tls
    name = stack.google.add_version("projects/proj/secrets/db", "x", KSA)
    plan, pod = stack.plan({"secrets": f"- {{resourceName: {name}, path: a}}"}), stack.pod()
    # Secret Manager over TLS without our CA: the call fails, nothing is read.
    untrusted = stack.rebuild(secretmanager_endpoint=f"localhost:{port}", local_channel=False)
    got = await untrusted.fetch(
        plan, await untrusted.identify(plan, pod), [GcpRef(name)], fetch_ctx(0.9)
    )
    error = got[GcpRef(name)]
    assert isinstance(error, StoreUnavailable)
    # Named as what it is, not as an outage: not retried, and the fix is in the message.
    assert "TLS certificate is not trusted" in str(error), error
    assert "--gcp-ca-file" in str(error) and not error.transient
    await untrusted.close()
    # STS over HTTPS without our CA: the pod's token is never sent.
    no_ca = stack.rebuild(sts_endpoint=f"{https}/v1/token")
    with pytest.raises(StoreUnavailable):
        await no_ca.fetch(plan, await no_ca.identify(plan, pod), [GcpRef(name)], fetch_ctx(0.9))
    await no_ca.close()
    assert stack.google.reads == []
    assert len(stack.google.sts_requests) == 1  # the first backend's, over plain HTTP
