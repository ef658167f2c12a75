"""Vault's aws auth method, `iam` type, as the pod: a signed sts:GetCallerIdentity request.

The pod's AWS credentials come from its own identity, never the node's: IRSA
(AssumeRoleWithWebIdentity with the pod's token, unsigned, so botocore never looks for the
node's credentials) or the EKS Pod Identity agent (the pod's pods.eks.amazonaws.com token).
botocore's SigV4Auth signs the request; Vault replays it to STS and logs in whoever signed it.
The credentials live only for the login: the Vault token is what is cached (auth.py).

This repeats a little of backends/aws/auth.py (the stores are independent of each other):
the role annotation, the unsigned STS call and the agent call.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from backends.proxies import Proxies, proxied_requests
from backends.vault.methods import AwsAuth
from backends.wire import MAX_SMALL_BODY, read_capped
from provider.core.backend import BackendEnv
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    PermissionDenied,
    StoreUnavailable,
    redacted,
    scrub,
)
from provider.core.identity import Annotation, pod_named, pod_token
from provider.core.model import Pod

log = logging.getLogger("secrets_bridge.vault")

ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
SERVER_ID_HEADER = "X-Vault-AWS-IAM-Server-ID"
#: The EKS Pod Identity agent's link-local addresses, IPv4 first (as the AWS SDKs try them).
AGENT_URLS = ("http://169.254.170.23/v1/credentials", "http://[fd00:ec2::23]/v1/credentials")
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

    @property
    def key(self) -> str:
        return f"irsa:{self.role_arn}" if self.kind == "irsa" else "pod-identity"

    def describe(self) -> str:
        return f"AWS role {self.role_arn}" if self.kind == "irsa" else "EKS Pod Identity"


@dataclass(frozen=True)
class AwsCredentials:
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(default="", repr=False)


class AwsSigner:
    """The pod's AWS identity (`who`) and its signed login (`login_data`), per backend."""

    def __init__(self, env: BackendEnv[Any]) -> None:
        self._env = env
        self._session: Any = None
        self._annotations = Annotation(env, ROLE_ANNOTATION, "vaultAWSRoleArn")
        self._request_class = proxied_requests(Proxies.from_env())

    async def who(self, aws: AwsAuth, audience: str, pod: Pod) -> AwsPod:
        """The pod's AWS identity, refused before any cache when its token is missing."""
        named = pod_named(pod)
        if aws.pod_identity:
            token = await pod_token(self._env, pod, audience)
            return AwsPod("pod-identity", token=token, pod=named)
        role = aws.role_arn or await self._annotations.of(pod)
        if not role:
            raise InvalidParameters(
                f"Vault's aws login for pod {named} needs an AWS role: set vaultAWSRoleArn, "
                f"annotate ServiceAccount {pod.subject} with {ROLE_ANNOTATION}, or set "
                "vaultAWSUsePodIdentity"
            )
        token = await pod_token(self._env, pod, audience)
        return AwsPod("irsa", role, _session_name(pod), token, named)

    async def login_data(self, aws: AwsAuth, who: AwsPod, subject: str) -> dict[str, str]:
        """The iam login fields, signed with the pod's AWS credentials."""
        if who.kind == "irsa":
            creds = await self._assume(aws, who, subject)
        else:
            creds = await self._from_agent(who, subject)
        return signed_login(aws, creds)

    async def _assume(self, aws: AwsAuth, who: AwsPod, subject: str) -> AwsCredentials:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session
        from botocore import UNSIGNED

        if self._session is None:
            self._session = get_session()
        pod = who.pod or subject
        what = f"AssumeRoleWithWebIdentity for {who.role_arn} in {aws.region} (pod {pod})"
        hint = (
            f"; the role's trust policy must allow {subject} "
            f"(sub system:serviceaccount:{subject.replace('/', ':')}, aud of the pod's token)"
        )
        config = AioConfig(
            signature_version=UNSIGNED,
            retries={"total_max_attempts": 1},
            connect_timeout=_TIMEOUT,
            read_timeout=_TIMEOUT,
        )
        with self._env.metrics.backend_call("vault", "AssumeRoleWithWebIdentity"), _sdk(what, hint):
            # --aws-sts-endpoint, as for the aws store; else AWS_ENDPOINT_URL_STS (botocore's).
            endpoint = self._env.core.aws_sts_endpoint
            async with self._session.create_client(
                "sts", aws.region, config=config, endpoint_url=endpoint
            ) as sts:
                answer = await sts.assume_role_with_web_identity(
                    RoleArn=who.role_arn,
                    RoleSessionName=who.session_name,
                    WebIdentityToken=who.token,
                )
            raw = answer["Credentials"]
            return AwsCredentials(
                raw["AccessKeyId"], raw["SecretAccessKey"], raw.get("SessionToken", "")
            )

    async def _from_agent(self, who: AwsPod, subject: str) -> AwsCredentials:
        last: BridgeError | None = None
        # The variable the Pod Identity webhook sets in pods (and tests set to a stub).
        override = os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI", "")
        for url in (override,) if override else AGENT_URLS:
            try:
                return await self._ask_agent(url, who, subject)
            except StoreUnavailable as exc:
                last = exc  # the IPv6 address when the IPv4 one is unreachable
        assert last is not None
        raise last

    async def _ask_agent(self, url: str, who: AwsPod, subject: str) -> AwsCredentials:
        import aiohttp

        what = f"EKS Pod Identity agent at {url} (pod {who.pod or subject})"
        timeout = aiohttp.ClientTimeout(total=_TIMEOUT)
        with self._env.metrics.backend_call("vault", "PodIdentityCredentials"), _sdk(what, ""):
            async with (
                aiohttp.ClientSession(timeout=timeout, request_class=self._request_class) as http,
                # No redirect: it would carry the pod's token to the host it names.
                http.get(url, headers={"Authorization": who.token}, allow_redirects=False) as r,
            ):
                body = await read_capped(r, MAX_SMALL_BODY, what)
                status = r.status
        if status == 200:
            return _agent_credentials(body, what)
        log.debug("%s answered HTTP %s (not relayed): %s", what, status, redacted(body))
        if status in (400, 401, 403, 404):
            raise PermissionDenied(
                f"{what}: refused (HTTP {status}); create a Pod Identity association for "
                f"ServiceAccount {subject}, or unset vaultAWSUsePodIdentity"
            )
        raise StoreUnavailable(f"{what}: HTTP {status}")


