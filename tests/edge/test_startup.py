"""`serve` and the driver's socket: a second provider on the same socket refuses to start and
leaves the first one serving; a refused start leaves nothing behind; shutdown removes only the
socket this process created."""

from __future__ import annotations

import os
import socket as pysocket
import subprocess
import sys
from pathlib import Path

from devkit.ports import free_port
from provider import __version__
from tests.edge.test_server_lifecycle import start_serve, wait_ready


def serve_again(sock: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provider.cli.main", "serve", "--socket", sock, *extra],
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_a_second_provider_on_the_same_socket_refuses_and_the_first_keeps_it(
    tmp_path: Path,
) -> None:
    first, sock = start_serve(tmp_path)
    try:
        await wait_ready(sock)
        inode = os.stat(sock).st_ino
        second = serve_again(sock, "--health-addr", f"127.0.0.1:{free_port()}")
        assert second.returncode == 1
        assert second.stderr.strip().splitlines()[-1] == (
            f"secrets-bridge serve: --socket {sock}: another provider ({__version__}) is serving "
            "there; stop it first, or choose another --socket"
        )
        assert "Traceback" not in second.stderr
        assert os.stat(sock).st_ino == inode
        await wait_ready(sock, seconds=5)  # the first one still answers on its own socket
    finally:
        first.terminate()
        first.wait(10)
    assert first.returncode == 0
    assert not os.path.exists(sock)


async def test_shutdown_leaves_a_socket_it_did_not_create(tmp_path: Path) -> None:
    proc, sock = start_serve(tmp_path)
    try:
        await wait_ready(sock)
        # Another process took the path over (e.g. an operator's manual run after an unlink).
        os.unlink(sock)
        other = pysocket.socket(pysocket.AF_UNIX)
        other.bind(sock)
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0
    assert os.path.exists(sock), "the other process's socket was removed"
    other.close()


def test_a_path_that_is_not_a_socket_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "p.sock"
    path.write_text("precious")
    result = serve_again(str(path), "--health-addr", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1
    assert "exists and is not a socket" in result.stderr and "Traceback" not in result.stderr
    assert path.read_text() == "precious"


def test_a_health_port_in_use_is_one_line_and_leaves_no_socket(tmp_path: Path) -> None:
    busy = pysocket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    sock = str(tmp_path / "p.sock")
    try:
        result = serve_again(sock, "--health-addr", f"127.0.0.1:{port}")
    finally:
        busy.close()
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"secrets-bridge serve: --health-addr 127.0.0.1:{port}: cannot ")
    assert "Traceback" not in result.stderr and "never awaited" not in result.stderr
    assert not os.path.exists(sock)
