"""Who the pod is to AWS, and the temporary credentials that go with it.

Three ways, chosen per class:
  - EKS Pod Identity (`usePodIdentity: "true"`): the pod's `pods.eks.amazonaws.com` token is
    sent to the node's Pod Identity agent, which answers with the associated role's credentials.
  - IRSA: AssumeRoleWithWebIdentity with the pod's `sts.amazonaws.com` token for `roleArn`, or
    for the ServiceAccount's `eks.amazonaws.com/role-arn` annotation.
  - The node's own credentials (the provider's default chain): only for namespaces listed in
    --allow-node-identity-namespaces, because a pod author can leave every parameter out.
Then, when the class names `assumeRoleArn`, that role is assumed with those credentials
(backends/aws/chaining.py). Credentials are cached per identity key until shortly before they
expire, so a rollout of many pods under one ServiceAccount logs in once.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from backends.aws.chaining import Chainer
from backends.aws.clients import ClientPool, Credentials, epoch, sts_credentials
from backends.aws.errors import STALE_CREDENTIALS, AwsDenied, translated
from backends.aws.options import POD_IDENTITY_IPV4, POD_IDENTITY_IPV6, Options
from backends.aws.refs import AssumeRole, AwsStore
from backends.proxies import Proxies, proxied_requests
from backends.wire import MAX_SMALL_BODY, read_capped
from provider.core.backend import BackendEnv
from provider.core.errors import (
    BridgeError,
    PermissionDenied,
    StoreUnavailable,
    redacted,
)
from provider.core.identity import (
    Annotation,
    pod_named,
    pod_scope,
    pod_token,
    require_node_identity,
)
from provider.core.model import FetchContext, Identity, Pod, identity_key

log = logging.getLogger("secrets_bridge.aws")

IRSA_AUDIENCE = "sts.amazonaws.com"
POD_IDENTITY_AUDIENCE = "pods.eks.amazonaws.com"
ROLE_ANNOTATION = "eks.amazonaws.com/role-arn"
#: Seconds a ServiceAccount's role annotation is reused (a rollout reads it once).
#: Credentials are dropped this long before AWS stops accepting them (at most).
EXPIRY_MARGIN = 300.0


@dataclass(frozen=True)
class Login:
    """How to obtain credentials; `token` is the pod's, never logged or keyed."""

    kind: Literal["irsa", "pod-identity", "node"]
    role_arn: str = ""
    session_name: str = ""
    token: str = field(default="", repr=False)
    #: The identity key of the first hop's credentials ("" = the identity's own key).
    base_key: str = ""
    #: The role assumed next with them (`assumeRoleArn`), if any.
    assume: AssumeRole | None = None
    #: The pod whose mount made the login, as refusals name it (identity.pod_named).
    pod: str = field(default="", compare=False)

    def describe(self, subject: str) -> str:
        then = f", then role {self.assume.role_arn}" if self.assume else ""
        return self.first_hop(subject) + then

    def first_hop(self, subject: str) -> str:
        who = self.pod or subject
        if self.kind == "irsa":
            return f"{who} as role {self.role_arn}"
        if self.kind == "pod-identity":
            return f"{who} via EKS Pod Identity"
        return f"{who} with the node's credentials"

    def principal(self, subject: str) -> str:
        """Who the second role's trust policy must trust."""
        if self.kind == "irsa":
            return f"role {self.role_arn}"
        if self.kind == "pod-identity":
            return f"the EKS Pod Identity role of ServiceAccount {subject}"
        return "the node's own role"