def signed_login(aws: AwsAuth, creds: AwsCredentials) -> dict[str, str]:
    """Vault's iam login fields: a GetCallerIdentity request signed by botocore's SigV4Auth,
    with the X-Vault-AWS-IAM-Server-ID header among the signed ones when the class sets it."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    if aws.server_id:
        headers[SERVER_ID_HEADER] = aws.server_id
    request = AWSRequest("POST", aws.sts_url, data=GET_CALLER_IDENTITY, headers=headers)
    signing = Credentials(creds.access_key_id, creds.secret_access_key, creds.session_token or None)
    SigV4Auth(signing, "sts", aws.region).add_auth(request)
    # Go's http.Header shape, as Vault's own clients send it.
    signed = {name: [str(value)] for name, value in request.headers.items()}
    return {
        "iam_http_request_method": "POST",
        "iam_request_url": _b64(aws.sts_url),
        "iam_request_body": _b64(GET_CALLER_IDENTITY),
        "iam_request_headers": _b64(json.dumps(signed)),
    }


def _agent_credentials(body: bytes, what: str) -> AwsCredentials:
    try:
        data = json.loads(body)
        return AwsCredentials(
            str(data["AccessKeyId"]), str(data["SecretAccessKey"]), str(data.get("Token", ""))
        )
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        raise StoreUnavailable(f"{what}: the answer holds no credentials") from None


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


def _session_name(pod: Pod) -> str:
    # CloudTrail shows it: name the pod's service account; AWS allows [\w+=,.@-]{2,64}.
    name = re.sub(r"[^\w+=,.@-]", "-", f"secrets-bridge-{pod.namespace}-{pod.service_account}")
    return name[:64]
