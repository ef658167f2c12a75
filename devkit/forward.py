"""A TCP forwarder on loopback whose upstream can be pulled and replaced: a store that goes
away and comes back (on a new port) while its clients keep one address.

While `upstream` is None, or the upstream refuses, every new connection is closed at once (the
client sees a reset, as from a crashed server); `drop()` also cuts the open ones.

    fwd = Forwarder("127.0.0.1", 8200); await fwd.start()   # clients dial fwd.url
    fwd.upstream = None; fwd.drop()                          # the store is down
    fwd.upstream = ("127.0.0.1", new_port)                   # ...and back
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl


class Forwarder:
    def __init__(self, host: str, port: int) -> None:
        self.upstream: tuple[str, int] | None = (host, port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tls = False

    @property
    def url(self) -> str:
        return f"{'https' if self._tls else 'http'}://127.0.0.1:{self.port}"

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> None:
        """Listen; with `ssl_context`, TLS ends here (a TLS front for a plain-HTTP store)."""
        self._tls = ssl_context is not None
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        target = self.upstream
        try:
            if target is None:
                raise ConnectionRefusedError
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        self._open.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                self._open.discard(w)
                w.close()

    def drop(self) -> None:
        for w in list(self._open):
            w.close()

    async def stop(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()
