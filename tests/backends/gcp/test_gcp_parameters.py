"""Google Parameter Manager end to end: whole Mounts through the real provider (gRPC on a Unix
socket) against the fake Google's RenderParameterVersion (devkit/google_params.py), global and
regional, with the pod's own identity, rotation and errors."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devkit.google import POOL
from devkit.google_params import start_parameter_manager
from devkit.serving import serving
from devkit.testing import driver_request
from provider.core.settings import CoreSettings
from tests.backends.gcp.conftest import Stack

KSA = "ksa:default/app"
GLOBAL = "projects/proj/locations/global/parameters/app"
REGIONAL = "projects/proj/locations/europe-west1/parameters/app"
SECRET = "projects/proj/secrets/db"


def request(parameters: dict[str, str], token: str = "pod-token-default-app") -> Any:
    return driver_request(parameters, tokens={POOL: token}, spc="app-params")


def gcp(*entries: str) -> dict[str, str]:
    return {"backend": "gcp", "secrets": "\n".join(entries)}


@pytest.fixture
async def provider(stack: Stack, tmp_path: Path) -> AsyncIterator[Any]:
    global_server, global_port = await start_parameter_manager(stack.google, "pm-global", False)
    regional_server, regional_port = await start_parameter_manager(
        stack.google, "pm-regional", True
    )
    options = dataclasses.replace(
        stack.options,
        parametermanager_endpoint=f"127.0.0.1:{global_port}",
        # One local server for every region; it refuses global names, so routing mistakes fail.
        parametermanager_regional_endpoint=f"127.0.0.1:{regional_port}",
    )
    core = CoreSettings(kube_api_url=stack.http)
    try:
        async with serving(tmp_path, backend_options={"gcp": options}, core=core) as served:
            yield served.stub
    finally:
        await global_server.stop(None)
        await regional_server.stop(None)


async def test_global_and_regional_parameters_render_as_the_pod(
    stack: Stack, provider: Any
) -> None:
    stack.pod()
    stack.google.add_version(SECRET, "s3cret")
    payload = (
        'db:\n  password: __REF__("//secretmanager.googleapis.com/' + SECRET + '/versions/1")\n'
    )
    stack.google.add_parameter_version(GLOBAL, "v1", payload, KSA)
    stack.google.add_parameter_version(REGIONAL, "v1", '{"region": "eu"}', KSA)
    reply = await provider.Mount(
        request(
            gcp(
                f"- {{resourceName: {GLOBAL}/versions/v1, path: app.yaml, mode: 0400}}",
                f"- {{resourceName: {REGIONAL}/versions/latest, path: region, "
                "extractJSONKey: region}",
            )
        ),
        timeout=10,
    )
    assert not reply.error.code
    assert {f.path: (f.mode, f.contents) for f in reply.files} == {
        "app.yaml": (0o400, b"db:\n  password: s3cret\n"),
        "region": (0o644, b"eu"),
    }
    # Upstream's ids: the resource name as written.
    assert [v.id for v in reply.object_version] == [
        f"{GLOBAL}/versions/v1",
        f"{REGIONAL}/versions/latest",
    ]
    assert ("pm-global", f"{GLOBAL}/versions/v1", KSA) in stack.google.reads
    assert ("pm-regional", f"{REGIONAL}/versions/latest", KSA) in stack.google.reads
    # The pod's own identity: one STS exchange for its pool audience, as for secrets.
    assert [r["subject_token"] for r in stack.google.sts_requests] == ["pod-token-default-app"]


async def test_rendered_secret_rotation_changes_the_version(stack: Stack, provider: Any) -> None:
    """A parameter version is immutable but its rendering follows the secret it references:
    the object version follows the rendered content, not the parameter version's name."""
    stack.pod()
    stack.google.add_version(SECRET, "one")
    ref = '__REF__("//secretmanager.googleapis.com/' + SECRET + '/versions/latest")'
    stack.google.add_parameter_version(GLOBAL, "v1", "password: " + ref, KSA)
    parameters = gcp(f"- {{resourceName: {GLOBAL}/versions/v1, path: app.yaml}}")
    first = await provider.Mount(request(parameters), timeout=10)
    again = await provider.Mount(request(parameters), timeout=10)
    assert list(first.object_version) == list(again.object_version)
    stack.google.add_version(SECRET, "two")
    rotated = await provider.Mount(request(parameters), timeout=10)
    assert [f.contents for f in rotated.files] == [b"password: two"]
    assert rotated.object_version[0].version != first.object_version[0].version
    assert rotated.object_version[0].id == first.object_version[0].id


async def test_denied_parameter_names_it_the_identity_and_the_role(
    stack: Stack, provider: Any
) -> None:
    stack.pod()
    stack.google.add_parameter_version(GLOBAL, "v1", "x", "ksa:other/app")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await provider.Mount(
            request(gcp(f"- {{resourceName: {GLOBAL}/versions/v1, path: a}}")), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    details = err.value.details() or ""
    assert f"{GLOBAL}/versions/v1" in details and "default/app" in details
    assert "Parameter Manager" in details and "parametermanager.parameterViewer" in details
    assert "pod-token" not in details and "ya29" not in details


async def test_missing_version_and_transient_failures(stack: Stack, provider: Any) -> None:
    stack.pod()
    stack.google.add_parameter_version(REGIONAL, "v1", "x", KSA)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await provider.Mount(
            request(gcp(f"- {{resourceName: {REGIONAL}/versions/v9, path: a}}")), timeout=10
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "parameter version" in (err.value.details() or "")
    # An UNAVAILABLE answer is retried within the mount.
    name = f"{REGIONAL}/versions/v1"
    stack.google.failures[name] = [grpc.StatusCode.UNAVAILABLE]
    reply = await provider.Mount(request(gcp(f"- {{resourceName: {name}, path: a}}")), timeout=10)
    assert [f.contents for f in reply.files] == [b"x"]
    assert [r for r in stack.google.reads if r[1] == name] == [("pm-regional", name, KSA)] * 2


async def test_unauthenticated_token_is_refreshed_once(stack: Stack, provider: Any) -> None:
    stack.pod()
    stack.google.add_parameter_version(GLOBAL, "v1", "x", KSA)
    parameters = gcp(f"- {{resourceName: {GLOBAL}/versions/v1, path: a}}")
    await provider.Mount(request(parameters), timeout=10)
    stack.google.revoke_all()  # the cached access token is no longer accepted
    reply = await provider.Mount(request(parameters), timeout=10)
    assert [f.contents for f in reply.files] == [b"x"]
    assert len(stack.google.sts_requests) == 2
