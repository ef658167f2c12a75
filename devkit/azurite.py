"""Azurite, Microsoft's Azure Storage emulator, as a real Storage queue for the Azure change
source's tests (backends/azure/changes.py).

    with azurite_queue(tmp_path) as queue:   # installs Azurite once, starts azurite-queue
        queue.connection_string               # the well-known dev account, this endpoint
        queue.endpoint                        # http://127.0.0.1:<port>/devstoreaccount1
        queue.stop()                          # the emulator gone (a test of an outage)

Azurite comes from npm, pinned by deploy/azurite/package-lock.json, and is installed with
`npm ci` into .tools/azurite the first time a test asks for it (about 15 s); a stamp of the
lock's digest makes later runs skip it, and a changed lock reinstalls. Several pytest-xdist
workers may start at once: a file lock lets one install while the others wait, and the install
happens in a directory of its own that is renamed into place whole.

The emulator listens on 127.0.0.1 on a port the kernel picks (`--queuePort 0`, read back from
its start-up line, so no two servers race for one port), keeps its queues in memory, and sends
no telemetry. `--skipApiVersionCheck` lets a newer azure-storage-queue than the pinned Azurite
knows talk to it, and `--loose` ignores headers it does not implement.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK_DIR = ROOT / "deploy" / "azurite"
INSTALL_DIR = ROOT / ".tools" / "azurite"
#: The development storage account every Azurite has (its documented name and key).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
_LISTENING = re.compile(rb"listens on (http://127\.0\.0\.1:(\d+))")


def install() -> Path:
    """azurite-queue's path, after installing Azurite into .tools/azurite if it is not there
    (or was installed from another lock)."""
    lock = (LOCK_DIR / "package-lock.json").read_bytes()
    stamp = INSTALL_DIR / f".installed-{hashlib.sha256(lock).hexdigest()[:16]}"
    binary = INSTALL_DIR / "node_modules" / ".bin" / "azurite-queue"
    if stamp.exists():
        return binary
    INSTALL_DIR.parent.mkdir(parents=True, exist_ok=True)
    with open(INSTALL_DIR.parent / "azurite.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another worker's install: wait for it
        if not stamp.exists():
            _install(stamp.name)
    return binary


def _install(stamp: str) -> None:
    work = INSTALL_DIR.with_name(f"azurite.installing-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(LOCK_DIR / name, work / name)
    # No install scripts: no package in the lock has one, and none should run unasked.
    done = subprocess.run(
        ["npm", "ci", "--prefix", str(work), "--ignore-scripts", "--no-audit", "--no-fund"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(f"npm ci of deploy/azurite failed: {done.stderr[-2000:]}")
    (work / stamp).touch()
    shutil.rmtree(INSTALL_DIR, ignore_errors=True)
    work.rename(INSTALL_DIR)


@dataclass
class AzuriteQueue:
    """One azurite-queue process on 127.0.0.1."""

    process: subprocess.Popen[bytes]
    #: The dev account's queue service: http://127.0.0.1:<port>/devstoreaccount1.
    endpoint: str
    log_path: Path

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"QueueEndpoint={self.endpoint};"
        )

    def queue_url(self, queue: str) -> str:
        return f"{self.endpoint}/{queue}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start(workdir: Path, *, timeout: float = 30.0) -> AzuriteQueue:
    """azurite-queue on a kernel-picked loopback port, its log `workdir/azurite.log`."""
    binary = install()
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "azurite.log"
    with open(log_path, "wb") as out:
        process = subprocess.Popen(
            [
                str(binary),
                "--queueHost=127.0.0.1",
                "--queuePort=0",
                "--inMemoryPersistence",
                "--extentMemoryLimit=64",
                "--disableTelemetry",
                "--skipApiVersionCheck",
                "--loose",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _LISTENING.search(log_path.read_bytes())
        if found:
            return AzuriteQueue(process, f"{found[1].decode()}/{ACCOUNT}", log_path)
        if process.poll() is not None:
            break
        time.sleep(0.05)
    output = log_path.read_text(errors="replace")[-2000:]
    AzuriteQueue(process, "", log_path).stop()
    raise RuntimeError(f"azurite-queue did not start: {output}")


@contextlib.contextmanager
def azurite_queue(workdir: Path) -> Iterator[AzuriteQueue]:
    queue = start(workdir)
    try:
        yield queue
    finally:
        queue.stop()
