"""A real provider (app.serve) on a Unix socket in tmp_path; a client dialling like the driver."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from protos import provider_pb2
from provider.cli.mount import kubelet_keys
from provider.core.settings import CoreSettings
from tests.helpers import serving

STORE = {
    "secrets": {
        "db-creds": {"username": "app", "password": "pw-1"},
        "api-key": "key-123",
        "big": "x" * 3000,
    },
    "access": {"api-key": ["default/app", "other/app"]},
}


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
        **kubelet_keys(pod_name="app-0", namespace="default", uid="uid-0", service_account="app"),
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
    core_kw = dict(getattr(request, "param", {}) or {})
    latency = core_kw.pop("fake_latency", 0.0)
    options = {"fake": FakeOptions(store_file=str(store_file), latency=latency)}
    core = CoreSettings(enable_fake_backend=True, **core_kw)
    async with serving(tmp_path, backend_options=options, core=core) as running:
        yield Provider(running.socket, store_file, running.stub, running.health)
