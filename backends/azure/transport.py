"""One aiohttp session for every Entra and Key Vault call of the backend.

Each cached identity gets its own credential and clients, but they all share this session (the
SDK's transports are built with `session_owner=False`), so evicting an identity from the cache
leaks no connections and a thousand identities do not open a thousand pools. `--azure-ca-file`
and `--azure-connect-to` shape the session: a private CA, and a fixed address for every host
(TLS still checks the real host name, so tests exercise the real challenge and SNI rules); the
token proxy of identity bindings (binding.py) is dialled as its URL says.

Every body the SDK reads through this session stops at a byte cap (`capped_response`), and host
names are resolved on the backend's own bounded threads (backends/wire.py), never on the loop's
default executor.

Each request goes through the proxy HTTPS_PROXY / HTTP_PROXY / NO_PROXY choose for its URL
(backends/wire.py `Proxies`, read when the backend is built) rather than through aiohttp's
`trust_env`, which reads the environment and ~/.netrc at every request on the default executor
and follows urllib's NO_PROXY rules (no CIDR ranges), unlike the other stores. Through a proxy
the proxy resolves Entra's and the vault's names: `--azure-connect-to` applies to direct
connections only, never to the proxy's own address.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from backends.azure.options import Options
from backends.proxies import Proxies, proxied_requests
from backends.wire import Resolver, capped_response

#: Cap of one answer of Entra or Key Vault (a certificate with its chain is a few KiB; a page of
#: a version listing, tens).
MAX_BODY = 4 * 1024 * 1024


class _ConnectTo(AbstractResolver):
    """Resolves every host name to one HOST:PORT (like curl's --connect-to), except the names
    in `keep` (the proxies' and the token proxy's), which resolve as they are."""

    def __init__(
        self, host: str, port: int, inner: AbstractResolver, keep: frozenset[str] = frozenset()
    ) -> None:
        self._host, self._port = host, port
        self._inner = inner
        self._keep = keep

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host.lower() in self._keep:
            return await self._inner.resolve(host, port, family)
        found = await self._inner.resolve(self._host, self._port, family)
        return [{**r, "hostname": host} for r in found]  # type: ignore[typeddict-item]

    async def close(self) -> None:
        pass  # the inner resolver is the SharedSession's


class SharedSession:
    def __init__(
        self,
        options: Options | None,
        max_body: int = MAX_BODY,
        direct: frozenset[str] = frozenset(),
    ) -> None:
        """Checks the options when the backend is built, naming the flag (ValueError). The
        hosts in `direct` (the token proxy's) are dialled as named, never `--azure-connect-to`."""
        options = options or Options()
        self._direct = frozenset(h.lower() for h in direct)
        try:
            self._ssl = ssl.create_default_context(cafile=options.ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--azure-ca-file {options.ca_file}: {exc}") from None
        self._connect_to: tuple[str, int] | None = None
        if options.connect_to:
            host, _, port = options.connect_to.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"--azure-connect-to {options.connect_to!r}: expected HOST:PORT")
            self._connect_to = (host.strip("[]"), int(port))
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()
        self._resolver: Resolver | None = None
        self._response_class = capped_response(max_body)
        self._proxies = Proxies.from_env()

    async def session(self) -> aiohttp.ClientSession:
        async with self._lock:
            if self._session is None or self._session.closed:
                self._session = self._build()
        return self._session

    async def transport(self) -> Any:
        """A fresh SDK transport over the shared session (cheap; closing it keeps the session)."""
        from azure.core.pipeline.transport import AioHttpTransport

        return AioHttpTransport(session=await self.session(), session_owner=False)

    def resolver(self) -> Resolver:
        """The backend's bounded resolver (also for the identity binding's one handshake)."""
        if self._resolver is None:
            self._resolver = Resolver()
        return self._resolver

    def _build(self) -> aiohttp.ClientSession:
        resolver: AbstractResolver = self.resolver()
        if self._connect_to:
            keep = self._proxies.hosts | self._direct
            resolver = _ConnectTo(*self._connect_to, self.resolver(), keep=keep)
        connector = aiohttp.TCPConnector(ssl=self._ssl, resolver=resolver, limit=100)
        # As azure-core's own sessions: the SDK decompresses and keeps no cookies itself.
        return aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            request_class=proxied_requests(self._proxies),
            response_class=self._response_class,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._resolver is not None:
            await self._resolver.close()
            self._resolver = None
