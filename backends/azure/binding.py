"""AKS identity bindings (`useAzureTokenProxy: "true"`): the pod's login through the token proxy.

An identity binding lets many clusters use one managed identity without a federated credential
each. The pod's token for `api://AKSIdentityBinding` is the client assertion of `clientID`, as in
workload identity, but the token request goes to the cluster's token proxy (the API server's
address, with the cluster's CA and a TLS server name of its own), which checks the token and the
service account's right to use the identity (RBAC verb `use-managed-identity` on the client id,
API group `cid.wi.aks.azure.com`) and exchanges it with Microsoft Entra.

Followed: upstream's internal/identitybinding/identitybinding.go (the defaults: the proxy URL, the
service account's CA, the server name computed from the cluster id in the API server's
certificate) and pkg/auth/auth.go `getIdentityBindingTokenCredential` (a client-assertion
credential over the proxy transport, instance discovery off). The transport is azure-identity's
own, the one its `WorkloadIdentityCredential(enable_azure_proxy=True)` builds from the
AZURE_KUBERNETES_* variables (aio/_internal/token_binding_transport_aiohttp.py): it moves each
token request to the proxy's origin, keeping the path, sends the server name, trusts the CA and
reloads its file when it changes. We build it per identity over the backend's shared session:
that credential takes its settings from the process environment and the pod's token from a file,
where ours come from the provider's flags and from each Mount.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import ssl
import urllib.parse
from dataclasses import dataclass
from typing import Any

from backends.azure.options import DEFAULT_PROXY_CA_FILE, DEFAULT_PROXY_URL, Options
from backends.wire import Resolver
from provider.core.errors import MissingCredential, StoreUnavailable, scrub

AUDIENCE = "api://AKSIdentityBinding"
#: Upstream's resolveServerName: "a" + base32hex(sha256(salt + cluster id)) + ".ests.aks".
_SALT, _PREFIX, _SUFFIX = "identity-binding", "a", ".ests.aks"
#: The API server certificate's DNS name that carries the cluster id.
_SAN_PREFIX, _SAN_SUFFIX = "hcp-kubernetes.", ".svc.cluster.local"
#: Upstream's dial timeout for that handshake, seconds.
PROBE_TIMEOUT = 10.0


def server_name(cluster_id: str) -> str:
    """The token proxy's TLS server name for a cluster id (an RFC 1035 label, lowercase)."""
    digest = hashlib.sha256((_SALT + cluster_id).encode()).digest()
    return (_PREFIX + base64.b32hexencode(digest).decode().rstrip("=") + _SUFFIX).lower()


@dataclass(frozen=True)
class TokenProxy:
    """Where and how the pod's login goes: part of the identity key."""

    url: str
    server_name: str
    #: The CA bundle trusted for the proxy; "" for the system's.
    ca_file: str

    def key_parts(self) -> tuple[str, ...]:
        return ("proxy", self.url, self.server_name, self.ca_file or "system-cas")

    def describe(self) -> str:
        return f"the AKS token proxy {self.url} (server name {self.server_name})"


class ProxyUntrusted(MissingCredential):
    """The token proxy is not the one the provider was told to trust (its CA, its server name):
    a provider setting to fix, not the pod's, and retrying will not help."""


def check_url(url: str) -> str:
    """azure-identity's rules for the proxy URL (TokenBindingTransportMixin._validate_url),
    checked when the backend is built, naming the flag (ValueError)."""
    try:
        parsed = urllib.parse.urlparse(url)
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:
        parsed, port_ok = urllib.parse.urlparse(""), False
    if (
        not port_ok
        or parsed.scheme != "https"
        or not parsed.hostname
        or parsed.username
        or parsed.password
        or parsed.query
        or parsed.fragment
    ):
        raise ValueError(
            f"--azure-token-proxy-url {url!r}: expected an https:// URL without user, query or "
            "fragment"
        )
    return url.rstrip("/")


