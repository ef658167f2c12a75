"""Audit trail bytes per poll of one pod (issue 40, item 8): a class selecting N secrets of the
fake store against the same N secrets listed by name, through a served provider over its
socket; the largest line, and the median time the provider took per poll with the trail on.

    python -m devkit.probes.audit_bytes [--secrets 1000] [--polls 5]

Runs against whatever tree it is started in (to compare with a base commit, run it there).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from backends.fake.options import Options as FakeOptions
from devkit.serving import serving
from devkit.testing import driver_request
from provider.core.settings import CoreSettings


async def _polls(stub: Any, trail: Path, params: dict[str, str], polls: int) -> dict[str, float]:
    sizes, lines, longest, took = [], [], 0, []
    for _ in range(polls):
        before = trail.read_bytes()
        started = time.perf_counter()
        await stub.Mount(driver_request({"backend": "fake", **params}, pod="poll-0"), timeout=60)
        took.append(time.perf_counter() - started)
        added = trail.read_bytes()[len(before) :]
        sizes.append(len(added))
        lines.append(added.count(b"\n"))
        longest = max([longest, *(len(line) + 1 for line in added.splitlines())])
    return {
        "bytes_per_poll": statistics.median(sizes),
        "lines_per_poll": statistics.median(lines),
        "longest_line": longest,
        "median_poll_ms": statistics.median(took) * 1000,
    }


async def _run(secrets: int, polls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store = root / "store.yaml"
        names = [f"k{i}" for i in range(1, secrets + 1)]
        store.write_text(yaml.safe_dump({"secrets": {f"k1000/{n}": f"v-{n}" for n in names}}))
        trail = root / "audit.log"
        core = CoreSettings(enable_fake_backend=True, max_objects=secrets)
        options = {"fake": FakeOptions(store_file=str(store))}
        async with serving(root, backend_options=options, core=core, audit_log=str(trail)) as up:
            select = yaml.safe_dump([{"prefix": "k1000/", "directory": "sel"}])
            listed = yaml.safe_dump([{"objectName": n, "secretPath": f"k1000/{n}"} for n in names])
            for label, params in (
                ("selected", {"select": select}),
                ("listed", {"objects": listed}),
            ):
                got = await _polls(up.stub, trail, params, polls)
                shown = " ".join(f"{k}={v:.0f}" if k != "median_poll_ms" else f"{k}={v:.1f}"
                                 for k, v in got.items())  # fmt: skip
                print(f"{label} {secrets} secrets: {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--secrets", type=int, default=1000)
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(_run(args.secrets, args.polls))


if __name__ == "__main__":
    main()
