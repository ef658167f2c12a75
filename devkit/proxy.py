"""A fault proxy for any HTTP store: a throttling or failing upstream, on demand.

It forwards every request to `upstream` and answers a share of them (`error_rate`, drawn from a
seeded generator so runs repeat) with an error instead — 429 with Retry-After by default — and
counts what it saw. The end-to-end tests put it before OpenBao; `bench --error-rate` does too.
"""

from __future__ import annotations

import asyncio
import random

import aiohttp
from aiohttp import web

from devkit.ports import serve_app


class Proxy:
    """The forwarding every store proxy of the harness shares: requests to `upstream`, answers
    back with their headers (bodies passed through as they are, up to 16 MiB); subclasses
    decide per request in `_handle` whether to forward."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.url = ""
        self.calls = 0
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, port = await serve_app(app, shutdown_timeout=1.0)
        self.url = f"http://127.0.0.1:{port}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        return await self._forward(request, await request.read())

    async def _forward(self, request: web.Request, body: bytes) -> web.Response:
        assert self._http is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._http.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_HEADERS}
            return web.Response(status=resp.status, body=payload, headers=out)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._http is not None:
            await self._http.close()


#: Headers aiohttp sets itself for the body it sends back.
_HOP_HEADERS = {"content-length", "transfer-encoding", "content-encoding", "connection"}


class FaultProxy(Proxy):
    """HTTP proxy to a store that answers a share of requests with an error (429 with
    Retry-After by default) and counts every request: a throttling or failing store."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.error_rate = 0.0
        self.status = 429
        self.retry_after: str | None = "0"
        self.delay = 0.0
        self.injected = 0
        self._rng = random.Random(7)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self._rng.random() < self.error_rate:
            self.injected += 1
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return web.json_response({"errors": ["injected"]}, status=self.status, headers=headers)
        return await self._forward(request, await request.read())
