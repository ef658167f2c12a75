"""Vault's gcp auth method, `iam` type, as the pod: a JWT signed for its Google service account.

The pod's Kubernetes token for the workload identity pool is exchanged at Google STS (RFC 8693,
as the gcp backend does) for a federated token of the pod's own principal, which asks IAM
credentials `signJwt` for `{aud: vault/<role>, sub: <service account>, exp}`; Vault verifies the
signature with the service account's public keys and binds `sub` to the role. The federated
principal needs roles/iam.serviceAccountTokenCreator on the service account (signJwt is not in
roles/iam.workloadIdentityUser). Never the node's identity: no Application Default Credentials.

Both calls are plain HTTPS JSON APIs, called with aiohttp as backends/gcp/exchange.py does (the
stores are independent of each other, so the few lines repeat): no redirect, answers capped,
errors by status and Google's error code only. Endpoints are Google's unless the operator
overrides them the way gcloud does (CLOUDSDK_API_ENDPOINT_OVERRIDES_STS / _IAMCREDENTIALS, base
URLs); TLS trusts the system CAs (SSL_CERT_FILE / SSL_CERT_DIR honoured, as OpenSSL does).
"""

from __future__ import annotations

import json
import logging
import os
import re
import ssl
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from backends.proxies import Proxies, proxied_requests
from backends.vault.methods import GcpAuth
from backends.wire import MAX_SMALL_BODY, OAUTH_ERRORS, read_capped
from provider.core.backend import BackendEnv
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    PermissionDenied,
    StoreUnavailable,
    redacted,
    scrub,
)
from provider.core.identity import Annotation, pod_token
from provider.core.model import Pod

log = logging.getLogger("secrets_bridge.vault")

GSA_ANNOTATION = "iam.gke.io/gcp-service-account"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
STS_OVERRIDE = "CLOUDSDK_API_ENDPOINT_OVERRIDES_STS"
IAM_OVERRIDE = "CLOUDSDK_API_ENDPOINT_OVERRIDES_IAMCREDENTIALS"
DEFAULT_STS = "https://sts.googleapis.com/"
DEFAULT_IAM = "https://iamcredentials.googleapis.com/"
#: The login JWT's lifetime: it is used at once, and stays within a role's max_jwt_exp (Vault's
#: default 15 minutes) despite some clock skew between the node and Vault.
JWT_LIFETIME = 300
_TIMEOUT = 10.0
_EMAIL = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+$")
_STATUS = re.compile(r"^[A-Z][A-Z_]{2,40}$")


@dataclass(frozen=True)
class GcpPod:
    """The Google service account the pod signs its login as; `token` is never logged or keyed."""

    service_account: str
    token: str = field(default="", repr=False)

    @property
    def key(self) -> str:
        return f"gsa:{self.service_account}"

    def describe(self) -> str:
        return f"Google service account {self.service_account}"


