"""Logging in to Vault as the pod, and keeping its Vault token while it lives.

`auth/<mount>/login` with `{role, jwt}` serves both the kubernetes and the jwt auth methods; the
aws method takes a GetCallerIdentity request signed with the pod's AWS credentials instead
(backends/vault/awslogin.py), the gcp method a JWT that IAM signed for the pod's Google service
account (gcplogin.py), the azure method the Entra token of the pod's workload identity
(azurelogin.py). `who` finds the pod's identity for the method (refusing a pod without the token
it needs before any cache is consulted) and the parts of the identity key it adds.

The token is cached in `env.credentials` under the identity key (address, namespace, mount,
role, audience, the method and the pod's cloud identity, pod scope) until `token_renew_margin`
of its lease is left, so a rollout of many pods of one service account logs in once. A read
refused with 403 on a cached token may mean the token was revoked: `relogin` replaces it once,
shared by every concurrent caller that saw it refused.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from backends.vault.awslogin import AwsPod, AwsSigner
from backends.vault.azurelogin import AzurePod, AzureSigner
from backends.vault.client import Reply, VaultHTTP, status_error
from backends.vault.dialect import VaultStore
from backends.vault.gcplogin import JWT_LIFETIME, GcpPod, GcpSigner
from backends.vault.leases import TokenLife
from backends.vault.options import Options
from provider.core.backend import BackendEnv
from provider.core.errors import BridgeError, PermissionDenied, StoreUnavailable
from provider.core.identity import pod_token
from provider.core.model import FetchContext, Identity, Pod

JWT_MINUTES = JWT_LIFETIME // 60
#: How long a token without a lease (no expiry) is kept: policy changes show within this time.
NO_LEASE_TTL = 300.0


@dataclass(frozen=True)
class VaultToken:
    token: str = field(repr=False)
    #: time.monotonic() of the login; a 403 on a token this fresh is a real denial.
    obtained: float = 0.0
    #: Its TTL and end, moved by renew-self while leases it created are in use (leases.py).
    life: TokenLife = field(
        default_factory=lambda: TokenLife(0.0, math.inf, False), repr=False, compare=False
    )


class Authenticator:
    def __init__(
        self, env: BackendEnv[Options], http: VaultHTTP, margin: float, aws: AwsSigner
    ) -> None:
        self._env = env
        self._http = http
        self._margin = min(max(margin, 0.0), 0.9)
        self._aws = aws
        self._gcp = GcpSigner(env)
        self._azure = AzureSigner(env)

    async def who(self, store: VaultStore, pod: Pod) -> tuple[Any, tuple[str, ...]]:
        """The pod's login material for the class's method, and the identity key parts that name
        its cloud identity (method, principal and what the login is bound to; never a token)."""
        if store.aws is not None:
            aws = await self._aws.who(store.aws, store.audience, pod)
            return aws, ("aws", aws.key, store.aws.region, store.aws.server_id or "-")
        if store.gcp is not None:
            gcp = await self._gcp.who(store.gcp, store.audience, pod)
            return gcp, ("gcp", gcp.key, store.gcp.sts_audience)
        if store.azure is not None:
            azure = await self._azure.who(store.azure, store.audience, pod)
            fields = store.azure.login_fields()
            resource = (store.azure.resource, *(f"{k}={v}" for k, v in fields.items()))
            return azure, ("azure", azure.key, *resource)
        return await pod_token(self._env, pod, store.audience), ()

    async def token(self, store: VaultStore, identity: Identity, ctx: FetchContext) -> VaultToken:
        async def login() -> tuple[VaultToken, float]:
            return await self._login(store, identity, ctx)

        async def load() -> tuple[VaultToken, float]:
            # A coroutine function, not a lambda: tenacity awaits only coroutine functions.
            return await self._env.retry(login, ctx)

        token: VaultToken = await self._env.credentials.get_or_load(identity.key, load)
        return token

    async def relogin(
        self, store: VaultStore, identity: Identity, stale: VaultToken, ctx: FetchContext
    ) -> VaultToken:
        """A fresh token after `stale` was refused; concurrent callers share one login."""
        self._env.credentials.invalidate(identity.key, stale)
        return await self.token(store, identity, ctx)

    async def _login(
        self, store: VaultStore, identity: Identity, ctx: FetchContext
    ) -> tuple[VaultToken, float]:
        doing = login_doing(store, identity)
        body = json.dumps({"role": store.role, **await self._material(store, identity)})
        with self._env.metrics.backend_call("vault", "login"):
            reply = await self._http.request(
                store.address,
                store.tls,
                "POST",
                f"auth/{store.mount}/login",
                deadline=ctx.deadline,
                namespace=store.namespace,
                body=body,
                doing=doing,
            )
        if reply.status != 200:
            raise login_error(reply, store, identity)
        auth = reply.json().get("auth")
        client_token = auth.get("client_token") if isinstance(auth, dict) else None
        if not isinstance(auth, dict) or not isinstance(client_token, str) or not client_token:
            error = StoreUnavailable(
                f"{doing}: the answer carries no Vault token; does vaultAddress point at Vault?"
            )
            error.transient = False
            raise error
        lease = auth.get("lease_duration")
        lease = float(lease) if isinstance(lease, int | float) and lease > 0 else 0.0
        ttl = lease * (1 - self._margin) if lease > 0 else NO_LEASE_TTL
        now = time.monotonic()
        life = TokenLife(lease, now + lease if lease else math.inf, auth.get("renewable") is True)
        return VaultToken(client_token, now, life), ttl

    async def _material(self, store: VaultStore, identity: Identity) -> dict[str, str]:
        """What proves the pod's identity: its token, or an AWS request it signed."""
        credential = identity.credential
        if isinstance(credential, AwsPod) and store.aws is not None:
            return await self._aws.login_data(store.aws, credential, identity.subject)
        if isinstance(credential, GcpPod) and store.gcp is not None:
            return await self._gcp.login_data(store.gcp, credential, store.role, identity.subject)
        if isinstance(credential, AzurePod) and store.azure is not None:
            return await self._azure.login_data(store.azure, credential, identity.subject)
        return {"jwt": credential}


