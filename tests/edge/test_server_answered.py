"""A volume's unchanged request is answered again from the answer it last got while every value
in it is still the one the value cache keeps (provider/mount/mounting.py, `Mounter.answered`),
and not a moment longer: the answer and its files go when one of its cache entries goes."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from devkit.testing import Harness, attributes, mount_request
from provider.edge.server import ProviderServicer

OBJECTS = [{"objectName": "api-key"}, {"objectName": "user"}]


class _Context:
    def time_remaining(self) -> float:
        return 30.0

    async def abort(self, code: Any, message: str) -> None:
        raise AssertionError(f"the mount failed: {code} {message}")


def reads(harness: Harness) -> float:
    text = harness.metrics.render().decode()
    line = 'secrets_bridge_backend_call_duration_seconds_count{backend="fake",operation="read"} '
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].removeprefix(line)) if found else 0.0


def raw(request: Any) -> tuple[str, str, str, str]:
    return (request.attributes, request.secrets, request.permission, request.target_path)


async def test_a_dropped_cache_entry_ends_the_answer_and_the_next_mount_reads(
    tmp_path: Path,
) -> None:
    harness = Harness(tmp_path, cache_ttl=300)
    harness.write({"secrets": {"api-key": "key-1", "user": "u"}})
    servicer = ProviderServicer(mounter=harness.mounter, metrics=harness.metrics)
    request = mount_request(attributes(OBJECTS))
    first = await servicer.Mount(request, _Context())
    assert await servicer.Mount(request, _Context()) is first
    assert reads(harness) == len(OBJECTS)  # one read per object, none by the second mount
    held = harness.mounter.recall(raw(request))
    assert held is not None and held.answer is not None
    answer = held.answer
    # The store changes and the value cache forgets one of the two values (as a rotation
    # does when its entry is replaced): the answer kept by that entry is gone with it.
    harness.write({"secrets": {"api-key": "key-2", "user": "u"}})
    cache = harness.mounter._fetcher._cache
    key = next(k for k in list(cache._entries) if "api-key" in repr(k))
    cache.invalidate(key)
    gc.collect()
    assert answer.result is None and answer.reply is None
    assert len(harness.mounter._answers) == 0
    again = await servicer.Mount(request, _Context())
    assert again is not first
    assert {f.path: f.contents for f in again.files}["api-key"] == b"key-2"
    assert await servicer.Mount(request, _Context()) is again


async def test_an_expired_value_is_read_again_not_answered(tmp_path: Path) -> None:
    now = [1000.0]
    harness = Harness(tmp_path, cache_ttl=30)
    harness.write({"secrets": {"api-key": "key-1", "user": "u"}})
    harness.mounter._fetcher._cache._clock = lambda: now[0]
    servicer = ProviderServicer(mounter=harness.mounter, metrics=harness.metrics)
    request = mount_request(attributes(OBJECTS))
    first = await servicer.Mount(request, _Context())
    now[0] += 29
    assert await servicer.Mount(request, _Context()) is first
    now[0] += 2  # past --cache-ttl
    harness.write({"secrets": {"api-key": "key-2", "user": "u"}})
    later = await servicer.Mount(request, _Context())
    assert {f.path: f.contents for f in later.files}["api-key"] == b"key-2"


async def test_pods_of_one_class_share_one_answer(tmp_path: Path) -> None:
    """Each pod's request is its own entry; what they were built from, and so the answer and
    its protobuf, is one."""
    harness = Harness(tmp_path, cache_ttl=300)
    harness.write({"secrets": {"api-key": "key-1", "user": "u"}})
    servicer = ProviderServicer(mounter=harness.mounter, metrics=harness.metrics)
    one = mount_request(attributes(OBJECTS))
    other = mount_request(attributes(OBJECTS, **{"csi.storage.k8s.io/pod.name": "app-1"}))
    first = await servicer.Mount(one, _Context())
    second = await servicer.Mount(other, _Context())
    assert second is first
    assert harness.mounter.requests_kept() == 2 and len(harness.mounter._answers) == 1
