"""Who the pod is to Microsoft Entra, and the credential that logs it in.

Four ways, chosen by the parameters (dialect.AuthMode):
- workload identity: the pod's `api://AzureADTokenExchange` token is the client assertion for
  `clientID` in `tenantID` (the identity federated with the pod's service account);
- identity binding: the pod's `api://AKSIdentityBinding` token, the same exchange sent through
  the cluster's token proxy (binding.py);
- service principal: `clientid` / `clientsecret` from the volume's nodePublishSecretRef;
- VM managed identity: the node's identity, only for namespaces the operator allowed.

The identity key names cloud, authority, vault, tenant, auth mode and client (and the token
proxy's URL, server name and CA file) — plus the pod's scope, or a hash of the
nodePublishSecretRef credentials — never a token. The SDK credential is cached with the clients
per identity key (store.py); `CheckedCredential` keeps its Entra access tokens in
`env.credentials` until shortly before they expire; `Login` carries this Mount's pod token to it
through `AssertionSource`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from backends import nodefiles
from backends.azure import binding
from backends.azure.binding import TokenProxy
from backends.azure.dialect import CLOUDS, AzureStore
from backends.azure.options import Options
from backends.clouds.azure import AUDIENCE, assertion_credential, entra_codes, outage
from provider.core.backend import BackendEnv
from provider.core.caching import ExpiringCache
from provider.core.errors import MissingCredential, PermissionDenied, StoreUnavailable, scrub
from provider.core.identity import pod_named, pod_scope, pod_token, require_node_identity
from provider.core.model import Identity, Pod, credential_hash, identity_key


@dataclass(frozen=True)
class Endpoints:
    authority_host: str
    vault_url: str


@dataclass(frozen=True)
class Login:
    """This Mount's login material (Identity.credential); never printed."""

    endpoints: Endpoints
    assertion: str = field(default="", repr=False)
    client_secret: str = field(default="", repr=False)
    client_id: str = ""
    #: Identity binding's token proxy; None for every other mode.
    proxy: TokenProxy | None = None


#: Cap of the cloudEnvFileName file (the Azure SDK for Go's environment file is about 2 KiB).
MAX_CLOUD_FILE = 64 * 1024


async def endpoints(store: AzureStore, options: Options | None) -> Endpoints:
    """Authority and vault URL: the cloud's, the cloud file's, or the provider's overrides."""
    authority, suffix = "", ""
    if store.cloud_env_file:
        authority, suffix = await asyncio.to_thread(_read_cloud_file, store.cloud_env_file)
    else:
        cloud = CLOUDS[store.cloud.lower()]
        authority, suffix = cloud.authority_host, cloud.vault_dns_suffix
    if options is not None:
        authority = options.authority_host or authority
        suffix = options.vault_dns_suffix or suffix
    authority = authority.rstrip("/")
    if not authority.startswith("https://"):
        authority = "https://" + authority
    return Endpoints(authority, f"https://{store.vault_name}.{suffix.strip('.')}")


def _read_cloud_file(path: str) -> tuple[str, str]:
    """The Azure SDK for Go's environment file (as upstream's AZURE_ENVIRONMENT_FILEPATH).

    A node file named by the class (backends/nodefiles.py): one message for every failure,
    unusable content included, so the class's author learns nothing about the node's files.
    """
    field, holding = "cloudEnvFileName", "JSON with activeDirectoryEndpoint and keyVaultDNSSuffix"
    raw = nodefiles.read_node_file(path, field, MAX_CLOUD_FILE, holding)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        data = None
    authority = data.get("activeDirectoryEndpoint") if isinstance(data, dict) else None
    suffix = data.get("keyVaultDNSSuffix") if isinstance(data, dict) else None
    if not isinstance(authority, str) or not isinstance(suffix, str) or not authority or not suffix:
        raise nodefiles.unusable(field, path, MAX_CLOUD_FILE, holding)
    return authority, suffix


