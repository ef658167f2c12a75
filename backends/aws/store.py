"""The AWS backend: Secrets Manager and SSM Parameter Store through aiobotocore.

A fetch logs in once (cached credentials), reads the SSM refs in batches of ten and the Secrets
Manager refs concurrently (both under one per-backend concurrency limit), and answers per ref.
Secrets Manager values are remembered for --revalidate-max-age: a repeat fetch within that age
asks DescribeSecret which version the object names now, and returns the remembered value when it
is unchanged (DescribeSecret has four times GetSecretValue's quota and returns no secret).
Selections (`select`) list with metadata and read every listed secret (backends/aws/listing.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

from backends.aws import dialect
from backends.aws.auth import Authenticator
from backends.aws.clients import ClientPool
from backends.aws.errors import STALE_CREDENTIALS, AwsDenied
from backends.aws.listing import Selector
from backends.aws.options import Options
from backends.aws.reading import Reader, Shared, pack
from backends.aws.refs import AwsRef, AwsSelection, AwsStore, Ref
from backends.clouds.aws import Credentials
from provider.core.backend import Backend, BackendEnv, Dialect
from provider.core.caching import ExpiringCache
from provider.core.errors import BridgeError, PermissionDenied
from provider.core.limits import FetchBytes, namespace_of
from provider.core.model import (
    FetchContext,
    Fetched,
    Identity,
    Pod,
    SecretValue,
    StorePlan,
    values_size,
)
from provider.core.selection import Selecting

#: Bounds of the values held for revalidation (they live in memory only; a Secrets Manager
#: value is at most 64 KiB), counted by what each keeps alive and shared fairly by namespace.
HELD_ENTRIES = 10_000
HELD_BYTES = 16 * 1024 * 1024

Plan = StorePlan[AwsStore, Ref]


class AwsBackend:
    name = "aws"

    def __init__(self, env: BackendEnv[Options]) -> None:
        self._env = env
        self._options = env.options
        self._pool = ClientPool(self._options)
        self._auth = Authenticator(env, self._options, self._pool)
        self._shared = Shared(env, self._pool, asyncio.Semaphore(self._options.max_concurrency))
        self._revalidations = env.metrics.cache_counter("aws-revalidate")
        self._held: ExpiringCache[tuple[SecretValue, int]] = ExpiringCache(
            max_entries=HELD_ENTRIES,
            max_bytes=HELD_BYTES,
            size_of=lambda held: values_size((held[0],)),
            on_event=self._revalidations,
            tenant_of=namespace_of,
        )
        #: (identity key, ref) whose DescribeSecret was denied: not revalidated for a while.
        self._undescribable: ExpiringCache[bool] = ExpiringCache(max_entries=HELD_ENTRIES)
        #: What each identity's selections held at its last poll (tests read `.selections`).
        self.selector = Selector()

    async def identify(self, plan: Plan, pod: Pod) -> Identity:
        return await self._auth.identify(plan.store, pod)

    async def fetch(
        self, plan: Plan, identity: Identity, refs: Sequence[Ref], ctx: FetchContext
    ) -> Mapping[Ref, Fetched]:
        store = plan.store
        if not refs:
            return {}
        creds = await self._auth.credentials(store, identity, ctx)
        # Every answer is charged to the mount's budget and the bytes in flight (ReadBytes).
        async with self._shared.env.reads.fetch(identity.key) as held:
            results = await self._read(store, identity, creds, refs, ctx, held)
            stale = [ref for ref in refs if _expired(results[ref])]
            if stale and held.refusal is None:
                # AWS says the credentials expired before we thought: one shared re-login.
                self._auth.forget(identity, creds)
                creds = await self._auth.credentials(store, identity, ctx)
                results.update(await self._read(store, identity, creds, stale, ctx, held))
        return results

    async def _read(
        self,
        store: AwsStore,
        identity: Identity,
        creds: Credentials | None,
        refs: Sequence[Ref],
        ctx: FetchContext,
        held: FetchBytes,
    ) -> dict[Ref, Fetched]:
        reader = Reader(self._shared, store, identity, creds, ctx, held)
        plain = [ref for ref in refs if isinstance(ref, AwsRef)]
        chosen = [ref for ref in refs if isinstance(ref, AwsSelection)]
        ssm = [ref for ref in plain if ref.service == "ssm"]
        secrets = [ref for ref in plain if ref.service == "secretsmanager"]
        parameters, values, selected = await asyncio.gather(
            self._parameters(reader, ssm),
            asyncio.gather(*(self._secret(reader, identity, ref) for ref in secrets)),
            asyncio.gather(*(self.selector.select(reader, store, identity, ref) for ref in chosen)),
        )
        results: dict[Ref, Fetched] = dict(parameters.items())
        results.update(zip(secrets, values, strict=True))
        results.update(zip(chosen, selected, strict=True))
        return results

    async def _parameters(self, reader: Reader, refs: list[AwsRef]) -> dict[AwsRef, Fetched]:
        # Batches are formed by primary names; each batch fails over as a whole.
        parts = await asyncio.gather(*(self._batch(reader, b) for b in pack(refs, 0)))
        results: dict[AwsRef, Fetched] = {}
        for part in parts:
            results.update(part)
        return results

    async def _batch(self, reader: Reader, batch: list[AwsRef]) -> dict[AwsRef, Fetched]:
        try:
            part, _ = await reader.with_failover(lambda index: reader.parameters(batch, index))
        except BridgeError as exc:
            return dict.fromkeys(batch, exc)
        return part

    async def _secret(self, reader: Reader, identity: Identity, ref: AwsRef) -> Fetched:
        max_age = self._options.revalidate_max_age
        key = (identity.key, ref)
        revalidate = max_age > 0 and self._undescribable.get(key) is None
        held = self._held.get(key) if revalidate else None
        if held is not None:
            try:
                if await reader.confirm(ref, held[1], held[0]):
                    self._revalidations("confirmed")
                    return [held[0]]
            except PermissionDenied:
                # Without DescribeSecret every check would cost a second call: read plainly
                # for this identity and object until the age has passed.
                self._undescribable.put(key, True, max_age)
                self._held.invalidate(key)
                revalidate = False
        try:
            value, index = await reader.with_failover(lambda i: reader.secret_value(ref, i))
        except BridgeError as exc:
            return exc
        if revalidate:
            # The age counts from this read: confirmations do not extend it. The held copy is
            # marked once here, so the audit trail tells a confirmed value from a read one.
            held_copy = dataclasses.replace(value, source="revalidated")
            self._held.put(key, (held_copy, index), max_age)
        return [value]

    async def close(self) -> None:
        await self._pool.close()


def _expired(result: Fetched) -> bool:
    return isinstance(result, AwsDenied) and result.aws_code in STALE_CREDENTIALS


def create(env: BackendEnv[Options]) -> Backend[AwsStore, Ref]:
    """The store's backend, typed as the protocol so that mypy checks it against it."""
    return AwsBackend(env)


#: The dialect module, checked by mypy against the Dialect protocol (provider/core/backend.py).
DIALECT: Dialect[AwsStore, Ref, Options] = dialect
#: ... and against the Selecting protocol (provider/core/selection.py).
SELECTING: Selecting[AwsStore, Ref] = dialect
