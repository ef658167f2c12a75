"""The pod's AWS credentials, for every store that needs them: the aws store and Vault's aws login.

  - IRSA: AssumeRoleWithWebIdentity with the pod's `sts.amazonaws.com` token for the class's
    role, or for the ServiceAccount's `eks.amazonaws.com/role-arn` annotation. The call is
    unsigned (the pod's token is the credential), so botocore never looks for the node's.
  - EKS Pod Identity: the pod's `pods.eks.amazonaws.com` token sent to the node's agent, which
    answers with the associated role's credentials.
  - `failover`: the one loop that tries the next region (or agent address) while the last one
    failed transiently; `sdk_client`: the one aiobotocore client configuration.

What differs by store is the caller's: its metrics label, its translation of SDK exceptions
(each store has its own error words), where its STS clients come from and what its refusals
tell the class author to change. Credentials are not cached here: the aws store caches them,
Vault caches the token they log in to.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

from backends.clouds.names import (
    POD_IDENTITY_IPV4,
    POD_IDENTITY_IPV6,
    ROLE_ANNOTATION,
)
from backends.proxies import Proxies, proxied_requests
from backends.wire import MAX_SMALL_BODY, read_capped
from provider.core.backend import BackendEnv
from provider.core.errors import BridgeError, PermissionDenied, StoreUnavailable, redacted
from provider.core.identity import Annotation
from provider.core.model import Pod

T = TypeVar("T")


#: A store's translation of SDK exceptions: `guard(what, hint)` around each call.
Guard = Callable[[str, str], AbstractContextManager[None]]
#: An unsigned STS client for a region, for the length of one call.
StsClient = Callable[[str], AbstractAsyncContextManager[Any]]


class PodLogin(Protocol):
    """What a store's login holds for AWS; `pod` names the pod in messages ("": use the
    ServiceAccount)."""

    @property
    def role_arn(self) -> str: ...
    @property
    def session_name(self) -> str: ...
    @property
    def token(self) -> str: ...
    @property
    def pod(self) -> str: ...


@dataclass(frozen=True)
class Credentials:
    """Temporary AWS credentials; only the access key id may appear anywhere."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str = field(repr=False, default="")
    #: Seconds since the epoch at which AWS stops accepting them (0 = unknown).
    expires: float = 0.0

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(
            f"{self.access_key_id}\0{self.secret_access_key}\0{self.session_token}".encode()
        )
        return digest.hexdigest()[:24]


def sts_credentials(raw: Any) -> Credentials:
    """The `Credentials` member of an STS answer (AssumeRole, AssumeRoleWithWebIdentity)."""
    return Credentials(
        access_key_id=raw["AccessKeyId"],
        secret_access_key=raw["SecretAccessKey"],
        session_token=raw.get("SessionToken", ""),
        expires=epoch(raw.get("Expiration")),
    )


def epoch(value: Any) -> float:
    """An expiry as seconds since the epoch: botocore's datetime or the agent's ISO text."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return 0.0
    return 0.0


def session_name(pod: Pod) -> str:
    # CloudTrail shows it: name the pod's service account; AWS allows [\w+=,.@-]{2,64}.
    name = re.sub(r"[^\w+=,.@-]", "-", f"secrets-bridge-{pod.namespace}-{pod.service_account}")
    return name[:64]


def agent_urls(address_type: str, override: str | None) -> list[str]:
    """Where the Pod Identity agent is asked: `override` alone, else its addresses by the
    class's address type ("auto": IPv6 when IPv4 is unreachable, as upstream)."""
    if override:
        return [override]
    return {
        "ipv4": [POD_IDENTITY_IPV4],
        "ipv6": [POD_IDENTITY_IPV6],
    }.get(address_type, [POD_IDENTITY_IPV4, POD_IDENTITY_IPV6])


async def failover(places: Sequence[str], call: Callable[[str], Awaitable[T]]) -> T:
    """`call` at the first place (region, agent address), at the next while the last one
    failed transiently (unreachable, throttled); a refusal ends it at once."""
    last: BridgeError | None = None
    for place in places:
        try:
            return await call(place)
        except BridgeError as exc:
            if not exc.transient:
                raise
            last = exc
    assert last is not None
    raise last


