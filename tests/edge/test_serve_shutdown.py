"""`serve` releases what it acquired through one exit stack, in reverse order; a resource that
fails to be released is logged (one line naming it, no secret) and the others still are."""

from __future__ import annotations

import errno
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends.fake.options import Options as FakeOptions
from devkit.serving import serving
from provider.core.metrics import Metrics
from provider.core.settings import CoreSettings
from provider.edge import app, startup

TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJlLXNpZ25hdHVyZQ"
RELEASE_FAILED = "could not release a resource"


def _failures(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        dict(getattr(r, "fields", {}))
        for r in caplog.records
        if r.getMessage() == RELEASE_FAILED and r.levelno == logging.WARNING
    ]


def _listening(addr: str) -> bool:
    host, _, port = addr.removeprefix("http://").rpartition(":")
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) == 0


async def test_a_failed_release_is_logged_and_the_rest_is_still_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    release_socket = startup.release_socket

    def failing(path: str, ours: tuple[int, int] | None) -> None:
        release_socket(path, ours)
        raise OSError(errno.EIO, f"cannot release the socket of {TOKEN}")

    monkeypatch.setattr(app, "release_socket", failing)
    store = tmp_path / "store.yaml"
    store.write_text(yaml.safe_dump({"secrets": {"api-key": "key-123"}}))
    caplog.set_level(logging.INFO, logger="secrets_bridge")
    options = {"fake": FakeOptions(store_file=str(store))}
    async with serving(
        tmp_path, backend_options=options, core=CoreSettings(enable_fake_backend=True)
    ) as running:
        health = running.health
        assert _listening(health)
    # `serving` checked that serve returned 0; the failure is one line naming the resource.
    assert _failures(caplog) == [
        {"resource": "the socket", "error": "OSError", "detail": _failures(caplog)[0]["detail"]}
    ]
    assert all(TOKEN not in str(vars(r)) for r in caplog.records)
    # Released after the socket: the health server.
    assert not _listening(health)
    messages = [r.getMessage() for r in caplog.records]
    assert messages.index("stopping") < messages.index(RELEASE_FAILED) < messages.index("stopped")


async def test_backends_close_logs_each_part_that_fails_and_closes_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backends = app.Backends(core=CoreSettings(), options={}, metrics=Metrics())
    closed: list[str] = []

    async def broken() -> None:
        raise RuntimeError(f"lost the session of {TOKEN}")

    async def fine() -> None:
        closed.append("fine")

    backends.on_close(broken, "the broken part")
    backends.on_close(fine, "the fine part")
    caplog.set_level(logging.INFO, logger="secrets_bridge")
    await backends.close()
    assert closed == ["fine"]
    failures = _failures(caplog)
    assert [(f["resource"], f["error"]) for f in failures] == [("the broken part", "RuntimeError")]
    assert all(TOKEN not in str(vars(r)) for r in caplog.records)
