"""Issue 33: an answer the provider accepts is one the driver accepts.

The driver receives the MountResponse with grpc-go's default receive limit, 4 MiB (raised by its
`--max-call-recv-msg-size`), which counts the serialized message: framing of every file and
object version included. A real provider on a Unix socket serves fake-store values sized so that
the answer is exactly 4 MiB, then one byte more, for 1, 100 and 1,000 objects: at the limit a
client with the driver's receive limit takes it; one byte over, the provider refuses it with its
own message (which a provider allowed one byte more would have made the driver refuse with
grpc's "received message larger than max").
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from backends.fake.options import Options as FakeOptions
from devkit.leaks import leaks_in_text
from devkit.serving import serving
from devkit.testing import attributes, mount_request
from protos import provider_pb2, provider_pb2_grpc
from provider.core.files import DRIVER_RECV_BYTES, File, ObjectVersion, wire_size
from provider.core.settings import CoreSettings
from provider.edge.server import _response
from provider.mount.mounting import MountResult

#: grpc-go's default receive size, the driver's limit unless --max-call-recv-msg-size says more.
DRIVER_LIMIT = 4 * 1024 * 1024
FILLER = "s3cr3t-value-"  # a known secret of the suite's leak guard (devkit/leaks.py)


def test_the_default_is_the_drivers_default() -> None:
    assert CoreSettings().max_response_bytes == DRIVER_RECV_BYTES == DRIVER_LIMIT


@contextlib.asynccontextmanager
async def driver(socket: str, receive: int = DRIVER_LIMIT) -> AsyncIterator[Any]:
    """A stub dialled as the driver dials, with the driver's receive limit."""
    channel = grpc.aio.insecure_channel(
        f"unix://{socket}",
        options=[
            ("grpc.default_authority", "localhost"),
            ("grpc.max_receive_message_length", receive),
        ],
    )
    try:
        yield provider_pb2_grpc.CSIDriverProviderStub(channel)
    finally:
        await channel.close()


def request(count: int, last: str) -> Any:
    objects = [{"objectName": f"o{i}", "secretPath": f"s{i}"} for i in range(count - 1)]
    objects.append({"objectName": f"o{count - 1}", "secretPath": last})
    return mount_request(attributes(objects))


def sizes_for(probe: provider_pb2.MountResponse, target: int) -> list[int]:
    """Contents lengths that make `probe`'s answer (same paths, modes, version lengths)
    serialize to exactly `target` bytes, measured with the generated stubs."""
    count = len(probe.files)
    answer = provider_pb2.MountResponse()
    answer.CopyFrom(probe)
    sizes = [(target - answer.ByteSize()) // count - 8] * count
    for _ in range(5):
        for file, size in zip(answer.files, sizes, strict=True):
            file.contents = b"x" * size
        missing = target - len(answer.SerializeToString())
        if not missing:
            return sizes
        sizes[-1] += missing
    raise AssertionError(f"no contents lengths make {count} files {target} bytes")


def value(size: int) -> str:
    return (FILLER * (size // len(FILLER) + 1))[:size]


def one_line_naming(details: str, count: int, size: int, contents: int) -> None:
    objects, files = ("object", "file") if count == 1 else ("objects", "files")
    assert details.startswith(
        f"the answer would be {size} bytes as sent to the driver ({count} {objects}, "
        f"{count} {files}: {contents} bytes of contents, {size - contents} of paths, modes, "
        f"versions and framing), over the provider's limit of {DRIVER_LIMIT} "
        "(--max-response-bytes)"
    ), details
    assert "--max-call-recv-msg-size" in details
    assert "\n" not in details
    assert not leaks_in_text(details), details


@pytest.mark.parametrize("count", [1, 100, 1000])
async def test_the_answer_is_measured_as_the_driver_receives_it(tmp_path: Path, count: int) -> None:
    store = tmp_path / "store.yaml"
    secrets = {f"s{i}": "v" for i in range(count)} | {"over": "v"}
    store.write_text(json.dumps({"secrets": secrets}))  # JSON is YAML, and quick to write
    fake = {"fake": FakeOptions(store_file=str(store))}
    core = CoreSettings(enable_fake_backend=True, max_objects=1000)
    assert core.max_response_bytes == DRIVER_LIMIT
    (tmp_path / "provider").mkdir()
    async with (
        serving(tmp_path / "provider", backend_options=fake, core=core) as provider,
        driver(provider.socket) as stub,
    ):
        # The paths, modes and version lengths of this class's answer, from a small mount.
        probe = await stub.Mount(request(count, f"s{count - 1}"), timeout=10)
        sizes = sizes_for(probe, DRIVER_LIMIT)
        secrets = {f"s{i}": value(n) for i, n in enumerate(sizes)}
        secrets["over"] = value(sizes[-1] + 1)
        store.write_text(json.dumps({"secrets": secrets}))

        # Exactly at the limit: served, and taken by a client with the driver's limit.
        at = await stub.Mount(request(count, f"s{count - 1}"), timeout=30)
        assert len(at.SerializeToString()) == DRIVER_LIMIT
        assert [len(f.contents) for f in at.files] == sizes
        assert [f.path for f in at.files] == [f.path for f in probe.files]

        # One byte over (the last object's value one byte longer): refused by the provider,
        # with its own message.
        over = provider_pb2.MountResponse()
        over.CopyFrom(at)
        over.files[-1].contents += b"x"
        assert len(over.SerializeToString()) == DRIVER_LIMIT + 1
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Mount(request(count, "over"), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        one_line_naming(info.value.details(), count, DRIVER_LIMIT + 1, sum(sizes) + 1)


async def test_one_byte_more_is_what_the_driver_refuses(tmp_path: Path) -> None:
    """A provider allowed one byte more sends that answer, and a client with the driver's
    receive limit refuses it with grpc's own error (what the pod saw before issue 33): the
    provider's count and grpc's are the same number."""
    count = 100
    store = tmp_path / "store.yaml"
    store.write_text(json.dumps({"secrets": {f"s{i}": "v" for i in range(count)}}))
    fake = {"fake": FakeOptions(store_file=str(store))}
    core = CoreSettings(enable_fake_backend=True, max_response_bytes=DRIVER_LIMIT + 1)
    async with (
        serving(tmp_path, backend_options=fake, core=core) as provider,
        driver(provider.socket, receive=64 * 1024 * 1024) as roomy,
        driver(provider.socket) as stub,
    ):
        probe = await roomy.Mount(request(count, f"s{count - 1}"), timeout=10)
        sizes = sizes_for(probe, DRIVER_LIMIT + 1)
        store.write_text(json.dumps({"secrets": {f"s{i}": value(n) for i, n in enumerate(sizes)}}))
        answer = await roomy.Mount(request(count, f"s{count - 1}"), timeout=30)
        assert len(answer.SerializeToString()) == DRIVER_LIMIT + 1
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Mount(request(count, f"s{count - 1}"), timeout=30)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"({DRIVER_LIMIT + 1} vs. {DRIVER_LIMIT})" in info.value.details()


def test_the_edge_sends_what_the_mount_measured() -> None:
    """The edge's own conversion (provider/edge/server.py) serializes to `wire_size`."""
    files = (
        File("a", 0o644, b""),
        File("dir/ключ", 0o400, b"x" * 300),
        File("t", 0, b"y" * 128),
    )
    versions = (ObjectVersion("a", "0" * 32), ObjectVersion("dir/ключ", "7"), ObjectVersion("", ""))
    result = MountResult(files, versions, "fake")
    assert len(_response(result).SerializeToString()) == wire_size(files, versions)
