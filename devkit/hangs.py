"""A store that hangs: an HTTP proxy that accepts requests and never answers, or answers late.

Store outages are mostly hangs (a load balancer that accepts and never answers, a sealed or
overloaded Vault, a partition), not refused connections (issue 21). Put `HangProxy` in front of
a real store and switch it while the provider runs:

    proxy = HangProxy(bao.addr)          # pass-through
    await proxy.start()                  # proxy.url: point vaultAddress / --vault-addr here
    proxy.hang()                         # from now on: accept, read the request, never answer
    proxy.hang(when=is_read)             # only requests `when` accepts hang (logins pass)
    proxy.slow(2.5, when=is_read)        # answer, but this many seconds late
    proxy.heal()                         # pass-through again; held requests stay held...
    proxy.release()                      # ...until released (they are then answered 503)
    await proxy.stop()

`calls` counts requests that reached the proxy, `held` those hanging right now. A hung request
is held until the client closes the connection, `release()` or `stop()`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from devkit.proxy import Proxy

Rule = Callable[[web.Request], bool]


def is_read(request: web.Request) -> bool:
    """Vault requests other than logins (and the health endpoint)."""
    return "/login" not in request.path and not request.path.startswith("/v1/sys/")


def _always(_request: web.Request) -> bool:
    return True


class HangProxy(Proxy):
    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.held = 0
        self._hang: Rule | None = None
        self._delay = 0.0
        self._slow: Rule = _always
        self._released = asyncio.Event()

    def hang(self, when: Rule = _always) -> None:
        self._hang = when
        self._released = asyncio.Event()

    def slow(self, seconds: float, when: Rule = _always) -> None:
        self._delay, self._slow = seconds, when

    def heal(self) -> None:
        self._hang, self._delay = None, 0.0

    def release(self) -> None:
        self._released.set()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        body = await request.read()
        if self._hang is not None and self._hang(request):
            self.held += 1
            try:
                await self._released.wait()
            finally:
                self.held -= 1
            return web.Response(status=503, text="released")
        if self._delay and self._slow(request):
            await asyncio.sleep(self._delay)
        return await self._forward(request, body)

    async def stop(self) -> None:
        self._released.set()
        await super().stop()
