"""The provider's own Python heap per Mount waiting out a store outage (a benchmark).

    python -m devkit.probes.waiting_memory [--mounts 300] [--wait 1.0]

In an outage every mount that arrives waits on the shared read of its objects while that read
retries, and the allocators keep the high-water mark of what the waiting mounts held (issue 16's
soak). This builds the servicer as `serve` does over the bench's OpenBao rig (5 objects, the
soak's `--cache-ttl 0`), answers one mount per pod, then cuts the store off (its forwarder stops
forwarding: connections are reset, as when the process is killed), starts `--mounts` mounts at
once and, `--wait` seconds later — while they still wait — compares tracemalloc snapshots. What
grpc holds per call (its C core, its per-call Python objects) is not counted: the mounts are
driven without grpc, so this isolates what a change to our code costs.
"""

from __future__ import annotations

import argparse
import asyncio
import sysconfig
import tempfile
import tracemalloc
from pathlib import Path

from devkit import rigs
from devkit.inprocess import Context, serving


async def measure(mounts: int, wait: float, work: Path) -> tuple[float, list[tuple[str, float]]]:
    """Bytes per waiting mount in all, and by file (largest first)."""
    async with serving("openbao", work, mounts, cache_ttl=0) as (rig, provider, requests):
        assert isinstance(rig, rigs.OpenBaoRig)
        context = Context()
        for request in requests:  # logged in, every plan parsed, every request kept
            await provider.Mount(request, context)
        forwarder = rig.forwarder
        assert forwarder is not None
        forwarder.upstream = None
        forwarder.drop()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        waiting = [asyncio.create_task(provider.Mount(r, context)) for r in requests]
        await asyncio.sleep(wait)
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        stopped = sum(task.done() for task in waiting)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        if stopped:
            raise SystemExit(
                f"{stopped} of {mounts} mounts stopped waiting within {wait}s "
                "(the store's read gave up): run with a shorter --wait"
            )
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        diff = after.filter_traces(ignore).compare_to(before.filter_traces(ignore), "filename")
        total = sum(d.size_diff for d in diff) / mounts
        files = [(d.traceback[0].filename, d.size_diff / mounts) for d in diff if d.size_diff]
        return total, files


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mounts", type=int, default=300)
    parser.add_argument("--wait", type=float, default=1.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        total, files = asyncio.run(measure(args.mounts, args.wait, Path(work)))
    print(f"{total / 1024:.2f} KiB of Python heap per waiting mount ({args.mounts} waiting)")
    root = str(Path(__file__).resolve().parents[2]) + "/"
    places = {
        sysconfig.get_paths()["purelib"]: "<site-packages>",
        sysconfig.get_paths()["stdlib"]: "<python>",
    }
    for name, size in files[:8]:
        shown = name.removeprefix(root)
        for place, label in places.items():
            shown = shown.replace(place, label)
        print(f"  {size:7.0f} B  {shown}")


if __name__ == "__main__":
    main()
