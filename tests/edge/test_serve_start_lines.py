"""A refused `serve` start says one line, even without --hmac-key-file (issue 41, defect 9): the
random key's warning is said only once serve has started."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from devkit.ports import free_port


def _serve(tmp_path: Path, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "provider.cli.main",
            "serve",
            "--socket",
            str(tmp_path / "p.sock"),
            *argv,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_health_port_in_use_is_one_line_without_a_key_file(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve(tmp_path, "--health-addr", f"127.0.0.1:{port}")
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.splitlines() == [
        f"secrets-bridge serve: --health-addr 127.0.0.1:{port}: cannot listen (address already "
        "in use); stop what listens there, or choose another --health-addr"
    ]


def test_a_started_serve_still_warns_of_the_random_key(tmp_path: Path) -> None:
    proc = _serve(tmp_path, "--health-addr", f"127.0.0.1:{free_port()}")
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            if '"serving"' in line:
                break
        assert any("no --hmac-key-file" in line for line in lines), lines
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
