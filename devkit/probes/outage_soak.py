"""Memory across repeated hang outages (issue 21): the rotation poll against a store that hangs.

    python -m devkit.probes.outage_soak [--volumes 660 --period 20 --deadline 10 --outages 4
                                  --outage 20 --interval 60 --stale 0]

A real OpenBao behind `devkit.hangs.HangProxy`; the provider runs as `secrets-bridge serve` in
its own process (its RSS is what is measured, from /proc); every volume (a 3-object class, one
of 20 service accounts) is re-mounted every `--period` seconds with the driver's deadline of
`--deadline` seconds. Every `--interval` seconds the proxy hangs for `--outage` seconds (accepts,
never answers). The provider's RSS is sampled every second; the report gives, per outage, RSS
before, at its peak and after the settle time, and the mounts' outcomes.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from devkit.hangs import HangProxy
from devkit.openbao import OpenBao, read_policy
from devkit.served_process import provider_process
from devkit.serving import driver_channel
from devkit.testing import driver_request
from devkit.tokens import SigningKey
from protos import provider_pb2, provider_pb2_grpc

ACCOUNTS = [f"sa{i}" for i in range(20)]
OBJECTS = [
    {"objectName": f"o{i}", "secretPath": f"secret/data/soak/s{i}", "secretKey": "pw"}
    for i in range(3)
]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def run(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="outage-soak-"))
    bao = OpenBao.start(work / "openbao")
    key = SigningKey.generate()
    bao.configure_jwt_auth("jwt", key.public_pem)
    bao.put_policy("soak", read_policy(["secret/data/soak/*"]))
    bao.add_jwt_role("jwt", "soak", namespace="soak", service_account=ACCOUNTS, policies=["soak"])
    for i in range(3):
        bao.kv2_put("secret", f"soak/s{i}", {"pw": f"soak-secret-{i}"})
    proxy = HangProxy(bao.addr)
    await proxy.start()
    with provider_process(
        work / "served",
        f"--vault-addr={proxy.url}",
        f"--serve-stale-max-age={args.stale}",
        f"--store-call-timeout={args.store_call_timeout}",
    ) as served:
        params = {
            "backend": "vault",
            "roleName": "soak",
            "vaultAuthMountPath": "jwt",
            "objects": yaml.safe_dump(OBJECTS),
        }
        tokens = {sa: key.pod_token("soak", sa, "vault") for sa in ACCOUNTS}
        requests = [
            driver_request(
                params,
                tokens={"vault": tokens[ACCOUNTS[i % len(ACCOUNTS)]]},
                namespace="soak",
                service_account=ACCOUNTS[i % len(ACCOUNTS)],
                pod=f"p{i}",
            )
            for i in range(args.volumes)
        ]
        channel = driver_channel(served.socket)
        stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
        await stub.Version(provider_pb2.VersionRequest(), timeout=30, wait_for_ready=True)
        outcomes: collections.Counter[str] = collections.Counter()
        samples: list[tuple[float, float]] = []
        #: (start, seconds) of every answered mount, for latencies inside and outside outages.
        latencies: list[tuple[float, float]] = []
        inflight = 0
        start = time.monotonic()
        total = args.warmup + args.outages * args.interval

        async def mount(req: Any) -> None:
            nonlocal inflight
            inflight += 1
            began = time.monotonic()
            try:
                await stub.Mount(req, timeout=args.deadline)
                outcomes["OK"] += 1
                latencies.append((began - start, time.monotonic() - began))
            except grpc.aio.AioRpcError as exc:
                outcomes[exc.code().name] += 1
            finally:
                inflight -= 1

        async def poll() -> None:
            gap = args.period / len(requests)
            tasks: set[asyncio.Task[None]] = set()
            i = 0
            while time.monotonic() - start < total:
                task = asyncio.create_task(mount(requests[i % len(requests)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                await asyncio.sleep(gap)
            await asyncio.gather(*tasks)

        async def outages() -> list[tuple[float, float]]:
            windows = []
            await asyncio.sleep(args.warmup)
            for _ in range(args.outages):
                began = time.monotonic() - start
                proxy.hang()
                await asyncio.sleep(args.outage)
                proxy.heal()
                proxy.release()
                windows.append((began, time.monotonic() - start))
                await asyncio.sleep(args.interval - args.outage)
            return windows

        async def sample() -> None:
            while time.monotonic() - start < total + 2:
                samples.append((time.monotonic() - start, rss_mib(served.pid)))
                await asyncio.sleep(1.0)

        _, windows, _ = await asyncio.gather(poll(), outages(), sample())
        await channel.close()
    await proxy.stop()
    bao.stop()
    print(report(args, samples, windows, outcomes))
    print(latency_report(latencies, windows))
    return 0


def report(
    args: argparse.Namespace,
    samples: list[tuple[float, float]],
    windows: list[tuple[float, float]],
    outcomes: collections.Counter[str],
) -> str:
    def at(t: float) -> float:
        return min(samples, key=lambda s: abs(s[0] - t))[1]

    lines = [
        f"volumes={args.volumes} period={args.period}s ({args.volumes / args.period:.0f} mounts/s) "
        f"deadline={args.deadline}s outage={args.outage}s every {args.interval}s "
        f"stale={args.stale} store_call_timeout={args.store_call_timeout}",
        f"baseline RSS (just before the first outage): {at(windows[0][0]):.1f} MiB",
        "outage   before MiB   peak MiB   after MiB (end of interval)",
    ]
    for n, (began, ended) in enumerate(windows, 1):
        during = [mib for t, mib in samples if began <= t <= ended + args.deadline]
        after = at(began + args.interval - 1)
        lines.append(f"{n:6}   {at(began):10.1f}   {max(during):8.1f}   {after:9.1f}")
    lines.append(f"end: {samples[-1][1]:.1f} MiB; mounts: {dict(outcomes)}")
    return "\n".join(lines)


def latency_report(latencies: list[tuple[float, float]], windows: list[tuple[float, float]]) -> str:
    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    inside = [s for t, s in latencies if any(a <= t <= b for a, b in windows)]
    outside = [s for t, s in latencies if not any(a <= t <= b for a, b in windows)]
    rows = []
    for name, values in (("during outages", inside), ("otherwise", outside)):
        rows.append(
            f"OK mounts {name}: {len(values)}, p50 {pct(values, 0.5) * 1000:.0f} ms, "
            f"p99 {pct(values, 0.99) * 1000:.0f} ms, max {max(values, default=0) * 1000:.0f} ms"
        )
    return "\n".join(rows)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m devkit.probes.outage_soak")
    p.add_argument("--volumes", type=int, default=660)
    p.add_argument("--period", type=float, default=20.0, help="seconds between re-mounts")
    p.add_argument("--deadline", type=float, default=10.0, help="the driver's deadline")
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--outages", type=int, default=4)
    p.add_argument("--outage", type=float, default=20.0, help="seconds each hang lasts")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between hang starts")
    p.add_argument("--stale", type=float, default=0.0, help="--serve-stale-max-age")
    p.add_argument("--store-call-timeout", type=float, default=10.0)
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
