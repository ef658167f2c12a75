"""A Mounter over the fake store, built as the composition root builds it (no gRPC)."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.testing import Harness
from provider.mount.mounting import Mounter


@pytest.fixture
def harness(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


__all__ = ["Harness", "Mounter"]
