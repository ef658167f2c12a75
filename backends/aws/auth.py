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
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from backends.aws.chaining import Chainer
from backends.aws.clients import ClientPool
from backends.aws.errors import STALE_CREDENTIALS, AwsDenied, translated
from backends.aws.options import Options
from backends.aws.refs import AssumeRole, AwsStore
from backends.clouds.aws import Credentials, PodAws, agent_urls, failover, session_name
from backends.clouds.names import IRSA_AUDIENCE, POD_IDENTITY_AUDIENCE, ROLE_ANNOTATION
from provider.core.backend import BackendEnv
from provider.core.identity import pod_named, pod_scope, pod_token, require_node_identity
from provider.core.model import FetchContext, Identity, Pod, identity_key

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
    #: When the ServiceAccount annotation that named the role is read again.
    until: float = field(default=math.inf, compare=False)

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
        self._aws = PodAws(env, "aws", translated, "the roleArn parameter")

    async def identify(self, store: AwsStore, pod: Pod) -> Identity:
        login = await self._login(store, pod)
        auth = {"irsa": f"irsa:{login.role_arn}", "node": "node"}.get(
            login.kind, f"pod-identity:{store.address_type}"
        )
        where = (store.region, store.failover_region or "-")
        scope = pod_scope(self._env, pod)
        base_key = identity_key("aws", *where, auth, scope)
        if store.assume_role is None:
            return Identity(base_key, pod.subject, login, login.until)
        # The second role, its external id, tags and duration are part of the key: two classes
        # with different chains never share credentials (the first hop they may share).
        key = identity_key("aws", *where, auth, store.assume_role.key_part, scope)
        login = dataclasses.replace(login, base_key=base_key, assume=store.assume_role)
        return Identity(key, pod.subject, login, login.until)

    async def _login(self, store: AwsStore, pod: Pod) -> Login:
        session, named = session_name(pod), pod_named(pod)
        if store.use_pod_identity:
            token = await pod_token(self._env, pod, POD_IDENTITY_AUDIENCE)
            return Login("pod-identity", session_name=session, token=token, pod=named)
        role, until = await self._aws.role(store.role_arn, pod)
        if role:
            token = await pod_token(self._env, pod, IRSA_AUDIENCE)
            return Login("irsa", role, session, token, pod=named, until=until)
        require_node_identity(
            self._env,
            pod,
            f"The AWS class (no roleArn parameter, no {ROLE_ANNOTATION} annotation on "
            f"ServiceAccount {pod.subject}, usePodIdentity not set)",
        )
        return Login("node", session_name=session, pod=named, until=until)

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
            return await self._aws.web_identity(
                self._sts, store.regions, login, subject, IRSA_AUDIENCE
            )

        return await self._env.retry(attempt, ctx)

    @asynccontextmanager
    async def _sts(self, region: str) -> AsyncIterator[Any]:
        # The pool's client outlives the call: the pool closes it.
        yield await self._pool.get("sts", region, None, unsigned=True)

    async def _pod_identity(self, store: AwsStore, login: Login, subject: str) -> Credentials:
        urls = agent_urls(store.address_type, self._options.pod_identity_endpoint)
        return await failover(urls, lambda url: self._ask_agent(url, login, subject))

    async def _ask_agent(self, url: str, login: Login, subject: str) -> Credentials:
        return await self._aws.from_agent(
            url,
            login,
            subject,
            instead="set usePodIdentity to false",
            total_seconds=self._options.connect_timeout + self._options.read_timeout,
            connect_seconds=self._options.connect_timeout,
        )


def _ttl(creds: Credentials) -> float:
    """How long to keep credentials: until a margin before expiry (a fifth of their life)."""
    if not creds.expires:
        return 600.0  # unknown expiry: short, so a revoked role is noticed soon
    remaining = creds.expires - time.time()
    return max(0.0, remaining - min(EXPIRY_MARGIN, remaining / 5))
