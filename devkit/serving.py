"""The provider serving on a Unix socket in the caller's event loop, and a driver-like client.

`serving` runs `app.serve` as the DaemonSet runs it (HMAC key file, health port, grace period)
and, when the block ends, checks that /metrics carries no secret material whatever happened
inside, then stops the server and expects a clean exit. Tests of the edge, the backends' mount
tests and the end-to-end tests all reach the provider through it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import yaml

from devkit.leaks import leaks_in_text
from devkit.ports import free_port
from protos import provider_pb2_grpc
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge import app


def driver_channel(path: str) -> grpc.aio.Channel:
    """The driver's dial options: insecure, authority `localhost`."""
    return grpc.aio.insecure_channel(
        f"unix://{path}", options=[("grpc.default_authority", "localhost")]
    )


@dataclass
class Serving:
    """A provider serving on a Unix socket in the test's loop, and a driver-like stub."""

    socket: str
    stub: Any
    health: str


@contextlib.asynccontextmanager
async def serving(
    tmp_path: Path,
    *,
    backend_options: dict[str, Any],
    core: CoreSettings | None = None,
    grace_period: float = 2.0,
    audit_log: str | None = None,
) -> AsyncIterator[Serving]:
    """`app.serve` as the DaemonSet runs it (HMAC key file, health port), stopped at the end.
    With `audit_log`, a file, its lines are checked for secret material at the end too."""
    key = tmp_path / "hmac.key"
    key.write_bytes(b"0123456789abcdef0123456789abcdef")
    port = free_port()
    settings = ServeSettings(
        socket=str(tmp_path / "provider.sock"),
        health_addr=f"127.0.0.1:{port}",
        grace_period=grace_period,
        hmac_key_file=str(key),
        audit_log=audit_log,
        core=core or CoreSettings(),
        backend_options=backend_options,
    )
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(app.serve(settings, ready=ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 10)
    channel = driver_channel(settings.socket)
    try:
        yield Serving(
            settings.socket,
            provider_pb2_grpc.CSIDriverProviderStub(channel),
            f"http://127.0.0.1:{port}",
        )
        # Metric labels never carry secret material, whatever the test did.
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            assert not leaks_in_text(await resp.text()), "secret material in /metrics"
        if audit_log and audit_log != "-":
            trail = Path(audit_log).read_text()
            assert not leaks_in_text(trail), "secret material in the audit trail"
    finally:
        await channel.close()
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0


@dataclass
class Provider:
    """A provider serving the fake store from `store_file` (the edge tests' subject)."""

    socket: str
    store_file: Path
    stub: Any
    health: str

    def write_store(self, data: dict[str, Any]) -> None:
        self.store_file.write_text(yaml.safe_dump(data, sort_keys=False))
