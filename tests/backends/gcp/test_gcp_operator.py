"""Issue 15: --gcp-ca-file is the trust of every Google token request (a nodePublishSecretRef
key.json, the provider's own Application Default Credentials, STS), and a certificate failure
says so, naming the endpoint and the flag, instead of "cannot reach Google"."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.gcp.dialect import GcpRef
from backends.gcp.store import GcpBackend
from devkit.certs import ServerTLS, server_tls
from devkit.google import start_http
from devkit.testing import fetch_ctx, make_pod
from provider.core.errors import StoreUnavailable
from tests.backends.gcp.conftest import Stack
from tests.backends.gcp.test_gcp_fetch import DB, service_account_key, spc, values

EMAIL = "keyed@proj.iam.gserviceaccount.com"


@pytest.fixture
async def https(stack: Stack, tmp_path: Path) -> AsyncIterator[tuple[ServerTLS, str]]:
    """The stack's fake Google token endpoints over HTTPS, with a certificate from a CA that
    only the returned ServerTLS's ca_file holds."""
    cert = server_tls(tmp_path, "localhost", ips=["127.0.0.1"])
    runner, url = await start_http(stack.google, cert.context())
    try:
        yield cert, url
    finally:
        await runner.cleanup()


def _keyed(stack: Stack, url: str, ca_file: str | None) -> GcpBackend:
    # The key's token_uri is on the origin of --gcp-sts-endpoint, so the provider accepts it.
    return stack.rebuild(sts_endpoint=f"{url}/v1/token", iam_endpoint=url, ca_file=ca_file)


def _assert_certificate_error(error: BaseException, endpoint: str, ca_file: str | None) -> None:
    text = str(error)
    assert isinstance(error, StoreUnavailable), repr(error)
    assert "certificate" in text and "TLS" in text, text
    assert endpoint in text, text
    assert "--gcp-ca-file" in text, text
    if ca_file:
        assert ca_file in text, text
    assert "cannot reach Google" not in text, text
    assert not error.transient  # retrying within the Mount would not change the certificate


async def test_gcp_key_json_token_request_trusts_gcp_ca_file(
    stack: Stack, https: tuple[ServerTLS, str]
) -> None:
    cert, url = https
    name = stack.google.add_version(DB, "keyed-over-tls", f"gsa:{EMAIL}")
    plan = stack.plan(spc(name))
    pod = make_pod(secrets={"key.json": service_account_key(f"{url}/oauth2/token", EMAIL)})
    backend = _keyed(stack, url, str(cert.ca_file))
    got = await backend.fetch(plan, await backend.identify(plan, pod), [GcpRef(name)], fetch_ctx())
    assert values(got[GcpRef(name)]).content == b"keyed-over-tls"
    assert len(stack.google.oauth_requests) == 1


async def test_gcp_key_json_untrusted_token_endpoint_is_a_certificate_error(
    stack: Stack, https: tuple[ServerTLS, str], tmp_path: Path
) -> None:
    _cert, url = https
    name = stack.google.add_version(DB, "x", f"gsa:{EMAIL}")
    plan = stack.plan(spc(name))
    token_uri = f"{url}/oauth2/token"
    pod = make_pod(secrets={"key.json": service_account_key(token_uri, EMAIL)})
    # No --gcp-ca-file: the system's CAs do not know the test CA.
    backend = _keyed(stack, url, None)
    with pytest.raises(StoreUnavailable) as err:
        await backend.fetch(plan, await backend.identify(plan, pod), [GcpRef(name)], fetch_ctx(5))
    _assert_certificate_error(err.value, token_uri, None)
    # A --gcp-ca-file of another CA: the message names that file.
    other = server_tls(tmp_path / "other", "localhost")
    backend = _keyed(stack, url, str(other.ca_file))
    with pytest.raises(StoreUnavailable) as err:
        await backend.fetch(plan, await backend.identify(plan, pod), [GcpRef(name)], fetch_ctx(5))
    _assert_certificate_error(err.value, token_uri, str(other.ca_file))
    # The signed assertion never reached the endpoint.
    assert stack.google.oauth_requests == []


async def test_gcp_sts_untrusted_endpoint_is_a_certificate_error(
    stack: Stack, https: tuple[ServerTLS, str]
) -> None:
    _cert, url = https
    name = stack.google.add_version(DB, "x", "ksa:default/app")
    plan, pod = stack.plan(spc(name)), stack.pod()
    backend = stack.rebuild(sts_endpoint=f"{url}/v1/token")
    with pytest.raises(StoreUnavailable) as err:
        await backend.fetch(plan, await backend.identify(plan, pod), [GcpRef(name)], fetch_ctx(5))
    _assert_certificate_error(err.value, f"{url}/v1/token", None)
    assert stack.google.sts_requests == []


async def test_gcp_provider_adc_token_request_trusts_gcp_ca_file(
    stack: Stack,
    https: tuple[ServerTLS, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cert, url = https
    node = "node@proj.iam.gserviceaccount.com"
    name = stack.google.add_version(DB, "node-over-tls", f"gsa:{node}")
    plan = stack.plan({"auth": "provider-adc", **spc(name)})
    # The provider's Application Default Credentials: a key file whose token_uri is the fake
    # Google over HTTPS, found through GOOGLE_APPLICATION_CREDENTIALS as on a node.
    token_uri = f"{url}/oauth2/token"
    adc = tmp_path / "adc.json"
    adc.write_text(service_account_key(token_uri, node))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    for variable in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(variable, raising=False)
    core = {"allow_node_identity_namespaces": frozenset({"default"})}
    pod = make_pod()

    trusting = stack.rebuild(core, ca_file=str(cert.ca_file))
    got = await trusting.fetch(
        plan, await trusting.identify(plan, pod), [GcpRef(name)], fetch_ctx()
    )
    assert values(got[GcpRef(name)]).content == b"node-over-tls"
    assert len(stack.google.oauth_requests) == 1

    untrusting = stack.rebuild(core)
    with pytest.raises(StoreUnavailable) as err:
        identity = await untrusting.identify(plan, pod)
        await untrusting.fetch(plan, identity, [GcpRef(name)], fetch_ctx(5))
    _assert_certificate_error(err.value, token_uri, None)
    assert len(stack.google.oauth_requests) == 1
