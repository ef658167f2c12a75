"""aiobotocore clients, shared per (service, region, endpoint, credentials).

One `AioSession` per backend keeps the loaded service models, so a client costs little; clients
are still reused because each owns a connection pool (TLS handshakes dominate cold reads).
Credentials rotate about hourly, so the pool is a small LRU: a client that falls out is closed a
while later rather than at once, since a concurrent fetch may still be using it.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from backends.aws.options import Options, endpoint_map

#: Clients kept open at once (regions x identities in use on one node).
MAX_CLIENTS = 64
#: Seconds a retired client stays open for calls still using it.
RETIRE_AFTER = 120.0


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


class ClientPool:
    def __init__(self, options: Options) -> None:
        self._options = options
        self._endpoints = endpoint_map(options.endpoints)
        self._session: Any = None
        self._clients: OrderedDict[tuple[str, ...], tuple[Any, Any]] = OrderedDict()
        self._retired: list[tuple[float, Any]] = []
        self._lock = asyncio.Lock()

    def endpoint(self, service: str, region: str) -> str | None:
        """Our override for (service, region); None lets botocore apply AWS_ENDPOINT_URL*."""
        if service == "sts" and self._options.sts_endpoint:
            return self._options.sts_endpoint
        return self._endpoints.get(region)

    async def get(
        self, service: str, region: str, creds: Credentials | None, *, unsigned: bool = False
    ) -> Any:
        """A client signing with `creds` (None: the provider's own chain), or none (`unsigned`:
        AssumeRoleWithWebIdentity, where the pod's token is the credential)."""
        endpoint = self.endpoint(service, region)
        signer = "unsigned" if unsigned else (creds.fingerprint if creds else "node")
        key = (service, region, endpoint or "", signer)
        async with self._lock:  # concurrent first calls share one client
            entry = self._clients.get(key)
            if entry is not None:
                self._clients.move_to_end(key)
                return entry[1]
            await self._close_retired(time.monotonic() - RETIRE_AFTER)
            context = self._create(service, region, endpoint, None if unsigned else creds, unsigned)
            client = await context.__aenter__()
            self._clients[key] = (context, client)
            while len(self._clients) > MAX_CLIENTS:
                _, (old, _client) = self._clients.popitem(last=False)
                self._retired.append((time.monotonic(), old))
            return client

    def _create(
        self, service: str, region: str, endpoint: str | None, creds: Any, unsigned: bool
    ) -> Any:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session
        from botocore import UNSIGNED

        if self._session is None:
            self._session = get_session()
        config: dict[str, Any] = {
            # Retries are ours (provider/core/retrying.py), bounded by the Mount's deadline.
            "retries": {"total_max_attempts": 1},
            "connect_timeout": self._options.connect_timeout,
            "read_timeout": self._options.read_timeout,
            "max_pool_connections": max(10, self._options.max_concurrency),
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
        return self._session.create_client(service, config=AioConfig(**config), **kwargs)

    async def _close_retired(self, before: float) -> None:
        keep: list[tuple[float, Any]] = []
        for stamp, context in self._retired:
            if stamp <= before:
                await context.__aexit__(None, None, None)
            else:
                keep.append((stamp, context))
        self._retired = keep

    async def close(self) -> None:
        contexts = [context for context, _ in self._clients.values()]
        contexts += [context for _, context in self._retired]
        self._clients.clear()
        self._retired.clear()
        for context in contexts:
            await context.__aexit__(None, None, None)
