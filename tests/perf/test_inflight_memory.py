"""`python -m devkit.probes.inflight_memory` compares RSS per held call of the provider (its
OpenBao cut off) with a bare grpc server's, and refuses to report unless every held call was
still waiting."""

from __future__ import annotations

import re
import subprocess
import sys


def test_inflight_memory_reports_floor_and_provider() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devkit.probes.inflight_memory", "--pairs", "1", "--calls", "40"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    # Only the shape is checked: RSS moves in pages and allocator arenas, so 40 held calls can
    # read as anything from 0 up; the tool itself fails if a held call ended before the count.
    pattern = r"(floor|provider) +-?\d+\.\d KiB of RSS per call in flight \(median of 1: "
    assert re.findall(pattern, run.stdout) == ["floor", "provider"], run.stdout
    assert run.stdout.count("; 40 calls held)") == 2, run.stdout
