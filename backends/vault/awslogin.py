"""Vault's aws auth method, `iam` type, as the pod: a signed sts:GetCallerIdentity request.

The pod's AWS credentials come from its own identity, never the node's: IRSA or the EKS Pod
Identity agent, exchanged where the aws store exchanges them (backends/clouds/aws.py).
botocore's SigV4Auth signs the request; Vault replays it to STS and logs in whoever signed it.
The credentials live only for the login: the Vault token is what is cached (auth.py).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from backends.clouds.aws import Credentials, PodAws, agent_urls, failover, sdk_client, session_name
from backends.clouds.names import ROLE_ANNOTATION
from backends.vault.methods import AwsAuth
from provider.core.backend import BackendEnv
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    PermissionDenied,
    StoreUnavailable,
    redacted,
    scrub,
)
from provider.core.identity import pod_named, pod_token
from provider.core.model import Pod

log = logging.getLogger("secrets_bridge.vault")

SERVER_ID_HEADER = "X-Vault-AWS-IAM-Server-ID"
GET_CALLER_IDENTITY = "Action=GetCallerIdentity&Version=2011-06-15"
_TIMEOUT = 10.0
#: STS error codes that name the pod's identity as the problem (not an outage).
_DENIED = frozenset(
    {"AccessDenied", "InvalidIdentityToken", "IDPRejectedClaim", "ExpiredTokenException"}
)


@dataclass(frozen=True)
class AwsPod:
    """Which AWS identity of the pod signs the request; `token` is never logged or keyed."""

    kind: Literal["irsa", "pod-identity"]
    role_arn: str = ""
    session_name: str = ""
    token: str = field(default="", repr=False)
    #: The pod whose mount made the login, as refusals name it (identity.pod_named).
    pod: str = field(default="", compare=False)
    #: When the ServiceAccount annotation that named the role is read again.
    until: float = field(default=math.inf, compare=False)

    @property
    def key(self) -> str:
        return f"irsa:{self.role_arn}" if self.kind == "irsa" else "pod-identity"

    def describe(self) -> str:
        return f"AWS role {self.role_arn}" if self.kind == "irsa" else "EKS Pod Identity"


class AwsSigner:
    """The pod's AWS identity (`who`) and its signed login (`login_data`), per backend."""

    def __init__(self, env: BackendEnv[Any]) -> None:
        self._env = env
        self._session: Any = None
        self._aws = PodAws(env, "vault", _sdk, "vaultAWSRoleArn")

    async def who(self, aws: AwsAuth, audience: str, pod: Pod) -> AwsPod:
        """The pod's AWS identity, refused before any cache when its token is missing."""
        named = pod_named(pod)
        if aws.pod_identity:
            token = await pod_token(self._env, pod, audience)
            return AwsPod("pod-identity", token=token, pod=named)
        role, until = await self._aws.role(aws.role_arn, pod)
        if not role:
            raise InvalidParameters(
                f"Vault's aws login for pod {named} needs an AWS role: set vaultAWSRoleArn, "
                f"annotate ServiceAccount {pod.subject} with {ROLE_ANNOTATION}, or set "
                "vaultAWSUsePodIdentity"
            )
        token = await pod_token(self._env, pod, audience)
        return AwsPod("irsa", role, session_name(pod), token, named, until)

    async def login_data(self, aws: AwsAuth, who: AwsPod, subject: str) -> dict[str, str]:
        """The iam login fields, signed with the pod's AWS credentials."""
        if who.kind == "irsa":
            aud = "of the pod's token"
            creds = await self._aws.web_identity(self._sts, (aws.region,), who, subject, aud)
        else:
            creds = await self._from_agent(who, subject)
        return signed_login(aws, creds)

    def _sts(self, region: str) -> Any:
        from aiobotocore.session import get_session

        if self._session is None:
            self._session = get_session()
        # A client per login (logins are rare: the Vault token is cached), so none is left open.
        return sdk_client(
            self._session,
            "sts",
            region,
            # --aws-sts-endpoint, as for the aws store; else AWS_ENDPOINT_URL_STS (botocore's).
            endpoint=self._env.core.aws_sts_endpoint,
            unsigned=True,
            connect_timeout=_TIMEOUT,
            read_timeout=_TIMEOUT,
        )

    async def _from_agent(self, who: AwsPod, subject: str) -> Credentials:
        # The variable the Pod Identity webhook sets in pods (and tests set to a stub).
        urls = agent_urls("auto", os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI"))

        async def ask(url: str) -> Credentials:
            return await self._aws.from_agent(
                url, who, subject, instead="unset vaultAWSUsePodIdentity", total_seconds=_TIMEOUT
            )

        return await failover(urls, ask)


def signed_login(aws: AwsAuth, creds: Credentials) -> dict[str, str]:
    """Vault's iam login fields: a GetCallerIdentity request signed by botocore's SigV4Auth,
    with the X-Vault-AWS-IAM-Server-ID header among the signed ones when the class sets it."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as Signing

    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    if aws.server_id:
        headers[SERVER_ID_HEADER] = aws.server_id
    request = AWSRequest("POST", aws.sts_url, data=GET_CALLER_IDENTITY, headers=headers)
    signing = Signing(creds.access_key_id, creds.secret_access_key, creds.session_token or None)
    SigV4Auth(signing, "sts", aws.region).add_auth(request)
    # Go's http.Header shape, as Vault's own clients send it.
    signed = {name: [str(value)] for name, value in request.headers.items()}
    return {
        "iam_http_request_method": "POST",
        "iam_request_url": _b64(aws.sts_url),
        "iam_request_body": _b64(GET_CALLER_IDENTITY),
        "iam_request_headers": _b64(json.dumps(signed)),
    }


@contextmanager
def _sdk(what: str, hint: str) -> Iterator[None]:
    """The one translation of botocore's and aiohttp's exceptions in this module: the AWS
    error code and status only, never AWS's message (free text)."""
    import aiohttp
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except BridgeError:
        raise
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", "Unknown"))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        log.debug("%s: %s (not relayed): %s", what, code, redacted(str(error.get("Message"))))
        if code in _DENIED or status == 403:
            raise PermissionDenied(f"{what}: refused ({code}){hint}") from None
        failed = StoreUnavailable(f"{what}: AWS answered {code} (HTTP {status})")
        failed.transient = status >= 500 or code in ("Throttling", "ThrottlingException")
        raise failed from None
    except (BotoCoreError, aiohttp.ClientError, OSError, TimeoutError) as exc:
        detail = f"{type(exc).__name__}: {scrub(exc)}"
        raise StoreUnavailable(f"{what}: unreachable ({detail})") from None


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
