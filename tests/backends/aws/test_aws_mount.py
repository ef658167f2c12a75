"""Through the provider's own core (as `serve` builds it), against moto: files, modes, versions."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from backends.aws.options import Options
from devkit.moto import CountingProxy, MotoServer
from provider.core.errors import MountFailed
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings, ServeSettings
from provider.edge.app import Backends, build_mounter
from provider.mount.mounting import Mounter, MountInput
from tests.backends.aws.conftest import REGION, ROLE, irsa_pod

# The AWS provider's documented class: only `provider` changed and `backend: aws` added; the
# region comes from the provider's --aws-region.
DOCUMENTED = {
    "backend": "aws",
    "roleArn": ROLE,
    "objects": """
        - objectName: "MySecret"
          objectType: "secretsmanager"
          jmesPath:
              - path: "username"
                objectAlias: "MySecretUsername"
              - path: '"db-password"'
                objectAlias: "MySecretPassword"
                filePermission: "0400"
        - objectName: "/prod/app/flags"
          objectType: "ssmparameter"
          objectAlias: flags
    """,
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


def request(params: dict[str, str]) -> MountInput:
    return MountInput(params=params, pod=irsa_pod(), permission=0o644)


async def test_aws_documented_class_mounts_through_the_core(
    core: tuple[Mounter, Backends], moto: MotoServer, proxy: CountingProxy
) -> None:
    mounter, _ = core
    secret = json.dumps({"username": "testuser", "db-password": "pw"})
    moto.client("secretsmanager").create_secret(Name="MySecret", SecretString=secret)
    moto.client("ssm").put_parameter(Name="/prod/app/flags", Value="a,b", Type="StringList")
    result = await mounter.mount(request(DOCUMENTED))
    files = {f.path: (f.contents, f.mode) for f in result.files}
    assert files == {
        "MySecret": (secret.encode(), 0o644),
        "MySecretUsername": (b"testuser", 0o644),
        "MySecretPassword": (b"pw", 0o400),
        "flags": (b"a,b", 0o644),
    }
    assert proxy.counts["GetSecretValue"] == 1 and proxy.counts["GetParameters"] == 1
    versions = {v.id: v.version for v in result.versions}
    assert set(versions) == set(files)

    # The kubelet's republish: one DescribeSecret confirms the held value, no GetSecretValue.
    again = await mounter.mount(request(DOCUMENTED))
    assert {f.path: f.contents for f in again.files} == {p: c for p, (c, _) in files.items()}
    assert {v.id: v.version for v in again.versions} == versions
    assert proxy.counts["GetSecretValue"] == 1
    assert proxy.counts["DescribeSecret"] == 1


async def test_aws_mount_failure_names_object_region_and_identity(
    core: tuple[Mounter, Backends], moto: MotoServer
) -> None:
    mounter, _ = core
    with pytest.raises(MountFailed) as caught:
        await mounter.mount(request(DOCUMENTED))
    text = str(caught.value)
    assert "MySecret" in text and "/prod/app/flags" in text
    assert REGION in text and "default/app" in text
