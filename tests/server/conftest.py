"""A real provider (app.serve) on a Unix socket in tmp_path; a client dialling like the driver."""

from __future__ import annotations

import asyncio
import json
import socket as pysocket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from protos import provider_pb2, provider_pb2_grpc
from provider import app
from provider.settings import CoreSettings, ServeSettings

STORE = {
    "secrets": {
        "db-creds": {"username": "app", "password": "pw-1"},
        "api-key": "key-123",
        "big": "x" * 3000,
    },
    "access": {"api-key": ["default/app", "other/app"]},
}


def free_port() -> int:
    with pysocket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def driver_channel(path: str) -> grpc.aio.Channel:
    """The driver's dial options: insecure, authority `localhost`."""
    return grpc.aio.insecure_channel(
        f"unix://{path}", options=[("grpc.default_authority", "localhost")]
    )


def attributes(objects: list[dict[str, Any]] | str, **extra: str) -> str:
    attrs = {
        "backend": "fake",
        "objects": objects if isinstance(objects, str) else yaml.safe_dump(objects),
        "secretProviderClass": "spc",
        "csi.storage.k8s.io/pod.name": "app-0",
        "csi.storage.k8s.io/pod.namespace": "default",
        "csi.storage.k8s.io/pod.uid": "uid-0",
        "csi.storage.k8s.io/serviceAccount.name": "app",
        "csi.storage.k8s.io/ephemeral": "true",
    }
    attrs.update(extra)
    return json.dumps(attrs)


def mount_request(attrs: str, secrets: str = "null", permission: str = "420") -> Any:
    return provider_pb2.MountRequest(
        attributes=attrs,
        secrets=secrets,
        target_path="/var/lib/kubelet/pods/x",
        permission=permission,
    )


@dataclass
class Provider:
    socket: str
    store_file: Path
    stub: Any
    health: str

    def write_store(self, data: dict[str, Any]) -> None:
        self.store_file.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture
async def provider(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Provider]:
    store_file = tmp_path / "store.yaml"
    store_file.write_text(yaml.safe_dump(STORE, sort_keys=False))
    key_file = tmp_path / "hmac.key"
    key_file.write_bytes(b"0123456789abcdef0123456789abcdef")
    core_kw = dict(getattr(request, "param", {}) or {})
    latency = core_kw.pop("fake_latency", 0.0)
    port = free_port()
    settings = ServeSettings(
        socket=str(tmp_path / "provider.sock"),
        health_addr=f"127.0.0.1:{port}",
        grace_period=2.0,
        hmac_key_file=str(key_file),
        core=CoreSettings(enable_fake_backend=True, **core_kw),
        backend_options={"fake": FakeOptions(store_file=str(store_file), latency=latency)},
    )
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(app.serve(settings, ready=ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 10)
    async with driver_channel(settings.socket) as channel:
        yield Provider(
            settings.socket,
            store_file,
            provider_pb2_grpc.CSIDriverProviderStub(channel),
            f"http://127.0.0.1:{port}",
        )
    stop.set()
    assert await asyncio.wait_for(task, 10) == 0
