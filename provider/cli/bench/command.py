"""`secrets-bridge bench`: pick the target, run the floor and the provider with the same load,
and report what each cost.

A target is a provider already serving (`--socket`, the team's classes and tokens) or one the
bench starts as a `serve` subprocess on dev-kit store rigs (`--store`). Unless `--cold`, one
probe mount goes first: it fails the run early with the provider's own message when the class
or the tokens are wrong, and its answer is what the floor serves, so both servers send the same
files. Then each server gets the same load in turn (floor first), from client processes
(`load`), and its CPU time is read from the OS (or /metrics) at the start and end of the
measured phase.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from provider.cli.bench import load, stats, targets
from provider.cli.bench.summary import phase_summary, soak_summary
from provider.core.errors import InvalidParameters


def _devkit() -> Any:
    """The store rigs live in the dev kit (a source checkout), not in the wheel."""
    try:
        from devkit import ports, rigs
    except ImportError:
        raise SystemExit(
            "secrets-bridge bench: --store needs the dev kit: run `python -m provider.cli.main "
            "bench ...` at the root of a source checkout with the test extras installed; "
            "against a running provider use --socket"
        ) from None
    return ports, rigs


@dataclass
class Target:
    socket: str
    requests: list[bytes]
    pid: int | None = None
    metrics_url: str | None = None
    rigs: list[Any] = field(default_factory=list)
    ready_s: float | None = None
    log: Path | None = None


def shape_of(args: argparse.Namespace) -> tuple[load.Shape, int]:
    """The load shape and the number of distinct pods (volumes) it cycles over."""
    warmup = 0.0 if args.cold else args.warmup
    pods = args.pods
    if args.scenario == "rotation":
        pods = args.volumes or args.pods
        duration = args.duration or 3 * args.interval
        rate = pods / args.interval
        return load.Shape(
            "open",
            rate=rate,
            duration=duration,
            warmup=warmup,
            timeout=args.timeout,
            mounts=args.mounts,
        ), pods
    mounts, duration = args.mounts, args.duration
    if not mounts and not duration:
        mounts, duration = (0, 10.0) if args.rate else (2000, 0.0)
    if args.rate:
        return load.Shape(
            "open",
            rate=args.rate,
            mounts=mounts,
            duration=duration,
            warmup=warmup,
            timeout=args.timeout,
        ), pods
    return load.Shape(
        "closed",
        concurrency=args.concurrency,
        mounts=mounts,
        duration=duration,
        warmup=warmup,
        timeout=args.timeout,
    ), pods


def _accounts(args: argparse.Namespace, default: str) -> list[str]:
    value = args.service_accounts or (str(args.identities) if args.identities else default)
    return targets.service_accounts(value)


@contextlib.asynccontextmanager
async def remote(args: argparse.Namespace, pods: int) -> AsyncIterator[Target]:
    if not args.classes:
        raise InvalidParameters("--socket needs at least one --class SPC.yaml")
    if not os.path.exists(args.socket):  # noqa: ASYNC240 - once, before any load
        raise InvalidParameters(
            f"--socket {args.socket}: nothing there (is the provider running on this node, and "
            "its socket directory mounted?)"
        )
    tokens = targets.token_source(args.token, args.token_command, args.audience)
    classes = targets.class_files(args.classes, tokens)
    reqs = targets.requests(
        classes, pods=pods, namespace=args.namespace, accounts=_accounts(args, "default")
    )
    yield Target(args.socket, reqs, metrics_url=args.metrics_url)


@contextlib.asynccontextmanager
async def started(args: argparse.Namespace, pods: int, work: Path) -> AsyncIterator[Target]:
    """A `serve` subprocess on the dev kit's store rigs."""
    if args.classes:
        raise InvalidParameters("--class needs --socket (the rigs bring their own classes)")
    ports, rig_kit = _devkit()
    health = ports.free_port()
    accounts = _accounts(args, "1")
    rigs = rig_kit.make_rigs(
        (args.store or "fake").split(","),
        work,
        objects=args.objects,
        identities=len(accounts),
        health_port=health,
        error_rate=args.store_error_rate,
        service_accounts=accounts,
    )
    async with contextlib.AsyncExitStack() as stack:
        for rig in rigs:
            await rig.start()
            stack.push_async_callback(rig.stop)
        classes = [
            targets.BenchClass("bench", "bench", rig.params, 1, _rig_tokens(rig)) for rig in rigs
        ]
        reqs = targets.requests(classes, pods=pods, namespace=None, accounts=accounts)
        socket, key, log = work / "provider.sock", work / "hmac.key", work / "provider.log"
        key.write_bytes(os.urandom(32))
        cmd = [
            sys.executable, "-m", "provider.cli.main", "serve",
            "--socket", str(socket), "--health-addr", f"127.0.0.1:{health}",
            "--hmac-key-file", str(key),
            "--cache-ttl", str(args.cache_ttl),
            *(a for rig in rigs for a in rig.provider_args), *args.provider_arg,
        ]  # fmt: skip
        begin = time.monotonic()
        with log.open("wb") as out:
            # The provider's log goes to a file: a failing run must not flood the report.
            proc = subprocess.Popen(cmd, stderr=out)  # noqa: ASYNC220 - before any load
        try:
            await wait_ready(str(socket), proc)
            yield Target(
                str(socket), reqs, proc.pid, f"http://127.0.0.1:{health}/metrics", rigs,
                time.monotonic() - begin, log,
            )  # fmt: skip
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 15)


