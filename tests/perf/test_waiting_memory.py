"""`python -m devkit.probes.waiting_memory` measures mounts that are still waiting on a store
that is down (it refuses to report once any of them stopped waiting), against a real OpenBao."""

from __future__ import annotations

import re
import subprocess
import sys


def test_waiting_memory_measures_mounts_still_waiting() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devkit.probes.waiting_memory", "--mounts", "50", "--wait", "0.5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.match(
        r"(\d+\.\d\d) KiB of Python heap per waiting mount \(50 waiting\)\n", run.stdout
    )
    assert found is not None, run.stdout
    # The fetcher's wait is where a waiting mount's own state lives: it must be counted.
    assert "provider/mount/fetching.py" in run.stdout
    assert 0 < float(found.group(1)) < 64
