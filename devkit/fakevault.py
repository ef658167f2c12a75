"""A scriptable HTTP server speaking just enough of Vault's API to inject faults on the wire:
sealed (503), throttled (429 + Retry-After), 5xx, garbage bodies, dropped connections, slowness,
redirects. The real OpenBao covers the happy paths and denials; this covers what it cannot do
on demand.

    fake = await FakeVault.start()
    fake.on("POST", "auth/jwt/login", login_ok())          # answers in order; the last repeats
    fake.on("GET", "secret/data/x", status(503, errors=["Vault is sealed"]), json_ok({...}))
    fake.calls[("GET", "secret/data/x")]                    # how many requests it got
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from devkit.ports import serve_app

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

FAKE_TOKEN = "s.FakeVaultTokenForTestsOnly0001"


def json_ok(data: Any, **extra: Any) -> Handler:
    async def handler(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"request_id": "r", "data": data, "warnings": None, **extra})

    return handler


def login_ok(lease: int = 3600, token: str = FAKE_TOKEN) -> Handler:
    async def handler(_request: web.Request) -> web.StreamResponse:
        auth = {"client_token": token, "lease_duration": lease, "renewable": True}
        return web.json_response({"request_id": "r", "data": None, "auth": auth})

    return handler


def status(
    code: int, *, errors: list[str] | None = None, headers: dict[str, str] | None = None
) -> Handler:
    async def handler(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"errors": errors or []}, status=code, headers=headers)

    return handler


def raw(body: bytes, code: int = 200, content_type: str = "text/html") -> Handler:
    async def handler(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, status=code, content_type=content_type)

    return handler


def slow(seconds: float, then: Handler) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return await then(request)

    return handler


def drop() -> Handler:
    """Promise a long body, send a little, then cut the connection."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": "100000"})
        await response.prepare(request)
        await response.write(b'{"data": {')
        assert request.transport is not None
        request.transport.close()
        return response

    return handler


def redirect(location: str) -> Handler:
    async def handler(_request: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(location)

    return handler


class FakeVault:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Handler]] = {}
        self.calls: Counter[tuple[str, str]] = Counter()
        self.bodies: list[tuple[str, str, bytes]] = []
        self.headers: list[dict[str, str]] = []
        #: The client's (host, port) of each request: one per TCP connection it came on.
        self.peers: list[tuple[str, int]] = []
        self._runner: web.AppRunner | None = None
        self.addr = ""

    @classmethod
    async def start(cls) -> FakeVault:
        fake = cls()
        app = web.Application()
        app.router.add_route("*", "/v1/{path:.*}", fake._dispatch)
        # A short shutdown: slow handlers of deadline tests must not hold up teardown.
        fake._runner, port = await serve_app(app, shutdown_timeout=0.1)
        fake.addr = f"http://127.0.0.1:{port}"
        return fake

    def on(self, method: str, path: str, *handlers: Handler) -> None:
        self.routes[(method, path)] = list(handlers)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        key = (request.method, request.match_info["path"])
        self.calls[key] += 1
        self.bodies.append((*key, await request.read()))
        self.headers.append(dict(request.headers))
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername")[:2])
        handlers = self.routes.get(key)
        if not handlers:
            return web.json_response({"errors": []}, status=404)
        handler = handlers.pop(0) if len(handlers) > 1 else handlers[0]
        return await handler(request)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
