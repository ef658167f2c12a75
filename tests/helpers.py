"""Builders shared by tests: a BackendEnv and a Pod as the composition root makes them, a
MountRequest as the driver builds it, and a provider serving on a socket."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provider.core.caching import ExpiringCache
from provider.core.kube import KubeClient
from provider.core.metrics import Metrics
from provider.core.model import BackendEnv, FetchContext, Pod, PodToken
from provider.core.settings import CoreSettings


def make_env(name: str, options: Any = None, **core: Any) -> BackendEnv:
    return BackendEnv(
        name=name,
        core=CoreSettings(**core),
        options=options,
        kube=KubeClient(core.get("kube_api_url")),
        metrics=Metrics(),
        credentials=ExpiringCache(),
    )


def make_pod(
    namespace: str = "default",
    service_account: str = "app",
    name: str = "app-0",
    uid: str = "uid-0",
    tokens: dict[str, str] | None = None,
    secrets: dict[str, str] | None = None,
) -> Pod:
    return Pod(
        namespace=namespace,
        name=name,
        uid=uid,
        service_account=service_account,
        tokens={aud: PodToken(tok) for aud, tok in (tokens or {}).items()},
        node_publish_secret=secrets or {},
    )


def fetch_ctx(seconds: float = 30.0) -> FetchContext:
    now = time.monotonic()
    return FetchContext(deadline=now + seconds, retry_deadline=now + seconds / 3)


def driver_request(
    parameters: dict[str, str],
    *,
    tokens: dict[str, str] | None = None,
    namespace: str = "default",
    service_account: str = "app",
    pod: str = "app-0",
    secrets: str = "null",
    permission: str = "420",
    spc: str = "spc",
) -> Any:
    """A MountRequest as the driver builds it: SPC parameters, the kubelet's pod keys, and the
    tokens JSON inside the attributes JSON (SPEC §1)."""
    import json

    from protos import provider_pb2
    from provider.cli.mount import kubelet_keys

    attrs = {
        **parameters,
        "secretProviderClass": spc,
        **kubelet_keys(
            pod_name=pod,
            namespace=namespace,
            uid=f"uid-{pod}",
            service_account=service_account,
            tokens=tokens,
        ),
    }
    return provider_pb2.MountRequest(
        attributes=json.dumps(attrs), secrets=secrets, target_path="/t", permission=permission
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
) -> AsyncIterator[Serving]:
    """`app.serve` as the DaemonSet runs it (HMAC key file, health port), stopped at the end."""
    import asyncio

    import grpc

    from devkit.devstores import free_port
    from protos import provider_pb2_grpc
    from provider.core.settings import ServeSettings
    from provider.edge import app

    key = tmp_path / "hmac.key"
    key.write_bytes(b"0123456789abcdef0123456789abcdef")
    port = free_port()
    settings = ServeSettings(
        socket=str(tmp_path / "provider.sock"),
        health_addr=f"127.0.0.1:{port}",
        grace_period=grace_period,
        hmac_key_file=str(key),
        core=core or CoreSettings(),
        backend_options=backend_options,
    )
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(app.serve(settings, ready=ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 10)
    # The driver's dial options: insecure, authority `localhost`.
    channel = grpc.aio.insecure_channel(
        f"unix://{settings.socket}", options=[("grpc.default_authority", "localhost")]
    )
    try:
        yield Serving(
            settings.socket,
            provider_pb2_grpc.CSIDriverProviderStub(channel),
            f"http://127.0.0.1:{port}",
        )
        # Metric labels never carry secret material, whatever the test did.
        import aiohttp

        from tests.leaks import leaks_in_text

        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                assert not leaks_in_text(await resp.text()), "secret material in /metrics"
    finally:
        await channel.close()
        stop.set()
        assert await asyncio.wait_for(task, 10) == 0
