"""The access audit trail against a real OpenBao (issue 18): with the value cache on, three pods
of one service account are three records in our trail while OpenBao's own audit log shows one
read; concurrent mounts are `coalesced`; an outage with serve-stale is `stale`; an identity
OpenBao refuses is recorded with its code."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from backends.vault.options import Options as VaultOptions
from devkit.leaks import leaks_in_text
from devkit.openbao import OpenBao, read_policy
from devkit.proxy import FaultProxy
from devkit.serving import serving
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from provider.cli.main import main
from provider.core.settings import CoreSettings

OBJECTS = [{"objectName": "pw", "secretPath": "secret/data/audit/db", "secretKey": "pw"}]


@dataclass
class Rig:
    bao: OpenBao
    proxy: FaultProxy
    tokens: SigningKey
    stub: Any
    trail: Path

    async def mount(self, pod: str, sa: str = "app") -> Any:
        params = {
            "backend": "vault",
            "roleName": "audit",
            "vaultAuthMountPath": "jwt",
            "objects": yaml.safe_dump(OBJECTS),
        }
        token = self.tokens.pod_token("e2e", sa, "vault")
        request = driver_request(
            params, tokens={"vault": token}, namespace="e2e", service_account=sa, pod=pod
        )
        return await self.stub.Mount(request, timeout=15)

    def records(self) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.trail.read_text().splitlines()]
        return [line for line in lines if line["type"] == "audit"]


@pytest.fixture
async def rig(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    core = CoreSettings(**dict(getattr(request, "param", {}) or {}))
    bao = OpenBao.start(tmp_path / "openbao")
    tokens = SigningKey.generate()
    bao.configure_jwt_auth("jwt", tokens.public_pem)
    bao.put_policy("audit", read_policy(["secret/data/audit/*"]))
    bao.add_jwt_role("jwt", "audit", namespace="e2e", service_account=["app"], policies=["audit"])
    bao.kv2_put("secret", "audit/db", {"pw": "e2e-secret-audit"})
    bao.audit_mark()
    proxy = FaultProxy(bao.addr)
    await proxy.start()
    trail = tmp_path / "audit.log"
    options = {"vault": VaultOptions(addr=proxy.url)}
    try:
        async with serving(
            tmp_path, backend_options=options, core=core, audit_log=str(trail)
        ) as running:
            yield Rig(bao, proxy, tokens, running.stub, trail)
    finally:
        await proxy.stop()
        bao.stop()
    text = trail.read_text()
    assert "e2e-secret-audit" not in text and not leaks_in_text(text)
    key = str(tmp_path / "hmac.key")
    assert main(["audit", "verify", str(trail), "--hmac-key-file", key]) == 0


def sources(rig: Rig) -> list[str]:
    return [o["source"] for r in rig.records() for o in r.get("objects", []) if "source" in o]


@pytest.mark.parametrize("rig", [{"cache_ttl": 30}], indirect=True)
async def test_three_pods_three_records_while_openbao_saw_one_read(rig: Rig) -> None:
    for i in range(3):
        await rig.mount(f"web-{i}")
    reads = rig.bao.audit_counts()[("read", "secret/data/audit/db")]
    assert reads == 1
    records = rig.records()
    assert [r["pod"] for r in records] == ["web-0", "web-1", "web-2"]
    assert sources(rig) == ["store", "cache", "cache"]
    assert records[0]["objects"][0]["ref"] == "GET secret/data/audit/db"
    assert records[0]["store"] == f"{rig.proxy.url} (auth/jwt role audit)"


@pytest.mark.parametrize("rig", [{"cache_ttl": 30}], indirect=True)
async def test_concurrent_mounts_share_one_read_and_say_so(rig: Rig) -> None:
    rig.proxy.delay = 0.3
    await asyncio.gather(*(rig.mount(f"web-{i}") for i in range(4)))
    assert rig.bao.audit_counts()[("read", "secret/data/audit/db")] == 1
    assert sorted(sources(rig)) == ["coalesced", "coalesced", "coalesced", "store"]


@pytest.mark.parametrize(
    "rig", [{"serve_stale_max_age": 300, "serve_stale_wait": 0.2}], indirect=True
)
async def test_an_outage_served_stale_is_recorded_as_stale(rig: Rig) -> None:
    await rig.mount("web-0")
    rig.proxy.error_rate, rig.proxy.status = 1.0, 503
    await rig.mount("web-1")
    assert sources(rig) == ["store", "stale"]


async def test_an_identity_openbao_refuses_is_recorded_with_its_code(rig: Rig) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rig.mount("intruder-0", sa="intruder")
    [record] = rig.records()
    assert record["code"] == refused.value.code().name == "PERMISSION_DENIED"
    assert record["serviceaccount"] == "intruder" and record["message"] == refused.value.details()
    assert record["objects"] == [{"object": "pw", "ref": "GET secret/data/audit/db"}]


SELECT_POLICY = """
path "secret/data/sel/*" { capabilities = ["read"] }
path "secret/metadata/sel/*" { capabilities = ["list"] }
path "secret/detailed-metadata/sel/*" { capabilities = ["list"] }
"""


async def test_search_finds_the_pods_that_received_a_selected_secret(
    rig: Rig, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 40 item 8: a selector's secrets are each on record, by their OpenBao path and
    version, and `audit search --secret` names the pods that received one, and when."""
    rig.bao.put_policy("sel", SELECT_POLICY)
    rig.bao.add_jwt_role("jwt", "sel", namespace="e2e", service_account=["app"], policies=["sel"])
    for name in ("db", "api", "api-old"):
        rig.bao.kv2_put("secret", f"sel/{name}", {"v": f"e2e-secret-sel-{name}"})
    chosen = yaml.safe_dump([{"path": "secret/sel", "directory": "sel"}])

    async def poll(pod: str) -> Any:
        params = {"backend": "vault", "roleName": "sel", "vaultAuthMountPath": "jwt"}
        request = driver_request(
            {**params, "select": chosen},
            tokens={"vault": rig.tokens.pod_token("e2e", "app", "vault")},
            namespace="e2e",
            pod=pod,
        )
        return await rig.stub.Mount(request, timeout=15)

    await poll("web-0")
    await poll("web-1")
    rig.bao.kv2_put("secret", "sel/api", {"v": "e2e-secret-sel-api-2"})
    await poll("web-0")
    [entry] = rig.records()[0]["objects"]
    assert entry["ref"] == "KV secret/sel/*"
    assert sorted(entry["secrets"]) == [
        "KV secret/sel/api",
        "KV secret/sel/api-old",
        "KV secret/sel/db",
    ]

    key = str(tmp_path / "hmac.key")
    capsys.readouterr()
    code = main(
        ["audit", "search", str(rig.trail), "--secret", "secret/sel/api", "--hmac-key-file", key]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    found = [line.split() for line in out.splitlines()]
    assert [f[2] for f in found] == ["e2e/web-0", "e2e/web-1", "e2e/web-0"]
    # The version each was given: the same to both first pods, a new one after the update.
    versions = [f[f.index("version") + 1] for f in found]
    assert versions[0] == versions[1] != versions[2]
    assert all(f[-1].startswith(f"[{rig.trail}:") for f in found)
