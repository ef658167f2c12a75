"""Vault's azure auth method in front of a real OpenBao, checking Entra's published keys.

OpenBao bundles no azure auth method (devkit/vault_aws.py says why these methods are stand-ins),
so this one does what vault-plugin-auth-azure's `path_login.go` does, against the Entra of
devkit/azure.py (Vault's config: `tenant_id`, `resource`, the cloud's authority host), and hands
everything else to OpenBao:

    auth = VaultAzureAuth(openbao.addr, authority=entra_url, tenant=TENANT, ssl=context)
    auth.add_role("app", bound_service_principal_ids=[oid], policies=["app"])
    await auth.start()        # auth.url: the class's vaultAddress
    auth.logins               # the login fields and `oid` of each login that got that far
    await auth.stop()

- `pathLogin`: `jwt` and `role` required ("jwt is required", "role is required"), the role must
  exist ("invalid role name %q"); subscription_id, resource_group_name, vm_name and vmss_name
  must be well formed when given;
- `newAzureProvider`: the tenant's discovery document (`<authority>/<tenant>/.well-known/
  openid-configuration`) names the issuer and the keys; go-oidc's verifier checks the RS256
  signature with the key of the header's `kid`, `iss` (exactly the discovery issuer), `aud`
  (the configured `resource`, exactly) and `exp`, with go-oidc's messages;
- `verifyRole`: `nbf`, then bound_service_principal_ids against `oid` and bound_group_ids
  against `groups` ("service principal not authorized: <oid>", "groups not authorized");
- `verifyResource` returns at once for a role without bound resource groups, subscriptions,
  locations or scale sets; roles with them (ARM lookups of the VM or scale set) are not played
  here and are refused when added;
- refusals are Vault's texts as HTTP 400; a success is a real OpenBao token with the role's
  policies.
"""

from __future__ import annotations

import re
import ssl as ssl_module
import time
from dataclasses import dataclass, field
from typing import Any

import jwt
from aiohttp import web

from devkit.vault_standin import Refused, StandIn

DEFAULT_RESOURCE = "https://management.azure.com/"
# vault-plugin-auth-azure's field checks (path_login.go: validateAzureField and its patterns).
_GUID = re.compile(r"^[0-9a-fA-F-]{36}$")
_GROUP = re.compile(r"^[-\w._()]+$")
_NAME = re.compile(r"^[-\w.]+$")


@dataclass
class AzureRole:
    policies: list[str]
    bound_service_principal_ids: list[str] = field(default_factory=list)
    bound_group_ids: list[str] = field(default_factory=list)


class VaultAzureAuth(StandIn):
    """Vault's azure auth method; `authority`: the cloud's Entra authority host."""

    def __init__(
        self,
        upstream: str,
        *,
        authority: str,
        tenant: str,
        resource: str = DEFAULT_RESOURCE,
        ssl: ssl_module.SSLContext | None = None,
        mount: str = "azure",
    ) -> None:
        super().__init__(upstream, mount)
        self.authority = authority.rstrip("/")
        self.tenant = tenant
        self.resource = resource
        self.ssl = ssl
        self.roles: dict[str, AzureRole] = {}
        self.logins: list[dict[str, str]] = []

    def add_role(
        self,
        name: str,
        *,
        policies: list[str],
        bound_service_principal_ids: list[str] | None = None,
        bound_group_ids: list[str] | None = None,
        **bound_resources: list[str],
    ) -> None:
        if bound_resources:
            raise NotImplementedError("bound resources need ARM lookups this stand-in lacks")
        self.roles[name] = AzureRole(
            policies, bound_service_principal_ids or [], bound_group_ids or []
        )

    async def login(self, data: dict[str, Any]) -> web.Response:
        token = data.get("jwt")
        if not isinstance(token, str) or not token:
            raise Refused("jwt is required")
        name = str(data.get("role") or "")
        if not name:
            raise Refused("role is required")
        role = self.roles.get(name)
        if role is None:
            raise Refused(f'invalid role name "{name}"')
        fields = {k: str(data.get(k) or "") for k in _FIELDS}
        for key, (pattern, label) in _FIELDS.items():
            if fields[key] and not pattern.match(fields[key]):
                raise Refused(f'invalid {label} "{fields[key]}"')
        claims = await self._verified(token)
        self.logins.append({**{k: v for k, v in fields.items() if v}, "oid": claims["oid"]})
        _verify_role(claims, role)
        return await self.mint(role.policies, name, {"oid": str(claims.get("oid", ""))})

    async def _verified(self, token: str) -> dict[str, Any]:
        """newAzureProvider's discovery, and go-oidc's IDTokenVerifier.Verify."""
        discovery_url = f"{self.authority}/{self.tenant}/.well-known/openid-configuration"
        async with self.http.get(discovery_url, ssl=self.ssl or True) as answer:
            discovery = await answer.json()
        async with self.http.get(discovery["jwks_uri"], ssl=self.ssl or True) as answer:
            keys = {k["kid"]: k for k in (await answer.json())["keys"]}
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise Refused(f"oidc: malformed jwt: {exc}") from None
        if unverified.get("iss") != discovery["issuer"]:
            raise Refused(
                "oidc: id token issued by a different provider, expected "
                f"{discovery['issuer']!r} got {unverified.get('iss')!r}"
            )
        audiences = unverified.get("aud")
        audiences = [audiences] if isinstance(audiences, str) else audiences or []
        if self.resource not in audiences:
            raise Refused(f"oidc: expected audience {self.resource!r} got {audiences}")
        exp = unverified.get("exp")
        if not isinstance(exp, int | float) or exp < time.time():
            raise Refused(f"oidc: token is expired (Token Expiry: {exp})")
        key = keys.get(str(header.get("kid", "")))
        if header.get("alg") != "RS256" or key is None:
            raise Refused("failed to verify signature: failed to verify id token signature")
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                jwt.PyJWK(key).key,
                algorithms=["RS256"],
                options={"verify_aud": False, "verify_exp": False, "verify_nbf": False},
            )
        except jwt.PyJWTError:
            raise Refused(
                "failed to verify signature: failed to verify id token signature"
            ) from None
        return claims


#: Each login field, its check and how Vault's refusal names it.
_FIELDS = {
    "subscription_id": (_GUID, "subscription id"),
    "resource_group_name": (_GROUP, "resource group name"),
    "vm_name": (_NAME, "vm name"),
    "vmss_name": (_NAME, "vmss_name"),
}


def _verify_role(claims: dict[str, Any], role: AzureRole) -> None:
    """additionalClaims.verifyRole."""
    nbf = claims.get("nbf")
    if isinstance(nbf, int | float) and nbf > time.time():
        raise Refused(f"token is not yet valid (Token Not Before: {nbf})")
    principals, groups = role.bound_service_principal_ids, role.bound_group_ids
    if (principals == ["*"] and groups == ["*"]) or (not principals and not groups):
        raise Refused(
            "expected specific bound_group_ids or bound_service_principal_ids; both cannot be "
            "empty or '*'"
        )
    if principals and principals != ["*"] and claims.get("oid") not in principals:
        raise Refused(f"service principal not authorized: {claims.get('oid')}")
    token_groups = claims.get("groups") or []
    if groups and groups != ["*"] and not any(g in groups for g in token_groups):
        raise Refused(f"groups not authorized: {token_groups}")
