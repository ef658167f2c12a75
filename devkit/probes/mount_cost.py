"""The provider's own Python per cached Mount, in one process, without gRPC (a benchmark).

    python -m devkit.probes.mount_cost [--store fake|openbao] [--mounts 5000] [--repeats 7]
                                [--log-repeats-every 600]

Builds the servicer as `serve` does — from `serve`'s own flags, over the bench's store rig (the
fake store, or a real OpenBao with its jwt role and KV v2 secrets), 5 objects, `--cache-ttl 30` —
answers the bench's requests for 100 pods once, then times `ProviderServicer.Mount` over them
with the process's CPU clock and prints the best of `--repeats` rounds. The log goes to a file
at INFO, as a DaemonSet's does. `bench` measures the whole process (gRPC included) against the
floor; this isolates what a change to our code costs, with less noise than a whole-process run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from pathlib import Path

from devkit.inprocess import Context, serving

PODS = 100


async def measure(
    mounts: int, repeats: int, log_repeats_every: float, work: Path, store: str = "fake"
) -> float:
    """Best µs of CPU per Mount over `repeats` rounds of `mounts`."""
    setup = serving(store, work, PODS, log_repeats_every=log_repeats_every)
    async with setup as (_rig, provider, requests):
        context = Context()
        for request in requests:  # every value cached, every plan parsed
            await provider.Mount(request, context)
        gc.collect()
        gc.freeze()
        best = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            for i in range(mounts):
                await provider.Mount(requests[i % PODS], context)
            best = min(best, time.process_time() - start)
        return best / mounts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["fake", "openbao"], default="fake")
    parser.add_argument("--mounts", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--log-repeats-every", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        cost = asyncio.run(
            measure(args.mounts, args.repeats, args.log_repeats_every, Path(work), args.store)
        )
    print(
        f"{cost:.1f} µs of CPU per cached Mount, {args.store} store "
        f"(best of {args.repeats} x {args.mounts})"
    )


if __name__ == "__main__":
    main()
