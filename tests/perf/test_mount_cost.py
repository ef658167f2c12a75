"""`python -m devkit.probes.mount_cost` answers the bench's cached mounts over each store it
offers.

The tool times the servicer in one process; this checks it still builds the servicer from
`serve`'s flags and that every mount it times succeeds (a failed mount ends it with the
provider's message), over the fake store and over a real OpenBao.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.parametrize("store", ["fake", "openbao"])
def test_mount_cost_times_successful_mounts(store: str) -> None:
    probe = "devkit.probes.mount_cost"
    command = ["-m", probe, "--store", store, "--mounts", "50", "--repeats", "1"]
    run = subprocess.run(
        [sys.executable, *command],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.fullmatch(
        rf"(\d+\.\d) µs of CPU per cached Mount, {store} store \(best of 1 x 50\)\n", run.stdout
    )
    assert found is not None, run.stdout
    assert float(found.group(1)) > 0