def login_doing(store: VaultStore, identity: Identity) -> str:
    credential = identity.credential
    cloud = (
        f"{credential.describe()}, " if isinstance(credential, AwsPod | GcpPod | AzurePod) else ""
    )
    return (
        f"login of service account {identity.subject} to Vault at {store.address} as role "
        f"{store.role!r} via auth/{store.mount} ({store.method} method, {cloud}token audience "
        f"{store.audience!r}" + (f", namespace {store.namespace!r})" if store.namespace else ")")
    )


def login_error(reply: Reply, store: VaultStore, identity: Identity) -> BridgeError:
    """A refused login (400 or 403) is a denial naming role, mount, audience and likely cause."""
    doing = login_doing(store, identity)
    if reply.status not in (400, 401, 403):
        return status_error(
            reply,
            doing,
            denied="",
            not_found="check vaultNamespace and vaultAuthMountPath",
        )
    why = reply.errors()
    cause = (
        _aws_cause(why, store, identity)
        or _gcp_cause(why, store, identity)
        or _azure_cause(why, store, identity)
        or _cause(why, store, identity)
    )
    return PermissionDenied(f"{doing} was refused ({reply.status_text()}); {cause}")


def _aws_cause(why: str, store: VaultStore, identity: Identity) -> str:
    """What to fix when Vault's aws method refused the signed request."""
    who = identity.credential
    if not isinstance(who, AwsPod) or store.aws is None:
        return ""
    text = why.lower()
    principal = who.role_arn or "the role of the pod's Pod Identity association"
    if "does not belong to the role" in text:
        return (
            f"likely cause: role {store.role!r} at auth/{store.mount} is not bound to "
            f"{principal}; add it to the role's bound_iam_principal_arn, or use a role that is"
        )
    if "server-id" in text:
        return (
            f"likely cause: the method's iam_server_id_header_value does not match the class's "
            f"vaultAWSIAMServerID ({store.aws.server_id or 'not set'})"
        )
    if "upstream request" in text:
        return (
            f"likely cause: STS refused the request signed for {store.aws.sts_url} in region "
            f"{store.aws.region}; the method's sts_endpoint and sts_region must match "
            "vaultAWSRegion"
        )
    if "iam not allowed" in text:
        return f"likely cause: role {store.role!r} is not an auth_type=iam role"
    return ""


