"""How far one cached Mount travels through our modules (`python -m devkit.mounttrace`), held
to the figures it had when issue 42 straightened the fetch stack.

Each ceiling is the trace's figure at that commit: a change that makes the cached path reach
more modules, or come back to one more often, fails here and must raise the ceiling with a
reason in its commit (the issue's own bound was 8 modules and 12 returns; before it, 15 and 54).
"""

from __future__ import annotations

import json
import subprocess
import sys

#: The figures of c10a7a9: the mounter's request memo, the value cache's entries, the log repeats.
CEILINGS = {"modules": 6, "returns": 7, "calls": 11}
#: What those modules are: the edge, the mounter and its memo, the value cache, the log repeats.
REACHED = [
    "provider.edge.server",
    "provider.mount.mounting",
    "provider.core.memo",
    "provider.mount.fetching",
    "provider.core.caching",
    "provider.edge.repeats",
]


def test_a_cached_mount_stays_within_its_modules() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "devkit.mounttrace", "--json"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(run.stdout)
    assert figures["modules_reached"] == REACHED
    over = {k: figures[k] for k, ceiling in CEILINGS.items() if figures[k] > ceiling}
    assert not over, f"the cached Mount grew past its ceilings {CEILINGS}: {over}"
    # A first visit to each module but the first is a move; every other move is a return.
    assert figures["moves"] == figures["returns"] + figures["modules"] - 1
