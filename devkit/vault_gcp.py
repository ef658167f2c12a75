"""Vault's gcp auth method (iam type) in front of a real OpenBao, checking keys Google publishes.

OpenBao bundles no gcp auth method (devkit/vault_aws.py says why these methods are stand-ins), so
this one does what vault-plugin-auth-gcp's `plugin/path_login.go` does for an iam role, step by
step, against the Google of devkit/google.py (Vault's `custom_endpoint` api and iam), and hands
everything else to OpenBao:

    auth = VaultGcpAuth(openbao.addr, google=google_url)
    auth.add_role("app", bound_service_accounts=[gsa], policies=["app"])
    await auth.start()        # auth.url: the class's vaultAddress
    auth.logins               # the `sub` of each login that got past the signature
    await auth.stop()

- `parseAndValidateJwt`: `role` and `jwt` required, the role must exist ("role %q not found");
  the JWT is RS256/ES256/HS256 with exactly one header; its key (`getSigningKey`) is the
  service account's public key for the header's `kid`, fetched from Google's x509 endpoint of
  the `sub` (Vault tries Google's OAuth2 keys first: they never sign a service account's JWT);
  the signature is checked with it;
- `validateBaseJWTClaims`: `exp` present and not more than 60 s past, at most 60 min (+60 s)
  ahead, `sub` present, every `aud` ending in `vault/<role>`;
- `pathIamLogin`: `exp` within the role's `max_jwt_exp` (default 15 min); the service account
  read from IAM (serviceAccounts.get: email, uniqueId, projectId);
  `authorizeIAMServiceAccount`: bound_projects, then `*`, the email or the uniqueId;
- refusals are Vault's texts as HTTP 400 (logical.ErrorResponse); a success is a real OpenBao
  token with the role's policies (auth/token/create with the root token).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import jwt
from aiohttp import web
from cryptography import x509

from devkit.vault_standin import Refused, StandIn

#: vault-plugin-auth-gcp's constants (path_login.go, path_role.go).
JWT_EXP_TOLERANCE = 60
MAX_JWT_EXP_MAX_MINUTES = 60
DEFAULT_MAX_JWT_EXP = 15 * 60
_ALGORITHMS = ("RS256", "ES256", "HS256")


@dataclass
class GcpRole:
    bound_service_accounts: list[str]
    policies: list[str]
    bound_projects: list[str] = field(default_factory=list)
    max_jwt_exp: int = DEFAULT_MAX_JWT_EXP


class VaultGcpAuth(StandIn):
    """Vault's gcp auth method, iam roles; `google`: Vault's custom api and iam endpoint."""

    def __init__(self, upstream: str, *, google: str, mount: str = "gcp") -> None:
        super().__init__(upstream, mount)
        self.google = google.rstrip("/")
        self.roles: dict[str, GcpRole] = {}
        self.logins: list[str] = []

    def add_role(
        self,
        name: str,
        *,
        bound_service_accounts: list[str],
        policies: list[str],
        bound_projects: list[str] | None = None,
        max_jwt_exp: int = DEFAULT_MAX_JWT_EXP,
    ) -> None:
        self.roles[name] = GcpRole(
            bound_service_accounts, policies, bound_projects or [], max_jwt_exp
        )

    async def login(self, data: dict[str, Any]) -> web.Response:
        name = str(data.get("role") or "")
        if not name:
            raise Refused("role is required")
        role = self.roles.get(name)
        if role is None:
            raise Refused(f'role "{name}" not found')
        token = data.get("jwt")
        if not isinstance(token, str) or not token:
            raise Refused("jwt argument is required")
        claims = await self._verified(token)
        _validate_base_claims(claims, name)
        sub = str(claims["sub"])
        self.logins.append(sub)
        if claims["exp"] > time.time() + role.max_jwt_exp:
            raise Refused(
                f"role requires that service account JWTs expire within {role.max_jwt_exp} seconds"
            )
        account = await self._service_account(sub)
        email, unique_id, project = account["email"], account["uniqueId"], account["projectId"]
        if role.bound_projects and project not in role.bound_projects:
            raise Refused(f"service account {email!r} not in bound projects {role.bound_projects}")
        bound = role.bound_service_accounts
        if bound != ["*"] and email not in bound and unique_id not in bound:
            raise Refused(f"service account {email} (id: {unique_id}) is not authorized for role")
        return await self.mint(role.policies, name, {"service_account_email": email})

    async def _verified(self, token: str) -> dict[str, Any]:
        """parseAndValidateJwt's signature check, with getSigningKey's service account key."""
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError as exc:
            raise Refused(f"unable to parse signed JWT: {exc}") from None
        if header.get("alg") not in _ALGORITHMS:
            raise Refused("unable to parse signed JWT: unexpected signature algorithm")
        sub = unverified.get("sub")
        if not isinstance(sub, str) or not sub:
            raise Refused("unable to get public key for signed JWT: expected 'sub' claim from JWT")
        kid = str(header.get("kid", ""))
        async with self.http.get(f"{self.google}/service_accounts/v1/metadata/x509/{sub}") as r:
            certs = await r.json() if r.status == 200 else {}
        if kid not in certs:
            raise Refused(
                f"unable to get public key for signed JWT: unable to get public key {kid!r} "
                f"for JWT subject {sub!r}: key not found"
            )
        public = x509.load_pem_x509_certificate(certs[kid].encode()).public_key()
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                public,  # type: ignore[arg-type]
                algorithms=[str(header["alg"])],
                options={"verify_aud": False, "verify_exp": False, "verify_iat": False},
            )
        except jwt.PyJWTError:
            raise Refused("go-jose/go-jose: error in cryptographic primitive") from None
        return claims

    async def _service_account(self, email_or_id: str) -> dict[str, str]:
        """gcputil.ServiceAccount: IAM's serviceAccounts.get, with Vault's own credentials."""
        url = f"{self.google}/v1/projects/-/serviceAccounts/{email_or_id}"
        async with self.http.get(url) as answer:
            if answer.status != 200:
                # Vault returns the IAM error itself (HTTP 500), not an ErrorResponse.
                raise Refused(f"googleapi: Error {answer.status}: service account lookup failed")
            account: dict[str, str] = await answer.json()
        return account


def _validate_base_claims(claims: dict[str, Any], role: str) -> None:
    """validateBaseJWTClaims."""
    exp, now = claims.get("exp"), time.time()
    if not isinstance(exp, int | float) or exp < now - JWT_EXP_TOLERANCE:
        raise Refused("JWT is expired or does not have proper 'exp' claim")
    if exp - now > MAX_JWT_EXP_MAX_MINUTES * 60 + JWT_EXP_TOLERANCE:
        raise Refused(
            f"JWT must expire in {MAX_JWT_EXP_MAX_MINUTES} minutes, expires in {exp - now:.0f}s"
        )
    if not claims.get("sub"):
        raise Refused("expected JWT to have 'sub' claim with service account id or email")
    audiences = claims.get("aud")
    audiences = [audiences] if isinstance(audiences, str) else audiences or []
    suffix = f"vault/{role}"
    for aud in audiences:
        if not str(aud).endswith(suffix):
            raise Refused(f"at least one of the JWT claim 'aud' must end in {suffix!r}")