def _rig_tokens(rig: Any) -> targets.TokenSource:
    return lambda namespace, pod, account: rig.tokens(account)


def _channel(socket: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        f"unix://{socket}",
        options=[
            ("grpc.default_authority", "localhost"),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ],
    )


async def wait_ready(socket: str, proc: subprocess.Popen[bytes], limit: float = 30) -> float:
    """Seconds until a Version call on `socket` answers (the process must stay up)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before it was ready")
        if os.path.exists(socket):  # noqa: ASYNC240 - a stat on a local socket path
            async with _channel(socket) as channel:
                version = channel.unary_unary(load.VERSION)
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await version(b"", timeout=1)
                    return time.monotonic() - start
        await asyncio.sleep(0.01)
    raise RuntimeError("the server did not become ready")


async def probe(socket: str, request: bytes, deadline: float) -> bytes:
    """One mount before the load: the run stops here, with the provider's message, when the
    class or the tokens are wrong."""
    async with _channel(socket) as channel:
        mount = channel.unary_unary(load.MOUNT)
        try:
            answer: bytes = await mount(request, timeout=deadline, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            raise InvalidParameters(
                f"the first mount failed: {exc.code().name}: {exc.details()}"
            ) from None
        return answer


@contextlib.asynccontextmanager
async def floor(
    work: Path, answer: bytes | None, loop: str = "asyncio"
) -> AsyncIterator[tuple[str, int]]:
    socket = str(work / "floor.sock")
    cmd = [sys.executable, "-m", "provider.cli.bench.floor", "--loop", loop, socket]
    if answer is not None:
        (work / "answer.bin").write_bytes(answer)
        cmd.append(str(work / "answer.bin"))
    proc = subprocess.Popen(cmd)  # noqa: ASYNC220 - before any load
    try:
        await wait_ready(socket, proc)
        yield socket, proc.pid
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 15)


UsageFn = Callable[[], stats.Usage | None]


def usage_of(pid: int | None, metrics_url: str | None) -> UsageFn:
    def usage() -> stats.Usage | None:
        if pid is not None:
            return stats.proc_usage(pid)
        if metrics_url:
            with contextlib.suppress(OSError):
                return stats.scrape(metrics_url).usage
        return None

    return usage


async def measure(
    socket: str,
    reqs: list[bytes],
    shape: load.Shape,
    args: argparse.Namespace,
    label: str,
    usage: UsageFn,
    during: Callable[[float], list[asyncio.Task[Any]]] | None = None,
) -> dict[str, Any]:
    """One phase against one server: clients, progress line, CPU and RSS at its edges."""
    clients = load.start_clients(socket, reqs, shape, max(1, args.clients))
    bar = _progress(label, shape, args.progress)
    collecting = asyncio.ensure_future(asyncio.to_thread(clients.collect))
    tasks: list[asyncio.Task[Any]] = []
    before = None
    try:
        while not collecting.done():
            now = time.monotonic()
            if before is None and now >= clients.begin:
                before = usage()
                tasks = during(clients.begin) if during else []
            if bar is not None:
                bar(clients, now - clients.begin)
            # Wake up at the measured phase's start, to read the CPU counters right then.
            wait = 0.25 if before is not None else min(0.25, clients.begin - now)
            await asyncio.wait([collecting], timeout=max(wait, 0.0))
        outcomes = collecting.result()
    finally:
        clients.stop()
        for task in tasks:
            task.cancel()
        if bar is not None:
            print(file=sys.stderr)
    after = usage()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    hist, outcome = load.merge(outcomes)
    return phase_summary(hist, outcome, before, after)


def _progress(label: str, shape: load.Shape, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm  # type: ignore[import-untyped]

    total = shape.mounts or shape.duration
    unit = "mount" if shape.mounts else "s"
    bar = tqdm(total=total, desc=f"{label:>8}", unit=unit, file=sys.stderr, leave=False)

    def update(clients: load.Clients, elapsed: float) -> None:
        _, measured = clients.done()
        bar.n = measured if shape.mounts else min(max(elapsed, 0.0), shape.duration)
        state = "warming up" if elapsed < 0 else f"{measured} mounts"
        bar.set_postfix_str(state, refresh=False)
        bar.refresh()

    return update


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    shape, pods = shape_of(args)
    with tempfile.TemporaryDirectory(prefix="sb-bench-") as tmp:
        work = Path(tmp)
        target_cm = remote(args, pods) if args.socket else started(args, pods, work)
        async with target_cm as target:
            answer = None
            if not args.cold:
                answer = await probe(target.socket, target.requests[0], args.timeout)
            result: dict[str, Any] = {"echo": None}
            if not args.no_echo:
                async with floor(work, answer, args.floor_loop) as (socket, pid):
                    result["echo"] = await measure(
                        socket, target.requests, shape, args, "echo", usage_of(pid, None)
                    )
            result.update(await provider_phase(target, shape, args))
            if result["mount"]["errors"] and target.log is not None:
                lines = target.log.read_text(errors="replace").splitlines()
                result["provider_log_tail"] = lines[-3:]
            result["settings"] = settings_of(args, shape, pods, target)
            return result


async def provider_phase(
    target: Target, shape: load.Shape, args: argparse.Namespace
) -> dict[str, Any]:
    usage = usage_of(target.pid, target.metrics_url)
    samples: list[tuple[float, stats.Usage]] = []
    outages: list[tuple[float, float]] = []

    async def sample(begin: float) -> None:
        while True:
            if (u := await asyncio.to_thread(usage)) is not None:
                samples.append((time.monotonic() - begin, u))
            await asyncio.sleep(args.sample_every)

    async def restart(begin: float) -> None:
        rigs = [r for r in target.rigs if hasattr(r, "restart")]
        while rigs:
            await asyncio.sleep(args.store_restart_every)
            down = time.monotonic() - begin
            await asyncio.gather(*(r.restart(args.store_down) for r in rigs))
            outages.append((down, time.monotonic() - begin))

    def during(begin: float) -> list[asyncio.Task[Any]]:
        tasks = [asyncio.create_task(sample(begin))]
        if args.store_restart_every > 0:
            tasks.append(asyncio.create_task(restart(begin)))
        return tasks

    calls_before = _store_calls(target)
    scraped_before = _scrape(target.metrics_url)
    mount = await measure(target.socket, target.requests, shape, args, "mount", usage, during)
    scraped_after = _scrape(target.metrics_url)
    out: dict[str, Any] = {"mount": mount}
    out["store_calls"] = stats.delta(_store_calls(target), calls_before)
    if scraped_before is not None and scraped_after is not None:
        calls = stats.delta(scraped_after.store_calls, scraped_before.store_calls)
        out["store_calls_per_s"] = {k: v / mount["seconds"] for k, v in calls.items()}
    out["soak"] = soak_summary(samples, outages, mount, args.timeout)
    return out


def _store_calls(target: Target) -> dict[str, float]:
    calls: dict[str, float] = {}
    for rig in target.rigs:
        for name, n in rig.store_calls().items():
            calls[f"{rig.name} {name}"] = n
    return calls


def _scrape(url: str | None) -> stats.Scrape | None:
    if not url:
        return None
    try:
        return stats.scrape(url)
    except OSError:
        return None


def settings_of(
    args: argparse.Namespace, shape: load.Shape, pods: int, target: Target
) -> dict[str, Any]:
    return {
        "target": f"socket {args.socket}" if args.socket else f"store {args.store or 'fake'}",
        "classes": args.classes,
        "scenario": args.scenario,
        "shape": shape.mode,
        "concurrency": shape.concurrency if shape.mode == "closed" else None,
        "rate_per_s": shape.rate if shape.mode == "open" else None,
        "mounts": shape.mounts,
        "duration_s": shape.duration,
        "warmup_s": shape.warmup,
        "pods": pods,
        "clients": args.clients,
        "objects": None if args.socket else args.objects,
        "cache_ttl": None if args.socket else args.cache_ttl,
        "provider_args": args.provider_arg,
        "store_error_rate": args.store_error_rate,
        "store_restart_every": args.store_restart_every,
        "start_to_ready_s": target.ready_s,
    }
