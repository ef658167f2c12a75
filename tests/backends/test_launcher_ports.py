"""The real-server launchers survive losing the race for their port.

`free_port` only says a port is free when asked; under pytest-xdist another worker (or any
outgoing connection) may bind it before OpenBao, PostgreSQL or moto_server does. Each launcher
then starts again on a new port. The race is forced here: the first port handed out is one a
listening socket of the test already holds.
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devkit import moto, openbao, ports, postgres


@pytest.fixture
def taken_first(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[object], int]]:
    """taken_first(module): that module's next free_port() is a port someone listens on."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken: int = holder.getsockname()[1]

    def arm(module: object) -> int:
        handed = iter([taken])
        monkeypatch.setattr(module, "free_port", lambda: next(handed, None) or ports.free_port())
        return taken

    yield arm
    holder.close()


def test_openbao_starts_on_another_port_when_its_port_was_taken(
    tmp_path: Path, taken_first: Callable[[object], int]
) -> None:
    taken = taken_first(openbao)
    server = openbao.OpenBao.start(tmp_path / "bao")
    try:
        assert not server.addr.endswith(f":{taken}")
        with urllib.request.urlopen(f"{server.addr}/v1/sys/health", timeout=5) as resp:
            assert resp.status == 200
    finally:
        server.stop()


def test_postgres_starts_on_another_port_when_its_port_was_taken(
    tmp_path: Path, taken_first: Callable[[object], int]
) -> None:
    taken = taken_first(postgres)
    server = postgres.PostgreSQL.start(tmp_path / "pg")
    try:
        assert server.port != taken
        assert server.can_login(server.admin_user, server.admin_password)
    finally:
        server.stop()


def test_moto_starts_on_another_port_when_its_port_was_taken(
    taken_first: Callable[[object], int],
) -> None:
    taken = taken_first(moto)
    with moto.moto_server() as server:
        assert server.port != taken
        assert server.client("secretsmanager").list_secrets()["SecretList"] == []


def test_a_server_that_fails_for_another_reason_is_not_started_again(tmp_path: Path) -> None:
    """Only a taken port is retried: any other start-up failure is reported at once."""
    calls = []

    def start() -> None:
        calls.append(1)
        raise RuntimeError("bao exited: config error")

    with pytest.raises(RuntimeError, match="config error"):
        ports.retrying(start)
    assert calls == [1]
