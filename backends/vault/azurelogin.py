"""Vault's azure auth method as the pod: a Microsoft Entra access token of its workload identity.

The pod's `api://AzureADTokenExchange` token is the client assertion of the class's client id in
its tenant (backends/clouds/azure.py, as the azure backend logs in), for the
method's configured `resource`; Vault checks the token's signature against the tenant's keys,
its audience, issuer and expiry, and binds its `oid` (or groups) to the role. The login also
carries the class's subscription, resource group and VM / scale set names, which roles with
bound resources check. Never the node's managed identity.

The authority is azure-identity's own choice: AZURE_AUTHORITY_HOST (which the workload identity
webhook sets in pods too), else the public cloud. TLS trusts the system CAs (SSL_CERT_FILE /
SSL_CERT_DIR honoured, as OpenSSL does). The Entra token lives only for the login: the Vault token
is what is cached (auth.py).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any

from backends.clouds.azure import assertion_credential, entra_codes, outage
from backends.proxies import Proxies, proxied_requests
from backends.vault.methods import AzureAuth
from backends.wire import capped_response
from provider.core.backend import BackendEnv
from provider.core.errors import PermissionDenied
from provider.core.identity import pod_token
from provider.core.model import Pod

#: Cap of one Entra answer (a token response is a few KiB).
MAX_ANSWER = 64 * 1024


@dataclass(frozen=True)
class AzurePod:
    """The workload identity the pod logs in as; `token` is never logged or keyed."""

    tenant_id: str
    client_id: str
    token: str = field(default="", repr=False)

    @property
    def key(self) -> str:
        return f"wi:{self.tenant_id}:{self.client_id}"

    def describe(self) -> str:
        return f"Azure workload identity {self.client_id} in tenant {self.tenant_id}"


class AzureSigner:
    """The pod's workload identity (`who`) and its Entra token for the login (`login_data`)."""

    def __init__(self, env: BackendEnv[Any]) -> None:
        self._env = env
        self._request_class = proxied_requests(Proxies.from_env())

    async def who(self, azure: AzureAuth, audience: str, pod: Pod) -> AzurePod:
        """Refused before any cache when the pod's token for `audience` is missing."""
        token = await pod_token(self._env, pod, audience)
        return AzurePod(azure.tenant_id, azure.client_id, token)

    async def login_data(self, azure: AzureAuth, who: AzurePod, subject: str) -> dict[str, str]:
        """The azure login's fields: the Entra token for `resource`, and the resource names."""
        import aiohttp
        from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError
        from azure.core.pipeline.transport import AioHttpTransport

        what = (
            f"Microsoft Entra login of {subject} as {who.describe()} for resource "
            f"{azure.resource!r}"
        )
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl.create_default_context()),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            request_class=self._request_class,
            response_class=capped_response(MAX_ANSWER),
        )
        token = who.token
        transport = AioHttpTransport(session=session, session_owner=False)
        credential = assertion_credential(who.tenant_id, who.client_id, lambda: token, transport)
        try:
            with self._env.metrics.backend_call("vault", "EntraToken"):
                access = await credential.get_token(_scope(azure.resource))
        except (ServiceRequestError, ClientAuthenticationError) as exc:
            raise outage(exc, f"{what}: Microsoft Entra") or PermissionDenied(
                f"{what} was refused ({entra_codes(exc)}); check the federated credential of "
                f"client {who.client_id} (subject system:serviceaccount:"
                f"{subject.replace('/', ':')}, the cluster's issuer, audience of the pod's token)"
            ) from None
        finally:
            await credential.close()
            await session.close()
        return {"jwt": access.token, **azure.login_fields()}


def _scope(resource: str) -> str:
    """Entra's v2 scope for a v1 resource: the token's `aud` is then `resource` exactly (a
    trailing slash included, as Vault's default https://management.azure.com/ has it)."""
    return f"{resource}/.default"
