"""The servicer `serve` would build, in this process, over one of the bench's store rigs: what
the in-process probes (devkit.probes.mount_cost) and the mount trace (devkit.mounttrace) call
`ProviderServicer.Mount` on, without gRPC."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
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

OBJECTS = 5


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
