"""aiobotocore clients, shared per (service, region, endpoint, credentials).

One `AioSession` per backend keeps the loaded service models, so a client costs little; clients
are still reused because each owns a connection pool (TLS handshakes dominate cold reads).
Credentials rotate about hourly, so the pool is a small LRU: a client that falls out is closed a
while later rather than at once, since a concurrent fetch may still be using it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Any

from backends.aws.options import Options, endpoint_map
from backends.clouds.aws import Credentials, sdk_client

#: Clients kept open at once (regions x identities in use on one node).
MAX_CLIENTS = 64
#: Seconds a retired client stays open for calls still using it.
RETIRE_AFTER = 120.0


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
        from aiobotocore.session import get_session

        if self._session is None:
            self._session = get_session()
        return sdk_client(
            self._session,
            service,
            region,
            endpoint=endpoint,
            creds=creds,
            unsigned=unsigned,
            connect_timeout=self._options.connect_timeout,
            read_timeout=self._options.read_timeout,
            max_connections=max(10, self._options.max_concurrency),
        )

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
