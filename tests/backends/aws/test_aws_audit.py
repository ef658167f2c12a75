"""The audit trail's sources against moto (issue 18): a Secrets Manager value confirmed by
DescribeSecret instead of re-read is recorded as `revalidated`, not `store`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.aws.options import Options
from devkit.moto import CountingProxy, MotoServer
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import Backends, build_mounter
from provider.mount.mounting import Mounter, MountInput
from tests.backends.aws.conftest import REGION, ROLE, irsa_pod

CLASS = {
    "backend": "aws",
    "roleArn": ROLE,
    "objects": "- {objectName: app/db, objectType: secretsmanager, objectAlias: db}",
}


@pytest.fixture
async def core(tmp_path: Path, proxy: CountingProxy) -> AsyncIterator[tuple[Mounter, Backends]]:
    key = tmp_path / "hmac"
    key.write_bytes(b"k" * 32)
    settings = ServeSettings(
        hmac_key_file=str(key),
        core=CoreSettings(),
        backend_options={"aws": Options(region=REGION, endpoints=f"{REGION}={proxy.url}")},
    )
    mounter, backends = build_mounter(settings, Metrics())
    yield mounter, backends
    await backends.close()


async def test_aws_revalidation_is_recorded_as_revalidated(
    core: tuple[Mounter, Backends], moto: MotoServer, proxy: CountingProxy
) -> None:
    mounter, _ = core
    moto.client("secretsmanager").create_secret(Name="app/db", SecretString="s3cr3t")
    request = MountInput(params=CLASS, pod=irsa_pod(), permission=0o644)
    first = await mounter.mount(request, audit=True)
    second = await mounter.mount(request, audit=True)
    assert proxy.counts["GetSecretValue"] == 1 and proxy.counts["DescribeSecret"] == 1
    [read], [confirmed] = first.served, second.served
    assert (read.source, confirmed.source) == ("store", "revalidated")
    assert read.ref == confirmed.ref == "secretsmanager app/db"
    assert read.store == f"aws {REGION} as {ROLE}"
    assert read.versions == confirmed.versions == tuple(v.version for v in first.versions)
    # Without the trail, nothing is recorded (and the answer is the memoized one).
    assert (await mounter.mount(request)).served == ()
