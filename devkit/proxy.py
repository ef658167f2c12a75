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


class FaultProxy:
    """HTTP proxy to a store that answers a share of requests with an error (429 with
    Retry-After by default) and counts every request: a throttling or failing store."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.error_rate = 0.0
        self.status = 429
        self.retry_after: str | None = "0"
        self.delay = 0.0
        self.calls = 0
        self.injected = 0
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._rng = random.Random(7)

    async def start(self) -> None:
        self._http = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner, port = await serve_app(app)
        self.url = f"http://127.0.0.1:{port}"

    async def _handle(self, request: web.Request) -> web.Response:
        assert self._http is not None
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if self._rng.random() < self.error_rate:
            self.injected += 1
            headers = {"Retry-After": self.retry_after} if self.retry_after else {}
            return web.json_response({"errors": ["injected"]}, status=self.status, headers=headers)
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with self._http.request(
            request.method,
            self.upstream + request.path_qs,
            data=await request.read(),
            headers=headers,
        ) as resp:
            return web.Response(
                status=resp.status, body=await resp.read(), content_type=resp.content_type
            )

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        if self._http:
            await self._http.close()
