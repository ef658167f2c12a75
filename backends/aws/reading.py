"""The store calls of one fetch: Secrets Manager reads and checks, SSM batches, failover.

Failover follows upstream's rule: a transient failure in the primary region (unreachable, 5xx,
throttled) sends the same call to the failover region; a 4xx (denied, not found) is the answer,
so a misconfiguration is never masked by a stale copy elsewhere. Each attempt tries the primary
then the failover region, and attempts are retried within the Mount's retry budget.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from backends.aws.auth import Login
from backends.aws.clients import ClientPool
from backends.aws.errors import STALE_CREDENTIALS, AwsDenied, translated
from backends.aws.options import Options
from backends.aws.refs import AwsRef, AwsStore, Target
from backends.clouds.aws import Credentials
from provider.core.backend import BackendEnv
from provider.core.errors import (
    BridgeError,
    DeadlineExceeded,
    NotFound,
    PermissionDenied,
    StoreUnavailable,
)
from provider.core.limits import FetchBytes, answer_size
from provider.core.model import FetchContext, Fetched, Identity, SecretValue

T = TypeVar("T")
log = logging.getLogger("secrets_bridge.aws")
#: GetParameters takes at most ten names.
SSM_BATCH = 10


@dataclass
class Shared:
    """What a backend lends each fetch."""

    env: BackendEnv[Options]
    pool: ClientPool
    limit: asyncio.Semaphore


class Reader:
    def __init__(
        self,
        shared: Shared,
        store: AwsStore,
        identity: Identity,
        creds: Credentials | None,
        ctx: FetchContext,
        held: FetchBytes | None = None,
    ) -> None:
        self._shared = shared
        self._held = held
        self._store = store
        self._creds = creds
        self._ctx = ctx
        login = identity.credential
        self._who = login.describe(identity.subject) if isinstance(login, Login) else ""

    # -- failover and calls ------------------------------------------------------------------

    async def with_failover(self, call: Callable[[int], Awaitable[T]]) -> tuple[T, int]:
        """Run call(region index) in the primary, then in the failover region when transient."""

        async def attempt() -> tuple[T, int]:
            try:
                return await call(0), 0
            except BridgeError as exc:
                if not (exc.transient and self._store.failover_region):
                    raise
                primary = exc
            log.warning(
                "primary region unavailable; reading from the failover region",
                extra={
                    "fields": {
                        "backend": "aws",
                        "region": self._store.region,
                        "failover_region": self._store.failover_region,
                        "error": str(primary),
                    }
                },
            )
            try:
                return await call(1), 1
            except BridgeError as exc:
                if not exc.transient:
                    raise
                raise StoreUnavailable(
                    f"{primary}; failover region {self._store.failover_region}: {exc}"
                ) from None

        return await self._shared.env.retry(attempt, self._ctx)

    async def call(
        self, service: str, region: str, operation: str, what: str, hint: str, **kwargs: Any
    ) -> Any:
        """One AWS call: concurrency-limited, counted, deadline-bounded, translated."""
        remaining = self._ctx.deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(f"{what}: the Mount's deadline passed")
        async with self._shared.limit:
            with self._shared.env.metrics.backend_call("aws", operation):
                try:
                    async with asyncio.timeout(remaining):
                        with translated(what, hint):
                            client = await self._shared.pool.get(service, region, self._creds)
                            method = getattr(client, _snake(operation))
                            answer = await method(**kwargs)
                except TimeoutError:
                    raise DeadlineExceeded(f"{what}: the Mount's deadline passed") from None
        if self._held is not None:
            # Charged once parsed (the SDK reads the body whole): the services bound each
            # answer — a secret 64 KiB, a parameter 8 KiB, a batch or a page 20 secrets or 10
            # parameters and their metadata (about 1.3 MB at most).
            await self._held.charge(answer_size(answer))
        return answer

    async def in_region(self, index: int, call: Callable[[int], Awaitable[T]]) -> T:
        """call(index), retried within the Mount's budget in that one region: the reads of a
        selection go where its listing was answered, whose markers they must match."""
        return await self._shared.env.retry(lambda: call(index), self._ctx)

    def region(self, index: int) -> str:
        return self._store.regions[index]

    def about(self, text: str, index: int) -> str:
        """`text` with the region and the identity, as every message of a call names them."""
        return f"{text} in {self.region(index)} (read by {self._who})"

    def _what(self, kind: str, target: Target, index: int) -> str:
        selector = target.name
        if target.version:
            selector += f" version {target.version}"
        if target.label:
            selector += f" label {target.label}"
        return f"{kind} {selector!r} in {self.region(index)} (read by {self._who})"

    # -- Secrets Manager ---------------------------------------------------------------------

    async def secret_value(self, ref: AwsRef, index: int) -> SecretValue:
        target = ref.target(index)
        kwargs: dict[str, Any] = {"SecretId": target.name}
        if target.version:
            kwargs["VersionId"] = target.version
        if target.label:
            kwargs["VersionStage"] = target.label
        hint = "; allow secretsmanager:GetSecretValue on it (and kms:Decrypt on its key)"
        what = self._what("Secrets Manager secret", target, index)
        response = await self.call(
            "secretsmanager", self.region(index), "GetSecretValue", what, hint, **kwargs
        )
        text, binary = response.get("SecretString"), response.get("SecretBinary")
        if isinstance(text, str):
            content = text.encode()
        elif isinstance(binary, bytes):
            content = binary
        else:
            # A proxy's page parsed as an empty answer must not become an empty file.
            raise StoreUnavailable(f"{what}: the answer holds no SecretString or SecretBinary")
        return SecretValue(content=content, version=response.get("VersionId"))

    async def confirm(self, ref: AwsRef, index: int, held: SecretValue) -> bool:
        """Whether `held` is still the version the object names (one DescribeSecret).

        Raises PermissionDenied when the pod may not call DescribeSecret.
        """
        target = ref.target(index)
        what = self._what("Secrets Manager secret", target, index)
        try:
            response = await self.call(
                "secretsmanager",
                self.region(index),
                "DescribeSecret",
                what,
                "",
                SecretId=target.name,
            )
        except PermissionDenied:
            raise  # the caller stops asking for a while
        except BridgeError as exc:
            log.debug("aws: DescribeSecret failed (%s); reading instead", type(exc).__name__)
            return False  # failing: a plain read decides
        stages: dict[str, list[str]] = response.get("VersionIdsToStages") or {}
        if target.version:
            return target.version == held.version and target.version in stages
        wanted = target.label or "AWSCURRENT"
        current = [vid for vid, names in stages.items() if wanted in (names or [])]
        return current == [held.version]

    # -- SSM Parameter Store -----------------------------------------------------------------

    async def parameters(self, refs: Sequence[AwsRef], index: int) -> dict[AwsRef, Fetched]:
        """Read SSM refs in `index`'s region, ten per GetParameters call."""
        batches = pack(refs, index)
        parts = await asyncio.gather(*(self._parameter_batch(b, index) for b in batches))
        results: dict[AwsRef, Fetched] = {}
        for part in parts:
            results.update(part)
        return results

    async def _parameter_batch(self, refs: Sequence[AwsRef], index: int) -> dict[AwsRef, Fetched]:
        region = self.region(index)
        selectors = {_selector(ref.target(index)): ref for ref in refs}
        names = ", ".join(repr(s) for s in selectors)
        what = f"SSM parameters {names} in {region} (read by {self._who})"
        hint = "; allow ssm:GetParameters on them (and kms:Decrypt for SecureString)"
        try:
            response = await self.call(
                "ssm",
                region,
                "GetParameters",
                what,
                hint,
                Names=list(selectors),
                WithDecryption=True,
            )
        except AwsDenied as exc:
            if len(refs) == 1 or exc.aws_code in STALE_CREDENTIALS:
                raise
            # AWS refuses the whole batch for one forbidden name: ask one by one to say which.
            parts = await asyncio.gather(*(self._parameter_single(ref, index) for ref in refs))
            return dict(zip(refs, parts, strict=True))
        if not isinstance(response.get("Parameters"), list):
            raise StoreUnavailable(f"{what}: the answer holds no Parameters list")
        return self._match(response, selectors, index)

    async def _parameter_single(self, ref: AwsRef, index: int) -> Fetched:
        try:
            result = await self._parameter_batch([ref], index)
        except BridgeError as exc:
            return exc
        return result[ref]

    def _match(
        self, response: Any, selectors: dict[str, AwsRef], index: int
    ) -> dict[AwsRef, Fetched]:
        # A batch never holds one name twice (see pack), so Name or ARN identifies the request.
        by_name = {ref.target(index).name: ref for ref in selectors.values()}
        results: dict[AwsRef, Fetched] = {}
        for param in response["Parameters"]:
            if not isinstance(param, dict):
                continue
            ref = by_name.get(str(param.get("Name"))) or by_name.get(str(param.get("ARN")))
            value = param.get("Value")
            if ref is None or not isinstance(value, str):
                continue
            version = param.get("Version")
            results[ref] = [
                SecretValue(
                    content=value.encode(), version=None if version is None else str(version)
                )
            ]
        for ref in selectors.values():
            if ref not in results:
                what = self._what("SSM parameter", ref.target(index), index)
                results[ref] = NotFound(
                    f"{what}: not found; check objectName, objectType, the version or label "
                    "and the region"
                )
        return results


def pack(refs: Sequence[AwsRef], index: int) -> list[list[AwsRef]]:
    """Batches of at most ten, never two selectors of one name in a batch.

    GetParameters answers with the parameter's name (moto omits the `Selector` field), so two
    versions of one name in a batch could not be told apart.
    """
    batches: list[list[AwsRef]] = []
    names: list[set[str]] = []
    for ref in refs:
        name = ref.target(index).name
        for batch, seen in zip(batches, names, strict=True):
            if len(batch) < SSM_BATCH and name not in seen:
                batch.append(ref)
                seen.add(name)
                break
        else:
            batches.append([ref])
            names.append({name})
    return batches


def _selector(target: Target) -> str:
    if target.version:
        return f"{target.name}:{target.version}"
    if target.label:
        return f"{target.name}:{target.label}"
    return target.name


def _snake(operation: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in operation).lstrip("_")
