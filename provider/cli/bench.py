"""`secrets-bridge bench`: a load generator for Mount, with a bare gRPC echo server as the floor.

Runs in its own process: starts the provider (`serve`, a subprocess) against a chosen store
rig, and the echo server (`devkit.echo`, a subprocess) on its own socket; drives both with
the same client at the same concurrency; reports latency percentiles, throughput, store calls
(counted by the store where it can), the provider's RSS and its start-to-ready time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from protos import provider_pb2, provider_pb2_grpc
from provider.cli.mount import kubelet_keys
from provider.edge.server import dial

if TYPE_CHECKING:
    from devkit.rigs import Rig


def _devkit() -> Any:
    """The store rigs live in the dev kit (a source checkout), not in the wheel."""
    try:
        from devkit import devstores, rigs
    except ImportError as exc:
        raise SystemExit(
            "secrets-bridge bench: the store rigs (fake, openbao, moto) come from the dev kit "
            "of a source checkout; run `make bench` there"
        ) from exc
    return devstores, rigs


def add_bench_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        default="fake",
        help="fake, openbao, moto, or several comma-separated (mounts alternate)",
    )
    p.add_argument("--mounts", type=int, default=2000, help="mounts per target")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pods", type=int, default=100, help="distinct pods (names/uids)")
    p.add_argument("--identities", type=int, default=1, help="distinct service accounts")
    p.add_argument("--objects", type=int, default=5, help="objects per class")
    p.add_argument("--cache-ttl", type=float, default=0.0)
    p.add_argument(
        "--cold",
        action="store_true",
        help="no warm-up: store calls count from the provider's start",
    )
    p.add_argument("--no-echo", action="store_true", help="skip the echo floor (long runs)")
    p.add_argument(
        "--store-error-rate",
        type=float,
        default=0.0,
        help="openbao: share of requests answered 429 by a proxy in front",
    )
    p.add_argument(
        "--rss-every", type=int, default=0, help="sample the provider's RSS every N mounts"
    )
    p.add_argument("--provider-arg", action="append", default=[], help="extra serve flag")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="latency distributions (needs matplotlib)")
    p.add_argument("--progress", action="store_true", default=sys.stderr.isatty())


@dataclass
class Run:
    target: str
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> dict[str, float]:
        lat = sorted(self.latencies) or [0.0]

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000

        return {
            "p50_ms": pct(0.50),
            "p95_ms": pct(0.95),
            "p99_ms": pct(0.99),
            "mean_ms": statistics.fmean(lat) * 1000,
            "throughput_per_s": len(self.latencies) / self.seconds if self.seconds else 0.0,
            "ok": len(self.latencies),
            "errors": sum(self.errors.values()),
        }


async def drive(
    socket: str, requests: list[Any], concurrency: int, label: str, progress: bool
) -> Run:
    run = Run(label)
    queue = iter(requests)
    async with dial(socket) as channel:
        stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
        await stub.Version(provider_pb2.VersionRequest(), wait_for_ready=True, timeout=30)

        async def worker() -> None:
            import grpc

            for req in queue:
                start = time.perf_counter()
                try:
                    await stub.Mount(req, timeout=120)
                except grpc.aio.AioRpcError as exc:
                    run.errors[exc.code().name] = run.errors.get(exc.code().name, 0) + 1
                else:
                    run.latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        ticker = asyncio.create_task(_progress(run, len(requests), label)) if progress else None
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.seconds = time.perf_counter() - start
        if ticker:
            ticker.cancel()
            print(file=sys.stderr)
    return run


async def _progress(run: Run, total: int, label: str) -> None:
    while True:
        done = len(run.latencies) + sum(run.errors.values())
        bar = "#" * int(30 * done / max(total, 1))
        print(f"\r{label:>8} [{bar:<30}] {done}/{total}", end="", file=sys.stderr, flush=True)
        await asyncio.sleep(0.25)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def wait_ready(socket: str, proc: subprocess.Popen[bytes], limit: float = 30) -> float:
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"the provider exited with {proc.returncode} before it was ready")
        if os.path.exists(socket):  # noqa: ASYNC240 - a stat on tmpfs; this is the load tool
            async with dial(socket) as channel:
                stub = provider_pb2_grpc.CSIDriverProviderStub(channel)
                try:
                    await stub.Version(provider_pb2.VersionRequest(), timeout=1)
                    return time.monotonic() - start
                except Exception:  # noqa: S110 - not up yet
                    pass
        await asyncio.sleep(0.01)
    raise RuntimeError("the provider did not become ready")


def requests_for(rigs: list[Rig], args: argparse.Namespace) -> list[Any]:
    """Mount requests as the driver builds them; pods (and stores) alternate."""
    out = []
    for i in range(args.mounts):
        rig = rigs[i % len(rigs)]
        pod = i % args.pods
        identity = pod % args.identities
        attrs = {
            **rig.params,
            "secretProviderClass": "bench",
            **kubelet_keys(
                pod_name=f"pod-{pod}",
                namespace="bench",
                uid=f"uid-{pod}",
                service_account=f"sa-{identity}",
                tokens=rig.tokens(f"sa-{identity}"),
            ),
        }
        out.append(
            provider_pb2.MountRequest(
                attributes=json.dumps(attrs), secrets="null", target_path="/t", permission="420"
            )
        )
    return out


def store_calls(rigs: list[Rig]) -> dict[str, int]:
    calls: dict[str, int] = {}
    for rig in rigs:
        for name, n in rig.store_calls().items():
            calls[f"{rig.name} {name}"] = n
    return calls


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        work = Path(tmp)
        devstores, rig_kit = _devkit()
        health = devstores.free_port()
        rigs = rig_kit.make_rigs(
            args.store.split(","),
            work,
            objects=args.objects,
            identities=args.identities,
            health_port=health,
            error_rate=args.store_error_rate,
        )
        for rig in rigs:
            await rig.start()
        echo_sock, prov_sock = str(work / "echo.sock"), str(work / "provider.sock")
        key = work / "hmac.key"
        key.write_bytes(os.urandom(32))
        echo = subprocess.Popen([sys.executable, "-m", "devkit.echo", echo_sock])  # noqa: ASYNC220
        cmd = [
            sys.executable,
            "-m",
            "provider.cli.main",
            "serve",
            "--socket",
            prov_sock,
            "--health-addr",
            f"127.0.0.1:{health}",
            "--hmac-key-file",
            str(key),
            "--log-level",
            "warning",
            "--cache-ttl",
            str(args.cache_ttl),
            *(a for rig in rigs for a in rig.provider_args),
            *args.provider_arg,
        ]
        started = time.monotonic()
        # The provider's log goes to a file: a failing run must not flood the report.
        provider_log = (work / "provider.log").open("wb")
        provider = subprocess.Popen(cmd, stderr=provider_log)  # noqa: ASYNC220 - before measuring
        try:
            await wait_ready(prov_sock, provider)
            ready = time.monotonic() - started
            rss_start = rss_mib(provider.pid)
            requests = requests_for(rigs, args)
            if not args.cold:
                warm = requests[: min(50, len(requests))]
                await drive(echo_sock, warm, args.concurrency, "warm", False)
                await drive(prov_sock, warm, args.concurrency, "warm", False)
            calls_before = store_calls(rigs)
            floor = Run("echo")
            if not args.no_echo:
                floor = await drive(echo_sock, requests, args.concurrency, "echo", args.progress)
            mount, rss = await drive_sampling(prov_sock, requests, args, provider.pid)
            calls = _diff(store_calls(rigs), calls_before)
            result = summarize(args, floor, mount, calls, ready, rss_start, rss)
            if args.plot:
                plot(args.plot, floor, mount, result)
            if mount.errors:
                lines = (work / "provider.log").read_text(errors="replace").splitlines()
                result["provider_log_tail"] = lines[-3:]
            return result
        finally:
            for proc in (provider, echo):
                proc.terminate()
                proc.wait(15)
            provider_log.close()
            for rig in rigs:
                await rig.stop()


async def drive_sampling(
    socket: str, requests: list[Any], args: argparse.Namespace, pid: int
) -> tuple[Run, list[tuple[int, float]]]:
    """The mount phase, in chunks of --rss-every mounts with an RSS sample after each."""
    every = args.rss_every or len(requests)
    total = Run("mount")
    samples: list[tuple[int, float]] = []
    for start in range(0, len(requests), every):
        run = await drive(
            socket, requests[start : start + every], args.concurrency, "mount", args.progress
        )
        total.latencies += run.latencies
        total.seconds += run.seconds
        for code, n in run.errors.items():
            total.errors[code] = total.errors.get(code, 0) + n
        samples.append((start + len(run.latencies) + sum(run.errors.values()), rss_mib(pid)))
    return total, samples


def summarize(
    args: argparse.Namespace,
    floor: Run,
    mount: Run,
    calls: dict[str, int],
    ready: float,
    rss_start: float,
    rss: list[tuple[int, float]],
) -> dict[str, Any]:
    e, m = floor.summary(), mount.summary()
    return {
        "store": args.store,
        "mounts": args.mounts,
        "concurrency": args.concurrency,
        "pods": args.pods,
        "identities": args.identities,
        "objects": args.objects,
        "cache_ttl": args.cache_ttl,
        "cold": args.cold,
        "store_error_rate": args.store_error_rate,
        "provider_args": args.provider_arg,
        "echo": e,
        "mount": m,
        "mount_errors": mount.errors,
        "p50_ratio": m["p50_ms"] / e["p50_ms"] if e["p50_ms"] else None,
        "throughput_ratio": m["throughput_per_s"] / e["throughput_per_s"]
        if e["throughput_per_s"]
        else None,
        "store_calls": calls,
        "start_to_ready_s": ready,
        "rss_mib_start": rss_start,
        "rss_mib_samples": rss,
        "rss_mib_end": rss[-1][1] if rss else rss_start,
    }


def _diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def plot(path: str, floor: Run, mount: Run, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    data = [[x * 1000 for x in floor.latencies], [x * 1000 for x in mount.latencies]]
    ax.violinplot(data, showmedians=True)
    ax.set_xticks([1, 2], ["echo (floor)", f"mount ({result['store']})"])
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.set_title(
        f"{result['mounts']} mounts, concurrency {result['concurrency']}, "
        f"{result['objects']} objects, cache-ttl {result['cache_ttl']}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report(result: dict[str, Any]) -> str:
    e, m = result["echo"], result["mount"]
    head = (
        f"store={result['store']} mounts={result['mounts']} "
        f"concurrency={result['concurrency']} pods={result['pods']} "
        f"identities={result['identities']} objects={result['objects']} "
        f"cache_ttl={result['cache_ttl']}"
        + (" cold" if result["cold"] else "")
        + (f" store_error_rate={result['store_error_rate']}" if result["store_error_rate"] else "")
    )
    lines = [head, f"{'':8}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'req/s':>10}{'errors':>8}"]
    for label, row in (("echo", e), ("mount", m)):
        if row["ok"] or row["errors"]:
            lines.append(
                f"{label:8}{row['p50_ms']:>10.2f}{row['p95_ms']:>10.2f}"
                f"{row['p99_ms']:>10.2f}{row['throughput_per_s']:>10.0f}"
                f"{row['errors']:>8}"
            )
    if result["p50_ratio"] is not None:
        lines.append(
            f"p50 ratio {result['p50_ratio']:.2f}x, throughput ratio "
            f"{result['throughput_ratio']:.0%} (mount vs echo, same run)"
        )
    lines.append(f"store calls: {result['store_calls'] or 'none'}")
    samples = ", ".join(f"{n}: {mib:.0f}" for n, mib in result["rss_mib_samples"])
    lines.append(
        f"provider: start to ready {result['start_to_ready_s']:.2f}s, RSS "
        f"{result['rss_mib_start']:.0f} MiB at start; after N mounts (MiB) {samples}"
    )
    if result["mount_errors"]:
        lines.append(f"mount errors: {result['mount_errors']}")
        lines.extend("  " + line[:300] for line in result.get("provider_log_tail", []))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(bench(args))
    print(report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if not result["mount_errors"] else 1


__all__ = ["add_bench_flags", "run"]
