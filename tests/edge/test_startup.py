"""`serve` and the driver's socket: a second provider on the same socket refuses to start and
leaves the first one serving; a refused start leaves nothing behind; shutdown removes only the
socket this process created."""

from __future__ import annotations

import os
import shutil
import socket as pysocket
import subprocess
import sys
import time
from pathlib import Path

import pytest

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


# -- the socket's path: relative, the default directory, the image's own default ---------------

CLI_DATA = Path(__file__).parents[1] / "cli" / "data"


def test_a_relative_socket_is_served_in_the_working_directory_and_dialled_by_the_clients(
    tmp_path: Path,
) -> None:
    """`serve --socket p.sock` binds (and removes) ./p.sock, never `/.p.sock.PID`; `mount
    --provider-socket` and `bench --socket` dial the same relative path."""
    root = set(os.listdir("/"))
    key = tmp_path / "hmac.key"
    key.write_bytes(b"k" * 32)
    serve = subprocess.Popen(
        [
            sys.executable, "-m", "provider.cli.main", "serve", "--socket", "p.sock",
            "--health-addr", f"127.0.0.1:{free_port()}", "--hmac-key-file", str(key),
            "--enable-fake-backend", "--fake-store-file", str(CLI_DATA / "fake-store.yaml"),
            "--log-level", "warning",
        ],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "p.sock").exists() and time.monotonic() < deadline:
            assert serve.poll() is None, serve.communicate()[1]
            time.sleep(0.05)
        spc = str(CLI_DATA / "fake-spc.yaml")
        mount = cli(tmp_path, "mount", spc, "--target", "v", "--provider-socket", "p.sock")
        assert mount.returncode == 0, mount.stderr
        assert (tmp_path / "v" / "api-key").read_text()
        bench = cli(
            tmp_path, "bench", "--socket", "p.sock", "--class", spc, "--cold", "--no-echo",
            "--mounts", "20", "--no-progress",
        )  # fmt: skip
        assert bench.returncode == 0, bench.stderr
        assert "E0000" not in mount.stderr + bench.stderr
    finally:
        serve.terminate()
        _, err = serve.communicate(timeout=15)
    assert serve.returncode == 0, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hmac.key", "v"]
    assert set(os.listdir("/")) == root


def cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provider.cli.main", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )


async def test_only_the_drivers_default_directory_is_created_and_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's directory is created when missing (0755, as its DirectoryOrCreate volume
    makes it) and removed again when the start is abandoned; any other is refused, named."""
    from provider.edge import startup

    default = tmp_path / "providers"  # (short: pytest's directories are long for a socket)
    monkeypatch.setattr(startup, "DEFAULT_DIRECTORY", str(default))
    claim = await startup.claim_socket(str(default / "sb.sock"))
    assert default.is_dir() and default.stat().st_mode & 0o777 == 0o755
    assert list(default.iterdir()) == [], "the bind probe left its private name"
    claim.abandon()
    assert not default.exists()
    mistyped = tmp_path / "provider"
    with pytest.raises(startup.StartupError, match="does not exist; create it, or correct"):
        await startup.claim_socket(str(mistyped / "sb.sock"))
    assert not mistyped.exists()


def test_the_images_default_against_a_directory_it_may_not_create(tmp_path: Path) -> None:
    """The image's own default (`USER 65532`, `CMD serve`) where the driver's directory is not
    mounted: the directory cannot be created in the root-owned /var/run. Emulated with the
    default directory in a parent owned by another uid (and, as root, no capabilities)."""
    parent = tmp_path / "run"  # (short names: pytest's directories are long for a socket)
    parent.mkdir()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root, and no setpriv to drop capabilities with")
        os.chown(parent, 65532, 65532)
        prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    else:
        parent.chmod(0o555)
        prefix = []
    default = parent / "providers"
    code = (
        "import sys; from provider.edge import startup; "
        f"startup.DEFAULT_DIRECTORY = {str(default)!r}; "
        "from provider.cli.main import main; sys.exit(main(sys.argv[1:]))"
    )
    result = subprocess.run(
        [*prefix, sys.executable, "-c", code, "serve", "--socket", f"{default}/sb.sock",
         "--health-addr", f"127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=30,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    owner = 65532 if os.geteuid() == 0 else os.geteuid()
    mode = 755 if os.geteuid() == 0 else 555
    # As root without capabilities, the message says so and does not ask for uid 0 again.
    root = os.geteuid() == 0
    who = " without CAP_DAC_OVERRIDE, so the directory's mode applies to it as to any user"
    as_root = "" if root else " and run serve as uid 0"
    assert result.stderr.strip().splitlines() == [
        f"secrets-bridge serve: --socket {default}/sb.sock: {default} does not "
        f"exist and cannot be created (permission denied: it belongs to uid {owner} with mode "
        f"{mode}, and this process runs as uid {os.geteuid()}{who if root else ''}); mount the "
        f"driver's provider directory from the node there{as_root}"
        ", as deploy/base/daemonset.yaml does, or choose another --socket"
    ]
    assert list(parent.iterdir()) == []
