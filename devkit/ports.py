"""Loopback ports: one free-port finder, and one way to serve an aiohttp app on 127.0.0.1.

Every store, stub and proxy of the harness listens on 127.0.0.1 only; `serve_app` binds port 0
(the kernel picks) so two servers started together can never race for the same port. A process
that must be told its port (OpenBao, PostgreSQL, moto_server) gets one from `free_port`, which
is free only when asked: another process (a second pytest-xdist worker, a client's outgoing
connection) may take it before the server binds it, so those launchers start again on a new port
when the server says the address is in use (`PortTaken`, `retrying`).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable
from typing import TypeVar

from aiohttp import web

T = TypeVar("T")
#: How a server started on a port someone else holds says so (Go, PostgreSQL, werkzeug alike).
IN_USE = "address already in use"
ATTEMPTS = 3


class PortTaken(RuntimeError):
    """A server exited at start-up because the port `free_port` gave it was taken meanwhile."""


def port_taken(output: str) -> bool:
    return IN_USE in output.lower()


def retrying(start: Callable[[], T], attempts: int = ATTEMPTS) -> T:
    """start(), again (each time on a new free port) while it raises PortTaken."""
    for _ in range(attempts - 1):
        try:
            return start()
        except PortTaken:
            continue
    return start()


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
