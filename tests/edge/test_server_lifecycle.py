"""The `serve` process itself: stale socket, ready quickly, SIGTERM drains in-flight mounts."""

from __future__ import annotations

import asyncio
import os
import signal
import socket as pysocket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import yaml

from devkit.ports import free_port
from devkit.serving import driver_channel
from devkit.testing import attributes, mount_request
from protos import provider_pb2, provider_pb2_grpc


def start_serve(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    sock = str(tmp_path / "p.sock")
    store = tmp_path / "store.yaml"
    store.write_text(yaml.safe_dump({"secrets": {"api-key": "key-123"}}))
    cmd = [
        sys.executable,
        "-m",
        "provider.cli.main",
        "serve",
        "--socket",
        sock,
        "--health-addr",
        f"127.0.0.1:{free_port()}",
        "--enable-fake-backend",
        "--fake-store-file",
        str(store),
        "--grace-period",
        "5",
        "--log-format",
        "text",
        *extra,
    ]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    return proc, sock


async def wait_ready(sock: str, seconds: float = 10) -> float:
    start = time.monotonic()
    async with driver_channel(sock) as channel:
        stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
        await stub.Version(
            provider_pb2.VersionRequest(version="v1alpha1"), wait_for_ready=True, timeout=seconds
        )
    return time.monotonic() - start


async def test_stale_socket_is_replaced(tmp_path: Path) -> None:
    stale = pysocket.socket(pysocket.AF_UNIX)
    stale.bind(str(tmp_path / "p.sock"))
    stale.close()  # leaves the socket file behind, like a SIGKILLed provider
    proc, sock = start_serve(tmp_path)
    try:
        await wait_ready(sock)
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0
    assert not os.path.exists(sock)


@pytest.mark.parametrize(("choice", "loop"), [("auto", "uvloop"), ("asyncio", "asyncio")])
async def test_sigterm_drains_in_flight_mount_and_exits_zero(
    tmp_path: Path, choice: str, loop: str
) -> None:
    """On either event loop (uvloop is the default where installed, as in the image)."""
    proc, sock = start_serve(tmp_path, "--fake-latency", "1.5", "--event-loop", choice)
    try:
        await wait_ready(sock)
        async with driver_channel(sock) as channel:
            stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
            call = asyncio.ensure_future(
                stub.Mount(mount_request(attributes([{"objectName": "api-key"}])), timeout=20)
            )
            await asyncio.sleep(0.5)  # the mount is now waiting on the slow store
            proc.send_signal(signal.SIGTERM)
            reply = await call
        assert [f.contents for f in reply.files] == [b"key-123"]
        # New connections are refused once draining began.
        async with driver_channel(sock) as channel:
            stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
            try:
                await stub.Version(provider_pb2.VersionRequest(), timeout=1)
                refused = False
            except grpc.aio.AioRpcError:
                refused = True
        assert refused
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not os.path.exists(sock)
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert b"stopped" in log
    assert f"loop={loop}".encode() in log
    assert b"key-123" not in log


async def mount_like_the_driver(sock: str, attempts: int = 4) -> object:
    """The driver re-sends a Mount that failed with UNAVAILABLE up to 3 times (1 s backoff)."""
    delay = 1.0
    for attempt in range(attempts):
        try:
            async with driver_channel(sock) as channel:
                stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
                return await stub.Mount(
                    mount_request(attributes([{"objectName": "api-key"}])), timeout=5
                )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == attempts - 1:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10)
    raise AssertionError("unreachable")


async def test_sigkill_then_restart_serves_a_retrying_driver(tmp_path: Path) -> None:
    proc, sock = start_serve(tmp_path)
    await wait_ready(sock)
    proc.kill()
    proc.wait(10)
    assert os.path.exists(sock)  # SIGKILL leaves the socket file behind
    call = asyncio.ensure_future(mount_like_the_driver(sock))
    await asyncio.sleep(0.3)  # the driver's first attempt fails: nobody listens
    restarted, _ = start_serve(tmp_path)
    try:
        reply = await call
        assert [f.contents for f in reply.files] == [b"key-123"]
    finally:
        restarted.terminate()
        assert restarted.wait(10) == 0
