"""The real server on a Unix socket, called with the driver's dial options."""

from __future__ import annotations

import os
import stat

import aiohttp
import grpc
import pytest

from devkit.serving import Provider
from devkit.testing import attributes, mount_request
from protos import provider_pb2
from provider import __version__


async def test_version_answers_like_the_driver_expects(provider: Provider) -> None:
    reply = await provider.stub.Version(
        provider_pb2.VersionRequest(version="v1alpha1"), wait_for_ready=True, timeout=5
    )
    assert (reply.version, reply.runtime_name, reply.runtime_version) == (
        "v1alpha1",
        "secrets-bridge",
        __version__,
    )


async def test_socket_is_not_world_writable(provider: Provider) -> None:
    mode = os.stat(provider.socket).st_mode
    assert stat.S_ISSOCK(mode)
    assert not mode & stat.S_IWOTH


async def test_mount_returns_files_modes_and_versions(provider: Provider) -> None:
    objects = [
        {"objectName": "db.json", "secretPath": "db-creds", "filePermission": 0o400},
        {"objectName": "password", "secretPath": "db-creds", "extract": "password"},
        {"objectName": "api-key"},
    ]
    reply = await provider.stub.Mount(mount_request(attributes(objects)), timeout=10)
    files = {f.path: (f.mode, f.contents) for f in reply.files}
    assert files == {
        "db.json": (0o400, b'{"username":"app","password":"pw-1"}'),
        "password": (0o644, b"pw-1"),
        "api-key": (0o644, b"key-123"),
    }
    ids = [v.id for v in reply.object_version]
    assert ids == ["db.json", "password", "api-key"]
    assert all(len(v.version) == 32 for v in reply.object_version)
    # A version is an HMAC, never the content or a plain hash of it.
    assert all(v.version not in (b"pw-1".hex(), "pw-1") for v in reply.object_version)
    assert not reply.error.code


async def test_versions_change_exactly_when_content_changes(provider: Provider) -> None:
    objects = [
        {"objectName": "password", "secretPath": "db-creds", "extract": "password"},
        {"objectName": "api-key"},
    ]
    first = await provider.stub.Mount(mount_request(attributes(objects)), timeout=10)
    again = await provider.stub.Mount(mount_request(attributes(objects)), timeout=10)
    assert list(first.object_version) == list(again.object_version)
    provider.write_store({"secrets": {"db-creds": {"password": "pw-2"}, "api-key": "key-123"}})
    rotated = await provider.stub.Mount(mount_request(attributes(objects)), timeout=10)
    old = {v.id: v.version for v in first.object_version}
    new = {v.id: v.version for v in rotated.object_version}
    assert new["password"] != old["password"]
    assert new["api-key"] == old["api-key"]


async def test_missing_object_fails_the_whole_mount(provider: Provider) -> None:
    objects = [{"objectName": "api-key"}, {"objectName": "nope"}]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await provider.stub.Mount(mount_request(attributes(objects)), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'nope'" in info.value.details()
    assert "default/app" in info.value.details()


async def test_denied_identity_is_permission_denied(provider: Provider) -> None:
    attrs = attributes(
        [{"objectName": "api-key"}], **{"csi.storage.k8s.io/serviceAccount.name": "intruder"}
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await provider.stub.Mount(mount_request(attrs), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "default/intruder" in info.value.details()


async def test_health_ready_and_metrics(provider: Provider) -> None:
    await provider.stub.Mount(mount_request(attributes([{"objectName": "api-key"}])), timeout=10)
    async with aiohttp.ClientSession() as http:
        async with http.get(provider.health + "/healthz") as r:
            assert r.status == 200
        async with http.get(provider.health + "/readyz") as r:
            assert r.status == 200
            assert __version__ in await r.text()
        async with http.get(provider.health + "/metrics") as r:
            text = await r.text()
    assert 'secrets_bridge_mount_requests_total{backend="fake",code="OK"} 1.0' in text
    assert "secrets_bridge_mount_duration_seconds_bucket" in text
    assert "key-123" not in text


@pytest.mark.parametrize("provider", [{"fake_latency": 3.0}], indirect=True)
async def test_slow_store_gives_deadline_exceeded(provider: Provider) -> None:
    import time

    start = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await provider.stub.Mount(
            mount_request(attributes([{"objectName": "api-key"}])), timeout=0.5
        )
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - start < 1.5
