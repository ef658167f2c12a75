"""The provider's own Python per cached Mount, in one process, without gRPC (a benchmark).

    python -m devkit.mount_cost [--mounts 5000] [--repeats 7] [--log-repeats-every 600]

Builds the servicer as `serve` does over the fake store (5 objects, `--cache-ttl 30`), answers
the bench's requests for 100 pods once, then times `ProviderServicer.Mount` over them with the
process's CPU clock and prints the best of `--repeats` rounds. The log goes to a file at INFO, as
a DaemonSet's does. `bench` measures the whole process (gRPC included) against the floor; this
isolates what a change to our code costs, with less noise than a whole-process run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from devkit.testing import Harness
from protos import provider_pb2
from provider.cli.bench import targets
from provider.edge import logs
from provider.edge.server import ProviderServicer

OBJECTS, PODS = 5, 100


class _Context:
    """What the servicer asks of grpc's context on a successful mount."""

    def time_remaining(self) -> float:
        return 30.0

    async def abort(self, code: Any, message: str) -> None:
        raise RuntimeError(f"{code}: {message}")


async def measure(mounts: int, repeats: int, log_repeats_every: float, work: Path) -> float:
    """Best µs of CPU per Mount over `repeats` rounds of `mounts`."""
    harness = Harness(work, cache_ttl=30.0)
    harness.write({"secrets": {f"s{i}": {"user": f"u{i}"} for i in range(OBJECTS)}})
    items = [{"objectName": f"o{i}", "secretPath": f"s{i}"} for i in range(OBJECTS)]
    params = {"backend": "fake", "objects": yaml.safe_dump(items)}
    bench_class = targets.BenchClass("bench", "bench", params, 1, lambda _n, _p, _a: {})
    requests = [
        provider_pb2.MountRequest.FromString(raw)
        for raw in targets.requests([bench_class], pods=PODS, namespace=None, accounts=["sa-0"])
    ]
    logs.configure("info", "json")
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream((work / "provider.log").open("w"))
    servicer = ProviderServicer(
        mounter=harness.mounter, metrics=harness.metrics, log_repeats_every=log_repeats_every
    )
    context = _Context()
    for request in requests:  # every value cached, every plan parsed
        await servicer.Mount(request, context)
    gc.collect()
    gc.freeze()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for i in range(mounts):
            await servicer.Mount(requests[i % PODS], context)
        best = min(best, time.process_time() - start)
    return best / mounts * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mounts", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--log-repeats-every", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        cost = asyncio.run(measure(args.mounts, args.repeats, args.log_repeats_every, Path(work)))
    print(f"{cost:.1f} µs of CPU per cached Mount (best of {args.repeats} x {args.mounts})")


if __name__ == "__main__":
    main()
