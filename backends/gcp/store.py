"""The gcp Backend: identity from backends/gcp/auth.py, reads through backends/gcp/client.py.

A fetch logs in once (cached per identity), then reads every unique secret version in parallel,
bounded by a semaphore so a rollout stays under Secret Manager's per-project quotas. Each value
carries the resolved version name as its object version, so `latest` rotates when a new version
is added and stays put otherwise. Parameter Manager versions (backends/gcp/parameters.py) go
through the same login, limits and retries; their version is an HMAC of the rendered content.
Per-object failures are returned; a refused login is raised. Selectors (`select`) list and
read through backends/gcp/selecting.py, on the same login, slots and retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from backends.clouds.gcp import AccessToken, GoogleTokens
from backends.gcp import dialect
from backends.gcp.auth import Authenticator
from backends.gcp.client import SecretManager
from backends.gcp.dialect import GcpRef, GcpStore, Ref
from backends.gcp.errors import TokenRejected
from backends.gcp.options import Options
from backends.gcp.parameters import ParameterManager
from backends.gcp.selecting import SecretSelector
from backends.gcp.selection import GcpSelection
from provider.core.backend import Backend, BackendEnv, Dialect
from provider.core.errors import BridgeError
from provider.core.model import FetchContext, Fetched, Identity, Pod, SecretValue, StorePlan
from provider.core.selection import Selecting

#: Concurrent AccessSecretVersion calls per provider process (quota: 90,000/min/project).
MAX_CONCURRENT_READS = 32

Plan = StorePlan[GcpStore, Ref]


class GcpBackend:
    name = "gcp"

    def __init__(self, env: BackendEnv[Options]) -> None:
        self._env = env
        options = env.options
        self._tokens = GoogleTokens(options.ca_file)
        self._auth = Authenticator(env, self._tokens)
        self._secrets = SecretManager(options)
        self._parameters = ParameterManager(options)
        self._limit = asyncio.Semaphore(MAX_CONCURRENT_READS)
        self._selector = SecretSelector(env, self._secrets, self._limit)
        #: What each identity's selections held at its last poll.
        self.selections = self._selector.selections

    async def identify(self, plan: Plan, pod: Pod) -> Identity:
        return await self._auth.identify(plan, pod)

    async def fetch(
        self, plan: Plan, identity: Identity, refs: Sequence[Ref], ctx: FetchContext
    ) -> Mapping[Ref, Fetched]:
        token = await self._auth.access_token(identity, ctx)
        # Every answer is charged to the mount's budget and the bytes in flight (ReadBytes, by
        # the client's calls); once spent, the reads still waiting are cancelled.
        async with self._env.reads.fetch(identity.key) as held:
            results = await held.gather(*(self._read(r, token, identity, ctx) for r in refs))
        return {ref: _fetched(result) for ref, result in zip(refs, results, strict=True)}

    async def _read(
        self, ref: Ref, token: AccessToken, identity: Identity, ctx: FetchContext
    ) -> Fetched:
        try:
            try:
                return await self._answer(ref, token, identity, ctx)
            except TokenRejected:
                # A token Google no longer accepts (revoked, or cached across a key rotation):
                # log in again once; concurrent readers share that one login.
                self._auth.forget(identity, token)
                fresh = await self._auth.access_token(identity, ctx)
                return await self._answer(ref, fresh, identity, ctx)
        except BridgeError as exc:
            return exc

    async def _answer(
        self, ref: Ref, token: AccessToken, identity: Identity, ctx: FetchContext
    ) -> Fetched:
        if isinstance(ref, GcpSelection):
            return await self._selector.select(ref, token.token, identity, ctx)
        return await self._access(ref, token, identity, ctx)

    async def _access(
        self, ref: GcpRef, token: AccessToken, identity: Identity, ctx: FetchContext
    ) -> Sequence[SecretValue]:
        async def call() -> Sequence[SecretValue]:
            async with self._limit:
                if ref.kind == "parameter":
                    with self._env.metrics.backend_call("gcp", "RenderParameterVersion"):
                        got = await self._parameters.render(
                            ref, token.token, identity.subject, ctx.deadline
                        )
                    # A rendered payload changes when a secret it references rotates while the
                    # parameter version stays: the version is then an HMAC of the content.
                    return [SecretValue(content=got.data)]
                with self._env.metrics.backend_call("gcp", "AccessSecretVersion"):
                    got = await self._secrets.access(
                        ref, token.token, identity.subject, ctx.deadline
                    )
            return [SecretValue(content=got.data, version=got.name)]

        return await self._env.retry(call, ctx)

    async def close(self) -> None:
        await self._secrets.close()
        await self._parameters.close()
        await self._tokens.close()
        self._auth.close()


def _fetched(result: Fetched | BaseException) -> Fetched:
    """A read's outcome (`_read` returns its errors; anything raised is a bug, raised)."""
    if isinstance(result, BridgeError):
        return result
    if isinstance(result, BaseException):
        raise result
    return result


def create(env: BackendEnv[Options]) -> Backend[GcpStore, Ref]:
    """The store's backend, typed as the protocol so that mypy checks it against it."""
    return GcpBackend(env)


#: The dialect module, checked by mypy against the Dialect protocol (provider/core/backend.py).
DIALECT: Dialect[GcpStore, Ref, Options] = dialect
#: ... and against the Selecting protocol (provider/core/selection.py).
SELECTING: Selecting[GcpStore, Ref] = dialect