def sdk_client(
    session: Any,
    service: str,
    region: str,
    *,
    endpoint: str | None,
    creds: Credentials | None = None,
    unsigned: bool = False,
    connect_timeout: float,
    read_timeout: float,
    max_connections: int = 10,
) -> Any:
    """aiobotocore's client context for `service`: signed with `creds` (None: the provider's
    own chain), or not at all (`unsigned`); `endpoint` None lets botocore apply
    AWS_ENDPOINT_URL*."""
    from aiobotocore.config import AioConfig
    from botocore import UNSIGNED

    config: dict[str, Any] = {
        # Retries are ours (provider/core/retrying.py), bounded by the Mount's deadline.
        "retries": {"total_max_attempts": 1},
        "connect_timeout": connect_timeout,
        "read_timeout": read_timeout,
        "max_pool_connections": max_connections,
    }
    kwargs: dict[str, Any] = {"region_name": region, "endpoint_url": endpoint}
    if unsigned:
        config["signature_version"] = UNSIGNED
    elif creds is not None:
        kwargs.update(
            aws_access_key_id=creds.access_key_id,
            aws_secret_access_key=creds.secret_access_key,
            aws_session_token=creds.session_token or None,
        )
    return session.create_client(service, config=AioConfig(**config), **kwargs)


class PodAws:
    """The pod's AWS credentials as one store asks for them (`label` names it in metrics and
    logs; `guard` is its translation of SDK exceptions; `role_parameter` its class parameter
    that makes the annotation unnecessary)."""

    def __init__(self, env: BackendEnv[Any], label: str, guard: Guard, role_parameter: str) -> None:
        self._env = env
        self._label = label
        self._guard = guard
        self._log = logging.getLogger(f"secrets_bridge.{label}")
        self._annotations = Annotation(env, ROLE_ANNOTATION, role_parameter)
        # The agent is called as the AWS SDKs call a credentials endpoint: through HTTP_PROXY
        # unless NO_PROXY lists it (with a proxy, list 169.254.170.23 and fd00:ec2::23 there).
        self._request_class = proxied_requests(Proxies.from_env())

    async def role(self, given: str, pod: Pod) -> tuple[str, float]:
        """The IRSA role: the class's, else the ServiceAccount's annotation ("": neither); and
        until when it holds (`Identity.expires`: when the annotation is read again)."""
        if given:
            return given, math.inf
        return await self._annotations.read(pod)

    async def web_identity(
        self, sts: StsClient, regions: Sequence[str], login: PodLogin, subject: str, aud: str
    ) -> Credentials:
        """AssumeRoleWithWebIdentity in the first region whose STS answers; `subject` is the
        pod's ServiceAccount, `aud` how refusals name its token's audience."""
        hint = (
            f"; the role's trust policy must allow {subject} "
            f"(sub system:serviceaccount:{subject.replace('/', ':')}, aud {aud})"
        )

        async def assume(region: str) -> Credentials:
            pod = login.pod or subject
            what = f"AssumeRoleWithWebIdentity for {login.role_arn} in {region} (pod {pod})"
            operation = "AssumeRoleWithWebIdentity"
            with self._env.metrics.backend_call(self._label, operation), self._guard(what, hint):
                async with sts(region) as client:
                    response = await client.assume_role_with_web_identity(
                        RoleArn=login.role_arn,
                        RoleSessionName=login.session_name,
                        WebIdentityToken=login.token,
                    )
                return sts_credentials(response["Credentials"])

        return await failover(regions, assume)

    async def from_agent(
        self,
        url: str,
        login: PodLogin,
        subject: str,
        *,
        instead: str,
        total_seconds: float,
        connect_seconds: float | None = None,
    ) -> Credentials:
        """The EKS Pod Identity agent's credentials for the pod's token; `instead` is how the
        class stops asking for Pod Identity, for a refusal."""
        import aiohttp

        what = f"EKS Pod Identity agent at {url} (pod {login.pod or subject})"
        limits = aiohttp.ClientTimeout(total=total_seconds, connect=connect_seconds)
        with (
            self._env.metrics.backend_call(self._label, "PodIdentityCredentials"),
            self._guard(what, ""),
        ):
            async with (
                aiohttp.ClientSession(timeout=limits, request_class=self._request_class) as http,
                # No redirect: it would carry the pod's token to the host it names.
                http.get(url, headers={"Authorization": login.token}, allow_redirects=False) as r,
            ):
                body = await read_capped(r, MAX_SMALL_BODY, what)
                status = r.status
            if status == 200:
                return _agent_credentials(body, what)
        # The agent's error text is not relayed (backends/wire.py); its status says enough.
        self._log.debug("%s answered HTTP %s (not relayed): %s", what, status, redacted(body))
        if status in (400, 401, 403, 404):
            raise PermissionDenied(
                f"{what}: refused (HTTP {status}); create a Pod Identity association for "
                f"ServiceAccount {subject}, or {instead}"
            )
        raise StoreUnavailable(f"{what}: HTTP {status}")


def _agent_credentials(body: bytes, what: str) -> Credentials:
    try:
        data = json.loads(body)
        return Credentials(
            access_key_id=str(data["AccessKeyId"]),
            secret_access_key=str(data["SecretAccessKey"]),
            session_token=str(data.get("Token", "")),
            expires=epoch(data.get("Expiration")),
        )
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError):
        raise StoreUnavailable(f"{what}: the answer holds no credentials") from None
