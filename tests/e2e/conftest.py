"""End-to-end rigs: a real OpenBao (provider.devstores), a fault-injecting proxy in front of it,
and the provider serving on a Unix socket in the test's event loop."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.vault.options import Options as VaultOptions
from protos import provider_pb2, provider_pb2_grpc
from provider import app
from provider.devstores import FaultProxy, OpenBaoDev, PodTokens, free_port
from provider.settings import CoreSettings, ServeSettings
from tests.server.conftest import driver_channel

OBJECTS = [
    {"objectName": f"o{i}", "secretPath": f"secret/data/e2e/s{i}", "secretKey": "pw"}
    for i in range(3)
]


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
