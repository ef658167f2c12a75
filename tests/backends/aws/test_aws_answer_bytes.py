"""AWS answers are charged to the mount's answer budget and the bytes in flight (issue 40,
item 1), against moto through the provider's own core: a mount whose secrets pass its budget
is refused with the budget's message (the load's one error: RESOURCE_EXHAUSTED at the edge),
objects and selections alike, and gives every byte back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from backends.aws.options import Options
from devkit.moto import CountingProxy, MotoServer
from provider.core.errors import LimitExceeded
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import Backends, build_mounter
from provider.mount.mounting import Mounter, MountInput
from tests.backends.aws.conftest import REGION, ROLE, irsa_pod

#: A small answer budget: 10 secrets of 40 KB pass it (with the 64 KiB slack) by far.
BUDGET = 100_000


@pytest.fixture
async def core(tmp_path: Path, proxy: CountingProxy) -> AsyncIterator[tuple[Mounter, Backends]]:
    key = tmp_path / "hmac"
    key.write_bytes(b"k" * 32)
    settings = ServeSettings(
        hmac_key_file=str(key),
        core=CoreSettings(max_response_bytes=BUDGET),
        backend_options={"aws": Options(region=REGION, endpoints=f"{REGION}={proxy.url}")},
    )
    mounter, backends = build_mounter(settings, Metrics())
    yield mounter, backends
    await backends.close()


@pytest.mark.parametrize("shape", ["objects", "selection"])
async def test_aws_reads_past_the_answer_budget_refuse_the_mount(
    shape: str, core: tuple[Mounter, Backends], moto: MotoServer
) -> None:
    mounter, backends = core
    client = moto.client("secretsmanager")
    for i in range(10):
        client.create_secret(Name=f"big{shape}/s{i}", SecretString="x" * 40_000)
    if shape == "objects":
        objects = [
            {"objectName": f"big{shape}/s{i}", "objectType": "secretsmanager"} for i in range(10)
        ]
        params = {"backend": "aws", "roleArn": ROLE, "objects": yaml.safe_dump(objects)}
    else:
        selectors = [{"namePrefix": f"big{shape}/", "directory": "d"}]
        params = {"backend": "aws", "roleArn": ROLE, "select": yaml.safe_dump(selectors)}
    with pytest.raises(
        LimitExceeded, match=r"over the provider's limit of 100000 \(--max-response-bytes\)"
    ):
        await mounter.mount(MountInput(params=params, pod=irsa_pod(), permission=0o644))
    assert backends.reads.in_use == 0


async def test_aws_reads_within_the_budget_are_served(
    core: tuple[Mounter, Backends], moto: MotoServer
) -> None:
    mounter, backends = core
    moto.client("secretsmanager").create_secret(Name="small/s", SecretString="x" * 40_000)
    objects = [{"objectName": "small/s", "objectType": "secretsmanager", "objectAlias": "s"}]
    params = {"backend": "aws", "roleArn": ROLE, "objects": yaml.safe_dump(objects)}
    got = await mounter.mount(MountInput(params=params, pod=irsa_pod(), permission=0o644))
    assert [f.contents for f in got.files] == [b"x" * 40_000]
    assert backends.reads.in_use == 0