async def identify(
    env: BackendEnv[Options],
    store: AzureStore,
    pod: Pod,
    proxy: Callable[[], Awaitable[TokenProxy]] | None = None,
) -> Identity:
    """`proxy` resolves the provider's token proxy (identity binding only)."""
    ends = await endpoints(store, env.options)
    parts: list[object] = [store.cloud, ends.authority_host, ends.vault_url, store.tenant_id]
    if store.auth == "workload-identity":
        token = await pod_token(env, pod, AUDIENCE)
        login = Login(ends, assertion=token, client_id=store.client_id)
        parts += ["workload", store.client_id]
    elif store.auth == "identity-binding":
        token = await pod_token(env, pod, binding.AUDIENCE)
        assert proxy is not None, "identity binding needs the backend's token proxy"
        try:
            settings = await proxy()
        except (binding.ProxyUntrusted, StoreUnavailable) as exc:
            raise type(exc)(
                f"Key Vault {store.vault_name}: the login of {pod.subject} with identity binding "
                f"(clientID {store.client_id}) cannot start: {exc}"
            ) from None
        login = Login(ends, assertion=token, client_id=store.client_id, proxy=settings)
        parts += ["binding", store.client_id, *settings.key_parts()]
    elif store.auth == "vm-managed-identity":
        require_node_identity(env, pod, f"Key Vault {store.vault_name} (useVMManagedIdentity)")
        login = Login(ends, client_id=store.user_assigned_identity_id)
        parts += ["vm", store.user_assigned_identity_id or "system"]
    else:
        secret = pod.node_publish_secret
        client_id, client_secret = secret.get("clientid", ""), secret.get("clientsecret", "")
        if not client_id or not client_secret:
            raise MissingCredential(
                f"Key Vault {store.vault_name}: pod {pod_named(pod)} brought no "
                "credentials: set clientID for workload identity (the pod's token for audience "
                f"{AUDIENCE!r}), or reference a Secret with keys clientid and clientsecret in "
                "the volume's nodePublishSecretRef"
            )
        login = Login(ends, client_secret=client_secret, client_id=client_id)
        parts += ["sp", credential_hash({"clientid": client_id, "clientsecret": client_secret})]
    key = identity_key("azure", *parts, pod_scope(env, pod))
    return Identity(key=key, subject=pod.subject, credential=login)


def build_credential(store: AzureStore, login: Login, transport: Any, assertion: Any) -> Any:
    """The SDK credential for one identity; `assertion()` returns the latest pod token."""
    from azure.identity.aio import ClientSecretCredential, ManagedIdentityCredential

    authority = login.endpoints.authority_host
    if store.auth in ("workload-identity", "identity-binding"):
        # Identity binding: the same exchange over the token proxy's transport (upstream's
        # getIdentityBindingTokenCredential).
        return assertion_credential(
            store.tenant_id, login.client_id, assertion, transport, authority
        )
    # One try per token request: retry_transient owns retries, so they don't multiply.
    common: dict[str, Any] = {"transport": transport, "retry_total": 0}
    aad = {**common, "authority": authority, "disable_instance_discovery": True}
    if store.auth == "service-principal":
        return ClientSecretCredential(store.tenant_id, login.client_id, login.client_secret, **aad)
    return ManagedIdentityCredential(client_id=login.client_id or None, **common)


class AssertionSource:
    """The client assertion callback: the newest pod token of the identity (never printed).

    Every Mount brings a fresh token, while the credential (cached per identity key) asks for
    one only when it logs in again, possibly long after the Mount that built it.
    """

    def __init__(self) -> None:
        self.token = ""

    def __call__(self) -> str:
        return self.token

    def __repr__(self) -> str:
        return "AssertionSource(<hidden>)"


class LoginRefused(PermissionDenied):
    """Entra refused the login: the whole Mount fails, not one object."""


class WrongTenant(LoginRefused):
    """The vault's challenge names a tenant other than the class's tenantID: the SDK refuses to
    ask for a token there, so nothing reached Entra; the fix is tenantID."""


def _requested_tenant(kwargs: Any) -> str:
    """The tenant Key Vault's challenge asked the credential for (get_token's `tenant_id`, or
    get_token_info's `options`), empty when it named none."""
    options = kwargs.get("options") or {}
    tenant = kwargs.get("tenant_id") or options.get("tenant_id") or ""
    return tenant if isinstance(tenant, str) else ""


