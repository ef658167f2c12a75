"""An in-process closed loop over protobuf requests, for scripts that drive a provider they
started themselves (tests/perf/rss_all_backends.py); the bench proper uses `load`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from provider.cli.bench import load


@dataclass
class Run:
    target: str
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, float]:
        lat = sorted(self.latencies) or [0.0]
        return {"p50_ms": lat[len(lat) // 2] * 1000, "ok": len(self.latencies)}


async def drive(socket: str, requests: list[Any], concurrency: int, label: str, _: bool) -> Run:
    import asyncio

    run = Run(label)
    queue = iter(requests)
    options = [("grpc.default_authority", "localhost")]
    async with grpc.aio.insecure_channel(f"unix://{socket}", options=options) as channel:
        mount = channel.unary_unary(load.MOUNT)
        await channel.unary_unary(load.VERSION)(b"", timeout=30, wait_for_ready=True)

        async def worker() -> None:
            for req in queue:
                start = time.perf_counter()
                try:
                    await mount(req.SerializeToString(), timeout=120)
                except grpc.aio.AioRpcError as exc:
                    run.errors[exc.code().name] = run.errors.get(exc.code().name, 0) + 1
                else:
                    run.latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - start
    return run
