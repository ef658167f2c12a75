"""End-to-end rigs: a real OpenBao (provider.devstores), a fault-injecting proxy in front of it,
and the provider serving on a Unix socket in the test's event loop."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from backends.vault.options import Options as VaultOptions
from protos import provider_pb2, provider_pb2_grpc
from provider import app
from provider.devstores import OpenBaoDev, PodTokens, free_port
from provider.settings import CoreSettings, ServeSettings
from tests.server.conftest import driver_channel

OBJECTS = [
    {"objectName": f"o{i}", "secretPath": f"secret/data/e2e/s{i}", "secretKey": "pw"}
    for i in range(3)
]


class FaultProxy:
    """HTTP proxy to the store that answers a share of requests with an error, and counts."""

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
        app_ = web.Application()
        app_.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app_, handle_signals=False, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
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


@dataclass
class Stack:
    bao: OpenBaoDev
    proxy: FaultProxy
    tokens: PodTokens
    socket: str
    stub: Any

    def request(self, service_account: str = "app", pod: str = "p0") -> Any:
        attrs = {
            "backend": "vault",
            "roleName": "e2e",
            "vaultAuthMountPath": "jwt",
            "objects": yaml.safe_dump(OBJECTS),
            "secretProviderClass": "e2e",
            "csi.storage.k8s.io/pod.name": pod,
            "csi.storage.k8s.io/pod.namespace": "e2e",
            "csi.storage.k8s.io/pod.uid": f"uid-{pod}",
            "csi.storage.k8s.io/serviceAccount.name": service_account,
            "csi.storage.k8s.io/serviceAccount.tokens": json.dumps(
                {
                    "vault": {
                        "token": self.tokens.token("e2e", service_account, "vault"),
                        "expirationTimestamp": "",
                    }
                }
            ),
        }
        return provider_pb2.MountRequest(
            attributes=json.dumps(attrs), secrets="null", target_path="/t", permission="420"
        )


@pytest.fixture
async def stack(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Stack]:
    core = dict(getattr(request, "param", {}) or {})
    bao = OpenBaoDev(tmp_path)
    await bao.start()
    tokens = PodTokens()
    await bao.configure_jwt(tokens)
    await bao.add_role("e2e", "e2e", ["app", "app2"], ["secret/data/e2e/*"])
    for i in range(3):
        await bao.kv_put(f"e2e/s{i}", {"pw": f"e2e-secret-{i}"})
    proxy = FaultProxy(bao.url)
    await proxy.start()
    key = tmp_path / "key"
    key.write_bytes(b"k" * 32)
    settings = ServeSettings(
        socket=str(tmp_path / "p.sock"),
        health_addr=f"127.0.0.1:{free_port()}",
        grace_period=2,
        hmac_key_file=str(key),
        core=CoreSettings(**core),
        backend_options={"vault": VaultOptions(addr=proxy.url)},
    )
    ready, stop = asyncio.Event(), asyncio.Event()
    server = asyncio.create_task(app.serve(settings, ready=ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 10)
    try:
        async with driver_channel(settings.socket) as channel:
            yield Stack(
                bao,
                proxy,
                tokens,
                settings.socket,
                provider_pb2_grpc.CSIDriverProviderStub(channel),
            )
    finally:
        stop.set()
        await asyncio.wait_for(server, 10)
        await proxy.stop()
        await bao.stop()
