"""Whole Mounts through the real provider (gRPC on a Unix socket) against the fake Google."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from devkit.google import POOL
from devkit.serving import serving
from devkit.testing import driver_request
from provider.core.settings import CoreSettings
from tests.backends.gcp.conftest import Stack

HERE = Path(__file__).parent
KSA = "ksa:default/app"


def request(parameters: dict[str, str], token: str = "pod-token-default-app") -> Any:
    """What the driver sends: the SPC parameters plus the kubelet's pod keys and tokens."""
    return driver_request(parameters, tokens={POOL: token}, spc="app-secrets")


@pytest.fixture
async def provider(stack: Stack, tmp_path: Path) -> AsyncIterator[Any]:
    core = CoreSettings(kube_api_url=stack.http)
    async with serving(tmp_path, backend_options={"gcp": stack.options}, core=core) as provider:
        yield provider.stub


async def test_gcp_upstream_class_mounts(stack: Stack, provider: Any) -> None:
    spc = yaml.safe_load((HERE / "upstream_spc.yaml").read_text())
    stack.pod()  # registers the pod's token with the fake STS
    stack.google.add_version("projects/proj/secrets/testsecret", '{"user":"old"}', KSA)
    stack.google.add_version("projects/proj/secrets/testsecret", '{"user":"alice"}', KSA)
    regional = "projects/proj/locations/us-central1/secrets/testsecret"
    stack.google.add_version(regional, '{"user":"bob","pass":"x"}', KSA)
    reply = await provider.Mount(request(spc["spec"]["parameters"]), timeout=10)
    assert not reply.error.code
    assert {f.path: (f.mode, f.contents) for f in reply.files} == {
        "good1.txt": (0o644, b"alice"),
        "good2.txt": (0o644, b"bob"),
    }
    # Upstream's ids: the resourceName as written.
    assert [v.id for v in reply.object_version] == [
        "projects/proj/secrets/testsecret/versions/latest",
        f"{regional}/versions/latest",
    ]
    assert ("regional", f"{regional}/versions/latest", KSA) in stack.google.reads


async def test_gcp_mount_yaml_key_modes_versions_and_rotation(stack: Stack, provider: Any) -> None:
    stack.pod()
    cfg = "projects/proj/secrets/cfg"
    stack.google.add_version(cfg, "db:\n  host: h\npassword: p1\n", KSA)
    parameters = {
        "backend": "gcp",
        "secrets": f"""
- resourceName: {cfg}/versions/latest
  path: password
  extractYAMLKey: password
  mode: 0400
- resourceName: {cfg}/versions/latest
  fileName: cfg.yaml
""",
    }
    first = await provider.Mount(request(parameters), timeout=10)
    files = {f.path: (f.mode, f.contents) for f in first.files}
    assert files == {
        "password": (0o400, b"p1"),
        "cfg.yaml": (0o644, b"db:\n  host: h\npassword: p1\n"),
    }
    # Both entries share one resourceName, so (as upstream) one id: keep them in file order.
    versions = dict(
        zip(["password", "cfg.yaml"], [v.version for v in first.object_version], strict=True)
    )
    assert [v.id for v in first.object_version] == [f"{cfg}/versions/latest"] * 2
    # The whole secret's version is the resolved version name, so `latest` rotates with it.
    assert versions["cfg.yaml"] == f"{cfg}/versions/1"
    assert len(stack.google.reads) == 1  # both entries read the version once
    again = await provider.Mount(request(parameters), timeout=10)
    assert list(again.object_version) == list(first.object_version)
    stack.google.add_version(cfg, "db:\n  host: h\npassword: p2\n", KSA)
    rotated = await provider.Mount(request(parameters), timeout=10)
    new_versions = dict(
        zip(["password", "cfg.yaml"], [v.version for v in rotated.object_version], strict=True)
    )
    assert new_versions["cfg.yaml"] == f"{cfg}/versions/2"
    assert new_versions["password"] != versions["password"]
    assert {f.path: f.contents for f in rotated.files}["password"] == b"p2"


async def test_gcp_mount_denied_names_resource_and_identity(stack: Stack, provider: Any) -> None:
    stack.pod()
    stack.google.add_version("projects/proj/secrets/theirs", "x", "ksa:other/app")
    parameters = {
        "backend": "gcp",
        "secrets": "- {resourceName: projects/proj/secrets/theirs/versions/1, path: a}",
    }
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await provider.Mount(request(parameters), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    details = err.value.details() or ""
    assert "projects/proj/secrets/theirs/versions/1" in details
    assert "default/app" in details
    assert "pod-token" not in details and "ya29" not in details
