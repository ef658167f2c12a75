"""End-to-end rigs: a real OpenBao (devkit.openbao, configured like the vault backend tests'
one), a fault-injecting proxy in front of it, and the provider serving on a Unix socket in the
test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.vault.options import Options as VaultOptions
from devkit.openbao import OpenBao, read_policy
from devkit.proxy import FaultProxy
from devkit.serving import serving
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from provider.core.settings import CoreSettings

OBJECTS = [
    {"objectName": f"o{i}", "secretPath": f"secret/data/e2e/s{i}", "secretKey": "pw"}
    for i in range(3)
]


@dataclass
class Stack:
    bao: OpenBao
    proxy: FaultProxy
    tokens: SigningKey
    socket: str
    stub: Any

    def request(self, service_account: str = "app", pod: str = "p0") -> Any:
        params = {
            "backend": "vault",
            "roleName": "e2e",
            "vaultAuthMountPath": "jwt",
            "objects": yaml.safe_dump(OBJECTS),
        }
        token = self.tokens.pod_token("e2e", service_account, "vault")
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
    bao = OpenBao.start(tmp_path / "openbao")
    tokens = SigningKey.generate()
    bao.configure_jwt_auth("jwt", tokens.public_pem)
    bao.put_policy("e2e", read_policy(["secret/data/e2e/*"]))
    bao.add_jwt_role(
        "jwt", "e2e", namespace="e2e", service_account=["app", "app2"], policies=["e2e"]
    )
    for i in range(3):
        bao.kv2_put("secret", f"e2e/s{i}", {"pw": f"e2e-secret-{i}"})
    proxy = FaultProxy(bao.addr)
    await proxy.start()
    options = {"vault": VaultOptions(addr=proxy.url)}
    try:
        async with serving(tmp_path, backend_options=options, core=CoreSettings(**core)) as running:
            yield Stack(bao, proxy, tokens, running.socket, running.stub)
    finally:
        await proxy.stop()
        bao.stop()
