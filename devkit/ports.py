"""Loopback ports: one free-port finder, and one way to serve an aiohttp app on 127.0.0.1.

Every store, stub and proxy of the harness listens on 127.0.0.1 only; `serve_app` binds port 0
(the kernel picks) so two servers started together can never race for the same port.
"""

from __future__ import annotations

import socket
import ssl

from aiohttp import web


def free_port() -> int:
    """A port free on 127.0.0.1 right now (for processes that must be told their port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def closed_url() -> str:
    """A loopback URL nobody listens on: connections are refused at once."""
    return f"http://127.0.0.1:{free_port()}"


async def serve_app(
    app: web.Application,
    *,
    ssl_context: ssl.SSLContext | None = None,
    shutdown_timeout: float = 60.0,
) -> tuple[web.AppRunner, int]:
    """Serve `app` on 127.0.0.1 (a port the kernel picks); returns the runner and the port.
    Stop it with `await runner.cleanup()`."""
    runner = web.AppRunner(
        app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port: int = runner.addresses[0][1]
    return runner, port