def _gcp_cause(why: str, store: VaultStore, identity: Identity) -> str:
    """What to fix when Vault's gcp method refused the signed JWT (client.py's phrases)."""
    who = identity.credential
    if not isinstance(who, GcpPod):
        return ""
    text = why.lower()
    if "not authorized for the role" in text or "bound projects" in text:
        return (
            f"likely cause: role {store.role!r} at auth/{store.mount} is not bound to "
            f"{who.service_account}; add it to the role's bound_service_accounts (and its "
            "project to bound_projects), or use a role that is"
        )
    if any(s in text for s in ("must end in", "expires", "token is expired")):
        return (
            f"likely cause: the method refused the JWT signed for {who.service_account} "
            f"(aud vault/{store.role}, valid {JWT_MINUTES} minutes); check the role's "
            "max_jwt_exp and the clocks of the provider's node and Vault"
        )
    if "no public key" in text or "signature" in text:
        return (
            f"likely cause: the method cannot check the signature of {who.service_account}'s "
            "JWT (its key is not published, or the method cannot reach Google's APIs)"
        )
    return ""


def _azure_cause(why: str, store: VaultStore, identity: Identity) -> str:
    """What to fix when Vault's azure method refused the Entra token (client.py's phrases)."""
    who = identity.credential
    if not isinstance(who, AzurePod) or store.azure is None:
        return ""
    text = why.lower()
    if "service principal not authorized" in text or "groups not authorized" in text:
        return (
            f"likely cause: role {store.role!r} at auth/{store.mount} is not bound to the "
            f"workload identity {who.client_id}; add its object (principal) id to the role's "
            "bound_service_principal_ids (or a group of it to bound_group_ids)"
        )
    if any(s in text for s in ("audience", "issuer", "token is expired", "signature")):
        return (
            f"likely cause: the method cannot verify the Entra token for "
            f"{store.azure.resource!r}: vaultAzureResource must be the method's configured "
            f"resource, and its tenant_id the class's vaultAzureTenantID ({who.tenant_id})"
        )
    if any(s in text for s in ("subscription", "resource group", "scale set", "location")):
        return (
            "likely cause: the role binds resources that the login's vaultAzureSubscriptionID, "
            "vaultAzureResourceGroup, vaultAzureVMName / vaultAzureVMSSName do not match"
        )
    if "invalid role name" in text:
        return f"likely cause: there is no role {store.role!r} at auth/{store.mount}"
    return ""


def _cause(why: str, store: VaultStore, identity: Identity) -> str:
    text = why.lower()
    if "audience" in text or "aud" in text.split():
        return (
            f"likely cause: the role does not accept audience {store.audience!r}; set the "
            "class's `audience` to one of the role's bound audiences (or add it to the role)"
        )
    if "could not be found" in text or ("role" in text and "not found" in text):
        return f"likely cause: there is no role {store.role!r} at auth/{store.mount}"
    if any(s in text for s in ("subject", "not authorized", "service account", "bound")):
        return (
            f"likely cause: role {store.role!r} is not bound to service account "
            f"{identity.subject}; bind it in the role, or use a role that is"
        )
    if "permission denied" in text:
        return (
            f"likely cause: no auth method is mounted at auth/{store.mount} (check "
            "vaultAuthMountPath), or the Vault namespace is wrong"
        )
    if any(s in text for s in ("signature", "verify", "validating", "expired")):
        return (
            "likely cause: the auth method cannot verify the pod's token (check its "
            "jwt_validation_pubkeys / kubernetes_host configuration, and the token's expiry)"
        )
    return "check the role's bindings, the auth mount and the audience"
