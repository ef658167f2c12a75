"""`secrets-bridge serve` in a process of its own, as the DaemonSet runs it, for tests that
measure what the provider process itself holds (its peak RSS, VmHWM) while the driver calls it.

`devkit/serving.py` serves in the test's own loop, whose memory and CPU are the test's too; a
memory bound is checked here instead, on the provider's process alone.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from devkit.ports import free_port


@dataclass(frozen=True)
class ProviderProcess:
    socket: str
    pid: int
    log: Path

    def status_mib(self, field: str) -> float:
        """A /proc/<pid>/status field in MiB: VmHWM (peak RSS) or VmRSS."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        raise LookupError(field)


@contextlib.contextmanager
def provider_process(workdir: Path, *flags: str, pythonpath: str = "") -> Iterator[ProviderProcess]:
    """The provider serving on a socket in `workdir` with `flags`; stopped (SIGTERM) after.
    `pythonpath`: another checkout's code (a probe's before-and-after figures)."""
    workdir.mkdir(parents=True, exist_ok=True)
    key = workdir / "hmac.key"
    key.write_bytes(os.urandom(32))
    sock = str(workdir / "provider.sock")
    log = workdir / "provider.log"
    cmd = [
        str(Path(sys.executable).with_name("secrets-bridge")),
        "serve",
        f"--socket={sock}",
        f"--health-addr=127.0.0.1:{free_port()}",
        f"--hmac-key-file={key}",
        "--log-level=error",
        *flags,
    ]
    with open(log, "wb") as out:
        env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
        server = subprocess.Popen(cmd, stderr=out, env=env)
    try:
        yield ProviderProcess(sock, server.pid, log)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
