"""A forward proxy on 127.0.0.1, as networks with a proxy have one: CONNECT tunnels for https
(and gRPC), plain-HTTP forwarding for http, every request counted.

    proxy = ConnectProxy(hosts={"openbao.test": "127.0.0.1"})   # the proxy's own name map
    await proxy.start()          # proxy.url -> HTTPS_PROXY / HTTP_PROXY
    proxy.tunnels                # ["openbao.test:8200", ...]: each CONNECT target, in order
    proxy.forwarded              # ["GET http://127.0.0.1:5000/x", ...]: each plain-HTTP request
    proxy.authorizations         # each request's Proxy-Authorization ("" without one)
    proxy.refuse.add("host")     # 403 to CONNECTs and requests for that host
    await proxy.stop()

The proxy resolves the names it is asked for, as a real one does: `hosts` maps a name to HOST or
HOST:PORT (a name alone keeps the requested port), so a test can name a store by the name its
TLS certificate carries (`openbao.test`, `login.microsoftonline.com`) though the client under
test cannot resolve it — a call that reaches the store by such a name went through the proxy.
Unmapped names are resolved by the system.

A plain-HTTP request is sent on with `Connection: close` (one request per proxy connection), so
each one is counted without parsing bodies; a tunnel carries bytes both ways, untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from yarl import URL

#: Every spelling of the proxy variables the clients under test read (tests clear them all,
#: with monkeypatch, before setting the ones they test).
VARIABLES = (
    "https_proxy",
    "HTTPS_PROXY",
    "http_proxy",
    "HTTP_PROXY",
    "no_proxy",
    "NO_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "grpc_proxy",
    "no_grpc_proxy",
)
#: Largest request head (request line and headers) the proxy reads.
_MAX_HEAD = 64 * 1024
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authorization", "proxy-connection", "te", "upgrade"}
)


class ConnectProxy:
    def __init__(self, hosts: Mapping[str, str] | None = None) -> None:
        self.hosts = {name.lower(): target for name, target in (hosts or {}).items()}
        self.tunnels: list[str] = []
        self.forwarded: list[str] = []
        self.authorizations: list[str] = []
        self.refuse: set[str] = set()
        self.url = ""
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def calls(self) -> int:
        """Requests seen: tunnels opened plus plain-HTTP requests forwarded."""
        return len(self.tunnels) + len(self.forwarded)

    def reset(self) -> None:
        self.tunnels.clear()
        self.forwarded.clear()
        self.authorizations.clear()

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, limit=_MAX_HEAD)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> ConnectProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _address(self, host: str, port: int) -> tuple[str, int]:
        mapped = self.hosts.get(host.lower())
        if mapped is None:
            return host, port
        name, sep, mapped_port = mapped.rpartition(":")
        if sep and mapped_port.isdigit():
            return name.strip("[]"), int(mapped_port)
        return mapped, port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._writers.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, target, version = request_line.split(" ", 2)
            headers = [tuple(line.split(":", 1)) for line in header_lines if ":" in line]
            self.authorizations.append(
                next((v.strip() for k, v in headers if k.lower() == "proxy-authorization"), "")
            )
            if method == "CONNECT":
                upstream = await self._tunnel(target, reader, writer)
            else:
                upstream = await self._forward(method, target, version, headers, reader, writer)
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()
                    self._writers.discard(w)

    async def _tunnel(
        self, target: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> asyncio.StreamWriter | None:
        self.tunnels.append(target)
        url = URL(f"//{target}")
        host, port = url.host or "", url.port or 443
        if host.lower() in self.refuse:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return None
        opened = await self._open(host, port, writer)
        if opened is None:
            return None
        up_reader, up_writer = opened
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await _both_ways(reader, writer, up_reader, up_writer)
        return up_writer

    async def _forward(
        self,
        method: str,
        target: str,
        version: str,
        headers: list[tuple[str, ...]],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> asyncio.StreamWriter | None:
        self.forwarded.append(f"{method} {target}")
        url = URL(target)
        if not url.is_absolute() or url.host is None:
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return None
        if url.host.lower() in self.refuse:
            writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            return None
        opened = await self._open(url.host, url.port or 80, writer)
        if opened is None:
            return None
        up_reader, up_writer = opened
        kept = "".join(
            f"{name}:{value}\r\n" for name, value in headers if name.lower() not in _HOP_BY_HOP
        )
        up_writer.write(
            f"{method} {url.raw_path_qs} {version}\r\n{kept}Connection: close\r\n\r\n".encode(
                "latin-1"
            )
        )
        await up_writer.drain()
        # The request's body (if any) follows as it comes; the answer ends when upstream closes.
        sending = asyncio.ensure_future(_copy(reader, up_writer))
        try:
            await _copy(up_reader, writer)
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sending
        return up_writer

    async def _open(
        self, host: str, port: int, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._address(host, port))
        except OSError:
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            return None
        self._writers.add(up_writer)
        return up_reader, up_writer


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while chunk := await reader.read(64 * 1024):
            writer.write(chunk)
            await writer.drain()


async def _both_ways(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Bytes both ways until either side is done; then the tunnel closes."""
    pipes = [
        asyncio.ensure_future(_copy(reader, up_writer)),
        asyncio.ensure_future(_copy(up_reader, writer)),
    ]
    try:
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pipe in pipes:
            pipe.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
