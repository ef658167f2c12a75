"""Stores for `bench`: each rig starts (or prepares) a store, seeds it, tells the provider how
to reach it, and counts the calls the store served."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path
from typing import Protocol

import yaml


class Rig(Protocol):
    provider_args: list[str]
    params: dict[str, str]

    def tokens(self, service_account: str) -> dict[str, str]: ...
    def store_calls(self) -> dict[str, int]: ...
    def free_port(self) -> int: ...
    def stop(self) -> None: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class FakeRig:
    """The in-memory fake store; calls are read from the provider's own metrics."""

    def __init__(self, work: Path, objects: int) -> None:
        store = work / "fake-store.yaml"
        secrets = {f"s{i}": {"user": f"u{i}", "password": f"p{i}"} for i in range(objects)}
        store.write_text(yaml.safe_dump({"secrets": secrets}))
        self.health = free_port()
        self.provider_args = ["--enable-fake-backend", "--fake-store-file", str(store)]
        items = [{"objectName": f"o{i}", "secretPath": f"s{i}"} for i in range(objects)]
        self.params = {"backend": "fake", "objects": yaml.safe_dump(items)}

    def free_port(self) -> int:
        return self.health

    def tokens(self, service_account: str) -> dict[str, str]:
        return {}

    def store_calls(self) -> dict[str, int]:
        url = f"http://127.0.0.1:{self.health}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return {}
        total = 0
        for line in text.splitlines():
            if line.startswith('secrets_bridge_backend_calls_total{backend="fake"'):
                total += int(float(line.rsplit(" ", 1)[1]))
        return {"fake reads": total}

    def stop(self) -> None:
        return None


def make_rig(store: str, work: Path, *, objects: int, identities: int) -> Rig:
    if store == "fake":
        return FakeRig(work, objects)
    raise SystemExit(f"bench: store {store!r} is not available in this build")
