"""A Mounter over the fake store, built as the composition root builds it (no gRPC)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import build_mounter
from provider.mount.mounting import Mounter, MountInput
from tests.helpers import make_pod


class Harness:
    def __init__(self, tmp_path: Path, options: dict[str, Any] | None = None, **core: Any) -> None:
        self.store_file = tmp_path / "store.yaml"
        key = tmp_path / "key"
        key.write_bytes(b"k" * 32)
        self.write({"secrets": {}})
        settings = ServeSettings(
            hmac_key_file=str(key),
            core=CoreSettings(enable_fake_backend=True, **core),
            backend_options={
                "fake": FakeOptions(store_file=str(self.store_file)),
                **(options or {}),
            },
        )
        self.metrics = Metrics()
        self.mounter, self.backends = build_mounter(settings, self.metrics)

    def write(self, data: dict[str, Any]) -> None:
        self.store_file.write_text(yaml.safe_dump(data, sort_keys=False))

    @property
    def fake(self) -> Any:
        return self.backends.get("fake")

    def request(self, objects: list[dict[str, Any]], pod: Any = None, **params: str) -> MountInput:
        p = {"backend": "fake", "objects": yaml.safe_dump(objects), **params}
        return MountInput(params=p, pod=pod or make_pod(), permission=0o644)

    async def files(self, objects: list[dict[str, Any]], **params: str) -> dict[str, bytes]:
        result = await self.mounter.mount(self.request(objects, **params))
        return {f.path: f.contents for f in result.files}


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


__all__ = ["Harness", "Mounter"]
