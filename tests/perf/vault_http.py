"""Measure: 200 concurrent KV reads through our aiohttp client vs hvac in a bounded thread pool.

Run: .venv/bin/python -m tests.perf.vault_http [--reads 200] [--rounds 5]
Starts its own OpenBao, logs in once (a root-issued token), and times the reads only. Both sides
use keep-alive connections; hvac gets one requests.Session per worker thread (hvac's Client is
not thread-safe to share), the pool bounded like our connection limit.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import hvac

from backends.vault.client import VaultHTTP
from backends.vault.dialect import TLSConfig
from devkit.openbao import OpenBao


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def aiohttp_round(http: VaultHTTP, addr: str, token: str, reads: int) -> list[float]:
    async def one() -> float:
        start = time.perf_counter()
        reply = await http.request(
            addr,
            TLSConfig(),
            "GET",
            "secret/data/bench",
            deadline=time.monotonic() + 30,
            token=token,
        )
        assert reply.status == 200
        return time.perf_counter() - start

    return list(await asyncio.gather(*(one() for _ in range(reads))))


async def hvac_round(
    pool: ThreadPoolExecutor, local: threading.local, addr: str, token: str, reads: int
) -> list[float]:
    def read() -> float:
        start = time.perf_counter()
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = hvac.Client(url=addr, token=token)
        client.secrets.kv.v2.read_secret_version("bench", raise_on_deleted_version=True)
        return time.perf_counter() - start

    loop = asyncio.get_running_loop()

    # Latency as a caller sees it: queueing for a pool thread included.
    async def one() -> float:
        start = time.perf_counter()
        await loop.run_in_executor(pool, read)
        return time.perf_counter() - start

    return list(await asyncio.gather(*(one() for _ in range(reads))))


async def main(reads: int, rounds: int, pool_size: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = OpenBao.start(Path(tmp))
        try:
            server.kv2_put("secret", "bench", {"password": "x" * 64})
            token = server.root().auth.token.create(policies=["root"], ttl="1h")["auth"][
                "client_token"
            ]
            http = VaultHTTP(max_connections=pool_size, max_body_bytes=1 << 20)
            pool = ThreadPoolExecutor(max_workers=pool_size)
            local = threading.local()
            results: dict[str, list[tuple[float, list[float]]]] = {
                "aiohttp": [],
                "hvac+threads": [],
            }
            for _ in range(rounds + 1):  # the first round warms connections up and is dropped
                for name in results:
                    start = time.perf_counter()
                    if name == "aiohttp":
                        lat = await aiohttp_round(http, server.addr, token, reads)
                    else:
                        lat = await hvac_round(pool, local, server.addr, token, reads)
                    results[name].append((time.perf_counter() - start, lat))
            await http.close()
            pool.shutdown()
        finally:
            server.stop()
    print(f"{reads} concurrent reads x {rounds} rounds, pool/connection limit {pool_size}")
    for name, runs in results.items():
        runs = runs[1:]
        walls = [w for w, _ in runs]
        lats = [x for _, lat in runs for x in lat]
        print(
            f"{name:13} wall median {statistics.median(walls) * 1000:7.1f} ms  "
            f"throughput {reads / statistics.median(walls):7.0f} reads/s  "
            f"latency p50 {percentile(lats, 0.5) * 1000:6.1f} ms  "
            f"p99 {percentile(lats, 0.99) * 1000:6.1f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pool", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main(args.reads, args.rounds, args.pool))
