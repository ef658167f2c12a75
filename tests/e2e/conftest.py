"""End-to-end rigs: a real OpenBao (devkit.devstores), a fault-injecting proxy in front of it,
and the provider serving on a Unix socket in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.vault.options import Options as VaultOptions
from devkit.devstores import FaultProxy, OpenBaoDev, PodTokens
from provider.core.settings import CoreSettings
from tests.helpers import driver_request, serving

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
        params = {
            "backend": "vault",
            "roleName": "e2e",
            "vaultAuthMountPath": "jwt",
            "objects": yaml.safe_dump(OBJECTS),
        }
        token = self.tokens.token("e2e", service_account, "vault")
        return driver_request(
            params,
            tokens={"vault": token},
            namespace="e2e",
            service_account=service_account,
            pod=pod,
            spc="e2e",
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
    options = {"vault": VaultOptions(addr=proxy.url)}
    try:
        async with serving(tmp_path, backend_options=options, core=CoreSettings(**core)) as running:
            yield Stack(bao, proxy, tokens, running.socket, running.stub)
    finally:
        await proxy.stop()
        await bao.stop()