class ProxySettings:
    """The provider's token proxy, resolved on first use and then kept: the flags, else
    upstream's defaults (the server name then costs one TLS handshake with the API server)."""

    def __init__(self, options: Options) -> None:
        self.url = check_url(options.token_proxy_url or DEFAULT_PROXY_URL)
        parsed = urllib.parse.urlparse(self.url)
        self.host, self.port = (parsed.hostname or "").lower(), parsed.port or 443
        self._name = (options.sni_name or "").strip()
        self._ca_file = options.token_proxy_ca_file or ""
        self._resolved: TokenProxy | None = None
        self._lock = asyncio.Lock()

    async def resolve(self, resolver: Resolver) -> TokenProxy:
        if self._resolved is None:
            async with self._lock:
                if self._resolved is None:
                    self._resolved = await self._resolve(resolver)
        return self._resolved

    async def _resolve(self, resolver: Resolver) -> TokenProxy:
        ca_file = self._ca_file
        if not ca_file and await asyncio.to_thread(os.path.isfile, DEFAULT_PROXY_CA_FILE):
            ca_file = DEFAULT_PROXY_CA_FILE
        name = self._name or server_name(await self._cluster_id(ca_file, resolver))
        return TokenProxy(self.url, name, ca_file)

    async def _cluster_id(self, ca_file: str, resolver: Resolver) -> str:
        """The id in the `hcp-kubernetes.<id>.svc.cluster.local` name of the certificate the
        proxy's address presents under its own host name (upstream's extractClusterID)."""
        where = f"identity binding: the API server {self.host}:{self.port}"
        fix = "or set --azure-sni-name to the token proxy's server name"
        try:
            context = await asyncio.to_thread(ssl.create_default_context, cafile=ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ProxyUntrusted(
                f"identity binding: --azure-token-proxy-ca-file {ca_file}: {scrub(exc)}"
            ) from None
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                found = await resolver.resolve(self.host, self.port)
                if not found:
                    raise OSError(f"{self.host} has no address")
                _, writer = await asyncio.open_connection(
                    found[0]["host"], self.port, ssl=context, server_hostname=self.host
                )
        except ssl.SSLError as exc:
            raise ProxyUntrusted(
                f"{where} failed TLS verification ({tls_text(exc)}); check "
                f"--azure-token-proxy-ca-file (trusted: {ca_file or 'the system CAs'}) {fix}"
            ) from None
        except (OSError, TimeoutError) as exc:
            raise StoreUnavailable(
                f"{where}, whose certificate names the cluster (the token proxy's server name "
                f"is derived from it), is unreachable: {scrub(exc)}; {fix}"
            ) from None
        cert = writer.get_extra_info("peercert") or {}
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
        for kind, name in cert.get("subjectAltName", ()):
            if kind == "DNS" and name.startswith(_SAN_PREFIX) and name.endswith(_SAN_SUFFIX):
                cluster = name[len(_SAN_PREFIX) : -len(_SAN_SUFFIX)]
                if cluster:
                    return str(cluster)
        raise ProxyUntrusted(
            f"{where} presents a certificate without a cluster id (no DNS name "
            f"{_SAN_PREFIX}<id>{_SAN_SUFFIX}): it is not an AKS API server; set "
            "--azure-token-proxy-url to the token proxy, " + fix.removeprefix("or ")
        )


async def transport(proxy: TokenProxy, session: Any) -> Any:
    """azure-identity's token proxy transport over `session` (the backend's; not closed with it).
    Built on a thread: it reads the CA file."""
    try:
        from azure.identity.aio._internal.token_binding_transport_aiohttp import (
            CustomAioHttpTransport,
        )
    except ImportError:
        raise MissingCredential(
            "identity binding (useAzureTokenProxy) needs azure-identity 1.27 or later in the "
            "provider: its token proxy transport is missing"
        ) from None
    try:
        return await asyncio.to_thread(
            CustomAioHttpTransport,
            session=session,
            session_owner=False,
            sni=proxy.server_name,
            proxy_endpoint=proxy.url,
            ca_file=proxy.ca_file or None,
        )
    except (ValueError, ssl.SSLError) as exc:
        raise ProxyUntrusted(
            f"identity binding: the token proxy's CA ({proxy.ca_file}): {scrub(exc)}; check "
            "--azure-token-proxy-ca-file"
        ) from None


def tls_text(exc: BaseException) -> str:
    """What a TLS failure says, the verification error's own words when there is one."""
    message = getattr(exc, "verify_message", None) or getattr(exc, "reason", None)
    return scrub(message or exc)


def tls_failure(exc: BaseException) -> BaseException | None:
    """The TLS error inside an SDK transport error (azure-core's ServiceRequestError around
    aiohttp's ClientSSLError around ssl's), or None when the failure was not TLS."""
    current: BaseException | None = exc
    for _ in range(8):
        if current is None:
            return None
        # aiohttp's errors are ssl.SSLError too: the ssl module's own error is inside.
        inner = getattr(current, "certificate_error", None) or getattr(current, "os_error", None)
        if isinstance(inner, ssl.SSLError):
            return inner
        if isinstance(current, ssl.SSLError):
            return current
        nested = getattr(current, "inner_exception", None)
        current = nested if isinstance(nested, BaseException) else current.__cause__
    return None
