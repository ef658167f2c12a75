"""A real provider (app.serve) on a Unix socket in tmp_path; a client dialling like the driver.

The builders (`attributes`, `mount_request`, `driver_channel`, `Provider`) live in the dev kit;
they are re-exported here for the edge tests only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from devkit.serving import Provider, driver_channel, serving
from devkit.testing import attributes, mount_request
from provider.core.settings import CoreSettings

STORE = {
    "secrets": {
        "db-creds": {"username": "app", "password": "pw-1"},
        "api-key": "key-123",
        "big": "x" * 3000,
    },
    "access": {"api-key": ["default/app", "other/app"]},
}


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


__all__ = ["STORE", "Provider", "attributes", "driver_channel", "mount_request"]
