"""The gcp Backend: identity from backends/gcp/auth.py, reads through backends/gcp/client.py.

A fetch logs in once (cached per identity), then reads every unique secret version in parallel,
bounded by a semaphore so a rollout stays under Secret Manager's per-project quotas. Each value
carries the resolved version name as its object version, so `latest` rotates when a new version
is added and stays put otherwise. Per-object failures are returned; a refused login is raised.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence

from backends.gcp.auth import Authenticator
from backends.gcp.client import SecretManager
from backends.gcp.dialect import GcpRef
from backends.gcp.errors import TokenRejected
from backends.gcp.exchange import AccessToken, TokenEndpoints
from provider.core.errors import BridgeError
from provider.core.model import (
    BackendEnv,
    FetchContext,
    Fetched,
    Identity,
    Pod,
    SecretValue,
    StorePlan,
)
from provider.core.retrying import retry_reason, retry_transient

#: Concurrent AccessSecretVersion calls per provider process (quota: 90,000/min/project).
MAX_CONCURRENT_READS = 32


class GcpBackend:
    name = "gcp"

    def __init__(self, env: BackendEnv) -> None:
        from backends.gcp.options import Options

        self._env = env
        options = env.options if env.options is not None else Options()
        self._endpoints = TokenEndpoints(
            options.sts_endpoint, options.iam_endpoint, options.ca_file
        )
        self._auth = Authenticator(env, self._endpoints)
        self._secrets = SecretManager(options)
        self._limit = asyncio.Semaphore(MAX_CONCURRENT_READS)

    async def identify(self, plan: StorePlan, pod: Pod) -> Identity:
        return await self._auth.identify(plan, pod)

    async def fetch(
        self, plan: StorePlan, identity: Identity, refs: Sequence[Hashable], ctx: FetchContext
    ) -> Mapping[Hashable, Fetched]:
        token = await self._auth.access_token(identity, ctx)
        results = await asyncio.gather(*(self._read(r, token, identity, ctx) for r in refs))
        return dict(zip(refs, results, strict=True))

    async def _read(
        self, ref: Hashable, token: AccessToken, identity: Identity, ctx: FetchContext
    ) -> Fetched:
        assert isinstance(ref, GcpRef)
        try:
            try:
                return await self._access(ref, token, identity, ctx)
            except TokenRejected:
                # A token Google no longer accepts (revoked, or cached across a key rotation):
                # log in again once; concurrent readers share that one login.
                self._auth.forget(identity, token)
                fresh = await self._auth.access_token(identity, ctx)
                return await self._access(ref, fresh, identity, ctx)
        except BridgeError as exc:
            return exc

    async def _access(
        self, ref: GcpRef, token: AccessToken, identity: Identity, ctx: FetchContext
    ) -> Sequence[SecretValue]:
        async def call() -> Sequence[SecretValue]:
            async with self._limit:
                with self._env.metrics.backend_call("gcp", "AccessSecretVersion"):
                    got = await self._secrets.access(
                        ref, token.token, identity.subject, ctx.deadline
                    )
            return [SecretValue(content=got.data, version=got.name)]

        def count(exc: BaseException) -> None:
            self._env.metrics.retries.labels("gcp", retry_reason(exc)).inc()

        return await retry_transient(call, ctx, on_retry=count)

    async def close(self) -> None:
        await self._secrets.close()
        await self._endpoints.close()


def create(env: BackendEnv) -> GcpBackend:
    return GcpBackend(env)
