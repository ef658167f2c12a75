"""Vault's gcp auth method, `iam` type, as the pod: a JWT signed for its Google service account.

The pod's Kubernetes token for the workload identity pool is exchanged at Google STS (RFC 8693,
as the gcp backend does) for a federated token of the pod's own principal, which asks IAM
credentials `signJwt` for `{aud: vault/<role>, sub: <service account>, exp}`; Vault verifies the
signature with the service account's public keys and binds `sub` to the role. The federated
principal needs roles/iam.serviceAccountTokenCreator on the service account (signJwt is not in
roles/iam.workloadIdentityUser). Never the node's identity: no Application Default Credentials.

Both calls are backends/clouds/gcp.py's, as the gcp store makes them (no redirect, answers
capped, errors by status and Google's error code only), on a session of this login's own.
Endpoints are Google's unless the operator overrides them the way gcloud does
(CLOUDSDK_API_ENDPOINT_OVERRIDES_STS / _IAMCREDENTIALS, base URLs); TLS trusts the system CAs
(SSL_CERT_FILE / SSL_CERT_DIR honoured, as OpenSSL does).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from backends.clouds.gcp import Call, GoogleTokens, service_account
from backends.clouds.names import GSA_ANNOTATION
from backends.proxies import Proxies
from backends.vault.methods import GcpAuth
from provider.core.backend import BackendEnv
from provider.core.errors import InvalidParameters
from provider.core.identity import Annotation, pod_token
from provider.core.model import Pod

STS_OVERRIDE = "CLOUDSDK_API_ENDPOINT_OVERRIDES_STS"
IAM_OVERRIDE = "CLOUDSDK_API_ENDPOINT_OVERRIDES_IAMCREDENTIALS"
DEFAULT_STS = "https://sts.googleapis.com/"
DEFAULT_IAM = "https://iamcredentials.googleapis.com/"
#: The login JWT's lifetime: it is used at once, and stays within a role's max_jwt_exp (Vault's
#: default 15 minutes) despite some clock skew between the node and Vault.
JWT_LIFETIME = 300
#: Seconds each of the login's Google calls may take.
_TIMEOUT = 10.0


@dataclass(frozen=True)
class GcpPod:
    """The Google service account the pod signs its login as; `token` is never logged or keyed."""

    service_account: str
    token: str = field(default="", repr=False)
    #: When the ServiceAccount annotation it was named by is read again (`Identity.expires`).
    until: float = field(default=math.inf, compare=False)

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
        self._proxies = Proxies.from_env()

    async def who(self, gcp: GcpAuth, audience: str, pod: Pod) -> GcpPod:
        """The pod's service account, refused before any cache when its token is missing."""
        account, until = gcp.service_account, math.inf
        if not account:
            account, until = await self._annotations.read(pod)
        if not account:
            raise InvalidParameters(
                f"Vault's gcp login for {pod.subject} needs a Google service account to sign "
                f"as: set vaultGCPServiceAccount, or annotate ServiceAccount {pod.subject} with "
                f"{GSA_ANNOTATION}"
            )
        account = service_account(account, pod.subject)
        return GcpPod(account, await pod_token(self._env, pod, audience), until)

    async def login_data(
        self, gcp: GcpAuth, who: GcpPod, role: str, subject: str
    ) -> dict[str, str]:
        """The iam login's `jwt`: `vault/<role>` for `who`, signed by IAM as the pod."""
        gsa = who.service_account
        exchange = Call(
            f"the Google STS token exchange for {subject} (audience {gcp.sts_audience!r})",
            f"check that the pod's token is issued for audience {gcp.token_audience!r} and that "
            "vaultGCPWorkloadIdentityAudience names the cluster's workload identity pool and "
            "provider",
            time.monotonic() + _TIMEOUT,
        )
        sts = _base(STS_OVERRIDE, DEFAULT_STS) + "v1/token"
        async with GoogleTokens(ca_flag="SSL_CERT_FILE", proxies=self._proxies) as google:
            with self._env.metrics.backend_call("vault", "StsExchange"):
                federated = await google.exchange(sts, gcp.sts_audience, who.token, exchange)
            claims = {"aud": f"vault/{role}", "sub": gsa, "exp": int(time.time()) + JWT_LIFETIME}
            sign = Call(
                f"IAM signJwt for {gsa} as {subject}",
                f"grant roles/iam.serviceAccountTokenCreator on {gsa} to the workload identity "
                f"principal of Kubernetes ServiceAccount {subject}",
                time.monotonic() + _TIMEOUT,
            )
            iam = _base(IAM_OVERRIDE, DEFAULT_IAM)
            with self._env.metrics.backend_call("vault", "SignJwt"):
                signed = await google.sign_jwt(iam, federated.token, gsa, claims, sign)
        return {"jwt": signed}


def _base(variable: str, default: str) -> str:
    base = os.environ.get(variable, "").strip() or default
    return base if base.endswith("/") else base + "/"