class GcpSigner:
    """The pod's Google service account (`who`) and its signed login JWT (`login_data`)."""

    def __init__(self, env: BackendEnv[Any]) -> None:
        self._env = env
        self._annotations = Annotation(env, GSA_ANNOTATION, "vaultGCPServiceAccount")
        self._request_class = proxied_requests(Proxies.from_env())

    async def who(self, gcp: GcpAuth, audience: str, pod: Pod) -> GcpPod:
        """The pod's service account, refused before any cache when its token is missing."""
        account = gcp.service_account or await self._annotations.of(pod)
        if not account:
            raise InvalidParameters(
                f"Vault's gcp login for {pod.subject} needs a Google service account to sign "
                f"as: set vaultGCPServiceAccount, or annotate ServiceAccount {pod.subject} with "
                f"{GSA_ANNOTATION}"
            )
        if not _EMAIL.match(account):
            raise InvalidParameters(
                f"the ServiceAccount {pod.subject} annotation {GSA_ANNOTATION} must be a Google "
                f"service account email, got {scrub(account, 100)!r}"
            )
        return GcpPod(account, await pod_token(self._env, pod, audience))

    async def login_data(
        self, gcp: GcpAuth, who: GcpPod, role: str, subject: str
    ) -> dict[str, str]:
        """The iam login's `jwt`: `vault/<role>` for `who`, signed by IAM as the pod."""
        import aiohttp

        connector = aiohttp.TCPConnector(ssl=ssl.create_default_context())
        async with aiohttp.ClientSession(
            connector=connector,
            request_class=self._request_class,
            timeout=aiohttp.ClientTimeout(total=_TIMEOUT),
        ) as http:
            federated = await self._exchange(http, gcp, who, subject)
            return {"jwt": await self._sign(http, federated, who, role, subject)}

    async def _exchange(self, http: Any, gcp: GcpAuth, who: GcpPod, subject: str) -> str:
        form = {
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "audience": gcp.sts_audience,
            "scope": SCOPE,
            "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "subject_token": who.token,
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        }
        what = f"the Google STS token exchange for {subject} (audience {gcp.sts_audience!r})"
        fix = (
            f"check that the pod's token is issued for audience {gcp.token_audience!r} and that "
            "vaultGCPWorkloadIdentityAudience names the cluster's workload identity pool and "
            "provider"
        )
        url = _base(STS_OVERRIDE, DEFAULT_STS) + "v1/token"
        with self._env.metrics.backend_call("vault", "StsExchange"):
            body = await _post(http, url, what, fix, data=form)
        return _field(body, "access_token", what)

    async def _sign(self, http: Any, federated: str, who: GcpPod, role: str, subject: str) -> str:
        gsa = who.service_account
        claims = {"aud": f"vault/{role}", "sub": gsa, "exp": int(time.time()) + JWT_LIFETIME}
        url = f"{_base(IAM_OVERRIDE, DEFAULT_IAM)}v1/projects/-/serviceAccounts/{gsa}:signJwt"
        what = f"IAM signJwt for {gsa} as {subject}"
        fix = (
            f"grant roles/iam.serviceAccountTokenCreator on {gsa} to the workload identity "
            f"principal of Kubernetes ServiceAccount {subject}"
        )
        headers = {"Authorization": f"Bearer {federated}"}
        with self._env.metrics.backend_call("vault", "SignJwt"):
            body = await _post(
                http, url, what, fix, json_body={"payload": json.dumps(claims)}, headers=headers
            )
        return _field(body, "signedJwt", what)


async def _post(
    http: Any,
    url: str,
    what: str,
    fix: str,
    *,
    data: Mapping[str, str] | None = None,
    json_body: Any = None,
    headers: Mapping[str, str] | None = None,
) -> Mapping[str, Any]:
    with _wire(what):
        async with http.post(
            url, data=data, json=json_body, headers=headers, allow_redirects=False
        ) as answer:
            raw = await read_capped(answer, MAX_SMALL_BODY, what)
            status = answer.status
    text = raw.decode("utf-8", errors="replace")
    parsed = _json(text)
    if status == 200 and parsed is not None:
        return parsed
    if status == 200:
        raise StoreUnavailable(f"{what}: the answer is not a JSON object")
    code = _code(parsed)
    log.debug("%s answered HTTP %s (not relayed): %s", what, status, redacted(text))
    if status in (400, 401, 403, 404):
        raise PermissionDenied(f"{what}: refused (HTTP {status}{code}); {fix}")
    failed = StoreUnavailable(f"{what}: Google answered HTTP {status}{code}")
    failed.transient = status == 429 or status >= 500
    raise failed


@contextmanager
def _wire(what: str) -> Iterator[None]:
    """The one translation of aiohttp's exceptions in this module (never a token or URL query)."""
    import aiohttp

    try:
        yield
    except BridgeError:
        raise
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise StoreUnavailable(
            f"{what}: unreachable ({type(exc).__name__}: {scrub(exc)})"
        ) from None


def _json(text: str) -> Mapping[str, Any] | None:
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def _code(body: Mapping[str, Any] | None) -> str:
    """Google's error code (OAuth's `error`, or the API's `error.status`), never its message."""
    error = body.get("error") if body else None
    if isinstance(error, str) and error in OAUTH_ERRORS:
        return f", {error}"
    status = error.get("status") if isinstance(error, dict) else None
    return f", {status}" if isinstance(status, str) and _STATUS.match(status) else ""


def _field(body: Mapping[str, Any], name: str, what: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise StoreUnavailable(f"{what}: the answer has no {name}")
    return value


def _base(variable: str, default: str) -> str:
    base = os.environ.get(variable, "").strip() or default
    return base if base.endswith("/") else base + "/"
