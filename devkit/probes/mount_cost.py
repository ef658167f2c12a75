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
import contextlib
import gc
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from devkit import rigs
from protos import provider_pb2
from provider.cli import flags
from provider.cli.bench import targets
from provider.core.metrics import Metrics
from provider.edge import logs
from provider.edge.app import build_mounter
from provider.edge.server import ProviderServicer

OBJECTS, PODS = 5, 100


class Context:
    """What the servicer asks of grpc's context on a successful mount."""

    def time_remaining(self) -> float:
        return 30.0

    async def abort(self, code: Any, message: str) -> None:
        raise RuntimeError(f"{code}: {message}")


def servicer(
    rig: Any, work: Path, log_repeats_every: float, cache_ttl: float = 30
) -> ProviderServicer:
    """The servicer `serve` would build with the rig's provider flags."""
    key = work / "hmac.key"
    key.write_bytes(os.urandom(32))
    parser = argparse.ArgumentParser()
    flags.add_serve_flags(parser)
    args = parser.parse_args(
        ["--hmac-key-file", str(key), "--cache-ttl", str(cache_ttl), *rig.provider_args]
    )
    metrics = Metrics()
    mounter, _ = build_mounter(flags.settings_from_args(args), metrics)
    return ProviderServicer(mounter=mounter, metrics=metrics, log_repeats_every=log_repeats_every)


@contextlib.asynccontextmanager
async def serving(
    store: str, work: Path, pods: int, *, cache_ttl: float = 30, log_repeats_every: float = 600.0
) -> AsyncIterator[tuple[Any, ProviderServicer, list[provider_pb2.MountRequest]]]:
    """The store's rig (started), the servicer over it, and the bench's requests for `pods`
    pods of one 5-object class; the log goes to a file at INFO, as a DaemonSet's does."""
    rig = rigs.make_rigs([store], work, objects=OBJECTS, identities=1, health_port=0)[0]
    await rig.start()
    try:
        bench_class = targets.BenchClass(
            "bench", "bench", rig.params, 1, lambda _n, _p, account: rig.tokens(account)
        )
        requests = [
            provider_pb2.MountRequest.FromString(raw)
            for raw in targets.requests([bench_class], pods=pods, namespace=None, accounts=["sa-0"])
        ]
        logs.configure("info", "json")
        handler = logging.getLogger().handlers[0]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream((work / "provider.log").open("w"))
        yield rig, servicer(rig, work, log_repeats_every, cache_ttl), requests
    finally:
        await rig.stop()


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
