"""The AKS token proxy of identity bindings, a wire fake beside the Entra of devkit/azure.py.

Built from what upstream's provider and azure-identity's token proxy transport expect of it
(backends/azure/binding.py names the files). One TLS port, two faces chosen by the server name
the client sends:
- any other name: the API server, with a certificate for its in-cluster names and
  `hcp-kubernetes.<cluster id>.svc.cluster.local` (from which clients compute the proxy's name);
- the proxy's name, `a<base32hex(sha256("identity-binding" + cluster id))>.ests.aks`: the token
  proxy, with a certificate for that name only.
Both are issued by the cluster's CA (`ca_file`). A token request (Entra's path,
`/<tenant>/oauth2/v2.0/token`, under the proxy's origin) is answered only on a connection that
named the proxy. Its client assertion must be a service-account token the cluster signed (the
`SigningKey`: signature, expiry, not-before), for audience api://AKSIdentityBinding, whose subject
may use the client id (`allowed`: the ClusterRole verb use-managed-identity); the proxy then
exchanges it with the fake Entra, which accepts it when the client id has an identity binding to
this cluster (`bindings`), and relays Entra's answer.
"""

from __future__ import annotations

import base64
import hashlib
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from aiohttp import web

from devkit import certs
from devkit.azure import FakeAzure
from devkit.ports import serve_app
from devkit.tokens import SigningKey

AUDIENCE = "api://AKSIdentityBinding"
JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
#: The names the API server's certificate carries besides the cluster id's.
API_SERVER_NAMES = ["kubernetes.default.svc.cluster.local", "kubernetes.default.svc", "localhost"]


def proxy_name(cluster_id: str) -> str:
    """The proxy's server name, written from upstream's resolveServerName independently of the
    provider's own (so a test compares the two)."""
    digest = hashlib.sha256(f"identity-binding{cluster_id}".encode()).digest()
    return "a" + base64.b32hexencode(digest).decode().rstrip("=").lower() + ".ests.aks"


@dataclass
class Call:
    server_name: str
    path: str
    client_id: str
    #: The assertion's subject, when it had one that verified.
    subject: str = ""


@dataclass
class FakeTokenProxy:
    entra: FakeAzure
    signer: SigningKey
    cluster_id: str = "c0ffee0123"
    #: client id -> subjects (system:serviceaccount:<ns>:<sa>) that may use the identity.
    allowed: dict[str, set[str]] = field(default_factory=dict)
    #: (tenant, client id) pairs with an identity binding to this cluster.
    bindings: set[tuple[str, str]] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    _proxy_context: ssl.SSLContext | None = field(default=None, init=False, repr=False)

    @property
    def server_name(self) -> str:
        return proxy_name(self.cluster_id)

    def allow(self, tenant: str, client: str, namespace: str, service_account: str) -> None:
        """Bind `client` to the cluster and let the service account use it."""
        self.bindings.add((tenant, client))
        subject = f"system:serviceaccount:{namespace}:{service_account}"
        self.allowed.setdefault(client, set()).add(subject)

    def tls(self, directory: Path) -> tuple[Path, ssl.SSLContext]:
        """The cluster CA's file, and the server context that picks a face by server name."""
        ca = certs.issue("cluster CA", ca=True)
        sans = [*API_SERVER_NAMES, f"hcp-kubernetes.{self.cluster_id}.svc.cluster.local"]
        api = certs.issue("kube-apiserver", ca, sans=sans, ips=["127.0.0.1"])
        proxy = certs.issue(self.server_name, ca, sans=[self.server_name])
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cluster-ca.pem").write_bytes(ca.pem)
        api_context = _server_context(directory, "api-server", api)
        proxy_context = _server_context(directory, "token-proxy", proxy)

        def pick(conn: Any, name: str | None, _: ssl.SSLContext) -> None:
            if name == self.server_name:
                conn.context = proxy_context

        api_context.sni_callback = pick
        self._proxy_context = proxy_context
        return directory / "cluster-ca.pem", api_context

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        tls = request.transport.get_extra_info("ssl_object") if request.transport else None
        on_proxy = tls is not None and tls.context is self._proxy_context
        parts = request.path.strip("/").split("/")
        if request.method != "POST" or len(parts) != 4 or parts[1:] != ["oauth2", "v2.0", "token"]:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        form = {k: str(v) for k, v in (await request.post()).items()}
        call = Call("proxy" if on_proxy else "api-server", request.path, form.get("client_id", ""))
        self.calls.append(call)
        if not on_proxy:
            return _refused(
                421, "invalid_request", "misdirected: not the token proxy's server name"
            )
        tenant, client = parts[0], call.client_id
        if form.get("client_assertion_type") != JWT_BEARER or "client_assertion" not in form:
            return _refused(400, "invalid_request", "a client assertion is required")
        try:
            claims = self.signer.verify(form["client_assertion"])
        except jwt.InvalidTokenError as exc:
            return _refused(401, "invalid_client", f"service account token rejected: {exc}")
        call.subject = str(claims.get("sub", ""))
        audiences = claims.get("aud")
        if AUDIENCE not in (audiences if isinstance(audiences, list) else [audiences]):
            return _refused(401, "invalid_client", f"the token's audience is not {AUDIENCE}")
        if call.subject not in self.allowed.get(client, set()):
            return _refused(
                403, "unauthorized_client", f"{call.subject} may not use managed identity {client}"
            )
        if self.entra.entra_status is not None:
            return _refused(self.entra.entra_status, "temporarily_unavailable", "Entra is down")
        if (tenant, client) not in self.bindings:
            return _refused(
                401,
                "invalid_client",
                "AADSTS700213: No matching federated identity record found for presented "
                "assertion.",
            )
        return self.entra.token_answer(tenant, client, form.get("scope", ""))


def _server_context(directory: Path, name: str, issued: certs.Issued) -> ssl.SSLContext:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    cert.write_bytes(issued.pem)
    key.write_bytes(issued.key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def _refused(status: int, error: str, description: str) -> web.Response:
    return web.json_response({"error": error, "error_description": description}, status=status)


async def start(proxy: FakeTokenProxy, directory: Path) -> tuple[web.AppRunner, int, Path]:
    """Serve the proxy (and its API server face) on 127.0.0.1: the runner, the port and the
    cluster CA's file."""
    ca_file, context = proxy.tls(directory)
    runner, port = await serve_app(proxy.app(), ssl_context=context)
    return runner, port, ca_file
