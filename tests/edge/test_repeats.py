"""Which mounts get a log line (provider/edge/repeats.py), and the server's use of it: answers
and failures."""

from __future__ import annotations

import json
import logging

import grpc
import pytest

from devkit.serving import Provider
from devkit.testing import attributes, mount_request
from provider.edge.repeats import MAX_KEY_CHARS, SLOW_SECONDS, Repeats


def test_a_volume_is_logged_first_then_counted_until_it_changes() -> None:
    r = Repeats(600)
    assert r.quiet("/v/1", ("spc", ("a",)), 0.01, now=0.0) == 0
    assert r.quiet("/v/1", ("spc", ("a",)), 0.01, now=1.0) is None
    assert r.quiet("/v/1", ("spc", ("a",)), 0.01, now=2.0) is None
    # A rotation (new versions) is logged at once, with the repeats since the last line.
    assert r.quiet("/v/1", ("spc", ("b",)), 0.01, now=3.0) == 2
    assert r.quiet("/v/1", ("spc", ("b",)), 0.01, now=4.0) is None
    # Another volume (another pod) has a line of its own.
    assert r.quiet("/v/2", ("spc", ("b",)), 0.01, now=4.0) == 0


def test_an_unchanged_volume_is_logged_again_after_the_interval() -> None:
    r = Repeats(600)
    assert r.quiet("/v", "same", 0.01, now=0.0) == 0
    assert r.quiet("/v", "same", 0.01, now=599.0) is None
    assert r.quiet("/v", "same", 0.01, now=600.0) == 1
    assert r.quiet("/v", "same", 0.01, now=601.0) is None


def test_slow_mounts_are_always_logged() -> None:
    r = Repeats(600)
    assert r.quiet("/v", "same", 0.01, now=0.0) == 0
    assert r.quiet("/v", "same", SLOW_SECONDS, now=1.0) == 0


def test_zero_logs_every_mount_and_odd_paths_are_never_counted() -> None:
    every = Repeats(0)
    assert [every.quiet("/v", "same", 0.01, now=float(i)) for i in range(3)] == [0, 0, 0]
    r = Repeats(600)
    long = "/" + "x" * MAX_KEY_CHARS
    assert [r.quiet(long, "same", 0.01, now=float(i)) for i in range(3)] == [0, 0, 0]
    assert [r.quiet("", "same", 0.01, now=float(i)) for i in range(3)] == [0, 0, 0]
    assert len(r) == 0


def test_memory_is_bounded_by_volumes_oldest_first() -> None:
    r = Repeats(600, max_volumes=3)
    for i in range(3):
        r.quiet(f"/v/{i}", "same", 0.01, now=0.0)
    r.quiet("/v/0", "same", 0.01, now=1.0)  # used: /v/1 is now the oldest
    r.quiet("/v/3", "same", 0.01, now=1.0)
    assert len(r) == 3
    assert r.quiet("/v/0", "same", 0.01, now=2.0) is None  # still remembered
    assert r.quiet("/v/1", "same", 0.01, now=2.0) == 0  # forgotten: logged as new


def mount_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    return [
        dict(getattr(r, "fields", {}))
        for r in caplog.records
        if r.name == "secrets_bridge.server" and r.getMessage() == "mount"
    ]


async def test_the_server_logs_a_volumes_first_mount_and_each_change(
    provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="secrets_bridge")
    request = mount_request(attributes([{"objectName": "api-key"}]))
    for _ in range(3):
        await provider.stub.Mount(request, timeout=10)
    lines = mount_lines(caplog)
    assert len(lines) == 1 and "repeats" not in lines[0]
    assert lines[0]["pod"] == "app-0" and lines[0]["files"] == 1
    provider.write_store({"secrets": {"api-key": "key-456"}})
    await provider.stub.Mount(request, timeout=10)
    lines = mount_lines(caplog)
    assert len(lines) == 2 and lines[1]["repeats"] == 2


async def test_the_server_groups_a_volumes_repeated_failures_like_its_answers(
    provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="secrets_bridge")
    request = mount_request(attributes([{"objectName": "api-key"}]))
    await provider.stub.Mount(request, timeout=10)
    provider.write_store({"secrets": {}})  # gone: every poll now fails the same way
    for _ in range(3):
        with pytest.raises(grpc.aio.AioRpcError):
            await provider.stub.Mount(request, timeout=10)
    provider.write_store({"secrets": {"api-key": "key-456"}})  # back: logged at once
    await provider.stub.Mount(request, timeout=10)
    lines = [
        (r.getMessage(), getattr(r, "fields", {}).get("repeats"))
        for r in caplog.records
        if r.name == "secrets_bridge.server"
    ]
    assert lines == [("mount", None), ("mount failed", None), ("mount", 2)]


async def test_one_target_path_of_several_namespaces_is_not_one_volume(
    provider: Provider, caplog: pytest.LogCaptureFixture
) -> None:
    """The secrets-store-sync-controller sends every SecretSync with one placeholder path: a
    namespace's failure is logged even when another's identical one was just logged."""
    twice = [{"objectName": "a"}, {"objectName": "a"}]  # refused alike in every namespace
    for namespace in ("team-a", "team-a", "team-b"):
        attrs = json.loads(attributes(twice))
        attrs["csi.storage.k8s.io/pod.namespace"] = namespace
        request = mount_request(json.dumps(attrs))
        request.target_path = "/mnt/secrets-store"
        with pytest.raises(grpc.aio.AioRpcError):
            await provider.stub.Mount(request, timeout=5)
    logged = [
        r for r in caplog.records if r.getMessage() == "mount failed" and hasattr(r, "fields")
    ]
    assert [r.fields["namespace"] for r in logged] == ["team-a", "team-b"]