class CheckedCredential:
    """The SDK credential behind a shared token cache, with our errors.

    The Key Vault clients ask for a token inside their pipeline (after the 401 challenge), one
    request each: without this, 20 simultaneous Mounts of one service account were 20 Entra
    logins. Tokens are kept in `env.credentials` per identity key and scope (single-flight) until
    five minutes before they expire. This is also where an Entra failure is told apart from a
    Key Vault answer.
    """

    #: Seconds before expiry a token stops being handed out (the SDK refreshes at 5 min too).
    REFRESH_MARGIN = 300.0

    def __init__(
        self,
        inner: Any,
        store: AzureStore,
        subject: str,
        cache: ExpiringCache[Any],
        key: str,
        proxy: TokenProxy | None = None,
    ) -> None:
        self._inner, self._store, self._subject = inner, store, subject
        self._cache, self._key = cache, key
        self._proxy = proxy
        #: Who answers the token requests.
        self._via = proxy.describe() if proxy else "Microsoft Entra"

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        return await self._cached("token", self._inner.get_token, scopes, kwargs)

    async def get_token_info(self, *scopes: str, **kwargs: Any) -> Any:
        return await self._cached("info", self._inner.get_token_info, scopes, kwargs)

    async def _cached(self, kind: str, method: Any, scopes: tuple[str, ...], kwargs: Any) -> Any:
        options = kwargs.get("options") or {}
        if kwargs.get("claims") or options.get("claims"):
            # A claims challenge (CAE) asks for a new token: never answer it from the cache.
            return await self._call(method, scopes, kwargs)
        tenant = kwargs.get("tenant_id") or options.get("tenant_id") or ""
        cae = bool(kwargs.get("enable_cae") or options.get("enable_cae"))

        async def load() -> tuple[Any, float]:
            token = await self._call(method, scopes, kwargs)
            return token, token.expires_on - time.time() - self.REFRESH_MARGIN

        key = (self._key, "entra-token", kind, scopes, tenant, cae)
        return await self._cache.get_or_load(key, load)

    async def _call(self, method: Any, scopes: tuple[str, ...], kwargs: Any) -> Any:
        from azure.core.exceptions import ClientAuthenticationError, ServiceRequestError

        try:
            return await method(*scopes, **kwargs)
        except (ServiceRequestError, ClientAuthenticationError) as exc:
            tls = binding.tls_failure(exc) if self._proxy else None
            if tls is not None and isinstance(exc, ServiceRequestError):
                raise binding.ProxyUntrusted(self._untrusted(tls)) from None
            raise outage(exc, self._via) or self._refused(exc, kwargs) from None

    def _refused(self, exc: Exception, kwargs: Any) -> LoginRefused:
        challenged = _requested_tenant(kwargs)
        local = getattr(exc, "response", None) is None
        if local and challenged and challenged != self._store.tenant_id:
            # azure-identity refused locally (its resolve_tenant compares exactly): no request
            # reached Entra.
            return WrongTenant(self._wrong_tenant(challenged))
        return LoginRefused(self._refusal(exc))

    def _wrong_tenant(self, tenant: str) -> str:
        s = self._store
        return (
            f"Key Vault {s.vault_name} belongs to tenant {scrub(tenant, 100)}, the class sets "
            f"tenantID {s.tenant_id}; set tenantID to the vault's tenant (the login of "
            f"{self._subject} was not attempted: Microsoft Entra issues tokens for a vault only "
            "in its own tenant)"
        )

    def _untrusted(self, tls: BaseException) -> str:
        s, proxy = self._store, self._proxy
        assert proxy is not None
        return (
            f"the login of {self._subject} with identity binding (clientID {s.client_id}) for Key "
            f"Vault {s.vault_name} failed: {proxy.describe()} failed TLS verification "
            f"({binding.tls_text(tls)}); check the provider's --azure-token-proxy-ca-file "
            f"(trusted: {proxy.ca_file or 'the system CAs'}) and --azure-sni-name (the proxy's "
            "certificate must name it)"
        )

    def _refusal(self, exc: Exception) -> str:
        s = self._store
        service_account = self._subject.replace("/", ":")
        how = {
            "workload-identity": f"workload identity (clientID {s.client_id}, the pod's token for "
            f"audience {AUDIENCE!r}); check the federated credential's subject "
            f"system:serviceaccount:{service_account} and issuer",
            "identity-binding": f"identity binding (clientID {s.client_id}, the pod's token "
            f"for audience {binding.AUDIENCE!r}); check the "
            f"cluster's identity binding for managed identity {s.client_id} and that service "
            f"account {self._subject} may use it (a ClusterRole with verb use-managed-identity "
            f"on resource {s.client_id} in API group cid.wi.aks.azure.com, bound to it)",
            "service-principal": "the nodePublishSecretRef service principal; check clientid and "
            "clientsecret",
            "vm-managed-identity": "the node's managed identity "
            f"{s.user_assigned_identity_id or '(system-assigned)'}",
        }[s.auth]
        who = f"{self._via} (or Microsoft Entra behind it)" if self._proxy else self._via
        return (
            f"{who} refused the login of {self._subject} to tenant {s.tenant_id} for "
            f"Key Vault {s.vault_name} with {how} ({entra_codes(exc)})"
        )

    async def close(self) -> None:
        await self._inner.close()

    async def __aenter__(self) -> CheckedCredential:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
