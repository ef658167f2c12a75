"""The access audit trail (`serve --audit-log`, issue 18) of a served provider over its socket:
one sealed line per mount answered or refused, with each object's source; a sink that cannot
be written fails the mount; SIGHUP reopens the file for logrotate."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from devkit.leaks import leaks_in_text
from devkit.serving import driver_channel, serving
from devkit.testing import Harness, driver_request, mount_request
from protos import provider_pb2_grpc
from provider.cli.main import main
from provider.core.settings import CoreSettings
from provider.edge import auditchain
from provider.edge.audit import UNWRITABLE_TEXT, AuditTrail, FileSink
from provider.edge.server import ProviderServicer, build_server
from tests.edge.conftest import STORE

OBJECTS = [
    {"objectName": "password", "secretPath": "db-creds", "extract": "password"},
    {"objectName": "api-key"},
]
KEY = b"0123456789abcdef0123456789abcdef"  # devkit.serving's installation key


class Audited:
    def __init__(self, stub: Any, trail: Path, store_file: Path, health: str) -> None:
        self.stub, self.trail, self.store_file, self.health = stub, trail, store_file, health

    async def mount(self, pod: str = "p0", sa: str = "app", **kw: Any) -> Any:
        params = {"backend": "fake", "objects": yaml.safe_dump(OBJECTS), **kw}
        request = driver_request(params, pod=pod, service_account=sa, spc="db")
        return await self.stub.Mount(request, timeout=10)

    def records(self) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.trail.read_text().splitlines()]
        return [line for line in lines if line["type"] == "audit"]

    def write_store(self, data: dict[str, Any]) -> None:
        self.store_file.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture
async def audited(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Audited]:
    store_file = tmp_path / "store.yaml"
    store_file.write_text(yaml.safe_dump(STORE, sort_keys=False))
    core_kw = dict(getattr(request, "param", {}) or {})
    latency = core_kw.pop("fake_latency", 0.0)
    options = {"fake": FakeOptions(store_file=str(store_file), latency=latency)}
    core = CoreSettings(enable_fake_backend=True, **core_kw)
    trail = tmp_path / "audit.log"
    async with serving(
        tmp_path, backend_options=options, core=core, audit_log=str(trail)
    ) as running:
        yield Audited(running.stub, trail, store_file, running.health)
    # Whatever the test did, the file it leaves is an intact chain.
    assert verify(trail) == 0


def verify(*files: Path) -> int:
    key = files[0].parent / "hmac.key"
    return main(["audit", "verify", *map(str, files), "--hmac-key-file", str(key)])


def sources(record: dict[str, Any]) -> list[str]:
    return [o["source"] for o in record["objects"]]


@pytest.mark.parametrize("audited", [{"cache_ttl": 30}], indirect=True)
async def test_three_pods_of_one_account_three_records_one_store_two_cache(
    audited: Audited,
) -> None:
    replies = [await audited.mount(pod=f"web-{i}") for i in range(3)]
    records = audited.records()
    assert [r["pod"] for r in records] == ["web-0", "web-1", "web-2"]
    assert [sources(r) for r in records] == [["store"] * 2, ["cache"] * 2, ["cache"] * 2]
    first = records[0]
    assert first["event"] == "answered" and first["code"] == "OK"
    assert (first["namespace"], first["serviceaccount"], first["pod_uid"]) == (
        "default",
        "app",
        "uid-web-0",
    )
    assert (first["class"], first["backend"], first["store"]) == ("db", "fake", "fake")
    assert [(o["object"], o["ref"]) for o in first["objects"]] == [
        ("password", "db-creds"),
        ("api-key", "api-key"),
    ]
    # The version recorded is the version the driver was answered.
    for record, reply in zip(records, replies, strict=True):
        answered = {v.id: v.version for v in reply.object_version}
        assert {o["object"]: o["version"] for o in record["objects"]} == answered
    text = audited.trail.read_text()
    assert "pw-1" not in text and "key-123" not in text and not leaks_in_text(text)


@pytest.mark.parametrize("audited", [{"fake_latency": 0.3}], indirect=True)
async def test_concurrent_mounts_are_recorded_as_coalesced(audited: Audited) -> None:
    await asyncio.gather(*(audited.mount(pod=f"web-{i}") for i in range(4)))
    seen = sorted(s for r in audited.records() for s in set(sources(r)))
    assert seen == ["coalesced", "coalesced", "coalesced", "store"]


@pytest.mark.parametrize(
    "audited", [{"serve_stale_max_age": 300, "serve_stale_wait": 0.1}], indirect=True
)
async def test_a_store_outage_with_serve_stale_is_recorded_as_stale(audited: Audited) -> None:
    await audited.mount()
    audited.write_store(
        {**STORE, "failures": {"db-creds": "unavailable", "api-key": "unavailable"}}
    )
    await audited.mount(pod="p1")
    assert [sources(r) for r in audited.records()] == [["store"] * 2, ["stale"] * 2]


async def test_a_denied_identity_is_recorded_with_its_code(audited: Audited) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as denied:
        await audited.mount(pod="intruder-0", sa="intruder")
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # A class whose audience the pod brought no token for: refused before any fetch.
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await audited.mount(pod="p1", audience="vault")
    [refused, untokened] = audited.records()
    assert refused["event"] == "refused" and refused["code"] == "PERMISSION_DENIED"
    assert refused["message"] == denied.value.details()
    assert (refused["pod"], refused["serviceaccount"]) == ("intruder-0", "intruder")
    # What it asked for, with neither a source nor a version: nothing was served.
    assert refused["objects"] == [
        {"object": "password", "ref": "db-creds"},
        {"object": "api-key", "ref": "api-key"},
    ]
    assert untokened["code"] == missing.value.code().name == "FAILED_PRECONDITION"


async def test_a_malformed_request_is_recorded_without_a_pod(audited: Audited) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await audited.stub.Mount(mount_request("{not json"), timeout=10)
    [record] = audited.records()
    assert record["code"] == refused.value.code().name == "INVALID_ARGUMENT"
    assert "pod" not in record and record["message"] == refused.value.details()


async def test_records_are_counted_in_metrics(audited: Audited) -> None:
    await audited.mount()
    with pytest.raises(grpc.aio.AioRpcError):
        await audited.mount(sa="intruder")
    async with aiohttp.ClientSession() as http, http.get(f"{audited.health}/metrics") as resp:
        text = await resp.text()
    for event, count in (("start", 1), ("answered", 1), ("refused", 1)):
        assert f'secrets_bridge_audit_records_total{{event="{event}"}} {count}.0' in text


async def test_sighup_reopens_the_file_after_logrotate_renames_it(audited: Audited) -> None:
    await audited.mount(pod="before")
    rotated = audited.trail.with_name("audit.log.1")
    audited.trail.rename(rotated)
    os.kill(os.getpid(), signal.SIGHUP)
    for _ in range(100):
        if audited.trail.exists():
            break
        await asyncio.sleep(0.01)
    await audited.mount(pod="after")
    old = [json.loads(line) for line in rotated.read_text().splitlines()]
    new = [json.loads(line) for line in audited.trail.read_text().splitlines()]
    assert [r.get("pod") for r in old] == [None, "before"]
    assert [(r["type"], r.get("reason"), r.get("pod")) for r in new] == [
        ("audit-start", "reopen", None),
        ("audit", None, "after"),
    ]
    assert new[0]["previous"] == old[-1]["mac"]
    assert verify(rotated, audited.trail) == 0
    # Newest first: the new file's first line continues the rotated one, given after it.
    assert verify(audited.trail, rotated) == 1
    # The end of the rotated file cut off: only the next file's first line can tell.
    cut = rotated.read_text().splitlines(keepends=True)[:-1]
    rotated.write_text("".join(cut))
    assert verify(rotated) == 0
    assert verify(rotated, audited.trail) == 1


class FullDisk(FileSink):
    """A file whose disk fills up: a write takes part of the line, then fails."""

    full = False

    def _write_all(self, data: bytes) -> None:
        if self.full:
            os.write(self._fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._write_all(data)


async def test_an_unwritable_trail_fails_the_mount_cleanly(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    harness.write({"secrets": {"s": "s3cr3t"}})
    path = tmp_path / "audit.log"
    sink = FullDisk(str(path))
    trail = AuditTrail(
        sink,
        auditchain.derive_key(b"k" * 32),
        metrics=harness.metrics,
        requested=harness.mounter.requested,
    )
    trail.start()
    servicer = ProviderServicer(mounter=harness.mounter, metrics=harness.metrics, audit=trail)
    server = build_server(servicer, max_send_bytes=1 << 20)
    socket = str(tmp_path / "p.sock")
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    channel = driver_channel(socket)
    stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
    request = driver_request({"backend": "fake", "objects": yaml.safe_dump([{"objectName": "s"}])})
    try:
        sink.full = True
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await stub.Mount(request, timeout=10)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert failed.value.details() == UNWRITABLE_TEXT
        assert harness.metrics.audit_failures.labels("write")._value.get() == 1
        sink.full = False  # space freed: mounts are answered and recorded again
        reply = await stub.Mount(request, timeout=10)
        assert [f.contents for f in reply.files] == [b"s3cr3t"]
    finally:
        await channel.close()
        await server.stop(None)
        trail.close()
        await harness.backends.close()
    # The half line the full disk took was taken back: the file holds whole lines only.
    lines = path.read_text().splitlines()
    assert [json.loads(line).get("code") for line in lines] == [None, "OK"]
    key = tmp_path / "key"
    assert main(["audit", "verify", str(path), "--hmac-key-file", str(key)]) == 0
    assert "s3cr3t" not in path.read_text()


async def test_serve_refuses_to_start_when_the_trail_cannot_be_written(tmp_path: Path) -> None:
    from provider.core.settings import ServeSettings
    from provider.edge import app
    from provider.edge.startup import StartupError

    key = tmp_path / "key"
    key.write_bytes(KEY)
    settings = ServeSettings(
        socket=str(tmp_path / "p.sock"), hmac_key_file=str(key), audit_log="/dev/full"
    )
    with pytest.raises(StartupError, match="--audit-log /dev/full: cannot write it"):
        await app.serve(settings)
    assert not os.path.exists(settings.socket)
    without_key = ServeSettings(socket=settings.socket, audit_log=str(tmp_path / "a.log"))
    with pytest.raises(StartupError, match="--audit-log needs --hmac-key-file"):
        await app.serve(without_key)