class Authenticator:
    def __init__(self, env: BackendEnv[Options], options: Options, pool: ClientPool) -> None:
        self._env = env
        self._options = options
        self._pool = pool
        self._chainer = Chainer(env, pool)
        self._annotations = Annotation(env, ROLE_ANNOTATION, "the roleArn parameter")
        # The agent is called as the AWS SDKs call a credentials endpoint: through HTTP_PROXY
        # unless NO_PROXY lists it (with a proxy, list 169.254.170.23 and fd00:ec2::23 there).
        self._request_class = proxied_requests(Proxies.from_env())

    async def identify(self, store: AwsStore, pod: Pod) -> Identity:
        login = await self._login(store, pod)
        auth = {"irsa": f"irsa:{login.role_arn}", "node": "node"}.get(
            login.kind, f"pod-identity:{store.address_type}"
        )
        where = (store.region, store.failover_region or "-")
        scope = pod_scope(self._env, pod)
        base_key = identity_key("aws", *where, auth, scope)
        if store.assume_role is None:
            return Identity(key=base_key, subject=pod.subject, credential=login)
        # The second role, its external id, tags and duration are part of the key: two classes
        # with different chains never share credentials (the first hop they may share).
        key = identity_key("aws", *where, auth, store.assume_role.key_part, scope)
        login = dataclasses.replace(login, base_key=base_key, assume=store.assume_role)
        return Identity(key=key, subject=pod.subject, credential=login)

    async def _login(self, store: AwsStore, pod: Pod) -> Login:
        session, named = _session_name(pod), pod_named(pod)
        if store.use_pod_identity:
            token = await pod_token(self._env, pod, POD_IDENTITY_AUDIENCE)
            return Login("pod-identity", session_name=session, token=token, pod=named)
        role = store.role_arn or await self._annotations.of(pod)
        if role:
            token = await pod_token(self._env, pod, IRSA_AUDIENCE)
            return Login("irsa", role, session, token, pod=named)
        require_node_identity(
            self._env,
            pod,
            f"The AWS class (no roleArn parameter, no {ROLE_ANNOTATION} annotation on "
            f"ServiceAccount {pod.subject}, usePodIdentity not set)",
        )
        return Login("node", session_name=session, pod=named)

    async def credentials(
        self, store: AwsStore, identity: Identity, ctx: FetchContext
    ) -> Credentials | None:
        login = identity.credential
        assert isinstance(login, Login)
        base = await self._first_hop(store, login, identity, ctx)
        role = login.assume
        if role is None:
            return base

        async def chained(first: Credentials | None) -> Credentials:
            principal = login.principal(identity.subject)
            who = login.first_hop(identity.subject)
            return await self._chainer.assume(
                store, role, first, login.session_name, who, principal, ctx
            )

        async def load() -> tuple[Credentials, float]:
            try:
                creds = await chained(base)
            except AwsDenied as exc:
                if base is None or exc.aws_code not in STALE_CREDENTIALS:
                    raise
                # The first hop's credentials went stale before we thought: once more, fresh.
                self._env.credentials.invalidate(login.base_key, base)
                creds = await chained(await self._first_hop(store, login, identity, ctx))
            return creds, _ttl(creds)

        creds: Credentials = await self._env.credentials.get_or_load(identity.key, load)
        return creds

    async def _first_hop(
        self, store: AwsStore, login: Login, identity: Identity, ctx: FetchContext
    ) -> Credentials | None:
        """The pod's own credentials (None: the node's, which the SDK finds itself)."""
        if login.kind == "node":
            return None

        async def from_agent() -> Credentials:
            return await self._pod_identity(store, login, identity.subject)

        async def load() -> tuple[Credentials, float]:
            if login.kind == "irsa":
                creds = await self._assume_role(store, login, identity.subject, ctx)
            else:
                # tenacity awaits only coroutine functions, never a lambda's coroutine.
                creds = await self._env.retry(from_agent, ctx)
            return creds, _ttl(creds)

        creds: Credentials = await self._env.credentials.get_or_load(
            login.base_key or identity.key, load
        )
        return creds

    def forget(self, identity: Identity, stale: Credentials | None) -> None:
        """Drop credentials AWS called expired, so the next call logs in again (once)."""
        self._env.credentials.invalidate(identity.key, stale)

    async def _assume_role(
        self, store: AwsStore, login: Login, subject: str, ctx: FetchContext
    ) -> Credentials:
        async def attempt() -> Credentials:
            # STS in the failover region when the primary's is unreachable.
            last: BridgeError | None = None
            for region in store.regions:
                try:
                    return await self._assume_in(region, login, subject)
                except BridgeError as exc:
                    if not exc.transient:
                        raise
                    last = exc
            assert last is not None
            raise last

        return await self._env.retry(attempt, ctx)

    async def _assume_in(self, region: str, login: Login, subject: str) -> Credentials:
        pod = login.pod or subject
        what = f"AssumeRoleWithWebIdentity for {login.role_arn} in {region} (pod {pod})"
        hint = (
            f"; the role's trust policy must allow {subject} "
            f"(sub system:serviceaccount:{subject.replace('/', ':')}, aud {IRSA_AUDIENCE})"
        )
        operation = "AssumeRoleWithWebIdentity"
        with self._env.metrics.backend_call("aws", operation), translated(what, hint):
            client = await self._pool.get("sts", region, None, unsigned=True)
            response = await client.assume_role_with_web_identity(
                RoleArn=login.role_arn,
                RoleSessionName=login.session_name,
                WebIdentityToken=login.token,
            )
            return sts_credentials(response["Credentials"])

    async def _pod_identity(self, store: AwsStore, login: Login, subject: str) -> Credentials:
        endpoints = self._agent_endpoints(store)
        last: BridgeError | None = None
        for url in endpoints:
            try:
                return await self._ask_agent(url, login, subject)
            except StoreUnavailable as exc:
                last = exc  # "auto" tries IPv6 when IPv4 is unreachable, as upstream
        assert last is not None
        raise last

    def _agent_endpoints(self, store: AwsStore) -> list[str]:
        if self._options.pod_identity_endpoint:
            return [self._options.pod_identity_endpoint]
        return {
            "ipv4": [POD_IDENTITY_IPV4],
            "ipv6": [POD_IDENTITY_IPV6],
        }.get(store.address_type, [POD_IDENTITY_IPV4, POD_IDENTITY_IPV6])

    async def _ask_agent(self, url: str, login: Login, subject: str) -> Credentials:
        import aiohttp

        what = f"EKS Pod Identity agent at {url} (pod {login.pod or subject})"
        timeout = aiohttp.ClientTimeout(
            total=self._options.connect_timeout + self._options.read_timeout,
            connect=self._options.connect_timeout,
        )
        with self._env.metrics.backend_call("aws", "PodIdentityCredentials"), translated(what):
            async with (
                aiohttp.ClientSession(timeout=timeout, request_class=self._request_class) as http,
                # No redirect: it would carry the pod's token to the host it names.
                http.get(
                    url, headers={"Authorization": login.token}, allow_redirects=False
                ) as response,
            ):
                body = await read_capped(response, MAX_SMALL_BODY, what)
                status = response.status
                if status == 200:
                    return _agent_credentials(_json(body), what)
        # The agent's error text is not relayed (backends/wire.py); its status says enough.
        log.debug("%s answered HTTP %s (not relayed): %s", what, status, redacted(body))
        if status in (400, 401, 403, 404):
            raise PermissionDenied(
                f"{what}: refused (HTTP {status}); create a Pod Identity "
                f"association for ServiceAccount {subject}, or set usePodIdentity to false"
            )
        raise StoreUnavailable(f"{what}: HTTP {status}")


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def _agent_credentials(data: Any, what: str) -> Credentials:
    try:
        return Credentials(
            access_key_id=str(data["AccessKeyId"]),
            secret_access_key=str(data["SecretAccessKey"]),
            session_token=str(data.get("Token", "")),
            expires=epoch(data.get("Expiration")),
        )
    except (KeyError, TypeError, AttributeError):
        raise StoreUnavailable(f"{what}: the answer holds no credentials") from None


def _ttl(creds: Credentials) -> float:
    """How long to keep credentials: until a margin before expiry (a fifth of their life)."""
    if not creds.expires:
        return 600.0  # unknown expiry: short, so a revoked role is noticed soon
    remaining = creds.expires - time.time()
    return max(0.0, remaining - min(EXPIRY_MARGIN, remaining / 5))


def _session_name(pod: Pod) -> str:
    # CloudTrail shows it: name the pod's service account; AWS allows [\w+=,.@-]{2,64}.
    name = re.sub(r"[^\w+=,.@-]", "-", f"secrets-bridge-{pod.namespace}-{pod.service_account}")
    return name[:64]
