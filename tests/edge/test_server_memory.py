"""With caching off, nothing of a mount stays in the provider once it is answered: neither the
answer memo (tests/mount/test_metrics_truth.py) nor the edge's reused protobuf response."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

from devkit.testing import Harness, attributes, mount_request
from provider.edge.server import ProviderServicer


class _Context:
    """The two things the handler asks of grpc's context on a successful mount."""

    def time_remaining(self) -> float:
        return 30.0

    async def abort(self, code: Any, message: str) -> None:
        raise AssertionError(f"the mount failed: {code} {message}")


async def settle() -> None:
    for _ in range(3):  # the finished load task's wake-ups
        await asyncio.sleep(0)
    gc.collect()


async def test_no_response_outlives_its_mount_without_caching(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    harness.write({"secrets": {"api-key": "key-123"}})
    servicer = ProviderServicer(mounter=harness.mounter, metrics=harness.metrics)
    request = mount_request(attributes([{"objectName": "api-key"}]))
    response = await servicer.Mount(request, _Context())
    assert response.files[0].contents == b"key-123"
    del response
    await settle()
    # The response is kept only with an answer, and no answer is kept without caching.
    held = harness.mounter.recall(
        (request.attributes, request.secrets, request.permission, request.target_path)
    )
    assert held is not None and held.answer is None
    assert len(harness.mounter._answers) == 0


async def test_cached_mounts_reuse_one_response(tmp_path: Path) -> None:
    harness = Harness(tmp_path, cache_ttl=30)
    harness.write({"secrets": {"api-key": "key-123"}})
    servicer = ProviderServicer(mounter=harness.mounter, metrics=harness.metrics)
    request = mount_request(attributes([{"objectName": "api-key"}]))
    first = await servicer.Mount(request, _Context())
    second = await servicer.Mount(request, _Context())
    assert second is first
